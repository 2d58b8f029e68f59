// InfiniGen (methods digest, section 6.9; docs/selector-references.md,
// section 8): recallable selection by partial, skewed keys, made to run a
// layer early (pq_decode_speculate) with an estimate of the query.
//
// Skew, at pq_prefill_queries, per kv head: A = the right singular vectors
// of the window queries of its GQA group (rows: w x group, the
// eigenvectors of Q^T Q, base/symmetric_eigen.h). q.k = (q A).(k A), and
// A concentrates the queries' magnitude in few columns; the r =
// max(1, int(head_dim * infinigen_partial_ratio)) columns of largest
// sum over the rows of |q A| are kept (truncated, as the authors'
// partial_weight_index_generation: 12 at head_dim 64 and the default 0.2). The authors compute A offline from
// one sample prompt (and order its columns by s_q * s_k, which only names
// them: the columns kept are chosen by magnitude either way) and the
// columns per request from the prompt's queries (the runtime path); here
// both come from the request's window queries. Every key is kept as its r
// skewed columns (the partial key), computed as tokens arrive.
//
// Select (the authors' speculate_attention): per query head the partial
// score s[t] = (q A)_cols . (k A)_cols / sqrt(head_dim) over the middle,
// averaged over the GQA group (the authors' models have no groups); per kv
// head the count of tokens with s > max(s) - infinigen_alpha; n = the
// floor of the mean count over kv heads, at most k; every kv head takes
// its top n (ties: the larger position). Layers are not special-cased: the
// authors leave layers 0 and 1 dense, which a caller does by not using
// this layer's selection.
//
// Bytes: r floats per middle token and kv head. The state (A's kept
// columns, their indices, the partial keys) is derived from the stored
// keys and the window queries: a save keeps the columns, the partial keys
// are recomputed after a restore.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "base/cut_to.h"
#include "base/dtype.h"
#include "base/error.h"
#include "base/symmetric_eigen.h"
#include "base/topk.h"
#include "format/state_io.h"
#include "selectors/prompt_scores.h"
#include "selectors/selection_request.h"
#include "selectors/selector.h"

namespace pq {

namespace {

// The authors' int(head_dim * partial_weight_ratio): a Python float
// product truncated. The ratio is taken as its shortest decimal (what the
// caller wrote: 0.7, not the float just below it, whose product with 10
// would truncate to 6 where Python's gives 7). At least one column.
int32_t partial_columns(const pq_config& c) {
  char text[32];  // the shortest decimal that reads back as the float (to_chars)
  const char* end = std::to_chars(text, text + sizeof text, c.infinigen_partial_ratio).ptr;
  double ratio = 0.0;
  std::from_chars(text, end, ratio);
  const double r = std::trunc(ratio * c.head_dim);
  return static_cast<int32_t>(std::clamp<double>(r, 1.0, c.head_dim));
}

struct InfiniGenState final : CopyableState<InfiniGenState> {
  InfiniGenState(int32_t layer, int32_t kv_heads, int32_t dim, int32_t r)
      : layer(layer), dim(dim), r(r), skew(static_cast<size_t>(kv_heads)),
        columns(static_cast<size_t>(kv_heads)), partial(static_cast<size_t>(kv_heads)) {}
  int32_t layer, dim, r;
  bool ready = false;                            // pq_prefill_queries seen
  std::vector<std::vector<float>> skew;          // [kv_head][dim][r]: A's kept columns
  std::vector<std::vector<int32_t>> columns;     // [kv_head][r]: which columns of A
  std::vector<std::vector<float>> partial;       // [kv_head][token][r]: partial keys

  int64_t tokens(size_t h) const { return static_cast<int64_t>(partial[h].size() / r); }

  // The partial keys of tokens [tokens(h), n) of every head.
  void extend(const KvTier& store, int64_t n) {
    // A run of keys per read (one read per run from a tier that reads files).
    constexpr int64_t kRun = 256;
    std::vector<float> keys;
    for (size_t h = 0; h < partial.size(); ++h) {
      const int64_t from = tokens(h);
      if (from >= n) continue;
      partial[h].resize(static_cast<size_t>(n) * r);
      keys.resize(static_cast<size_t>(std::min(kRun, n - from)) * dim);
      for (int64_t run = from; run < n; run += kRun) {
        const int64_t count = std::min(kRun, n - run);
        store.keys_as_float(static_cast<int32_t>(h), run, count, keys.data());
        for (int64_t t = run; t < run + count; ++t)
          project(h, keys.data() + (t - run) * dim, partial[h].data() + static_cast<size_t>(t) * r);
      }
    }
  }
  // out[j] = (x A)[columns[j]].
  void project(size_t h, const float* x, float* out) const {
    const float* a = skew[h].data();
    for (int32_t j = 0; j < r; ++j) out[j] = 0.f;
    for (int32_t i = 0; i < dim; ++i) {
      const float xi = x[i];
      const float* row = a + static_cast<size_t>(i) * r;
      for (int32_t j = 0; j < r; ++j) out[j] += xi * row[j];
    }
  }

