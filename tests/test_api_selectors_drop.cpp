// The selectors of the literature that score tokens from attention rather
// than from the current query: H2O, SCOPE, SnapKV, PyramidKV and Scissorhands. Public API
// only; the expectations (softmax over the observation window, pooling,
// accumulated mass, budget schedules) are recomputed here.
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include "api_test_util.h"

namespace {

using pqt::Ctx;
using pqt::Sel;

constexpr uint64_t kSeq = 7;

pq_config base_config(int32_t selector, int32_t layers, int32_t q_heads, int32_t kv_heads,
                      int32_t head_dim = 16) {
  pq_config c = pqt::make_config(layers, q_heads, kv_heads, head_dim, PQ_DTYPE_F32);
  c.selector = selector;
  c.sink_tokens = 4;
  c.local_tokens = 16;
  c.topk_tokens = 24;
  c.worker_threads = 2;
  return c;
}

// keys [tokens][kv_heads][head_dim]; values are the keys (not read here).
pq_status prefill(pq_context* ctx, int32_t layer, const pq_config& c, const std::vector<float>& keys,
                  int64_t first, int64_t count) {
  const float* src = keys.data() + static_cast<size_t>(first) * c.num_kv_heads * c.head_dim;
  pqt::HostTensor k = pqt::make_tensor(src, count, c.num_kv_heads, c.head_dim, c.dtype);
  pqt::HostTensor v = pqt::make_tensor(src, count, c.num_kv_heads, c.head_dim, c.dtype);
  return pq_prefill_layer(ctx, kSeq, layer, k.get(), v.get());
}

pq_status append(pq_context* ctx, int32_t layer, const pq_config& c, const std::vector<float>& keys,
                 int64_t token) {
  const float* src = keys.data() + static_cast<size_t>(token) * c.num_kv_heads * c.head_dim;
  pqt::HostTensor k = pqt::make_tensor(src, 1, c.num_kv_heads, c.head_dim, c.dtype);
  pqt::HostTensor v = pqt::make_tensor(src, 1, c.num_kv_heads, c.head_dim, c.dtype);
  return pq_decode_append(ctx, kSeq, layer, k.get(), v.get());
}

// queries [tokens][q_heads][head_dim]
pq_status prefill_queries(pq_context* ctx, int32_t layer, const pq_config& c,
                          const std::vector<float>& queries, int64_t tokens) {
  pqt::HostTensor q = pqt::make_tensor(queries, tokens, c.num_q_heads, c.head_dim, c.dtype);
  return pq_prefill_queries(ctx, kSeq, layer, q.get());
}

// A decode select with a random query (these selectors ignore it).
pq_status select(pq_context* ctx, int32_t layer, const pq_config& c, Sel* out, uint64_t seed = 1) {
  std::vector<float> q = pqt::random_normal(static_cast<size_t>(c.num_q_heads) * c.head_dim, seed);
  pqt::HostTensor qt = pqt::make_tensor(q, 1, c.num_q_heads, c.head_dim, c.dtype);
  return pq_decode_select(ctx, kSeq, layer, qt.get(), out->get());
}

Sel new_sel(pq_context* ctx, int32_t layer, const pq_config& c) {
  return Sel(c.num_kv_heads, pqt::selection_capacity(ctx, kSeq, layer));
}

struct Bounds {
  int64_t sink_end, local_begin;
};
Bounds bounds(int64_t n, const pq_config& c) {
  Bounds b;
  b.sink_end = std::min<int64_t>(c.sink_tokens, n);
  b.local_begin = std::max<int64_t>(b.sink_end, n - c.local_tokens);
  return b;
}

std::vector<int32_t> middle_of(const std::vector<int32_t>& row, Bounds b) {
  std::vector<int32_t> out;
  for (int32_t p : row)
    if (p >= b.sink_end && p < b.local_begin) out.push_back(p);
  return out;
}

// Sinks and locals present, ascending, count == capacity, k middle tokens.
void expect_bookkeeping(const Sel& s, int64_t n, const pq_config& c, int64_t k, int64_t capacity) {
  Bounds b = bounds(n, c);
  EXPECT_EQ(capacity, b.sink_end + k + (n - b.local_begin));
  for (int32_t h = 0; h < c.num_kv_heads; ++h) {
    SCOPED_TRACE("kv head " + std::to_string(h));
    std::vector<int32_t> row = s.row(h);
    ASSERT_EQ(static_cast<int64_t>(row.size()), capacity);
    for (size_t i = 1; i < row.size(); ++i) ASSERT_LT(row[i - 1], row[i]) << "not ascending at " << i;
    for (int64_t p = 0; p < b.sink_end; ++p) EXPECT_EQ(row[static_cast<size_t>(p)], p) << "sink";
    for (int64_t i = 0; i < n - b.local_begin; ++i)
      EXPECT_EQ(row[row.size() - 1 - static_cast<size_t>(i)], n - 1 - i) << "local";
    EXPECT_EQ(static_cast<int64_t>(middle_of(row, b).size()), k);
    EXPECT_GE(row.front(), 0);
    EXPECT_LT(row.back(), n);
  }
}

// PyramidKV's documented schedule (pyramidkv_selector.cpp), before rounding.
double pyramid_budget(double k, int32_t layer, int32_t layers, double rho) {
  if (layers <= 1) return k;
  return 2.0 * k / (1.0 + rho) * (1.0 - (1.0 - rho) * layer / (layers - 1));
}

// SnapKV's prompt score per token [0, P) for kv head h, computed in double:
// softmax per window query and query head (causal), summed, pooled within
// its span: the tokens before the window among themselves (as the official
// code and kvpress, which pool attn_weights[..., :-window] only), the
// window's among themselves.
std::vector<double> snapkv_reference(const std::vector<float>& keys, int64_t P,
                                     const std::vector<float>& queries, int64_t q_tokens,
                                     const pq_config& c, int32_t h) {
  const int64_t w = std::min<int64_t>(q_tokens, c.observation_window);
  const int32_t G = c.num_q_heads / c.num_kv_heads, d = c.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> raw(static_cast<size_t>(P), 0.0);
  for (int64_t i = 0; i < w; ++i) {
    const int64_t qt = q_tokens - w + i;  // row of the queries tensor
    const int64_t lim = P - w + i;        // its prompt position: sees [0, lim]
    for (int32_t g = 0; g < G; ++g) {
      const float* q = queries.data() + (static_cast<size_t>(qt) * c.num_q_heads + h * G + g) * d;
      std::vector<double> l(static_cast<size_t>(lim + 1));
      for (int64_t t = 0; t <= lim; ++t) {
        const float* k = keys.data() + (static_cast<size_t>(t) * c.num_kv_heads + h) * d;
        double dot = 0;
        for (int32_t e = 0; e < d; ++e) dot += static_cast<double>(q[e]) * k[e];
        l[static_cast<size_t>(t)] = dot * scale;
      }
      double mx = *std::max_element(l.begin(), l.end()), sum = 0;
      for (double v : l) sum += std::exp(v - mx);
      for (int64_t t = 0; t <= lim; ++t) raw[static_cast<size_t>(t)] += std::exp(l[static_cast<size_t>(t)] - mx) / sum;
    }
  }
  std::vector<double> pooled(static_cast<size_t>(P));
  const int64_t half = c.pooling_kernel / 2;
  for (int64_t t = 0; t < P; ++t) {
    const int64_t span_begin = t < P - w ? 0 : P - w, span_end = t < P - w ? P - w : P;
    double m = raw[static_cast<size_t>(t)], sum = 0.0;
    for (int64_t u = std::max(span_begin, t - half); u <= std::min(span_end - 1, t + half); ++u) {
      m = std::max(m, raw[static_cast<size_t>(u)]);
      sum += raw[static_cast<size_t>(u)];
    }
    // avg_pool1d with zero padding: the sum over the kernel / the kernel.
    pooled[static_cast<size_t>(t)] = c.pooling == PQ_POOLING_AVG ? sum / c.pooling_kernel : m;
  }
  return pooled;
}

std::vector<double> slice(const std::vector<double>& v, int64_t begin, int64_t end) {
  return std::vector<double>(v.begin() + begin, v.begin() + end);
}

// The data must not put two different scores within float rounding of each
// other at the top-k boundary (equal scores are fine: pooling copies one
// value, and both sides break the tie by position).
::testing::AssertionResult no_near_tie_at_boundary(const std::vector<double>& s, int64_t k) {
  if (k <= 0 || k >= static_cast<int64_t>(s.size())) return ::testing::AssertionSuccess();
  std::vector<double> sorted = s;
  std::sort(sorted.begin(), sorted.end(), std::greater<double>());
  for (double b : {sorted[static_cast<size_t>(k - 1)], sorted[static_cast<size_t>(k)]})
    for (double u : s)
      if (u != b && std::fabs(u - b) <= 1e-5 * std::fabs(b))
        return ::testing::AssertionFailure() << "near tie at the boundary: " << u << " vs " << b;
  return ::testing::AssertionSuccess();
}

// Test data: prompt keys (stddev 1) and queries (stddev 2: peaked softmax).
struct Data {
  std::vector<float> keys;     // [tokens][kv][d]
  std::vector<float> queries;  // [q_tokens][q_heads][d]
};
Data make_data(const pq_config& c, int64_t tokens, int64_t q_tokens, uint64_t seed) {
  Data d;
  d.keys = pqt::random_normal(static_cast<size_t>(tokens) * c.num_kv_heads * c.head_dim, seed);
  d.queries = pqt::random_normal(static_cast<size_t>(q_tokens) * c.num_q_heads * c.head_dim,
                                 seed + 1000, 2.0f);
  return d;
}

// Observes probs over a whole selection (as a caller would after attention).
pq_status observe(pq_context* ctx, int32_t layer, Sel& s, const std::vector<float>& probs) {
  return pq_observe_attention(ctx, kSeq, layer, s.get(), probs.data());
}

// A hand-made selection of the given positions for every kv head.
Sel manual_sel(int32_t kv_heads, const std::vector<int32_t>& positions) {
  Sel s(kv_heads, static_cast<int64_t>(positions.size()));
  for (int32_t h = 0; h < kv_heads; ++h) {
    s.counts[static_cast<size_t>(h)] = static_cast<int32_t>(positions.size());
    for (size_t i = 0; i < positions.size(); ++i)
      s.positions[static_cast<size_t>(h) * positions.size() + i] = positions[i];
  }
  return s;
}

// ---------------------------------------------------------------------------
// Bookkeeping: every selector, several layers and steps
// ---------------------------------------------------------------------------

std::vector<std::vector<int32_t>> run_decode_loop(int32_t selector, bool check) {
  pq_config c = base_config(selector, 3, 4, 2);
  c.pyramid_ratio = 0.5f;
  const int64_t P = 150, steps = 24;
  Data d = make_data(c, P + steps, 40, 11);
  Ctx ctx(c);
  EXPECT_TRUE(ctx.ok());
  std::vector<std::vector<int32_t>> history;
  if (!ctx.ok()) return history;
  EXPECT_TRUE(pqt::IsOk(pq_sequence_add(ctx, kSeq)));
  for (int32_t l = 0; l < c.num_layers; ++l) {
    EXPECT_TRUE(pqt::IsOk(prefill(ctx, l, c, d.keys, 0, P)));
    EXPECT_TRUE(pqt::IsOk(prefill_queries(ctx, l, c, d.queries, 40)));
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> unif(0.f, 1.f);
  for (int64_t s = 0; s <= steps; ++s) {
    const int64_t n = P + s;
    for (int32_t l = 0; l < c.num_layers; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l) + " step " + std::to_string(s));
      if (s > 0) EXPECT_TRUE(pqt::IsOk(append(ctx, l, c, d.keys, n - 1)));
      int64_t cap = pqt::selection_capacity(ctx, kSeq, l);
      Sel sel(c.num_kv_heads, cap);
      pq_status st = select(ctx, l, c, &sel, static_cast<uint64_t>(s));
      EXPECT_TRUE(pqt::IsOk(st));
      if (st != PQ_OK) continue;
      if (check) {
        Bounds b = bounds(n, c);
        int64_t k = std::min<int64_t>(c.topk_tokens, b.local_begin - b.sink_end);
        if (selector == PQ_SELECTOR_PYRAMIDKV)
          k = std::min<int64_t>(b.local_begin - b.sink_end,
                                std::llround(pyramid_budget(static_cast<double>(k), l,
                                                            c.num_layers, c.pyramid_ratio)));
        expect_bookkeeping(sel, n, c, k, cap);
        EXPECT_EQ(pqt::layer_info(ctx, kSeq, l).last_select_bytes, 0u);
      }
      for (int32_t h = 0; h < c.num_kv_heads; ++h) history.push_back(sel.row(h));
      std::vector<float> probs(static_cast<size_t>(c.num_kv_heads * cap));
      for (float& p : probs) p = unif(rng);
      EXPECT_TRUE(pqt::IsOk(observe(ctx, l, sel, probs)));
    }
  }
  return history;
}

