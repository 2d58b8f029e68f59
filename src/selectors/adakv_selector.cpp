// AdaKV (methods digest, section 5.5): head-wise adaptive budgets. The kv
// heads of a layer share its budget (k per head on average): the tokens
// kept are the layer's top k * kv_heads by score over all heads, so a head
// whose attention is spread keeps more and a focused one fewer; a safeguard
// keeps each head's own top floor(adakv_safeguard * k) first.
//
// The rule follows kvpress's AdaKVPress (NVIDIA/kvpress,
// kvpress/presses/adakv_press.py at 8bb29b9, endorsed by the AdaKV authors'
// README) over SnapKV's scores, which the library computes as kvpress's
// SnapKVPress does where the settings align (prompt_scores.h): each head's
// top n_safe scores are raised above every score, then the top
// kv_heads * k of all heads' middle scores are kept (ties: the later head,
// then the larger position). Tokens stored after the scoring (generated
// ones) have no score: every head keeps them first, as in SnapKV, and once
// they reach k every head keeps the latest k of them (no score tells heads
// apart, so none takes another's share).
// The authors' own code (FFY0/AdaKV) blends a proportional share with a
// floor instead; docs/selector-references.md compares the two.
//
// A head takes at most kv_heads * k - (kv_heads - 1) * n_safe middle tokens
// (the others keep their safeguard only), which sizes the selection; each
// head's count is its own (pq_selection.counts).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/topk.h"
#include "selectors/prompt_scores.h"
#include "selectors/selector_capabilities.h"

namespace pq {

namespace {

class AdaKvSelector final : public PromptScoreSelector, public LayerBudgets {
 public:
  const char* name() const override { return "adakv"; }
  const LayerBudgets* layer_budgets() const override { return this; }

  int64_t head_capacity(int64_t k, int64_t middle, const pq_config& c) const override {
    const int64_t heads = c.num_kv_heads;
    return std::min(middle, heads * k - (heads - 1) * protected_tokens(k, c));
  }

  uint64_t select_layer(const LayerSelection& r, int32_t* out) const override {
    PromptState& s = state_of<PromptState>(r.state, name());
    if (!s.prompt.ready()) fail_needs_prefill_queries(name(), r.context.layer);
    const int64_t heads = r.context.kv_heads(), begin = r.middle.begin, m = r.middle.size();
    const int64_t k = r.k_mean;
    if (k <= 0 || m <= 0) {
      std::fill(r.head_counts, r.head_counts + heads, 0);
      return 0;
    }
    if (heads * m > std::numeric_limits<int32_t>::max())
      fail(PQ_ERR_UNSUPPORTED, "adakv: " + std::to_string(heads) + " kv heads x " +
                                   std::to_string(m) + " middle tokens exceed 2^31 candidates");
    const int64_t scored = std::max(begin, std::min(r.middle.end, s.prompt.prompt_tokens));
    const int64_t generated = r.middle.end - scored;  // at the middle's end
    std::fill(r.head_counts, r.head_counts + heads, 0);
    if (generated >= k) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t p = r.middle.end - k; p < r.middle.end; ++p)
          out[h * r.k + r.head_counts[h]++] = static_cast<int32_t>(p);
      }
      return 0;
    }
    ScratchLease lease(r.scratch);
    SelectScratch& scratch = *lease;
    // All heads' middle scores, one run per head: entry h * m + i is token
    // begin + i of head h (in the lease's buffers, reused across selects).
    // +infinity is kept for the tokens every head must keep (generated ones,
    // then each head's safeguard): a score that overflowed to infinity or is
    // NaN must not tie with them, or a head could take more than its capacity.
    constexpr float kKept = std::numeric_limits<float>::infinity();
    std::vector<float>& scores = scratch.raw;
    scores.resize(static_cast<size_t>(heads * m));
    for (int64_t h = 0; h < heads; ++h) {
      const std::vector<float>& head = s.prompt.score[static_cast<size_t>(h)];
      float* row = scores.data() + h * m;
      for (int64_t i = 0; i < m; ++i) {
        if (begin + i >= scored) {
          row[i] = kKept;
          continue;
        }
        const float v = head[static_cast<size_t>(begin + i)];
        row[i] = std::isnan(v) ? -kKept : std::min(v, std::numeric_limits<float>::max());
      }
    }
    // The safeguard: each head's own top n_safe first (its generated tokens
    // among them, as they rank highest).
    const int64_t safe = std::min(m, protected_tokens(k, r.context.config));
    if (safe > 0) {
      std::vector<int32_t> top(static_cast<size_t>(safe));
      for (int64_t h = 0; h < heads; ++h) {
        float* row = scores.data() + h * m;
        select_top_k(row, m, safe, 0, top.data(), scratch);
        for (int32_t i : top) row[i] = kKept;
      }
    }
    // The layer's top k * heads: every kept token (heads * max(generated,
    // safe) <= heads * k of them) and the best of the rest, so one head takes
    // at most heads * k - (heads - 1) * safe = head_capacity.
    const int64_t kept = std::min(heads * m, heads * k);
    std::vector<int32_t>& chosen = scratch.candidates;
    chosen.resize(static_cast<size_t>(kept));
    select_top_k(scores.data(), heads * m, kept, 0, chosen.data(), scratch);
    // chosen is ascending: head by head, positions ascending within each.
    for (int32_t e : chosen) {
      const int64_t h = e / m;
      if (r.head_counts[h] >= r.k)
        fail(PQ_ERR_INTERNAL, "adakv: kv head " + std::to_string(h) + " would take more than " +
                                  std::to_string(r.k) + " middle tokens");
      out[h * r.k + r.head_counts[h]++] = static_cast<int32_t>(begin + e % m);
    }
    return 0;  // the prompt keys were read once, at pq_prefill_queries
  }

 private:
  // floor(adakv_safeguard * k), forgiving the float of the share (0.7f * 10
  // is a hair under 7).
  static int64_t protected_tokens(int64_t k, const pq_config& c) {
    return std::min(k, static_cast<int64_t>(std::floor(static_cast<double>(c.adakv_safeguard) *
                                                       static_cast<double>(k) * (1.0 + 1e-6))));
  }
};

}  // namespace

std::unique_ptr<Selector> make_adakv_selector() { return std::make_unique<AdaKvSelector>(); }

}  // namespace pq