  void truncate(int64_t n) override {
    for (size_t h = 0; h < partial.size(); ++h)
      if (tokens(h) > n) cut_to(partial[h], static_cast<size_t>(n) * r);
  }
  void save(ByteWriter& out) const override {
    out.put<uint8_t>(ready ? 1 : 0);
    out.put<int32_t>(r);
    for (size_t h = 0; ready && h < skew.size(); ++h) {
      out.put_vector(skew[h]);
      out.put_vector(columns[h]);
    }
  }
  void load(ByteReader& in, int64_t, const pq_config& c) override {
    const uint8_t flag = in.get<uint8_t>("infinigen: ready");
    if (flag > 1) in.corrupt("infinigen: the ready flag is " + std::to_string(flag));
    const int32_t saved_r = in.get<int32_t>("infinigen: partial columns");
    if (saved_r != r)
      in.corrupt("infinigen keeps " + std::to_string(saved_r) + " partial columns; this " +
                 "context's infinigen_partial_ratio gives " + std::to_string(r));
    ready = flag == 1;
    for (size_t h = 0; ready && h < skew.size(); ++h) {
      skew[h] = in.get_vector<float>("infinigen: skew", static_cast<uint64_t>(dim) * r);
      columns[h] = in.get_vector<int32_t>("infinigen: columns", static_cast<uint64_t>(r));
      if (skew[h].size() != static_cast<size_t>(dim) * r || columns[h].size() != size_t(r))
        in.corrupt("infinigen: kv head " + std::to_string(h) + " has a skew of " +
                   std::to_string(skew[h].size()) + " values and " +
                   std::to_string(columns[h].size()) + " columns; expected " +
                   std::to_string(dim * r) + " and " + std::to_string(r));
      for (float v : skew[h])
        if (!std::isfinite(v)) in.corrupt("infinigen: a skew value is not finite");
      for (int32_t col : columns[h])
        if (col < 0 || col >= c.head_dim)
          in.corrupt("infinigen: a column is " + std::to_string(col) + "; head_dim is " +
                     std::to_string(c.head_dim));
    }
    for (auto& p : partial) p.clear();  // recomputed from the keys (update_state)
  }
};

class InfiniGenSelector final : public Selector {
 public:
  const char* name() const override { return "infinigen"; }
  bool selects_without_changing_state() const override { return true; }

  std::unique_ptr<SelectorState> make_state(const pq_config& c, int32_t layer) const override {
    return std::make_unique<InfiniGenState>(layer, c.num_kv_heads, c.head_dim,
                                            partial_columns(c));
  }
  StateCost state_cost(const pq_config& c) const override {
    const uint64_t r = static_cast<uint64_t>(partial_columns(c));
    return {sizeof(InfiniGenState) +
                c.num_kv_heads * r * (static_cast<uint64_t>(c.head_dim) * 4 + 4),
            per_token_cost(c, r * sizeof(float))};
  }