TEST(SelectorsDrop, BookkeepingAndDeterminism) {
  for (int32_t selector :
       {PQ_SELECTOR_H2O, PQ_SELECTOR_SCOPE, PQ_SELECTOR_SNAPKV, PQ_SELECTOR_PYRAMIDKV,
        PQ_SELECTOR_SCISSORHANDS, PQ_SELECTOR_KEYFORMER}) {
    SCOPED_TRACE("selector " + std::to_string(selector));
    auto first = run_decode_loop(selector, true);
    auto second = run_decode_loop(selector, false);
    EXPECT_FALSE(first.empty());
    EXPECT_EQ(first, second) << "same inputs, different selections";
  }
}

// Every selector through a decode far past its budget and window (more
// generated tokens than k, than the window and than a ClusterKV window),
// several kv heads, each step observed: every row stays a valid selection
// within the capacity the library reported. A selector whose rule breaks
// only once generated tokens outnumber k (AdaKV did: the fuzzer's
// adakv-generated-over-head-capacity) fails here, and under ASan in CI.
TEST(SelectorsDrop, LongDecodeKeepsEveryRowValid) {
  for (int32_t selector = 0; selector < PQ_SELECTOR_COUNT; ++selector) {  // every one
    SCOPED_TRACE("selector " + std::to_string(selector));
    pq_config c = base_config(selector, 1, 4, 2);
    c.topk_tokens = 12;
    c.cluster_count = 16;
    const int64_t P = 120, steps = 360;
    Data d = make_data(c, P + steps, 24, 41);
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    PQ_ASSERT_OK(prefill(ctx, 0, c, d.keys, 0, P));
    PQ_ASSERT_OK(prefill_queries(ctx, 0, c, d.queries, 24));
    PQ_ASSERT_OK(pq_wait_builds(ctx));
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> unif(0.f, 1.f);
    for (int64_t n = P; n <= P + steps; ++n) {
      if (n > P) PQ_ASSERT_OK(append(ctx, 0, c, d.keys, n - 1));
      const int64_t cap = pqt::selection_capacity(ctx, kSeq, 0);
      Sel sel(c.num_kv_heads, cap);
      PQ_ASSERT_OK(select(ctx, 0, c, &sel, static_cast<uint64_t>(n)));
      const Bounds b = bounds(n, c);
      const int64_t fixed = b.sink_end + (n - b.local_begin);
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        const std::vector<int32_t> row = sel.row(h);
        ASSERT_GE(static_cast<int64_t>(row.size()), fixed) << "n " << n << " head " << h;
        ASSERT_LE(static_cast<int64_t>(row.size()), cap) << "n " << n << " head " << h;
        for (size_t i = 1; i < row.size(); ++i)
          ASSERT_LT(row[i - 1], row[i]) << "n " << n << " head " << h << " at " << i;
        ASSERT_GE(row.front(), 0);
        ASSERT_EQ(row.back(), n - 1);
        ASSERT_EQ(row[static_cast<size_t>(b.sink_end) - 1], b.sink_end - 1);
      }
      std::vector<float> probs(static_cast<size_t>(c.num_kv_heads * cap));
      for (float& p : probs) p = unif(rng);
      PQ_ASSERT_OK(observe(ctx, 0, sel, probs));
    }
  }
}

// ---------------------------------------------------------------------------
// SnapKV
// ---------------------------------------------------------------------------

TEST(SnapKv, MatchesWindowSoftmaxSumAndMaxPool) {
  for (int32_t kernel : {1, 7}) {
    for (int32_t group : {1, 3}) {
      SCOPED_TRACE("pooling_kernel " + std::to_string(kernel) + " group " + std::to_string(group));
      pq_config c = base_config(PQ_SELECTOR_SNAPKV, 1, 2 * group, 2);
      c.pooling_kernel = kernel;
      c.observation_window = 32;
      c.topk_tokens = 40;
      const int64_t P = 300, q_tokens = 40;  // more queries than the window: the last 32 count
      Data d = make_data(c, P, q_tokens, 100 + kernel * 10 + group);
      Ctx ctx(c);
      ASSERT_TRUE(ctx.ok());
      PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
      PQ_ASSERT_OK(prefill(ctx, 0, c, d.keys, 0, P));
      PQ_ASSERT_OK(prefill_queries(ctx, 0, c, d.queries, q_tokens));
      Sel sel = new_sel(ctx, 0, c);
      PQ_ASSERT_OK(select(ctx, 0, c, &sel));
      Bounds b = bounds(P, c);
      expect_bookkeeping(sel, P, c, c.topk_tokens, sel.capacity);
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        SCOPED_TRACE("kv head " + std::to_string(h));
        std::vector<double> mid =
            slice(snapkv_reference(d.keys, P, d.queries, q_tokens, c, h), b.sink_end, b.local_begin);
        ASSERT_TRUE(no_near_tie_at_boundary(mid, c.topk_tokens));
        EXPECT_EQ(middle_of(sel.row(h), b), pqt::topk_positions(mid, b.sink_end, c.topk_tokens));
      }
      // Pooling must matter: kernel 7 and 1 choose differently on this data.
      if (kernel == 7) {
        pq_config c1 = c;
        c1.pooling_kernel = 1;
        std::vector<double> mid1 =
            slice(snapkv_reference(d.keys, P, d.queries, q_tokens, c1, 0), b.sink_end, b.local_begin);
        EXPECT_NE(middle_of(sel.row(0), b), pqt::topk_positions(mid1, b.sink_end, c.topk_tokens));
      }
    }
  }
}

// PQ_POOLING_AVG, the official SnapKV code's pooling (kernel 5): the mean
// over the kernel with the zero padding counted; it chooses otherwise than
// max pooling on this data.
TEST(SnapKv, AveragePoolingMatchesAvgPool1d) {
  {  // PyramidKV and SCOPE score the prompt through the same code
    pq_config c = base_config(PQ_SELECTOR_SNAPKV, 1, 4, 2);
    c.pooling = PQ_POOLING_AVG;
    c.pooling_kernel = 5;
    c.observation_window = 32;
    c.topk_tokens = 40;
    const int64_t P = 300, q_tokens = 32;
    Data d = make_data(c, P, q_tokens, 77);
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok());
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    PQ_ASSERT_OK(prefill(ctx, 0, c, d.keys, 0, P));
    PQ_ASSERT_OK(prefill_queries(ctx, 0, c, d.queries, q_tokens));
    Sel sel = new_sel(ctx, 0, c);
    PQ_ASSERT_OK(select(ctx, 0, c, &sel));
    Bounds b = bounds(P, c);
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      SCOPED_TRACE("kv head " + std::to_string(h));
      std::vector<double> mid =
          slice(snapkv_reference(d.keys, P, d.queries, q_tokens, c, h), b.sink_end, b.local_begin);
      ASSERT_TRUE(no_near_tie_at_boundary(mid, c.topk_tokens));
      EXPECT_EQ(middle_of(sel.row(h), b), pqt::topk_positions(mid, b.sink_end, c.topk_tokens));
      pq_config max_pool = c;
      max_pool.pooling = PQ_POOLING_MAX;
      std::vector<double> mid_max = slice(snapkv_reference(d.keys, P, d.queries, q_tokens, max_pool, h),
                                          b.sink_end, b.local_begin);
      EXPECT_NE(middle_of(sel.row(h), b), pqt::topk_positions(mid_max, b.sink_end, c.topk_tokens));
    }
  }
}

TEST(SnapKv, GeneratedTokensAreAlwaysKept) {
  pq_config c = base_config(PQ_SELECTOR_SNAPKV, 1, 2, 1);
  c.local_tokens = 8;
  c.topk_tokens = 10;
  const int64_t P = 120, steps = 30;
  Data d = make_data(c, P + steps, 32, 3);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  PQ_ASSERT_OK(prefill(ctx, 0, c, d.keys, 0, P));
  PQ_ASSERT_OK(prefill_queries(ctx, 0, c, d.queries, 32));
  Sel first = new_sel(ctx, 0, c);
  PQ_ASSERT_OK(select(ctx, 0, c, &first));
  std::vector<int32_t> prompt_choice = middle_of(first.row(0), bounds(P, c));
  for (int64_t s = 1; s <= steps; ++s) {
    const int64_t n = P + s;
    PQ_ASSERT_OK(append(ctx, 0, c, d.keys, n - 1));
    Sel sel = new_sel(ctx, 0, c);
    PQ_ASSERT_OK(select(ctx, 0, c, &sel));
    Bounds b = bounds(n, c);
    std::vector<int32_t> mid = middle_of(sel.row(0), b);
    ASSERT_EQ(static_cast<int64_t>(mid.size()), c.topk_tokens);
    // Generated middle tokens: [P, local_begin). All kept, the most recent
    // first once they alone exceed k; the prompt fills the rest by score.
    const int64_t gen = std::max<int64_t>(0, b.local_begin - P);
    const int64_t kept_gen = std::min<int64_t>(gen, c.topk_tokens);
    std::vector<int32_t> expect_gen;
    for (int64_t p = b.local_begin - kept_gen; p < b.local_begin; ++p)
      expect_gen.push_back(static_cast<int32_t>(p));
    std::vector<int32_t> got_gen(mid.end() - kept_gen, mid.end());
    EXPECT_EQ(got_gen, expect_gen) << "step " << s;
    // The prompt part is the static top-(k - kept_gen): a prefix of the
    // initial choice by score, so a subset of it.
    for (auto it = mid.begin(); it != mid.end() - kept_gen; ++it)
      EXPECT_TRUE(std::binary_search(prompt_choice.begin(), prompt_choice.end(), *it))
          << "prompt token " << *it << " at step " << s;
  }
}

