// Block-granular selection shared by InfLLM and Quest: both score aligned
// blocks of block_tokens tokens and take whole blocks, best first.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "selectors/selection_request.h"
#include "selectors/selector.h"

namespace pq {

// Blocks of B tokens aligned to absolute positions that hold part of the
// middle [mid_begin, mid_end).
inline int64_t block_count(int64_t mid_begin, int64_t mid_end, int32_t B) {
  return mid_end > mid_begin ? (mid_end - 1) / B - mid_begin / B + 1 : 0;
}

// Which middle the per-block summaries of InfLLM and Quest cover, and with
// which settings: they are extended as tokens join the middle and rebuilt
// when the middle moves or the settings change.
struct BlockCoverage {
  int32_t block_tokens = 0;
  int32_t representatives = 0;  // InfLLM's; 0 for Quest
  int64_t mid_begin = -1;
  int64_t covered_end = -1;

  // Returns true (and starts over, covering nothing) when the summaries
  // cannot be extended to [mid_begin, mid_end) with these settings.
  bool restart_if_stale(int64_t begin, int64_t end, int32_t B, int32_t R) {
    if (mid_begin == begin && block_tokens == B && representatives == R && covered_end <= end)
      return false;
    mid_begin = begin;
    covered_end = begin;
    block_tokens = B;
    representatives = R;
    return true;
  }
  // Sequence state: summaries are derived from the stored keys, so they are
  // rebuilt (on the next selection) rather than cut, copied or saved.
  void forget() {
    mid_begin = -1;
    covered_end = -1;
  }
  bool covers(int64_t begin, int64_t end) const {
    return mid_begin == begin && covered_end == end;
  }
};

// Takes whole blocks of the middle in the order of `score` (descending, ties:
// the later block) until r.k() tokens are taken; the last one is cut to its
// highest positions. Writes the positions ascending.
inline void take_blocks(const SelectionRequest& r, int32_t B, const float* score, int64_t nb,
                 int32_t* out) {
  std::vector<int64_t> order(static_cast<size_t>(nb));
  for (int64_t j = 0; j < nb; ++j) order[static_cast<size_t>(j)] = j;
  auto key = [score](int64_t j) {
    float s = score[j];
    return std::isnan(s) ? -std::numeric_limits<float>::infinity() : s;
  };
  std::sort(order.begin(), order.end(), [&key](int64_t a, int64_t b) {
    float sa = key(a), sb = key(b);
    return sa != sb ? sa > sb : a > b;
  });
  const int64_t first_block = r.mid_begin() / B;
  auto block_begin = [&](int64_t j) { return std::max((first_block + j) * B, r.mid_begin()); };
  auto block_end = [&](int64_t j) { return std::min((first_block + j + 1) * B, r.mid_end()); };
  std::vector<int64_t> taken(static_cast<size_t>(nb), 0);
  int64_t left = r.k();
  for (int64_t j : order) {
    if (left == 0) break;
    int64_t t = std::min(left, block_end(j) - block_begin(j));
    taken[static_cast<size_t>(j)] = t;
    left -= t;
  }
  int64_t w = 0;
  for (int64_t j = 0; j < nb; ++j)
    for (int64_t p = block_end(j) - taken[static_cast<size_t>(j)]; p < block_end(j); ++p)
      out[w++] = static_cast<int32_t>(p);
}

}  // namespace pq
