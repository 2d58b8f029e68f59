// SnapKV (methods digest, section 4.2): prompt tokens are scored once, at
// pq_prefill_queries, by the attention the last observation_window prompt
// queries pay them (softmax per query head, summed over the window and the
// GQA group, then pooled as config.pooling says with kernel pooling_kernel
// over the tokens before the window only, as the official code and kvpress;
// see prompt_scores.h). Each decode step takes the top k middle tokens by that
// static score (ties: the larger position). Tokens stored after the scoring
// (generated tokens that left the local window, or a later prompt turn that
// was not rescored) have no prompt score: SnapKV keeps every generated
// token, so they rank +infinity and take the budget first (the most recent
// first if they alone exceed it).
//
// Selecting before any pq_prefill_queries call on the layer is
// PQ_ERR_BAD_STATE. SnapKV also keeps the window tokens themselves; here
// they are the last prompt tokens, inside the local window whenever
// local_tokens >= observation_window (the defaults: 128 and 32); otherwise
// those in the middle compete by their scores, pooled among themselves.
//
// Bytes: the scoring reads every prompt key once at pq_prefill_queries; a
// decode step reads no key and reports 0.
#include "selectors/prompt_scores.h"

namespace pq {

namespace {

class SnapKvSelector final : public PromptScoreSelector {
 public:
  const char* name() const override { return "snapkv"; }
};

}  // namespace

std::unique_ptr<Selector> make_snapkv_selector() { return std::make_unique<SnapKvSelector>(); }

}  // namespace pq