TEST(SnapKv, SelectWithoutPrefillQueriesIsBadState) {
  for (int32_t selector : {PQ_SELECTOR_SNAPKV, PQ_SELECTOR_PYRAMIDKV, PQ_SELECTOR_SCOPE}) {
    SCOPED_TRACE("selector " + std::to_string(selector));
    pq_config c = base_config(selector, 2, 2, 2);
    Data d = make_data(c, 100, 8, 4);
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok());
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    // Before any prefill, pq_prefill_queries itself is BAD_STATE.
    PQ_EXPECT_ERR(prefill_queries(ctx, 0, c, d.queries, 8), PQ_ERR_BAD_STATE, "pq_prefill_layer");
    PQ_ASSERT_OK(prefill(ctx, 0, c, d.keys, 0, 100));
    PQ_ASSERT_OK(prefill(ctx, 1, c, d.keys, 0, 100));
    Sel sel = new_sel(ctx, 0, c);
    PQ_EXPECT_ERR(select(ctx, 0, c, &sel), PQ_ERR_BAD_STATE, "pq_prefill_queries");
    for (int32_t v : sel.positions) EXPECT_EQ(v, -1) << "output written on failure";
    for (int32_t v : sel.counts) EXPECT_EQ(v, -1) << "output written on failure";
    // The queries of layer 1 do not serve layer 0.
    PQ_ASSERT_OK(prefill_queries(ctx, 1, c, d.queries, 8));
    PQ_EXPECT_ERR(select(ctx, 0, c, &sel), PQ_ERR_BAD_STATE, "pq_prefill_queries");
    PQ_EXPECT_OK(select(ctx, 1, c, &sel));
    // More window queries than stored tokens cannot be prompt queries.
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq + 1));
    pqt::HostTensor k5 = pqt::make_tensor(d.keys, 5, c.num_kv_heads, c.head_dim, c.dtype);
    PQ_ASSERT_OK(pq_prefill_layer(ctx, kSeq + 1, 0, k5.get(), k5.get()));
    pqt::HostTensor q8 = pqt::make_tensor(d.queries, 8, c.num_q_heads, c.head_dim, c.dtype);
    PQ_EXPECT_ERR(pq_prefill_queries(ctx, kSeq + 1, 0, q8.get()), PQ_ERR_INVALID_ARGUMENT,
                  "queries");
  }
}

// ---------------------------------------------------------------------------
// PyramidKV
// ---------------------------------------------------------------------------

TEST(PyramidKv, BudgetsFollowLinearScheduleWithSnapKvMean) {
  struct Case {
    int32_t layers;
    float ratio;
    int32_t topk;
    float fraction;
  };
  for (Case cs : {Case{5, 0.25f, 40, 0.f}, Case{8, 0.1f, 30, 0.f}, Case{4, 1.0f, 40, 0.f},
                  Case{6, 0.5f, 0, 0.25f}, Case{1, 0.25f, 40, 0.f}}) {
    SCOPED_TRACE("layers " + std::to_string(cs.layers) + " ratio " + std::to_string(cs.ratio));
    pq_config c = base_config(PQ_SELECTOR_PYRAMIDKV, cs.layers, 2, 1);
    c.pyramid_ratio = cs.ratio;
    c.topk_tokens = cs.topk;
    if (cs.topk == 0) c.topk_fraction = cs.fraction;
    const int64_t P = 420;
    Data d = make_data(c, P, 32, 9);
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok());
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    const pqt::Regions r = pqt::regions(P, c);  // SnapKV's k for this length
    double sum = 0;
    int64_t prev = std::numeric_limits<int64_t>::max(), first = 0, last = 0;
    for (int32_t l = 0; l < cs.layers; ++l) {
      PQ_ASSERT_OK(prefill(ctx, l, c, d.keys, 0, P));
      PQ_ASSERT_OK(prefill_queries(ctx, l, c, d.queries, 32));
      const int64_t kl = pqt::selection_capacity(ctx, kSeq, l) - r.sink_end - (P - r.local_begin);
      const double want = pyramid_budget(static_cast<double>(r.k), l, cs.layers, cs.ratio);
      EXPECT_LE(std::fabs(static_cast<double>(kl) - want), 0.5 + 1e-9) << "layer " << l;
      EXPECT_LE(kl, prev) << "budgets must not grow with the layer";
      prev = kl;
      if (l == 0) first = kl;
      last = kl;
      sum += static_cast<double>(kl);
      Sel sel = new_sel(ctx, l, c);
      PQ_ASSERT_OK(select(ctx, l, c, &sel));
      expect_bookkeeping(sel, P, c, kl, sel.capacity);
    }
    EXPECT_LE(std::fabs(sum / cs.layers - static_cast<double>(r.k)), 0.5) << "mean != SnapKV's k";
    if (cs.layers > 1) EXPECT_NEAR(static_cast<double>(last) / first, cs.ratio, 0.05);
    if (cs.ratio == 1.0f || cs.layers == 1) EXPECT_EQ(first, r.k);
  }
}

TEST(PyramidKv, SelectsSnapKvTopKOfItsBudgetAndClipsToMiddle) {
  pq_config c = base_config(PQ_SELECTOR_PYRAMIDKV, 4, 4, 2);
  c.pyramid_ratio = 0.25f;
  c.topk_tokens = 30;
  const int64_t P = 200;
  Data d = make_data(c, P, 32, 21);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  Bounds b = bounds(P, c);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    PQ_ASSERT_OK(prefill(ctx, l, c, d.keys, 0, P));
    PQ_ASSERT_OK(prefill_queries(ctx, l, c, d.queries, 32));
    Sel sel = new_sel(ctx, l, c);
    PQ_ASSERT_OK(select(ctx, l, c, &sel));
    const int64_t kl = std::llround(pyramid_budget(30, l, 4, 0.25));
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      std::vector<double> mid =
          slice(snapkv_reference(d.keys, P, d.queries, 32, c, h), b.sink_end, b.local_begin);
      ASSERT_TRUE(no_near_tie_at_boundary(mid, kl));
      EXPECT_EQ(middle_of(sel.row(h), b), pqt::topk_positions(mid, b.sink_end, kl))
          << "layer " << l << " head " << h;
    }
  }
  // A budget above the middle is clipped: bottom layer 2k/(1+rho) = 48 > 40.
  pq_config c2 = c;
  c2.topk_tokens = 30;
  Ctx ctx2(c2);
  ASSERT_TRUE(ctx2.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx2, kSeq));
  const int64_t P2 = 60;  // middle = 60 - 4 - 16 = 40
  PQ_ASSERT_OK(prefill(ctx2, 0, c2, d.keys, 0, P2));
  PQ_ASSERT_OK(prefill(ctx2, 3, c2, d.keys, 0, P2));
  EXPECT_EQ(pqt::selection_capacity(ctx2, kSeq, 0), P2);  // all 40 middle tokens
  EXPECT_EQ(pqt::selection_capacity(ctx2, kSeq, 3), 4 + 16 + std::llround(pyramid_budget(30, 3, 4, 0.25)));
}

// ---------------------------------------------------------------------------
// AdaKV
// ---------------------------------------------------------------------------

// kvpress's AdaKVPress over the middle's SnapKV scores: each head's top
// n_safe raised to the float maximum, then the top heads * k of all; ties
// to the later entry (head-major order, as the library's top-k).
std::vector<std::vector<int32_t>> adakv_reference(const std::vector<std::vector<double>>& mid,
                                                  int64_t k, int64_t n_safe, int64_t first) {
  const int64_t H = static_cast<int64_t>(mid.size()), m = static_cast<int64_t>(mid[0].size());
  std::vector<double> all;
  for (int64_t h = 0; h < H; ++h) {
    std::vector<double> row = mid[static_cast<size_t>(h)];
    for (int32_t p : pqt::topk_positions(row, 0, n_safe)) row[static_cast<size_t>(p)] = 1e300;
    all.insert(all.end(), row.begin(), row.end());
  }
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(H));
  for (int32_t e : pqt::topk_positions(all, 0, H * k))
    out[static_cast<size_t>(e / m)].push_back(static_cast<int32_t>(first + e % m));
  return out;
}

TEST(AdaKv, SharesTheLayersBudgetByScoreWithASafeguard) {
  const int64_t P = 200, k = 30;
  pq_config base = base_config(PQ_SELECTOR_ADAKV, 1, 4, 2);
  base.topk_tokens = static_cast<int32_t>(k);
  Data d = make_data(base, P, 32, 23);
  Bounds b = bounds(P, base);
  std::vector<std::vector<double>> mid;
  for (int32_t h = 0; h < 2; ++h)
    mid.push_back(slice(snapkv_reference(d.keys, P, d.queries, 32, base, h), b.sink_end,
                        b.local_begin));
  for (float safeguard : {0.2f, 0.f, 0.7f, 1.f}) {
    SCOPED_TRACE("safeguard " + std::to_string(safeguard));
    pq_config c = base;
    c.adakv_safeguard = safeguard;
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    PQ_ASSERT_OK(prefill(ctx, 0, c, d.keys, 0, P));
    PQ_ASSERT_OK(prefill_queries(ctx, 0, c, d.queries, 32));
    // floor(safeguard * k) of the share as written (0.7f * 30 is a hair under 21)
    const int64_t n_safe = static_cast<int64_t>(std::floor(double{safeguard} * k * (1 + 1e-6)));
    // A head takes at most its safeguard plus all of the rest of the budget.
    EXPECT_EQ(pqt::selection_capacity(ctx, kSeq, 0), 4 + 16 + (2 * k - n_safe));
    Sel sel = new_sel(ctx, 0, c);
    PQ_ASSERT_OK(select(ctx, 0, c, &sel));
    const auto want = adakv_reference(mid, k, n_safe, b.sink_end);
    for (int32_t h = 0; h < 2; ++h) {
      EXPECT_EQ(middle_of(sel.row(h), b), want[static_cast<size_t>(h)]) << "head " << h;
      EXPECT_EQ(sel.counts[static_cast<size_t>(h)],
                4 + 16 + static_cast<int64_t>(want[static_cast<size_t>(h)].size()));
      EXPECT_GE(static_cast<int64_t>(want[static_cast<size_t>(h)].size()), n_safe);
    }
    EXPECT_EQ(want[0].size() + want[1].size(), static_cast<size_t>(2 * k));
    if (safeguard < 1.f)
      EXPECT_NE(want[0].size(), want[1].size()) << "the data gives the heads equal shares";
    else  // every head keeps its own top k: SnapKV
      for (int32_t h = 0; h < 2; ++h)
        EXPECT_EQ(want[static_cast<size_t>(h)], pqt::topk_positions(mid[h], b.sink_end, k));
  }
  for (float bad : {-0.1f, 1.5f, NAN}) {
    pq_config c = base;
    c.adakv_safeguard = bad;
    pq_context* ctx = nullptr;
    EXPECT_TRUE(pqt::IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"adakv_safeguard"}));
  }
}

// Generated tokens have no prompt score and rank first in every head, as in
// SnapKV; a fetch and an attend read each head's own count.
TEST(AdaKv, GeneratedTokensComeFirstAndCountsDifferPerHead) {
  pq_config c = base_config(PQ_SELECTOR_ADAKV, 1, 4, 2);
  c.topk_tokens = 30;
  const int64_t P = 200, steps = 40;
  Data d = make_data(c, P + steps, 32, 29);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  PQ_ASSERT_OK(prefill(ctx, 0, c, d.keys, 0, P));
  PQ_ASSERT_OK(prefill_queries(ctx, 0, c, d.queries, 32));
  for (int64_t n = P + 1; n <= P + steps; ++n) PQ_ASSERT_OK(append(ctx, 0, c, d.keys, n - 1));
  const int64_t n = P + steps;
  Bounds b = bounds(n, c);
  Sel sel = new_sel(ctx, 0, c);
  PQ_ASSERT_OK(select(ctx, 0, c, &sel));
  for (int32_t h = 0; h < 2; ++h) {
    std::vector<int32_t> mid = middle_of(sel.row(h), b);
    for (int64_t p = P; p < b.local_begin; ++p)  // the generated tokens in the middle
      EXPECT_TRUE(std::binary_search(mid.begin(), mid.end(), static_cast<int32_t>(p)))
          << "head " << h << " left out unscored token " << p;
  }
  std::vector<float> k_out(static_cast<size_t>(2 * sel.capacity * c.head_dim)), v_out(k_out.size());
  pq_tensor kt, vt;
  PQ_ASSERT_OK(pq_tensor_init(&kt, k_out.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, sel.capacity,
                              2, c.head_dim));
  PQ_ASSERT_OK(pq_tensor_init(&vt, v_out.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, sel.capacity,
                              2, c.head_dim));
  PQ_ASSERT_OK(pq_fetch_kv(ctx, kSeq, 0, sel.get(), &kt, &vt));
  for (int32_t h = 0; h < 2; ++h) {
    const int32_t last = sel.positions[static_cast<size_t>(h * sel.capacity + sel.counts[h] - 1)];
    EXPECT_EQ(last, n - 1);
    const float* row = k_out.data() + (static_cast<size_t>(h) * sel.capacity + sel.counts[h] - 1) *
                                          c.head_dim;
    EXPECT_EQ(row[0], d.keys[(static_cast<size_t>(n - 1) * 2 + h) * c.head_dim]);
  }
}

