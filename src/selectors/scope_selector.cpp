// SCOPE, decoupled prefill and decode budgets (methods digest, section 8).
// The middle budget k splits into
//   k_dec = round(scope_decode_share * k)   (half away from zero)
//   k_pre = k - k_dec
// k_pre goes to prompt tokens, scored once as SnapKV does (static scores
// from the observation window, prompt_scores.h; needs pq_prefill_queries),
// k_dec to decode tokens, scored by accumulated attention as H2O does
// (attention_accumulator.h; fed by pq_observe_attention). If one side has
// fewer middle tokens than its budget, the other side gets the rest, so the
// step still returns exactly k tokens.
//
// Prompt vs decode: the prompt is the tokens stored when pq_prefill_queries
// was last called on the layer (P); positions >= P are decode tokens (those
// pq_decode_append added, or a later prompt turn that was not rescored).
// Calling pq_prefill_queries again rescores every stored token and moves P.
//
// As in SCOPE, the prompt side is static (Phi_p is never touched during
// decode: its top k_pre is recomputed from fixed scores, so it only changes
// when k_pre does) and the decode side evicts: a decode middle token left
// out of a selection is dropped for good, as in H2O. Decode tokens start at
// score 0, so without observations the most recent ones are kept.
//
// Selecting before any pq_prefill_queries call on the layer is
// PQ_ERR_BAD_STATE. Bytes: 0 per step (no key is read at decode).
#include <algorithm>
#include <cmath>

#include "selectors/attention_accumulator.h"
#include "base/error.h"
#include "selectors/prompt_scores.h"

namespace pq {

namespace {

struct ScopeState final : CopyableState<ScopeState> {
  ScopeState(int32_t kv_heads, int32_t l) : layer(l), attention(kv_heads) {}
  int32_t layer;
  PromptScores prompt;
  AttentionAccumulator attention;
  void truncate(int64_t tokens) override {
    prompt.truncate(tokens);
    attention.truncate(tokens);
  }
  void save(ByteWriter& out) const override {
    prompt.save(out);
    attention.save(out);
  }
  void load(ByteReader& in, int64_t tokens, const pq_config& c) override {
    prompt.load(in, tokens, c.num_kv_heads);
    attention.load(in, tokens);
  }
};

class ScopeSelector final : public Selector {
 public:
  const char* name() const override { return "scope"; }

  std::unique_ptr<SelectorState> make_state(const pq_config& c, int32_t layer) const override {
    return std::make_unique<ScopeState>(c.num_kv_heads, layer);
  }
  StateCost state_cost(const pq_config& c) const override {
    return {sizeof(ScopeState), per_token_cost(c, AttentionAccumulator::kBytesPerToken +
                                                      PromptScores::kBytesPerToken)};
  }

  void observe_queries(SelectorState* state, const KvTier& store, const float* queries,
                       int64_t w, const pq_config& c) const override {
    state_of<ScopeState>(state, "scope").prompt.compute(store, queries, w, c);
  }

  // Runs before the core writes any output (see PromptScoreSelector).
  void update_state(SelectorState* state, const KvTier&, int64_t n, int64_t, int64_t,
                    const pq_config&) const override {
    ScopeState& s = state_of<ScopeState>(state, "scope");
    if (!s.prompt.ready()) fail_needs_prefill_queries(name(), s.layer);
    s.attention.grow(n);
  }

  void observe_attention(SelectorState* state, int32_t kv_head, const int32_t* positions,
                         const float* probs, int64_t count) const override {
    state_of<ScopeState>(state, "scope").attention.add(kv_head, positions, probs, count);
  }

  uint64_t select_middle(const SelectionRequest& r, int32_t* out) const override {
    ScopeState* s = &state_of<ScopeState>(r.state(), "scope");
    if (!s->prompt.ready()) fail_needs_prefill_queries(name(), r.layer_index());
    const int64_t k = r.k();
    // Prompt middle: [mid_begin, split); decode middle: [split, mid_end).
    const int64_t split = std::clamp(s->prompt.prompt_tokens, r.mid_begin(), r.mid_end());
    const int64_t n_pre = split - r.mid_begin();
    const int64_t n_dec = s->attention.available(r.kv_head, split, r.mid_end());
    int64_t k_dec = static_cast<int64_t>(
        std::llround(static_cast<double>(r.config().scope_decode_share) * static_cast<double>(k)));
    k_dec = std::clamp<int64_t>(k_dec, 0, k);
    int64_t k_pre = k - k_dec;
    if (k_pre > n_pre) {  // short prompt side: decode takes the rest
      k_pre = n_pre;
      k_dec = k - k_pre;
    } else if (k_dec > n_dec) {  // short decode side: prompt takes the rest
      k_dec = n_dec;
      k_pre = std::min(n_pre, k - k_dec);
      k_dec = k - k_pre;  // both short (not with the core's budgets): revive
    }
    s->prompt.select(r, r.mid_begin(), split, k_pre, out);
    s->attention.select_and_drop(r, split, r.mid_end(), k_dec, out + k_pre);
    return 0;
  }
};

}  // namespace

std::unique_ptr<Selector> make_scope_selector() { return std::make_unique<ScopeSelector>(); }

}  // namespace pq
