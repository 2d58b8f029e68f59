// H2O, the heavy-hitter oracle (methods digest, section 3.1): each token's
// score is the attention it accumulated, fed by pq_observe_attention (the
// caller's probabilities over the tokens it attended to, summed over the GQA
// group), kept per kv head. A decode step takes the top k middle tokens by
// score (ties: the larger position) among those not dropped, and drops the
// middle tokens it leaves out for good: H2O evicts permanently, so a dropped
// token is never selected again and observing it later changes nothing (see
// attention_accumulator.h).
//
// Every pq_decode_select is an eviction step: selecting twice for the same
// token count with new observations in between may drop more tokens.
//
// Cold start: with no observation yet all scores are 0, and ties go to the
// larger position, so the first selection keeps the most recent middle
// tokens (a recency window). To seed H2O with the prompt's attention, pass
// pq_observe_attention a selection of the prompt tokens with their column
// sums before the first select.
//
// Bytes: the scores live in the state; a decode step reads no key (0).
#include "selectors/attention_accumulator.h"
#include "base/error.h"
#include "selectors/selection_request.h"
#include "selectors/selector.h"

namespace pq {

namespace {

struct H2oState final : CopyableState<H2oState> {
  explicit H2oState(int32_t kv_heads) : attention(kv_heads) {}
  AttentionAccumulator attention;
  void truncate(int64_t tokens) override { attention.truncate(tokens); }
  void save(ByteWriter& out) const override { attention.save(out); }
  void load(ByteReader& in, int64_t tokens, const pq_config&) override {
    attention.load(in, tokens);
  }
};

class H2oSelector final : public Selector {
 public:
  const char* name() const override { return "h2o"; }

  std::unique_ptr<SelectorState> make_state(const pq_config& c, int32_t) const override {
    return std::make_unique<H2oState>(c.num_kv_heads);
  }
  StateCost state_cost(const pq_config& c) const override {
    return {sizeof(H2oState), per_token_cost(c, AttentionAccumulator::kBytesPerToken)};
  }

  void update_state(SelectorState* state, const KvTier&, int64_t n, int64_t, int64_t,
                    const pq_config&) const override {
    state_of<H2oState>(state, "h2o").attention.grow(n);
  }

  void observe_attention(SelectorState* state, int32_t kv_head, const int32_t* positions,
                         const float* probs, int64_t count) const override {
    state_of<H2oState>(state, "h2o").attention.add(kv_head, positions, probs, count);
  }

  uint64_t select_middle(const SelectionRequest& r, int32_t* out) const override {
    state_of<H2oState>(r.state(), "h2o").attention.select_and_drop(r, r.mid_begin(), r.mid_end(), r.k(),
                                                                 out);
    return 0;
  }
};

}  // namespace

std::unique_ptr<Selector> make_h2o_selector() { return std::make_unique<H2oSelector>(); }

}  // namespace pq