// Generated tokens have no score to share the budget by: past k of them,
// every head keeps the latest k (as SnapKV does), and no head takes more
// than its capacity. Before the fix the later head took all of them and
// wrote past its share (the fuzzer's adakv-generated-over-head-capacity).
TEST(AdaKv, GeneratedTokensBeyondKAreTheLatestKOfEveryHead) {
  pq_config c = base_config(PQ_SELECTOR_ADAKV, 1, 4, 4);
  c.topk_tokens = 10;
  const int64_t P = 100, steps = 16 + 40;
  Data d = make_data(c, P + steps, 8, 37);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  PQ_ASSERT_OK(prefill(ctx, 0, c, d.keys, 0, P));
  PQ_ASSERT_OK(prefill_queries(ctx, 0, c, d.queries, 8));
  for (int64_t n = P + 1; n <= P + steps; ++n) {
    PQ_ASSERT_OK(append(ctx, 0, c, d.keys, n - 1));
    Bounds b = bounds(n, c);
    const int64_t generated = std::max<int64_t>(0, b.local_begin - P);
    Sel sel = new_sel(ctx, 0, c);
    PQ_ASSERT_OK(select(ctx, 0, c, &sel));
    for (int32_t h = 0; h < 4; ++h) {
      SCOPED_TRACE("n " + std::to_string(n) + " head " + std::to_string(h));
      std::vector<int32_t> mid = middle_of(sel.row(h), b);
      const int64_t from = b.local_begin - std::min<int64_t>(generated, c.topk_tokens);
      for (int64_t p = from; p < b.local_begin; ++p)
        EXPECT_TRUE(std::binary_search(mid.begin(), mid.end(), static_cast<int32_t>(p)));
      if (generated >= c.topk_tokens)
        EXPECT_EQ(mid.size(), static_cast<size_t>(c.topk_tokens));
    }
  }
}

// ---------------------------------------------------------------------------
// ZigZagKV
// ---------------------------------------------------------------------------

// The PR's MBA of one head: count(cumsum of the descending scores < mass *
// total) + 1, at most the tokens.
int64_t zigzag_mba(std::vector<double> s, double mass) {
  if (s.empty()) return 0;
  std::sort(s.begin(), s.end(), std::greater<double>());
  double total = 0, sum = 0;
  for (double v : s) total += v;
  int64_t below = 0;
  for (double v : s) {
    sum += v;
    if (!(sum < mass * total)) break;
    ++below;
  }
  return std::min<int64_t>(static_cast<int64_t>(s.size()), below + 1);
}

// Layer budgets by the PR's equation 6 from per-layer LMBA: round(floor +
// (k - floor) * L * u_l), clipped to [1, middle].
std::vector<int64_t> zigzag_budgets(const std::vector<double>& lmba, int64_t k, double floor_share,
                                    int64_t middle) {
  double total = 0;
  for (double v : lmba) total += v;
  std::vector<int64_t> out;
  const double L = static_cast<double>(lmba.size()), fl = floor_share * k;
  for (double v : lmba) {
    const double u = total > 0 ? v / total : 1.0 / L;
    out.push_back(std::max<int64_t>(1, std::min<int64_t>(middle, std::llround(fl + (k - fl) * L * u))));
  }
  return out;
}

// Three layers over the same keys, the queries sharp in layer 0 and flat in
// layer 2: the flat layer needs more tokens for 90% of its attention, and
// gets the larger share of the same total.
struct ZigZagCase {
  static constexpr int64_t P = 200, k = 30, w = 32;
  pq_config c = base_config(PQ_SELECTOR_ZIGZAGKV, 3, 4, 2);
  Data d = make_data(c, P, w, 41);
  std::vector<std::vector<float>> queries;  // per layer
  ZigZagCase() {
    c.topk_tokens = static_cast<int32_t>(k);
    c.observation_window = 4;  // few rows, unpooled: the layers' spreads differ
    c.pooling_kernel = 1;
    for (float scale : {4.f, 1.f, 0.1f}) {
      queries.push_back(d.queries);
      for (float& q : queries.back()) q *= scale;
    }
  }
  // The middle's SnapKV scores of layer l, kv head h.
  std::vector<double> mid(int32_t l, int32_t h, const pq_config& cc) const {
    Bounds b = bounds(P, cc);
    return slice(snapkv_reference(d.keys, P, queries[static_cast<size_t>(l)], w, cc, h), b.sink_end,
                 b.local_begin);
  }
  std::vector<int64_t> budgets(const pq_config& cc) const {
    std::vector<double> lmba;
    for (int32_t l = 0; l < cc.num_layers; ++l) {
      double sum = 0;
      for (int32_t h = 0; h < cc.num_kv_heads; ++h) sum += zigzag_mba(mid(l, h, cc), cc.zigzag_mass);
      lmba.push_back(sum / cc.num_kv_heads);
    }
    Bounds b = bounds(P, cc);
    return zigzag_budgets(lmba, k, cc.zigzag_floor, b.local_begin - b.sink_end);
  }
  // Prefills every layer, then its prompt queries in `order`.
  void feed(pq_context* ctx, const pq_config& cc, uint64_t seq, const std::vector<int32_t>& order) const {
    if (seq == kSeq) PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    for (int32_t l = 0; l < cc.num_layers; ++l) PQ_ASSERT_OK(prefill(ctx, l, cc, d.keys, 0, P));
    for (int32_t l : order) PQ_ASSERT_OK(prefill_queries(ctx, l, cc, queries[static_cast<size_t>(l)], w));
  }
};

TEST(ZigZagKv, SharesTheBudgetAcrossLayersByTheirAttentionSpread) {
  ZigZagCase z;
  for (float floor_share : {0.2f, 0.f, 1.f}) {
    for (float mass : {0.9f, 0.5f}) {
      SCOPED_TRACE("floor " + std::to_string(floor_share) + " mass " + std::to_string(mass));
      pq_config c = z.c;
      c.zigzag_floor = floor_share;
      c.zigzag_mass = mass;
      const std::vector<int64_t> want = z.budgets(c);
      Ctx ctx(c);
      ASSERT_TRUE(ctx.ok()) << pq_last_error();
      z.feed(ctx, c, kSeq, {0, 1, 2});
      Bounds b = bounds(ZigZagCase::P, c);
      const int64_t middle = b.local_begin - b.sink_end;
      if (floor_share == 1.f) {
        EXPECT_EQ(want, std::vector<int64_t>(3, ZigZagCase::k)) << "a floor of 1 is SnapKV";
      } else {
        EXPECT_LT(want[0], want[1]);
        EXPECT_LT(want[1], want[2]) << "the flat layer should need the most";
        EXPECT_NEAR(static_cast<double>(want[0] + want[1] + want[2]), 3.0 * ZigZagCase::k, 1.5);
        if (floor_share > 0.f) EXPECT_GE(want[0], std::llround(floor_share * ZigZagCase::k));
      }
      const int64_t cap = std::min<int64_t>(
          middle, std::llround(floor_share * 30 + (30 - floor_share * 30) * 3));
      for (int32_t l = 0; l < 3; ++l) {
        SCOPED_TRACE("layer " + std::to_string(l));
        EXPECT_EQ(pqt::selection_capacity(ctx, kSeq, l), 4 + 16 + cap);
        Sel sel = new_sel(ctx, l, c);
        PQ_ASSERT_OK(select(ctx, l, c, &sel));
        const int64_t kl = want[static_cast<size_t>(l)];
        for (int32_t h = 0; h < 2; ++h) {
          const std::vector<double> mid = z.mid(l, h, c);
          ASSERT_TRUE(no_near_tie_at_boundary(mid, kl));
          EXPECT_EQ(sel.counts[static_cast<size_t>(h)], 4 + 16 + kl);
          EXPECT_EQ(middle_of(sel.row(h), b), pqt::topk_positions(mid, b.sink_end, kl)) << "head " << h;
        }
      }
    }
  }
  for (auto bad : {std::make_pair("zigzag_mass", 0.f), {"zigzag_mass", 1.5f}, {"zigzag_mass", NAN},
                   {"zigzag_floor", -0.1f}, {"zigzag_floor", 1.5f}, {"zigzag_floor", NAN}}) {
    pq_config c = z.c;
    (std::string(bad.first) == "zigzag_mass" ? c.zigzag_mass : c.zigzag_floor) = bad.second;
    pq_context* ctx = nullptr;
    EXPECT_TRUE(pqt::IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {bad.first}));
  }
}

// Every layer's prompt queries decide every layer's budget: a select before
// the last is BAD_STATE naming the missing layers, and the order in which
// layers get theirs changes nothing.
TEST(ZigZagKv, NeedsEveryLayersPromptQueriesInAnyOrder) {
  ZigZagCase z;
  Ctx ctx(z.c);
  ASSERT_TRUE(ctx.ok());
  z.feed(ctx, z.c, kSeq, {2, 0});
  Sel sel = new_sel(ctx, 0, z.c);
  EXPECT_TRUE(pqt::IsError(select(ctx, 0, z.c, &sel), PQ_ERR_BAD_STATE,
                           {"layers 1 have no pq_prefill_queries", "zigzagkv"}));
  PQ_ASSERT_OK(prefill_queries(ctx, 1, z.c, z.queries[1], ZigZagCase::w));
  Ctx in_order(z.c);
  ASSERT_TRUE(in_order.ok());
  z.feed(in_order, z.c, kSeq, {0, 1, 2});
  for (int32_t l = 0; l < 3; ++l) {
    Sel a = new_sel(ctx, l, z.c), b = new_sel(in_order, l, z.c);
    PQ_ASSERT_OK(select(ctx, l, z.c, &a));
    PQ_ASSERT_OK(select(in_order, l, z.c, &b));
    EXPECT_EQ(a.positions, b.positions) << "layer " << l;
    EXPECT_EQ(a.counts, b.counts) << "layer " << l;
  }
}

