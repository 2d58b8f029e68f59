// Accumulated attention with drop semantics (H2O, section 3.1 of the methods
// digest), shared by H2O and SCOPE's decode side.
//
// Per kv head, every token has a score: the sum of the probabilities
// pq_observe_attention reported for it (the caller sums over the group's
// query heads). Any stored token may be observed, sinks and local tokens
// included, so a token that leaves the local window enters the middle with
// the mass it gathered while it was local.
//
// Drop: a middle token that a selection leaves out is dropped for good. It
// is never selected again, and later observations of it (through a
// selection the caller built by hand) are ignored: they neither add to its
// score nor revive it (H2O sets an evicted token's attention to 0 for all
// later steps). With the core's budgets the tokens not dropped always cover
// k (the middle grows by the tokens that leave the local window, and k grows
// by at most as many); should they not, the most recent dropped tokens are
// revived to return exactly k.
//
// Cold start: before any observation every score is 0, and ties go to the
// larger position, so the most recent middle tokens are kept.
//
// Saturation: a score stops at FLT_MAX (saturating_add). Any finite
// probability >= 0 is accepted, so two of 3e38 would sum to +inf, which a
// saved state cannot hold (the loader refuses it as corrupt): what the
// library saves it must restore. Tokens at FLT_MAX tie (the larger position
// wins), which only observations near the float's limit can cause.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "base/cut_to.h"
#include "selectors/drop_selection.h"
#include "selectors/selection_request.h"
#include "selectors/selector.h"
#include "format/state_io.h"

namespace pq {

// score + p (both finite, >= 0), at most FLT_MAX.
inline float saturating_add(float score, float p) {
  return std::min(score + p, std::numeric_limits<float>::max());
}

struct AttentionAccumulator {
  explicit AttentionAccumulator(int32_t kv_heads)
      : score(static_cast<size_t>(kv_heads)), dropped(static_cast<size_t>(kv_heads)) {}

  static constexpr uint64_t kBytesPerToken = sizeof(float) + sizeof(uint8_t);  // per kv head
  std::vector<std::vector<float>> score;      // [kv_head][token]
  std::vector<std::vector<uint8_t>> dropped;  // [kv_head][token]: 1 = dropped for good

  // Makes room for n tokens in every head (new tokens: score 0, kept).
  void grow(int64_t n) {
    for (size_t h = 0; h < score.size(); ++h) grow_head(h, n);
  }

  void add(int32_t kv_head, const int32_t* positions, const float* probs, int64_t count) {
    if (count <= 0) return;
    const size_t h = static_cast<size_t>(kv_head);
    grow_head(h, tokens_covered(positions, count));
    std::vector<float>& s = score[h];
    const std::vector<uint8_t>& d = dropped[h];
    for (int64_t i = 0; i < count; ++i) {
      const size_t p = static_cast<size_t>(positions[i]);
      if (!d[p]) s[p] = saturating_add(s[p], probs[i]);
    }
  }

  // Tokens of [begin, end) of kv_head that are not dropped.
  int64_t available(int32_t kv_head, int64_t begin, int64_t end) {
    const size_t h = static_cast<size_t>(kv_head);
    grow_head(h, end);
    const std::vector<uint8_t>& d = dropped[h];
    int64_t n = 0;
    for (int64_t p = begin; p < end; ++p) n += d[static_cast<size_t>(p)] == 0;
    return n;
  }

  // Writes k positions of [begin, end) into out, ascending: the tokens not
  // dropped with the largest scores (ties: the larger position). Every other
  // token of the range is dropped. Touches only kv_head's arrays, so kv
  // heads may run in parallel (after grow() for the store's length).
  void select_and_drop(const SelectionRequest& r, int64_t begin, int64_t end, int64_t k,
                       int32_t* out) {
    const size_t h = static_cast<size_t>(r.kv_head);
    grow_head(h, end);
    std::vector<float>& s = score[h];
    keep_top_k_and_drop(
        r, begin, end, k, [&](int64_t p) { return s[static_cast<size_t>(p)]; }, dropped[h], out,
        [&](int64_t p) { s[static_cast<size_t>(p)] = 0.f; });
  }

  // Sequence state (SelectorState's calls).
  void truncate(int64_t tokens) {
    for (size_t h = 0; h < score.size(); ++h)
      if (static_cast<int64_t>(score[h].size()) > tokens) {
        cut_to(score[h], static_cast<size_t>(tokens));
        cut_to(dropped[h], static_cast<size_t>(tokens));
      }
  }
  void save(ByteWriter& out) const {
    out.put<uint32_t>(static_cast<uint32_t>(score.size()));
    for (size_t h = 0; h < score.size(); ++h) {
      out.put_vector(score[h]);
      out.put_vector(dropped[h]);
    }
  }
  void load(ByteReader& in, int64_t tokens) {
    const uint32_t heads = in.get<uint32_t>("accumulated attention: kv heads");
    if (heads != score.size())
      in.corrupt("accumulated attention has " + std::to_string(heads) + " kv heads; expected " +
                 std::to_string(score.size()));
    for (size_t h = 0; h < score.size(); ++h) {
      score[h] = in.get_vector<float>("accumulated attention: scores", static_cast<uint64_t>(tokens));
      dropped[h] = in.get_vector<uint8_t>("accumulated attention: drop marks", score[h].size());
      if (dropped[h].size() != score[h].size())
        in.corrupt("accumulated attention of kv head " + std::to_string(h) + " has " +
                   std::to_string(score[h].size()) + " scores but " +
                   std::to_string(dropped[h].size()) + " drop marks");
      for (size_t p = 0; p < score[h].size(); ++p)
        if (!(score[h][p] >= 0.f && score[h][p] < std::numeric_limits<float>::infinity()) ||
            dropped[h][p] > 1)
          in.corrupt("accumulated attention of kv head " + std::to_string(h) + ", token " +
                     std::to_string(p) + ": not a finite non-negative score with a 0/1 mark");
    }
  }

 private:
  void grow_head(size_t h, int64_t n) {
    if (static_cast<int64_t>(score[h].size()) < n) {
      score[h].resize(static_cast<size_t>(n), 0.f);
      dropped[h].resize(static_cast<size_t>(n), 0);
    }
  }
};

}  // namespace pq
