// ZigZagKV (methods digest, section 5.3): SnapKV's static prompt scores
// (prompt_scores.h) with a budget shared across the layers of a sequence by
// how spread each layer's attention is.
//
// The rule follows the only implementation found, kvpress's unmerged
// ZigZagKVPress (NVIDIA/kvpress PR #238; docs/selector-references.md,
// section 6), which calls it the paper's equation 6:
//   MBA of a kv head   the fewest tokens whose top scores reach zigzag_mass
//                      (0.9) of the head's score mass: count(cumsum < mass *
//                      total) + 1, at most the tokens scored
//   LMBA_l             the mean MBA over the layer's kv heads
//   u_l                LMBA_l / sum over layers of LMBA
//   k_l                round(floor + (k - floor) * L * u_l), floor =
//                      zigzag_floor * k, clipped to [1, middle] (0 if k is 0)
// so the layers' budgets sum to L * k before rounding and clipping, as a
// uniform budget does, and a layer never gets less than the floor. Every
// kv head of layer l keeps its top k_l middle tokens by SnapKV's score.
//
// Where the library differs from the PR: MBA is measured over the scores of
// the prompt's middle (between the sinks and the local window), the tokens
// the budget governs; the PR measures the whole prompt, whose observation
// window it scores max + 1. Tokens generated after the prompt have no score
// and are kept first, as SNAPKV keeps them (the PR compresses the prompt
// only and keeps every generated token).
//
// Budgets depend on every layer's pq_prefill_queries: a select before all
// layers had theirs is PQ_ERR_BAD_STATE, naming the layers missing. A
// layer's LMBA is derived from its saved prompt scores, so a fork, truncate
// or restore carries it (nothing more is saved). The selection's capacity
// holds the largest share, min(middle, round(floor + (k - floor) * L)).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "selectors/layer_share.h"
#include "selectors/prompt_scores.h"
#include "selectors/selector_capabilities.h"

namespace pq {

namespace {

// A head's MBA over scores s[begin, end): the fewest top scores reaching
// `mass` of their sum (the PR's count of cumsum < threshold, plus one).
int64_t minimum_budget(const std::vector<float>& s, int64_t begin, int64_t end, double mass,
                       std::vector<float>& sorted) {
  const int64_t n = end - begin;
  if (n <= 0) return 0;
  sorted.assign(s.begin() + begin, s.begin() + end);
  std::sort(sorted.begin(), sorted.end(), [](float a, float b) { return a > b; });
  double total = 0.0;
  for (float v : sorted) total += std::max(0.0, static_cast<double>(v));
  const double threshold = mass * total;
  double sum = 0.0;
  int64_t below = 0;
  for (float v : sorted) {
    sum += std::max(0.0, static_cast<double>(v));
    if (!(sum < threshold)) break;
    ++below;
  }
  return std::min(n, below + 1);
}

class ZigZagKvSelector final : public PromptScoreSelector, public LayerBudgets,
                               public CrossLayerShares {
 public:
  const char* name() const override { return "zigzagkv"; }
  const LayerBudgets* layer_budgets() const override { return this; }
  const CrossLayerShares* cross_layer_shares() const override { return this; }

  // The layer's LMBA, over the middle of the prompt its scores cover.
  std::shared_ptr<LayerShare> layer_share(const SelectorState* state,
                                          const pq_config& c) const override {
    const auto* s = dynamic_cast<const PromptState*>(state);
    if (s == nullptr || !s->prompt.ready()) return nullptr;
    const int64_t P = s->prompt.prompt_tokens;
    const int64_t begin = std::min<int64_t>(c.sink_tokens, P);
    const int64_t end = std::max(begin, P - static_cast<int64_t>(c.local_tokens));
    std::vector<float> sorted;
    double sum = 0.0;
    for (const std::vector<float>& head : s->prompt.score)
      sum += static_cast<double>(minimum_budget(head, begin, end, c.zigzag_mass, sorted));
    auto share = std::make_shared<LayerShare>();
    share->weight =
        s->prompt.score.empty() ? 0.0 : sum / static_cast<double>(s->prompt.score.size());
    return share;
  }

  int64_t head_capacity(int64_t k, int64_t middle, const pq_config& c) const override {
    return std::min(middle, share(k, 1.0, c));
  }

  uint64_t select_layer(const LayerSelection& r, int32_t* out) const override {
    PromptState& s = state_of<PromptState>(r.state, name());
    if (!s.prompt.ready()) fail_needs_prefill_queries(name(), r.context.layer);
    const int32_t layers = r.context.config.num_layers;
    if (r.layer_shares == nullptr || static_cast<int32_t>(r.layer_shares->size()) != layers)
      fail(PQ_ERR_INTERNAL, "zigzagkv: the selection has no layer shares");
    const LayerShares& shares = *r.layer_shares;
    std::string missing;
    double total = 0.0;
    for (int32_t l = 0; l < layers; ++l) {
      if (shares[l] == nullptr) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(l);
      } else {
        total += shares[l]->weight;
      }
    }
    if (!missing.empty())
      fail(PQ_ERR_BAD_STATE,
           "layer " + std::to_string(r.context.layer) +
               ": the zigzagkv selector shares the budget across layers by each layer's "
               "prompt attention, and layers " + missing +
               " have no pq_prefill_queries yet; call it on every layer before "
               "pq_decode_select");
    const int64_t heads = r.context.kv_heads(), m = r.middle.size();
    const double u = total > 0.0 ? shares[r.context.layer]->weight / total
                                 : 1.0 / static_cast<double>(layers);
    int64_t k = std::min(share(r.k_mean, u, r.context.config), m);
    if (r.k_mean > 0) k = std::max<int64_t>(k, std::min<int64_t>(1, m));
    if (k > r.k)
      fail(PQ_ERR_INTERNAL, "zigzagkv: layer " + std::to_string(r.context.layer) + " takes " +
                                std::to_string(k) + " middle tokens; its capacity is " +
                                std::to_string(r.k));
    std::fill(r.head_counts, r.head_counts + heads, static_cast<int32_t>(k));
    r.for_each_head([&](int64_t h) {
      ScratchLease lease(r.scratch);
      const SelectionRequest head = r.head(static_cast<int32_t>(h), *lease);
      s.prompt.select(head, r.middle.begin, r.middle.end, k, out + h * r.k);
    });
    return 0;  // the prompt keys were read once, at pq_prefill_queries
  }

 private:
  // round(floor + (k - floor) * L * u), floor = zigzag_floor * k.
  static int64_t share(int64_t k, double u, const pq_config& c) {
    const double mean = static_cast<double>(k);
    const double floor = static_cast<double>(c.zigzag_floor) * mean;
    const double want = floor + (mean - floor) * static_cast<double>(c.num_layers) * u;
    return std::max<int64_t>(0, static_cast<int64_t>(std::llround(want)));
  }
};

}  // namespace

std::unique_ptr<Selector> make_zigzagkv_selector() { return std::make_unique<ZigZagKvSelector>(); }

}  // namespace pq