// The budgets belong to the sequence: a fork taken between two layers'
// prompt queries completes on its own, the parent still waits for its own;
// a truncate into the prompt re-measures the layers from the scores kept.
TEST(ZigZagKv, ForkAndTruncateKeepEachSequencesOwnBudgets) {
  ZigZagCase z;
  Ctx ctx(z.c);
  ASSERT_TRUE(ctx.ok());
  z.feed(ctx, z.c, kSeq, {0, 1});
  const uint64_t child = kSeq + 1;
  PQ_ASSERT_OK(pq_sequence_fork(ctx, kSeq, child));
  {
    pqt::HostTensor q = pqt::make_tensor(z.queries[2], ZigZagCase::w, z.c.num_q_heads, z.c.head_dim,
                                         z.c.dtype);
    PQ_ASSERT_OK(pq_prefill_queries(ctx, child, 2, q.get()));
  }
  Sel parent = new_sel(ctx, 1, z.c);
  EXPECT_TRUE(pqt::IsError(select(ctx, 1, z.c, &parent), PQ_ERR_BAD_STATE, {"layers 2"}));
  Ctx whole(z.c);
  ASSERT_TRUE(whole.ok());
  z.feed(whole, z.c, kSeq, {0, 1, 2});
  std::vector<float> q = pqt::random_normal(static_cast<size_t>(z.c.num_q_heads) * z.c.head_dim, 1);
  pqt::HostTensor qt = pqt::make_tensor(q, 1, z.c.num_q_heads, z.c.head_dim, z.c.dtype);
  for (int32_t l = 0; l < 3; ++l) {
    Sel a(z.c.num_kv_heads, pqt::selection_capacity(ctx, child, l)), b = new_sel(whole, l, z.c);
    PQ_ASSERT_OK(pq_decode_select(ctx, child, l, qt.get(), a.get()));
    PQ_ASSERT_OK(select(whole, l, z.c, &b));
    EXPECT_EQ(a.positions, b.positions) << "layer " << l;
  }
  // Truncate to 120 tokens: the middle is [4, 104) and each layer's LMBA is
  // measured over the scores of that middle only.
  PQ_ASSERT_OK(pq_sequence_truncate(whole, kSeq, 120));
  pq_config c = z.c;
  std::vector<double> lmba;
  for (int32_t l = 0; l < 3; ++l) {
    double sum = 0;
    for (int32_t h = 0; h < 2; ++h) {
      std::vector<double> m = z.mid(l, h, c);
      m.resize(100);  // the scores stay as computed over the 200-token prompt
      sum += zigzag_mba(m, c.zigzag_mass);
    }
    lmba.push_back(sum / 2);
  }
  const std::vector<int64_t> want = zigzag_budgets(lmba, ZigZagCase::k, c.zigzag_floor, 100);
  for (int32_t l = 0; l < 3; ++l) {
    Sel sel = new_sel(whole, l, c);
    PQ_ASSERT_OK(select(whole, l, c, &sel));
    EXPECT_EQ(sel.counts[0], 4 + 16 + want[static_cast<size_t>(l)]) << "layer " << l;
  }
}

// ---------------------------------------------------------------------------
// PyramidInfer
// ---------------------------------------------------------------------------

// PyramidInfer's prompt score of one layer, in double: the softmax of each
// window row (causal) over every query head, row i weighted 1 + 0.2 i /
// (w - 1), averaged over rows and heads; one score per token for the layer.
std::vector<double> pyramidinfer_scores(const std::vector<float>& keys, int64_t P,
                                        const std::vector<float>& queries, int64_t w,
                                        const pq_config& c) {
  const int32_t G = c.num_q_heads / c.num_kv_heads, d = c.head_dim;
  std::vector<double> s(static_cast<size_t>(P), 0.0);
  for (int64_t i = 0; i < w; ++i) {
    const int64_t lim = P - w + i;
    const double weight = w > 1 ? 1.0 + 0.2 * i / (w - 1) : 1.0;
    for (int32_t q = 0; q < c.num_q_heads; ++q) {
      const float* qv = queries.data() + (static_cast<size_t>(i) * c.num_q_heads + q) * d;
      const int32_t h = q / G;
      std::vector<double> l(static_cast<size_t>(lim + 1));
      for (int64_t t = 0; t <= lim; ++t) {
        const float* kv = keys.data() + (static_cast<size_t>(t) * c.num_kv_heads + h) * d;
        double dot = 0;
        for (int32_t e = 0; e < d; ++e) dot += static_cast<double>(qv[e]) * kv[e];
        l[static_cast<size_t>(t)] = dot / std::sqrt(static_cast<double>(d));
      }
      const double mx = *std::max_element(l.begin(), l.end());
      double sum = 0;
      for (double v : l) sum += std::exp(v - mx);
      for (int64_t t = 0; t <= lim; ++t)
        s[static_cast<size_t>(t)] += weight * std::exp(l[static_cast<size_t>(t)] - mx) / sum;
    }
  }
  for (double& v : s) v /= static_cast<double>(w) * c.num_q_heads;
  return s;
}

// k_l = round(k L f_l / sum f), f_l = r_0 ... r_(l-1), r_j the cosine schedule.
std::vector<int64_t> pyramidinfer_budgets(int64_t k, int32_t L, double decay, int64_t middle) {
  std::vector<double> f;
  double x = 1.0, sum = 0.0;
  for (int32_t j = 0; j < L; ++j) {
    f.push_back(x);
    sum += x;
    x *= (1.0 - decay) * (std::cos(M_PI * j / L) + 1.0) / 2.0 + decay;
  }
  std::vector<int64_t> out;
  for (double v : f) out.push_back(std::min<int64_t>(middle, std::llround(k * L * v / sum)));
  return out;
}

struct PyramidInferCase {
  static constexpr int64_t P = 200, k = 30, w = 8;
  pq_config c = base_config(PQ_SELECTOR_PYRAMIDINFER, 4, 4, 2);
  std::vector<Data> data;  // per layer: its own keys and window queries
  PyramidInferCase() {
    c.topk_tokens = static_cast<int32_t>(k);
    c.observation_window = static_cast<int32_t>(w);
    for (int32_t l = 0; l < c.num_layers; ++l) data.push_back(make_data(c, P, w, 50 + l));
  }
  void prefill_all(pq_context* ctx) const {
    for (int32_t l = 0; l < c.num_layers; ++l)
      PQ_ASSERT_OK(prefill(ctx, l, c, data[static_cast<size_t>(l)].keys, 0, P));
  }
  void queries(pq_context* ctx, int32_t l) const {
    PQ_ASSERT_OK(prefill_queries(ctx, l, c, data[static_cast<size_t>(l)].queries, w));
  }
};

TEST(PyramidInfer, KeepsNestedSubsetsChosenByTheLayerBelow) {
  PyramidInferCase z;
  for (float decay : {0.9f, 0.5f, 1.f}) {
    SCOPED_TRACE("decay " + std::to_string(decay));
    pq_config c = z.c;
    c.pyramidinfer_decay = decay;
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    PyramidInferCase zc = z;
    zc.c = c;
    zc.prefill_all(ctx);
    for (int32_t l : {3, 1, 0, 2}) zc.queries(ctx, l);  // any order
    Bounds b = bounds(z.P, c);
    const int64_t middle = b.local_begin - b.sink_end;
    const std::vector<int64_t> want_k = pyramidinfer_budgets(z.k, 4, decay, middle);
    if (decay == 1.f) {
      EXPECT_EQ(want_k, std::vector<int64_t>(4, z.k));
    } else {
      // r_0 = 1: layer 0's pruning keeps all, so layers 0 and 1 hold alike.
      EXPECT_EQ(want_k[1], want_k[0]);
      for (int32_t l = 2; l < 4; ++l) EXPECT_LT(want_k[l], want_k[l - 1]);
      EXPECT_NEAR(static_cast<double>(want_k[0] + want_k[1] + want_k[2] + want_k[3]), 4.0 * z.k, 2.0);
    }
    std::vector<int32_t> kept;  // K_(l-1), positions
    for (int32_t p = static_cast<int32_t>(b.sink_end); p < b.local_begin; ++p) kept.push_back(p);
    for (int32_t l = 0; l < 4; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      const Data& by = z.data[static_cast<size_t>(l == 0 ? 0 : l - 1)];
      const std::vector<double> s = pyramidinfer_scores(by.keys, z.P, by.queries, z.w, c);
      std::vector<double> sub;
      for (int32_t p : kept) sub.push_back(s[static_cast<size_t>(p)]);
      ASSERT_TRUE(no_near_tie_at_boundary(sub, want_k[static_cast<size_t>(l)]));
      std::vector<int32_t> next;
      for (int32_t i : pqt::topk_positions(sub, 0, want_k[static_cast<size_t>(l)]))
        next.push_back(kept[static_cast<size_t>(i)]);
      kept = next;
      EXPECT_EQ(pqt::selection_capacity(ctx, kSeq, l), 4 + 16 + want_k[static_cast<size_t>(l)]);
      Sel sel = new_sel(ctx, l, c);
      PQ_ASSERT_OK(select(ctx, l, c, &sel));
      for (int32_t h = 0; h < 2; ++h) EXPECT_EQ(middle_of(sel.row(h), b), kept) << "head " << h;
    }
  }
  for (float bad : {0.f, -0.1f, 1.5f, NAN}) {
    pq_config c = z.c;
    c.pyramidinfer_decay = bad;
    pq_context* ctx = nullptr;
    EXPECT_TRUE(pqt::IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"pyramidinfer_decay"}));
  }
}

