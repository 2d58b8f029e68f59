// The PQ index of one (sequence, layer): centroids and per-token codes.
#pragma once

#include <cstdint>
#include <vector>

#include "kmeans.h"

namespace pq {

struct PqIndex {
  PqCodebook codebook;
  // codes[head]: token-major, subspaces bytes per token, for tokens
  // [0, coded_tokens).
  std::vector<std::vector<uint8_t>> codes;
  int64_t coded_tokens = 0;
  // tuple_counts[head][t]: how many of tokens [0, coded_tokens) have the
  // code tuple t; kept for small tuple spaces only (pq_tuple_select.h).
  std::vector<std::vector<uint32_t>> tuple_counts;
  int32_t iterations = 0;      // K-Means iterations the build ran
  int32_t budget = 0;          // iteration budget it was given
  int64_t training_points = 0;
  double seconds = 0.0;        // build wall time

  uint64_t bytes() const {
    uint64_t b = codebook.data.size() * sizeof(float);
    for (const auto& c : codes) b += c.capacity();
    for (const auto& t : tuple_counts) b += t.capacity() * sizeof(uint32_t);
    return b;
  }
};

}  // namespace pq
