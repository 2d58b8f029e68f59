// Drop semantics, shared by the selectors that evict for good (H2O, SCOPE's
// decode side, Scissorhands): a selection keeps the k tokens of a range that
// score highest among those not dropped yet and drops every other token of
// the range, so a dropped token is never selected again.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "base/topk.h"
#include "selectors/selection_request.h"

namespace pq {

// The tokens an observation covers: one past its largest position (0 for
// none), what a per-token state grows to before it records the observation.
inline int64_t tokens_covered(const int32_t* positions, int64_t count) {
  int32_t top = -1;
  for (int64_t i = 0; i < count; ++i) top = positions[i] > top ? positions[i] : top;
  return static_cast<int64_t>(top) + 1;
}

// Writes k positions of [begin, end) into out, ascending: the tokens not
// dropped with the largest score(p) (ties: the larger position); marks
// every other token of the range dropped and calls forget(p) for each one
// newly dropped. Dropped tokens rank below every kept one (-inf, then by
// position), so should fewer than k be left the most recent dropped ones
// are revived. `dropped` covers at least [0, end).
template <class Score, class Forget>
void keep_top_k_and_drop(const SelectionRequest& r, int64_t begin, int64_t end, int64_t k,
                         Score score, std::vector<uint8_t>& dropped, int32_t* out,
                         Forget forget) {
  const int64_t m = end - begin;
  if (m <= 0) return;
  if (k > 0) {
    std::vector<float>& buf = r.scratch.combined;
    buf.resize(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) {
      const int64_t p = begin + i;
      buf[static_cast<size_t>(i)] =
          dropped[static_cast<size_t>(p)] ? -std::numeric_limits<float>::infinity() : score(p);
    }
    select_top_k(buf.data(), m, k, begin, out, r.scratch);
  }
  // out is ascending: one merge pass marks the rest of the range dropped.
  int64_t j = 0;
  for (int64_t p = begin; p < end; ++p) {
    uint8_t& d = dropped[static_cast<size_t>(p)];
    if (j < k && out[j] == p) {
      d = 0;  // kept (or revived)
      ++j;
    } else if (!d) {
      d = 1;
      forget(p);
    }
  }
}

}  // namespace pq