// Layer l reads the prompt scores of the layers below (layer 0 its own): a
// select before they have them is BAD_STATE naming them; a fork selects as
// its parent; generated tokens are kept first in every layer.
TEST(PyramidInfer, NeedsTheLayersBelowAndKeepsGeneratedTokens) {
  PyramidInferCase z;
  Ctx ctx(z.c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  z.prefill_all(ctx);
  z.queries(ctx, 2);
  Sel s0 = new_sel(ctx, 0, z.c), s3 = new_sel(ctx, 3, z.c);
  EXPECT_TRUE(pqt::IsError(select(ctx, 0, z.c, &s0), PQ_ERR_BAD_STATE, {"layers 0 have no"}));
  EXPECT_TRUE(pqt::IsError(select(ctx, 3, z.c, &s3), PQ_ERR_BAD_STATE,
                           {"layers 0, 1 have no pq_prefill_queries", "pyramidinfer"}));
  z.queries(ctx, 0);
  PQ_ASSERT_OK(select(ctx, 0, z.c, &s0));
  Sel s1 = new_sel(ctx, 1, z.c);
  PQ_ASSERT_OK(select(ctx, 1, z.c, &s1));  // needs layer 0 only
  z.queries(ctx, 1);
  PQ_ASSERT_OK(select(ctx, 3, z.c, &s3));
  PQ_ASSERT_OK(pq_sequence_fork(ctx, kSeq, kSeq + 1));
  std::vector<float> q = pqt::random_normal(static_cast<size_t>(z.c.num_q_heads) * z.c.head_dim, 1);
  pqt::HostTensor qt = pqt::make_tensor(q, 1, z.c.num_q_heads, z.c.head_dim, z.c.dtype);
  Sel child(z.c.num_kv_heads, pqt::selection_capacity(ctx, kSeq + 1, 3));
  PQ_ASSERT_OK(pq_decode_select(ctx, kSeq + 1, 3, qt.get(), child.get()));
  EXPECT_EQ(child.positions, s3.positions);
  // 40 generated tokens on every layer: the 24 that left the local window
  // are kept in every layer (the top layer's budget is larger than 24).
  Data gen = make_data(z.c, z.P + 40, 1, 77);
  for (int64_t n = z.P; n < z.P + 40; ++n)
    for (int32_t l = 0; l < 4; ++l) PQ_ASSERT_OK(append(ctx, l, z.c, gen.keys, n));
  const int64_t n = z.P + 40;
  Bounds b = bounds(n, z.c);
  for (int32_t l = 0; l < 4; ++l) {
    Sel sel = new_sel(ctx, l, z.c);
    PQ_ASSERT_OK(select(ctx, l, z.c, &sel));
    const std::vector<int32_t> mid = middle_of(sel.row(1), b);
    for (int64_t p = z.P; p < b.local_begin; ++p)
      EXPECT_TRUE(std::binary_search(mid.begin(), mid.end(), static_cast<int32_t>(p)))
          << "layer " << l << " left out generated token " << p;
  }
}

// Layers publish their shares while others select (a server's threads may
// run layers of one sequence concurrently): every select succeeds with a
// share from before or after, never a torn one (TSan runs this in CI).
TEST(LayerShares, PublishedWhileOtherLayersSelect) {
  for (int32_t selector : {PQ_SELECTOR_ZIGZAGKV, PQ_SELECTOR_PYRAMIDINFER}) {
    SCOPED_TRACE("selector " + std::to_string(selector));
    PyramidInferCase z;
    z.c.selector = selector;
    Ctx ctx(z.c);
    ASSERT_TRUE(ctx.ok());
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    z.prefill_all(ctx);
    for (int32_t l = 0; l < 4; ++l) z.queries(ctx, l);
    std::atomic<int> failures{0};
    std::thread feeder([&] {
      for (int round = 0; round < 20; ++round)
        for (int32_t l = 0; l < 4; ++l)
          if (prefill_queries(ctx, l, z.c, z.data[static_cast<size_t>(l)].queries, z.w) != PQ_OK)
            ++failures;
    });
    for (int round = 0; round < 20; ++round)
      for (int32_t l = 3; l >= 0; --l) {
        Sel sel = new_sel(ctx, l, z.c);
        if (select(ctx, l, z.c, &sel) != PQ_OK) ++failures;
      }
    feeder.join();
    EXPECT_EQ(failures.load(), 0) << pq_last_error();
  }
}

// ---------------------------------------------------------------------------
// H2O
// ---------------------------------------------------------------------------

struct H2oFixture {
  pq_config c;
  Data d;
  Ctx ctx;
  int64_t P = 100;
  explicit H2oFixture(int64_t steps = 40) : c(base_config(PQ_SELECTOR_H2O, 1, 4, 2)) {
    c.local_tokens = 8;
    c.topk_tokens = 10;
    d = make_data(c, P + steps, 1, 31);
    ctx = Ctx(c);
  }
};

// Accumulated mass per (head, token), as the test sums it.
using Mass = std::vector<std::vector<double>>;

TEST(H2o, SelectsLargestAccumulatedMass) {
  H2oFixture f;
  ASSERT_TRUE(f.ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(f.ctx, kSeq));
  PQ_ASSERT_OK(prefill(f.ctx, 0, f.c, f.d.keys, 0, f.P));
  const int32_t H = f.c.num_kv_heads;
  Mass mass(static_cast<size_t>(H), std::vector<double>(static_cast<size_t>(f.P), 0.0));
  // Observation 1: all prompt tokens; observation 2: the even ones.
  std::vector<int32_t> all, even;
  for (int32_t t = 0; t < f.P; ++t) {
    all.push_back(t);
    if (t % 2 == 0) even.push_back(t);
  }
  for (const auto* pos : {&all, &even}) {
    Sel s = manual_sel(H, *pos);
    std::vector<float> probs = pqt::random_uniform(static_cast<size_t>(H) * pos->size(),
                                                   pos->size(), 0.f, 1.f);
    for (int32_t h = 0; h < H; ++h)
      for (size_t i = 0; i < pos->size(); ++i)
        mass[static_cast<size_t>(h)][static_cast<size_t>((*pos)[i])] +=
            probs[static_cast<size_t>(h) * pos->size() + i];
    PQ_ASSERT_OK(observe(f.ctx, 0, s, probs));
  }
  Sel sel = new_sel(f.ctx, 0, f.c);
  PQ_ASSERT_OK(select(f.ctx, 0, f.c, &sel));
  Bounds b = bounds(f.P, f.c);
  expect_bookkeeping(sel, f.P, f.c, f.c.topk_tokens, sel.capacity);
  for (int32_t h = 0; h < H; ++h) {
    std::vector<double> mid = slice(mass[static_cast<size_t>(h)], b.sink_end, b.local_begin);
    ASSERT_TRUE(no_near_tie_at_boundary(mid, f.c.topk_tokens));
    EXPECT_EQ(middle_of(sel.row(h), b), pqt::topk_positions(mid, b.sink_end, f.c.topk_tokens))
        << "head " << h;
  }
  // Heads are independent: different masses, different choices.
  EXPECT_NE(middle_of(sel.row(0), b), middle_of(sel.row(1), b));
}

TEST(H2o, ColdStartKeepsTheMostRecentMiddleTokens) {
  H2oFixture f;
  ASSERT_TRUE(f.ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(f.ctx, kSeq));
  PQ_ASSERT_OK(prefill(f.ctx, 0, f.c, f.d.keys, 0, f.P));
  for (int64_t s = 0; s < 5; ++s) {
    const int64_t n = f.P + s;
    if (s > 0) PQ_ASSERT_OK(append(f.ctx, 0, f.c, f.d.keys, n - 1));
    Sel sel = new_sel(f.ctx, 0, f.c);
    PQ_ASSERT_OK(select(f.ctx, 0, f.c, &sel));
    Bounds b = bounds(n, f.c);
    std::vector<int32_t> want;
    for (int64_t p = b.local_begin - f.c.topk_tokens; p < b.local_begin; ++p)
      want.push_back(static_cast<int32_t>(p));
    for (int32_t h = 0; h < f.c.num_kv_heads; ++h)
      EXPECT_EQ(middle_of(sel.row(h), b), want) << "step " << s;
  }
}

TEST(H2o, DroppedTokensAreNeverSelectedAgain) {
  H2oFixture f;
  ASSERT_TRUE(f.ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(f.ctx, kSeq));
  PQ_ASSERT_OK(prefill(f.ctx, 0, f.c, f.d.keys, 0, f.P));
  const int32_t H = f.c.num_kv_heads;
  std::vector<int32_t> all;
  for (int32_t t = 0; t < f.P; ++t) all.push_back(t);
  Sel seed = manual_sel(H, all);
  std::vector<float> seed_probs = pqt::random_uniform(static_cast<size_t>(H) * all.size(), 77, 0.f, 1.f);
  PQ_ASSERT_OK(observe(f.ctx, 0, seed, seed_probs));

  Sel s1 = new_sel(f.ctx, 0, f.c);
  PQ_ASSERT_OK(select(f.ctx, 0, f.c, &s1));
  Bounds b = bounds(f.P, f.c);
  std::vector<int32_t> first = middle_of(s1.row(0), b);
  // A middle token left out: observe it with overwhelming mass.
  int32_t x = -1;
  for (int32_t p = static_cast<int32_t>(b.sink_end); p < b.local_begin; ++p)
    if (!std::binary_search(first.begin(), first.end(), p)) x = p;
  ASSERT_GE(x, 0);
  Sel mx = manual_sel(H, {x});
  PQ_ASSERT_OK(observe(f.ctx, 0, mx, std::vector<float>(static_cast<size_t>(H), 1000.f)));
  Sel s2 = new_sel(f.ctx, 0, f.c);
  PQ_ASSERT_OK(select(f.ctx, 0, f.c, &s2));
  EXPECT_EQ(middle_of(s2.row(0), b), first) << "a dropped token came back";

  // A local token observed heavily enters the middle with that mass and is
  // kept; the weakest kept token is dropped instead.
  const int32_t y = static_cast<int32_t>(b.local_begin);  // the next to leave the window
  Sel my = manual_sel(H, {y});
  PQ_ASSERT_OK(observe(f.ctx, 0, my, std::vector<float>(static_cast<size_t>(H), 500.f)));
  PQ_ASSERT_OK(append(f.ctx, 0, f.c, f.d.keys, f.P));
  Sel s3 = new_sel(f.ctx, 0, f.c);
  PQ_ASSERT_OK(select(f.ctx, 0, f.c, &s3));
  Bounds b3 = bounds(f.P + 1, f.c);
  std::vector<int32_t> third = middle_of(s3.row(0), b3);
  ASSERT_EQ(third.size(), static_cast<size_t>(f.c.topk_tokens));
  EXPECT_TRUE(std::binary_search(third.begin(), third.end(), y));
  // The weakest of `first` by mass is gone.
  int32_t weakest = first[0];
  for (int32_t p : first)
    if (seed_probs[static_cast<size_t>(p)] < seed_probs[static_cast<size_t>(weakest)]) weakest = p;
  EXPECT_FALSE(std::binary_search(third.begin(), third.end(), weakest));
  // Reviving it by observation fails too, over many later steps.
  Sel mw = manual_sel(H, {weakest, x});
  PQ_ASSERT_OK(observe(f.ctx, 0, mw, std::vector<float>(static_cast<size_t>(2 * H), 1e6f)));
  for (int64_t s = 1; s <= 20; ++s) {
    const int64_t n = f.P + 1 + s;
    PQ_ASSERT_OK(append(f.ctx, 0, f.c, f.d.keys, n - 1));
    Sel sel = new_sel(f.ctx, 0, f.c);
    PQ_ASSERT_OK(select(f.ctx, 0, f.c, &sel));
    std::vector<int32_t> mid = middle_of(sel.row(0), bounds(n, f.c));
    EXPECT_FALSE(std::binary_search(mid.begin(), mid.end(), weakest)) << "step " << s;
    EXPECT_FALSE(std::binary_search(mid.begin(), mid.end(), x)) << "step " << s;
  }
}

TEST(H2o, EachStepKeepsASubsetOfTheLastSelectionPlusNewTokens) {
  H2oFixture f(60);
  ASSERT_TRUE(f.ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(f.ctx, kSeq));
  PQ_ASSERT_OK(prefill(f.ctx, 0, f.c, f.d.keys, 0, f.P));
  const int32_t H = f.c.num_kv_heads;
  std::vector<std::set<int32_t>> dropped(static_cast<size_t>(H));
  std::vector<std::vector<int32_t>> prev(static_cast<size_t>(H));
  int64_t prev_local_begin = -1;
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> unif(0.f, 1.f);
  for (int64_t s = 0; s <= 60; ++s) {
    const int64_t n = f.P + s;
    if (s > 0) PQ_ASSERT_OK(append(f.ctx, 0, f.c, f.d.keys, n - 1));
    Sel sel = new_sel(f.ctx, 0, f.c);
    PQ_ASSERT_OK(select(f.ctx, 0, f.c, &sel));
    Bounds b = bounds(n, f.c);
    for (int32_t h = 0; h < H; ++h) {
      std::vector<int32_t> mid = middle_of(sel.row(h), b);
      ASSERT_EQ(mid.size(), static_cast<size_t>(f.c.topk_tokens));
      for (int32_t p : mid) {
        EXPECT_EQ(dropped[static_cast<size_t>(h)].count(p), 0u) << "dropped " << p << " back at step " << s;
        if (s > 0 && p < prev_local_begin)
          EXPECT_TRUE(std::binary_search(prev[static_cast<size_t>(h)].begin(),
                                         prev[static_cast<size_t>(h)].end(), p));
      }
      for (int32_t p = static_cast<int32_t>(b.sink_end); p < b.local_begin; ++p)
        if (!std::binary_search(mid.begin(), mid.end(), p)) dropped[static_cast<size_t>(h)].insert(p);
      prev[static_cast<size_t>(h)] = mid;
    }
    prev_local_begin = b.local_begin;
    std::vector<float> probs(static_cast<size_t>(H * sel.capacity));
    for (float& p : probs) p = unif(rng);
    PQ_ASSERT_OK(observe(f.ctx, 0, sel, probs));
    if (s % 7 == 3) {  // now and then a hand-made observation of every token
      std::vector<int32_t> all;
      for (int32_t t = 0; t < n; ++t) all.push_back(t);
      Sel ms = manual_sel(H, all);
      std::vector<float> big(static_cast<size_t>(H) * all.size());
      for (float& p : big) p = 10.f * unif(rng);
      PQ_ASSERT_OK(observe(f.ctx, 0, ms, big));
    }
  }
  EXPECT_GT(dropped[0].size(), 80u);
}

// ---------------------------------------------------------------------------
// Scissorhands
// ---------------------------------------------------------------------------

// The rule, recomputed from its statement: each observation is a step; a
// token it covers is a hit when prob >= group / count; a token's score is
// its hits over the steps that observed it among the last `window` steps.
struct HitHistory {
  int32_t group = 1, window = 1;
  std::vector<std::map<int32_t, bool>> steps;  // position -> hit, per step
  void observe(const std::vector<int32_t>& pos, const float* probs) {
    std::map<int32_t, bool> step;
    for (size_t i = 0; i < pos.size(); ++i)
      step[pos[i]] = static_cast<double>(probs[i]) >= static_cast<double>(group) / pos.size();
    steps.push_back(step);
  }
  std::vector<double> scores(int64_t begin, int64_t end) const {
    std::vector<double> out;
    for (int64_t p = begin; p < end; ++p) {
      int observed = 0, hits = 0;
      for (size_t s = steps.size() > static_cast<size_t>(window) ? steps.size() - window : 0;
           s < steps.size(); ++s) {
        auto it = steps[s].find(static_cast<int32_t>(p));
        if (it == steps[s].end()) continue;
        ++observed;
        hits += it->second ? 1 : 0;
      }
      out.push_back(observed == 0 ? 0.0 : static_cast<double>(hits) / observed);
    }
    return out;
  }
};

pq_config scissorhands_config(int32_t window) {
  pq_config c = base_config(PQ_SELECTOR_SCISSORHANDS, 1, 4, 2);  // a group of 2
  c.local_tokens = 8;
  c.topk_tokens = 10;
  c.history_window = window;
  return c;
}

TEST(Scissorhands, KeepsTheTokensMostOftenAboveUniformAttentionInTheWindow) {
  const int64_t P = 100;
  std::mt19937 rng(41);
  // Five steps, each over 64 of the 100 tokens (so group / count = 1/32 is
  // exact in float): a hit gets exactly 1/32, a miss the float just below.
  std::vector<std::vector<int32_t>> positions;
  std::vector<std::vector<float>> probs;  // [step][h * 64 + i]
  for (int s = 0; s < 5; ++s) {
    std::vector<int32_t> all(P);
    for (int32_t t = 0; t < P; ++t) all[static_cast<size_t>(t)] = t;
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(64);
    std::sort(all.begin(), all.end());
    positions.push_back(all);
    std::vector<float> p(2 * 64);
    for (float& x : p)
      x = rng() % 2 ? 1.f / 32.f : std::nextafter(1.f / 32.f, 0.f);
    probs.push_back(p);
  }
  std::vector<std::vector<int32_t>> by_window;
  for (int32_t window : {3, 5}) {
    SCOPED_TRACE("history_window " + std::to_string(window));
    pq_config c = scissorhands_config(window);
    Data d = make_data(c, P, 1, 31);
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    PQ_ASSERT_OK(prefill(ctx, 0, c, d.keys, 0, P));
    std::vector<HitHistory> ref(2);
    for (size_t s = 0; s < positions.size(); ++s) {
      Sel sel = manual_sel(2, positions[s]);
      PQ_ASSERT_OK(observe(ctx, 0, sel, probs[s]));
      for (int32_t h = 0; h < 2; ++h) {
        ref[static_cast<size_t>(h)].group = 2;
        ref[static_cast<size_t>(h)].window = window;
        ref[static_cast<size_t>(h)].observe(positions[s], probs[s].data() + h * 64);
      }
    }
    Sel sel = new_sel(ctx, 0, c);
    PQ_ASSERT_OK(select(ctx, 0, c, &sel));
    Bounds b = bounds(P, c);
    expect_bookkeeping(sel, P, c, c.topk_tokens, sel.capacity);
    for (int32_t h = 0; h < 2; ++h) {
      std::vector<double> want = ref[static_cast<size_t>(h)].scores(b.sink_end, b.local_begin);
      EXPECT_EQ(middle_of(sel.row(h), b), pqt::topk_positions(want, b.sink_end, c.topk_tokens))
          << "head " << h;
    }
    EXPECT_NE(middle_of(sel.row(0), b), middle_of(sel.row(1), b)) << "heads are independent";
    by_window.push_back(middle_of(sel.row(0), b));
  }
  EXPECT_NE(by_window[0], by_window[1]) << "steps before the window still counted";
}

TEST(Scissorhands, ColdStartKeepsRecentTokensAndDroppedOnesNeverReturn) {
  const int64_t P = 100;
  pq_config c = scissorhands_config(4);
  Data d = make_data(c, P + 30, 1, 33);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  PQ_ASSERT_OK(prefill(ctx, 0, c, d.keys, 0, P));
  Bounds b = bounds(P, c);
  Sel first = new_sel(ctx, 0, c);
  PQ_ASSERT_OK(select(ctx, 0, c, &first));
  std::vector<int32_t> recent;
  for (int64_t p = b.local_begin - c.topk_tokens; p < b.local_begin; ++p)
    recent.push_back(static_cast<int32_t>(p));
  EXPECT_EQ(middle_of(first.row(0), b), recent) << "no observation: the most recent middle";
  // At every later step the dropped tokens (the older middle) are hits and
  // every other token a miss: they would win on score, but stay dropped.
  for (int64_t s = 1; s <= 30; ++s) {
    const int64_t n = P + s;
    PQ_ASSERT_OK(append(ctx, 0, c, d.keys, n - 1));
    std::vector<int32_t> all;
    for (int32_t t = 0; t < n; ++t) all.push_back(t);
    std::vector<float> probs(2 * all.size(), 0.f);
    for (int32_t h = 0; h < 2; ++h)
      for (int32_t t = static_cast<int32_t>(b.sink_end); t < recent.front(); ++t)
        probs[static_cast<size_t>(h) * all.size() + static_cast<size_t>(t)] = 1.f;
    Sel everything = manual_sel(2, all);
    PQ_ASSERT_OK(observe(ctx, 0, everything, probs));
    Sel sel = new_sel(ctx, 0, c);
    PQ_ASSERT_OK(select(ctx, 0, c, &sel));
    std::vector<int32_t> mid = middle_of(sel.row(0), bounds(n, c));
    ASSERT_EQ(mid.size(), static_cast<size_t>(c.topk_tokens));
    for (int32_t p : mid)
      EXPECT_TRUE(p >= recent.front()) << "step " << s << ": dropped token " << p << " returned";
  }
}

TEST(Scissorhands, HistoryWindowIsCheckedAndSavedStatesMustAgree) {
  pq_config c = scissorhands_config(0);
  pq_context* ctx = nullptr;
  EXPECT_TRUE(pqt::IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"history_window", "0"}));
  c.history_window = 4097;
  EXPECT_TRUE(pqt::IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"history_window"}));
  // A state saved with one window does not restore into another.
  Ctx a(scissorhands_config(8)), b(scissorhands_config(9));
  ASSERT_TRUE(a.ok() && b.ok());
  Data d = make_data(scissorhands_config(8), 60, 1, 35);
  PQ_ASSERT_OK(pq_sequence_add(a, kSeq));
  PQ_ASSERT_OK(prefill(a, 0, scissorhands_config(8), d.keys, 0, 60));
  uint64_t size = 0, written = 0;
  PQ_ASSERT_OK(pq_sequence_state_size(a, kSeq, &size));
  std::vector<uint8_t> bytes(size);
  PQ_ASSERT_OK(pq_sequence_save_buffer(a, kSeq, bytes.data(), size, &written));
  EXPECT_TRUE(pqt::IsError(pq_sequence_restore(b, kSeq, bytes.data(), size), PQ_ERR_CORRUPT,
                           {"history_window", "8"}));
}

