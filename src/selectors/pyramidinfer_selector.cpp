// PyramidInfer (methods digest, section 5.2; docs/selector-references.md,
// section 5): the tokens a layer keeps are a subset of what the layer below
// kept, chosen by the attention of the latest prompt queries, with budgets
// that shrink with depth.
//
// The rule follows the authors' code (mutonix/pyramidinfer,
// models/modeling_llama_pyramidinfer.py at 61ac641): after layer j computes
// its attention, the prompt tokens entering layer j + 1 are the top
// int(n * r_j) of those that entered layer j, scored by the attention of
// the recent queries averaged over all heads and over the rows, row i of w
// weighted by linspace(1, 1.2)[i]; r_j = (1 - d) (cos(pi j / L) + 1) / 2 + d
// with d = pyramidinfer_decay (their prefill_decay_ratio, 0.9), from 1 at
// the bottom to d at the top. Here:
//   score_j[t]  = sum over window rows i and query heads q of
//                 (1 + 0.2 i / (w - 1)) softmax_t(q_i . k_t / sqrt(d)) / (w Q)
//                 (causal: row i sees [0, P - w + i]), from the
//                 pq_prefill_queries of layer j, one score for all its heads
//   f_l         = r_0 r_1 ... r_(l-1) (f_0 = 1), the share of the context the
//                 authors' layer l holds
//   k_l         = round(k L f_l / sum over layers of f), clipped to the
//                 middle: the same total as a uniform k, shrinking as f does
//   K_0         = the top k_0 middle tokens by score_0
//   K_l         = the top k_l of K_(l-1) by score_(l-1), l >= 1
// and every kv head of layer l keeps K_l. Tokens stored after a layer's
// scoring (generated ones) rank +infinity in every step: kept first, as
// SNAPKV keeps them.
//
// Where the library differs from the authors' code: it keeps the whole
// prompt at layer 0 (the budget's k_0 here); the recent rows are the
// observation_window prompt queries (theirs: the last 20% of the prompt)
// and their softmax spans every prompt token (theirs: the tokens that
// entered the layer, as the others were never computed); no 64-token floor;
// generated tokens are not compressed in blocks of 16 (theirs keep a share
// g_l of each block by stale attention rows).
//
// Layer l's selection reads the scores of layers 0 to l - 1 (layer_share.h):
// a select before those layers had their pq_prefill_queries is
// PQ_ERR_BAD_STATE naming them. Layer l's own scores serve layer l + 1 (and
// layer 0 itself).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/topk.h"
#include "format/state_io.h"
#include "selectors/layer_share.h"
#include "selectors/prompt_scores.h"
#include "selectors/selector_capabilities.h"

namespace pq {

namespace {

struct PyramidInferState final : CopyableState<PyramidInferState> {
  explicit PyramidInferState(int32_t l) : layer(l) {}
  int32_t layer;
  int64_t prompt_tokens = -1;  // tokens stored at the last pq_prefill_queries
  // Per prompt token, for all the layer's heads. Never changed once made (a
  // truncate makes another), so that the layer's share and a fork's state
  // hold the same vector instead of copies.
  std::shared_ptr<const std::vector<float>> score = std::make_shared<std::vector<float>>();

  bool ready() const { return prompt_tokens >= 0; }
  void truncate(int64_t tokens) override {
    if (prompt_tokens <= tokens) return;
    prompt_tokens = tokens;
    score = std::make_shared<std::vector<float>>(score->begin(), score->begin() + tokens);
  }
  void save(ByteWriter& out) const override {
    out.put<int64_t>(prompt_tokens);
    out.put_vector(*score);
  }
  void load(ByteReader& in, int64_t tokens, const pq_config&) override {
    prompt_tokens = in.get<int64_t>("pyramidinfer: prompt tokens");
    if (prompt_tokens < -1 || prompt_tokens > tokens)
      in.corrupt("pyramidinfer scores cover " + std::to_string(prompt_tokens) +
                 " tokens; the layer holds " + std::to_string(tokens));
    const uint64_t want = ready() ? static_cast<uint64_t>(prompt_tokens) : 0;
    auto loaded =
        std::make_shared<std::vector<float>>(in.get_vector<float>("pyramidinfer scores", want));
    if (loaded->size() != want)
      in.corrupt("pyramidinfer has " + std::to_string(loaded->size()) + " scores; expected " +
                 std::to_string(want));
    check_attention_scores(in, *loaded, "pyramidinfer score");
    score = std::move(loaded);
  }
};

// r_j of the authors' cosine schedule.
double layer_ratio(int32_t j, const pq_config& c) {
  const double d = c.pyramidinfer_decay;
  return (1.0 - d) * (std::cos(M_PI * j / c.num_layers) + 1.0) / 2.0 + d;
}

class PyramidInferSelector final : public Selector, public LayerBudgets, public CrossLayerShares {
 public:
  const char* name() const override { return "pyramidinfer"; }
  const LayerBudgets* layer_budgets() const override { return this; }
  const CrossLayerShares* cross_layer_shares() const override { return this; }

  int64_t budget(int64_t k, int64_t middle, int32_t layer, const pq_config& c) const override {
    double f = 1.0, sum = 0.0, mine = 1.0;
    for (int32_t j = 0; j < c.num_layers; ++j) {
      if (j == layer) mine = f;
      sum += f;
      f *= layer_ratio(j, c);
    }
    const double want = static_cast<double>(k) * c.num_layers * mine / sum;
    return std::max<int64_t>(0, std::min<int64_t>(middle, std::llround(want)));
  }

