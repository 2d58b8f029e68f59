// What the host memory limit counts for one (sequence, layer) of a
// configuration (pq_config.host_memory_limit in pqcache.h says it to
// callers): fixed state, held from pq_sequence_add until the sequence is
// freed, and state that grows with the tokens, counted per K/V chunk of
// KvStore::kChunkTokens tokens and held from the prefill or append that
// opens the chunk. Upper bounds: a caller that stays under the limit cannot
// make the library hold more than it in these kinds of state. Working
// memory of a call or a build (K-Means sample, scores of one selection) is
// transient and not counted.
#pragma once

#include <cstdint>
#include <string>

#include "pqcache.h"
#include "selectors/selector.h"

namespace pq {

struct MemoryCost {
  uint64_t layer_fixed = 0;  // per (sequence, layer): layer, selector state, index, cache slots
  uint64_t cache_fixed = 0;  // of which the block cache's slots
  uint64_t chunk = 0;        // per chunk of a layer: K/V, codes, selector and cache state
  uint64_t chunk_kv = 0;     // of which K and V

  // Fixed state of one sequence (every layer), saturating at UINT64_MAX.
  uint64_t sequence_fixed(int32_t layers) const;
  // A sentence saying how one sequence's fixed state adds up, for messages.
  std::string explain(const pq_config& c) const;
};

MemoryCost memory_cost(const pq_config& c, const Selector& selector);

}  // namespace pq
