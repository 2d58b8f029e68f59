// Exact re-ranking of PQ's candidates (config.pq_rerank): how many the
// codes pick, one rule for the host selector and the device step, so that
// both re-rank the same candidates.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace pq {

// The candidates per kv head the codes pick for k selected tokens:
// ceil((1 + rerank) * k), at most the middle; k without re-ranking.
inline int64_t rerank_candidates(float rerank, int64_t k, int64_t middle) {
  if (!(rerank > 0.f) || k == 0) return k;
  const double wide = std::ceil((1.0 + static_cast<double>(rerank)) * static_cast<double>(k));
  return std::min<int64_t>(middle, static_cast<int64_t>(wide));
}

// Why a device select refuses config.pq_rerank in an index-only context
// (PQ_KV_TIER_CALLER): the exact keys are in the caller's pool, which the
// device calls are not given; the host's multi-token select takes them.
inline std::string index_only_rerank_refusal() {
  return "config.pq_rerank re-ranks by exact keys, and this context is index-only "
         "(config.kv_tier PQ_KV_TIER_CALLER): the keys are in your pool, which the device "
         "select is not given; select on the host with pq_decode_select_multi, passing the "
         "pool as its keys (pq_paged_keys), or set pq_rerank to 0";
}

}  // namespace pq