  void observe_queries(SelectorState* state, const KvTier& store, const float* queries,
                       int64_t w, const pq_config& c) const override {
    InfiniGenState& s = state_of<InfiniGenState>(state, name());
    check_window(w, store.tokens());
    const int32_t d = c.head_dim, group = c.num_q_heads / c.num_kv_heads, r = s.r;
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      // Q^T Q over the group's window rows, in double.
      std::vector<double> gram(static_cast<size_t>(d) * d, 0.0);
      for (int64_t i = 0; i < w; ++i)
        for (int32_t g = 0; g < group; ++g) {
          const float* q = queries + (static_cast<size_t>(i) * c.num_q_heads + h * group + g) * d;
          for (int32_t a = 0; a < d; ++a)
            for (int32_t b = a; b < d; ++b) gram[a * d + b] += double{q[a]} * q[b];
        }
      for (int32_t a = 0; a < d; ++a)
        for (int32_t b = 0; b < a; ++b) gram[a * d + b] = gram[b * d + a];
      const SymmetricEigen e = symmetric_eigen(std::move(gram), d);
      // Column magnitude of Q A: sum over rows of |q . v_j|.
      std::vector<double> magnitude(static_cast<size_t>(d), 0.0);
      for (int64_t i = 0; i < w; ++i)
        for (int32_t g = 0; g < group; ++g) {
          const float* q = queries + (static_cast<size_t>(i) * c.num_q_heads + h * group + g) * d;
          for (int32_t j = 0; j < d; ++j) {
            double x = 0.0;
            for (int32_t a = 0; a < d; ++a) x += double{q[a]} * e.vectors[a * d + j];
            magnitude[j] += std::fabs(x);
          }
        }
      std::vector<int32_t> order(static_cast<size_t>(d));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return magnitude[a] > magnitude[b]; });
      order.resize(static_cast<size_t>(r));
      std::vector<float> kept(static_cast<size_t>(d) * r);
      for (int32_t a = 0; a < d; ++a)
        for (int32_t j = 0; j < r; ++j)
          kept[static_cast<size_t>(a) * r + j] = static_cast<float>(e.vectors[a * d + order[j]]);
      s.skew[h].swap(kept);
      s.columns[h].swap(order);
      s.partial[h].clear();  // every stored key again, with the new skew
    }
    s.ready = true;
    s.extend(store, store.tokens());
  }

  void update_state(SelectorState* state, const KvTier& store, int64_t n, int64_t, int64_t,
                    const pq_config& c) const override {
    InfiniGenState& s = state_of<InfiniGenState>(state, name());
    if (!s.ready) fail_needs_prefill_queries(name(), s.layer);
    s.extend(store, n);
  }

  uint64_t select_layer(const LayerSelection& r, int32_t* out) const override {
    const InfiniGenState& s = state_of<InfiniGenState>(r.state, name());
    if (!s.ready) fail_needs_prefill_queries(name(), r.context.layer);
    const int64_t heads = r.context.kv_heads(), m = r.middle.size(), begin = r.middle.begin;
    const int32_t group = r.context.group_size(), d = r.context.head_dim(), cols = s.r;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const float alpha = r.context.config.infinigen_alpha;
    if (m == 0 || r.k_mean == 0) {
      std::fill(r.head_counts, r.head_counts + heads, 0);
      return 0;
    }
    // Per kv head: the group-mean partial scores (row h of one heads x m
    // buffer from the pool: at long contexts a buffer per select would cost
    // page faults every step), then how many are within alpha of the best.
    ScratchLease rows_lease(r.scratch);
    std::vector<float>& scores = (*rows_lease).raw;
    scores.resize(static_cast<size_t>(heads * m));
    std::vector<int64_t> within(static_cast<size_t>(heads), 0);
    r.for_each_head([&](int64_t h) {
      float* sc = scores.data() + h * m;
      ScratchLease lease(r.scratch);
      std::vector<float>& pq = (*lease).combined;  // the group's projected queries
      pq.resize(static_cast<size_t>(group) * cols);
      for (int32_t g = 0; g < group; ++g)
        s.project(static_cast<size_t>(h), r.queries + (h * group + g) * d, pq.data() + g * cols);
      const float* keys = s.partial[static_cast<size_t>(h)].data();
      const float weight = scale / static_cast<float>(group);
      for (int64_t i = 0; i < m; ++i) {
        const float* k = keys + static_cast<size_t>(begin + i) * cols;
        float sum = 0.f;
        for (int32_t g = 0; g < group; ++g) {
          const float* q = pq.data() + g * cols;
          float dotp = 0.f;
          for (int32_t j = 0; j < cols; ++j) dotp += q[j] * k[j];
          sum += dotp;
        }
        sc[i] = sum * weight;
      }
      const float best = *std::max_element(sc, sc + m);
      int64_t count = 0;
      for (int64_t i = 0; i < m; ++i) count += sc[i] > best - alpha;
      within[static_cast<size_t>(h)] = count;
    });
    const int64_t mean = std::accumulate(within.begin(), within.end(), int64_t{0}) / heads;
    const int64_t n = std::min({mean, r.k_mean, r.k});
    std::fill(r.head_counts, r.head_counts + heads, static_cast<int32_t>(n));
    r.for_each_head([&](int64_t h) {
      ScratchLease lease(r.scratch);
      select_top_k(scores.data() + h * m, m, n, begin, out + h * r.k, *lease);
    });
    return static_cast<uint64_t>(heads) * m * cols * sizeof(float);
  }
};

}  // namespace

std::unique_ptr<Selector> make_infinigen_selector() {
  return std::make_unique<InfiniGenSelector>();
}

}  // namespace pq
