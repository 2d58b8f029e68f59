// The caller's paged key pool (pq_paged_keys) as the library reads it: a
// checked map from sequence positions to the pool's slots, the dense copy
// of a run of positions an append takes, and a read-only tier over the
// pool for what reads exact keys at a select of an index-only layer
// (re-ranking): there the engine's pool is the tier behind the seam.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "pqcache.h"
#include "store/kv_tier.h"

namespace pq {

class PoolKeys {
 public:
  // Checks the descriptor (copied) against the config's geometry: the pool
  // tensor, the map's form and sizes. `what` names it in messages
  // ("keys"). Slots are checked as they are read.
  PoolKeys(const pq_paged_keys& keys, const pq_config& c, const char* what);

  // The slot of sequence position p; PQ_ERR_INVALID_ARGUMENT when the map
  // does not cover p or points outside the pool.
  int64_t slot(int64_t p) const;
  // The keys of positions [first, first + count) as a dense token-major
  // tensor whose data is `buffer` (resized), every slot checked first.
  pq_tensor gather(int64_t first, int64_t count, std::vector<uint8_t>& buffer) const;
  // The key row of (position p, kv head h) in the pool.
  const uint8_t* row(int64_t p, int32_t h) const;
  const pq_paged_keys& keys() const { return keys_; }

 private:
  pq_paged_keys keys_;
  const char* what_;
  size_t element_size_;
  int64_t blocks_in_pool_ = 0;
};

// A tier that reads the keys of `tokens` positions from the pool, for the
// length of one call; it holds nothing and writes nothing. `layer` lends it
// its fp8 scales.
std::unique_ptr<KvTier> pool_key_reader(const PoolKeys& pool, int64_t tokens,
                                        const KvTier& layer);

}  // namespace pq