// ---------------------------------------------------------------------------
// SCOPE
// ---------------------------------------------------------------------------

struct ScopeRun {
  std::vector<int32_t> prompt, decode;  // middle tokens of kv head 0 by phase
};

// The documented split: k_dec = round(share * k), k_pre = k - k_dec; a side
// with fewer tokens than its budget gives the rest to the other.
std::pair<int64_t, int64_t> scope_split(int64_t k, double share, int64_t n_pre, int64_t n_dec) {
  int64_t k_dec = std::llround(share * static_cast<double>(k));
  int64_t k_pre = k - k_dec;
  if (k_pre > n_pre) {
    k_pre = n_pre;
    k_dec = k - k_pre;
  } else if (k_dec > n_dec) {
    k_dec = n_dec;
    k_pre = k - k_dec;
  }
  return {k_pre, k_dec};
}

void scope_loop(float share, int64_t P, int64_t steps, int32_t topk, uint64_t seed,
                const std::function<void(int64_t, int64_t, const ScopeRun&, int64_t, int64_t)>& check) {
  pq_config c = base_config(PQ_SELECTOR_SCOPE, 1, 2, 1);
  c.local_tokens = 8;
  c.topk_tokens = topk;
  c.scope_decode_share = share;
  c.observation_window = 16;
  c.pooling_kernel = 3;
  Data d = make_data(c, P + steps, 16, seed);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  PQ_ASSERT_OK(prefill(ctx, 0, c, d.keys, 0, P));
  PQ_ASSERT_OK(prefill_queries(ctx, 0, c, d.queries, 16));
  std::set<int32_t> dropped;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> unif(0.f, 1.f);
  for (int64_t s = 0; s <= steps; ++s) {
    const int64_t n = P + s;
    if (s > 0) PQ_ASSERT_OK(append(ctx, 0, c, d.keys, n - 1));
    Sel sel = new_sel(ctx, 0, c);
    PQ_ASSERT_OK(select(ctx, 0, c, &sel));
    Bounds b = bounds(n, c);
    const int64_t k = std::min<int64_t>(topk, b.local_begin - b.sink_end);
    expect_bookkeeping(sel, n, c, k, sel.capacity);
    ScopeRun run;
    for (int32_t p : middle_of(sel.row(0), b)) (p < P ? run.prompt : run.decode).push_back(p);
    const int64_t n_pre = std::min<int64_t>(P, b.local_begin) - b.sink_end;
    int64_t n_dec = 0;
    for (int64_t p = P; p < b.local_begin; ++p) n_dec += dropped.count(static_cast<int32_t>(p)) == 0;
    auto split = scope_split(k, share, n_pre, n_dec);
    EXPECT_EQ(static_cast<int64_t>(run.prompt.size()), split.first) << "step " << s;
    EXPECT_EQ(static_cast<int64_t>(run.decode.size()), split.second) << "step " << s;
    for (int32_t p : run.decode) EXPECT_EQ(dropped.count(p), 0u) << "dropped decode token back";
    for (int64_t p = P; p < b.local_begin; ++p)
      if (!std::binary_search(run.decode.begin(), run.decode.end(), static_cast<int32_t>(p)))
        dropped.insert(static_cast<int32_t>(p));
    check(s, n, run, n_pre, n_dec);
    std::vector<float> probs(static_cast<size_t>(sel.capacity));
    for (float& p : probs) p = unif(rng);
    PQ_ASSERT_OK(observe(ctx, 0, sel, probs));
  }
}