  std::unique_ptr<SelectorState> make_state(const pq_config&, int32_t layer) const override {
    return std::make_unique<PyramidInferState>(layer);
  }
  StateCost state_cost(const pq_config& c) const override {
    // One score per token for the layer, not per kv head.
    return {sizeof(PyramidInferState),
            kGrowthRoom * static_cast<uint64_t>(KvStore::kChunkTokens) * sizeof(float)};
  }

  void observe_queries(SelectorState* state, const KvTier& store, const float* queries,
                       int64_t w, const pq_config& c) const override {
    PyramidInferState& s = state_of<PyramidInferState>(state, name());
    const int64_t P = store.tokens();
    check_window(w, P);
    const int32_t group = c.num_q_heads / c.num_kv_heads;
    std::vector<double> sum(static_cast<size_t>(P), 0.0);
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      for_each_window_row(store, queries, w, c, h, [&](int64_t r, const float* l, int64_t n) {
        const int64_t i = r / group;
        const double weight = w > 1 ? 1.0 + 0.2 * static_cast<double>(i) / (w - 1) : 1.0;
        add_softmax(l, n, weight, sum.data());
      });
    }
    const double norm = 1.0 / (static_cast<double>(w) * c.num_q_heads);
    auto score = std::make_shared<std::vector<float>>(static_cast<size_t>(P));
    for (int64_t t = 0; t < P; ++t)
      (*score)[static_cast<size_t>(t)] = static_cast<float>(sum[static_cast<size_t>(t)] * norm);
    s.score = std::move(score);
    s.prompt_tokens = P;
  }

  // Checks the state is this selector's. Layer l's own scores serve the
  // layer above (and layer 0 itself): whether the layers below have theirs
  // is checked at the select.
  void update_state(SelectorState* state, const KvTier&, int64_t, int64_t, int64_t,
                    const pq_config&) const override {
    (void)state_of<PyramidInferState>(state, name());
  }

  std::shared_ptr<LayerShare> layer_share(const SelectorState* state,
                                          const pq_config&) const override {
    const auto* s = dynamic_cast<const PyramidInferState*>(state);
    if (s == nullptr || !s->ready()) return nullptr;
    auto share = std::make_shared<LayerShare>();
    share->scores = s->score;  // the same vector, not a copy
    return share;
  }

  uint64_t select_layer(const LayerSelection& r, int32_t* out) const override {
    const pq_config& c = r.context.config;
    const int32_t layer = r.context.layer;
    if (r.layer_shares == nullptr || static_cast<int32_t>(r.layer_shares->size()) != c.num_layers)
      fail(PQ_ERR_INTERNAL, "pyramidinfer: the selection has no layer shares");
    const LayerShares& shares = *r.layer_shares;
    // Layer l is chosen by layers 0 .. l - 1 (layer 0 by itself).
    const int32_t choosers = std::max(layer, 1);
    std::string missing;
    for (int32_t j = 0; j < choosers; ++j)
      if (shares[static_cast<size_t>(j)] == nullptr)
        missing += (missing.empty() ? "" : ", ") + std::to_string(j);
    if (!missing.empty())
      fail(PQ_ERR_BAD_STATE,
           "layer " + std::to_string(layer) + ": the pyramidinfer selector keeps a subset of " +
               "what the layers below kept, by their prompt attention, and layers " + missing +
               " have no pq_prefill_queries yet; call it on every layer below (and on layer "
               "0) before pq_decode_select");
    const int64_t heads = r.context.kv_heads(), m = r.middle.size();
    ScratchLease lease(r.scratch);
    SelectScratch& scratch = *lease;
    std::vector<int32_t>& kept = scratch.candidates;  // K_j, ascending positions
    kept.resize(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i)
      kept[static_cast<size_t>(i)] = static_cast<int32_t>(r.middle.begin + i);
    std::vector<float>& buf = scratch.combined;
    std::vector<int32_t> chosen;
    // K_0 .. K_l again at every select, not layer l - 1's K taken over:
    // that would tie one layer's select to another's in the same step (its
    // order, its middle, a fork between them). The passes after the first
    // read k_j tokens each, so layer l's select reads about m + l k scores.
    for (int32_t j = 0; j <= layer; ++j) {
      const int64_t kj = std::min<int64_t>(budget(configured_k(c, m), m, j, c),
                                           static_cast<int64_t>(kept.size()));
      const LayerShare& by = *shares[static_cast<size_t>(j == 0 ? 0 : j - 1)];
      const std::vector<float>& scores = *by.scores;
      const int64_t n = static_cast<int64_t>(kept.size());
      const int64_t scored = static_cast<int64_t>(scores.size());
      buf.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const int32_t p = kept[static_cast<size_t>(i)];
        buf[static_cast<size_t>(i)] = p < scored ? scores[static_cast<size_t>(p)]
                                                 : std::numeric_limits<float>::infinity();
      }
      chosen.resize(static_cast<size_t>(kj));
      select_top_k(buf.data(), n, kj, 0, chosen.data(), scratch);
      for (int64_t i = 0; i < kj; ++i)
        kept[static_cast<size_t>(i)] = kept[static_cast<size_t>(chosen[static_cast<size_t>(i)])];
      kept.resize(static_cast<size_t>(kj));
    }
    if (static_cast<int64_t>(kept.size()) != r.k)
      fail(PQ_ERR_INTERNAL, "pyramidinfer: layer " + std::to_string(layer) + " kept " +
                                std::to_string(kept.size()) + " middle tokens; its budget is " +
                                std::to_string(r.k));
    for (int64_t h = 0; h < heads; ++h) std::copy(kept.begin(), kept.end(), out + h * r.k);
    return 0;  // the prompt keys were read once, at pq_prefill_queries
  }
};

}  // namespace

std::unique_ptr<Selector> make_pyramidinfer_selector() {
  return std::make_unique<PyramidInferSelector>();
}

}  // namespace pq
