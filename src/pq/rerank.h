// Exact re-ranking of PQ's candidates (config.pq_rerank): how many the
// codes pick, one rule for the host selector and the device step, so that
// both re-rank the same candidates.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace pq {

// The candidates per kv head the codes pick for k selected tokens:
// ceil((1 + rerank) * k), at most the middle; k without re-ranking.
inline int64_t rerank_candidates(float rerank, int64_t k, int64_t middle) {
  if (!(rerank > 0.f) || k == 0) return k;
  const double wide = std::ceil((1.0 + static_cast<double>(rerank)) * static_cast<double>(k));
  return std::min<int64_t>(middle, static_cast<int64_t>(wide));
}

}  // namespace pq