TEST(Scope, SplitFollowsDecodeShareAndSpillsToThePrompt) {
  // P = 100, middle before decode: [4, 92); k = 20, share 0.5: 10 + 10 once
  // 10 decode tokens have left the local window, the prompt takes the rest
  // before that.
  std::vector<int32_t> prompt20, prompt10;
  int64_t full_steps = 0;
  scope_loop(0.5f, 100, 40, 20, 51,
             [&](int64_t s, int64_t, const ScopeRun& run, int64_t, int64_t n_dec) {
               if (s == 0) {
                 EXPECT_TRUE(run.decode.empty());
                 EXPECT_EQ(run.prompt.size(), 20u);
                 prompt20 = run.prompt;
               }
               if (n_dec >= 10) {
                 EXPECT_EQ(run.decode.size(), 10u);
                 EXPECT_EQ(run.prompt.size(), 10u);
                 if (prompt10.empty()) prompt10 = run.prompt;
                 EXPECT_EQ(run.prompt, prompt10) << "the prompt side is static";
                 ++full_steps;
               }
             });
  EXPECT_GT(full_steps, 10);
  // The prompt side is SnapKV's choice for the same prompt budget: SnapKV
  // with k = 20 at the prompt's end, and after 18 generated tokens, when the
  // 10 that left the local window take half of its budget (all prompt
  // tokens [4, 100) are middle then, as for SCOPE's full steps).
  pq_config c = base_config(PQ_SELECTOR_SNAPKV, 1, 2, 1);
  c.local_tokens = 8;
  c.topk_tokens = 20;
  c.observation_window = 16;
  c.pooling_kernel = 3;
  Data d = make_data(c, 140, 16, 51);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  PQ_ASSERT_OK(prefill(ctx, 0, c, d.keys, 0, 100));
  PQ_ASSERT_OK(prefill_queries(ctx, 0, c, d.queries, 16));
  Sel sel = new_sel(ctx, 0, c);
  PQ_ASSERT_OK(select(ctx, 0, c, &sel));
  EXPECT_EQ(middle_of(sel.row(0), bounds(100, c)), prompt20);
  for (int64_t t = 100; t < 118; ++t) PQ_ASSERT_OK(append(ctx, 0, c, d.keys, t));
  Sel later = new_sel(ctx, 0, c);
  PQ_ASSERT_OK(select(ctx, 0, c, &later));
  std::vector<int32_t> prompt_part;
  for (int32_t p : middle_of(later.row(0), bounds(118, c)))
    if (p < 100) prompt_part.push_back(p);
  EXPECT_EQ(prompt_part, prompt10);
}

TEST(Scope, SpillsToDecodeWhenThePromptIsShort) {
  // P = 16: at most 12 prompt middle tokens, below k_pre = 20 - round(0.25 * 20) = 15.
  int64_t saw_spill = 0;
  scope_loop(0.25f, 16, 40, 20, 61,
             [&](int64_t s, int64_t, const ScopeRun& run, int64_t n_pre, int64_t n_dec) {
               if (n_pre == 12 && n_dec >= 8) {
                 EXPECT_EQ(run.prompt.size(), 12u) << "every prompt middle token";
                 EXPECT_EQ(run.decode.size(), 8u);
                 ++saw_spill;
               }
             });
  EXPECT_GT(saw_spill, 10);
}

TEST(Scope, ExtremeSharesAndHeavyDecodeTokens) {
  // share 1: decode tokens take the whole budget once there are enough.
  scope_loop(1.0f, 60, 40, 10, 71, [&](int64_t, int64_t, const ScopeRun& run, int64_t, int64_t n_dec) {
    if (n_dec >= 10) EXPECT_TRUE(run.prompt.empty());
  });
  // share 0: decode tokens only when the prompt side runs out.
  scope_loop(0.0f, 60, 40, 10, 72, [&](int64_t, int64_t, const ScopeRun& run, int64_t n_pre, int64_t) {
    if (n_pre >= 10) EXPECT_TRUE(run.decode.empty());
  });
  // A decode token observed heavily while local is kept once it is middle.
  pq_config c = base_config(PQ_SELECTOR_SCOPE, 1, 2, 1);
  c.local_tokens = 8;
  c.topk_tokens = 10;
  const int64_t P = 60;
  Data d = make_data(c, P + 40, 32, 73);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  PQ_ASSERT_OK(prefill(ctx, 0, c, d.keys, 0, P));
  PQ_ASSERT_OK(prefill_queries(ctx, 0, c, d.queries, 32));
  const int32_t heavy = static_cast<int32_t>(P + 3);
  for (int64_t s = 1; s <= 40; ++s) {
    const int64_t n = P + s;
    PQ_ASSERT_OK(append(ctx, 0, c, d.keys, n - 1));
    if (n - 1 == heavy) {
      Sel m = manual_sel(1, {heavy});
      PQ_ASSERT_OK(observe(ctx, 0, m, {100.f}));
    }
    Sel sel = new_sel(ctx, 0, c);
    PQ_ASSERT_OK(select(ctx, 0, c, &sel));
    std::vector<float> probs(static_cast<size_t>(sel.capacity), 0.01f);
    PQ_ASSERT_OK(observe(ctx, 0, sel, probs));
    Bounds b = bounds(n, c);
    if (heavy < b.local_begin) {
      std::vector<int32_t> mid = middle_of(sel.row(0), b);
      EXPECT_TRUE(std::binary_search(mid.begin(), mid.end(), heavy)) << "step " << s;
    }
  }
}

// ---------------------------------------------------------------------------
// Large layers: the core selects kv heads in parallel (middle >= 4096)
// ---------------------------------------------------------------------------

TEST(SelectorsDrop, LargeLayersSelectHeadsInParallel) {
  const int64_t P = 4400;
  for (int32_t selector : {PQ_SELECTOR_SNAPKV, PQ_SELECTOR_H2O}) {
    SCOPED_TRACE("selector " + std::to_string(selector));
    pq_config c = base_config(selector, 1, 8, 4);
    c.topk_tokens = 300;
    Data d = make_data(c, P + 8, 32, 91);
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok());
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    PQ_ASSERT_OK(prefill(ctx, 0, c, d.keys, 0, P));
    PQ_ASSERT_OK(prefill_queries(ctx, 0, c, d.queries, 32));
    std::vector<int32_t> all;
    for (int32_t t = 0; t < P; ++t) all.push_back(t);
    Sel ms = manual_sel(c.num_kv_heads, all);
    std::vector<float> mass = pqt::random_uniform(all.size() * c.num_kv_heads, 92, 0.f, 1.f);
    PQ_ASSERT_OK(observe(ctx, 0, ms, mass));
    Sel sel = new_sel(ctx, 0, c);
    PQ_ASSERT_OK(select(ctx, 0, c, &sel));
    Bounds b = bounds(P, c);
    expect_bookkeeping(sel, P, c, c.topk_tokens, sel.capacity);
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      std::vector<double> ref;
      if (selector == PQ_SELECTOR_SNAPKV) {
        ref = slice(snapkv_reference(d.keys, P, d.queries, 32, c, h), b.sink_end, b.local_begin);
      } else {
        for (int64_t t = b.sink_end; t < b.local_begin; ++t)
          ref.push_back(mass[static_cast<size_t>(h) * all.size() + static_cast<size_t>(t)]);
      }
      // H2O's masses are the floats passed in (0 + p is exact): no rounding.
      if (selector == PQ_SELECTOR_SNAPKV) ASSERT_TRUE(no_near_tie_at_boundary(ref, c.topk_tokens));
      EXPECT_EQ(middle_of(sel.row(h), b), pqt::topk_positions(ref, b.sink_end, c.topk_tokens))
          << "head " << h;
    }
    if (selector == PQ_SELECTOR_H2O) {  // the others were dropped, heads in parallel
      std::vector<int32_t> first = middle_of(sel.row(0), b);
      for (int64_t s = 1; s <= 8; ++s) {
        PQ_ASSERT_OK(append(ctx, 0, c, d.keys, P + s - 1));
        Sel next = new_sel(ctx, 0, c);
        PQ_ASSERT_OK(select(ctx, 0, c, &next));
        for (int32_t p : middle_of(next.row(0), bounds(P + s, c)))
          EXPECT_TRUE(p >= b.local_begin || std::binary_search(first.begin(), first.end(), p));
      }
    }
  }
}

// ---------------------------------------------------------------------------
// pq_observe_attention arguments (validated by the core)
// ---------------------------------------------------------------------------

TEST(ObserveAttention, RejectsBadArgumentsAndChangesNothing) {
  H2oFixture f;
  ASSERT_TRUE(f.ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(f.ctx, kSeq));
  PQ_ASSERT_OK(prefill(f.ctx, 0, f.c, f.d.keys, 0, f.P));
  const int32_t H = f.c.num_kv_heads;
  // Middle tokens 10..19: a valid observation would change the choice.
  std::vector<int32_t> pos;
  for (int32_t t = 10; t < 20; ++t) pos.push_back(t);
  Sel s = manual_sel(H, pos);
  std::vector<float> good(static_cast<size_t>(H) * pos.size(), 1.f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();

  PQ_EXPECT_ERR(pq_observe_attention(f.ctx, kSeq, 0, nullptr, good.data()),
                PQ_ERR_INVALID_ARGUMENT, "selection");
  PQ_EXPECT_ERR(pq_observe_attention(f.ctx, kSeq, 0, s.get(), nullptr), PQ_ERR_INVALID_ARGUMENT,
                "probs");
  for (float bad : {-0.5f, nan, inf}) {
    std::vector<float> probs = good;
    probs.back() = bad;  // the last entry of the last head: nothing may be added before it
    PQ_EXPECT_ERR(observe(f.ctx, 0, s, probs), PQ_ERR_INVALID_ARGUMENT, "probs");
  }
  for (int32_t bad_pos : {-1, static_cast<int32_t>(f.P), 1 << 30}) {
    Sel b = manual_sel(H, pos);
    b.positions.back() = bad_pos;
    PQ_EXPECT_ERR(observe(f.ctx, 0, b, good), PQ_ERR_INVALID_ARGUMENT, "positions");
  }
  {
    Sel b = manual_sel(H, pos);
    b.counts[0] = static_cast<int32_t>(b.capacity + 1);
    PQ_EXPECT_ERR(observe(f.ctx, 0, b, good), PQ_ERR_INVALID_ARGUMENT, "counts");
    pq_selection* ps = b.get();
    ps->counts = nullptr;
    PQ_EXPECT_ERR(pq_observe_attention(f.ctx, kSeq, 0, ps, good.data()), PQ_ERR_INVALID_ARGUMENT,
                  "counts");
  }
  PQ_EXPECT_ERR(observe(f.ctx, 5, s, good), PQ_ERR_INVALID_ARGUMENT, "layer");
  PQ_EXPECT_ERR(pq_observe_attention(f.ctx, kSeq + 9, 0, s.get(), good.data()), PQ_ERR_NOT_FOUND,
                "seq");
  // Nothing was accumulated: the cold start (most recent) choice stands.
  Sel sel = new_sel(f.ctx, 0, f.c);
  PQ_ASSERT_OK(select(f.ctx, 0, f.c, &sel));
  Bounds b = bounds(f.P, f.c);
  std::vector<int32_t> want;
  for (int64_t p = b.local_begin - f.c.topk_tokens; p < b.local_begin; ++p)
    want.push_back(static_cast<int32_t>(p));
  for (int32_t h = 0; h < H; ++h) EXPECT_EQ(middle_of(sel.row(h), b), want);

  // Selectors that do not accumulate attention accept and ignore the call.
  for (int32_t selector : {PQ_SELECTOR_SNAPKV, PQ_SELECTOR_PYRAMIDKV, PQ_SELECTOR_EXACT}) {
    pq_config c = f.c;
    c.selector = selector;
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok());
    PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
    PQ_ASSERT_OK(prefill(ctx, 0, c, f.d.keys, 0, f.P));
    PQ_EXPECT_OK(observe(ctx, 0, s, good));
    std::vector<float> neg = good;
    neg[0] = -1.f;
    PQ_EXPECT_ERR(observe(ctx, 0, s, neg), PQ_ERR_INVALID_ARGUMENT, "probs");
  }
}

}  // namespace
