#include "layer/memory_cost.h"

#include <limits>

#include "store/block_cache.h"
#include "base/dtype.h"
#include "store/kv_store.h"
#include "layer/layer.h"

namespace pq {

namespace {
// A layer's objects beyond sizeof(Layer): the store's chunk list, mutexes'
// and vectors' heap parts, the selector state's allocation. Generous.
constexpr uint64_t kLayerOverhead = 1024;
// Per kv head, the selector state's per-head vectors: up to 4 vectors of
// 24 bytes in the state, each allocation with the allocator's 16-byte
// header (Scissorhands, the largest, keeps 3 per head plus a step count;
// PQ 2 code columns and tuple counts). Measured at 48-88 bytes per head.
constexpr uint64_t kPerKvHeadOverhead = 4 * (24 + 16) + 32;
// What the allocator adds to each of a chunk's two K/V blocks: a page, for
// blocks large enough to be mapped on their own (glibc's mmap threshold).
constexpr uint64_t kAllocationOverhead = 4096;

uint64_t saturating_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<uint64_t>::max() : r;
}
}  // namespace

MemoryCost memory_cost(const pq_config& c, const Selector& selector) {
  MemoryCost m;
  const StateCost state = selector.state_cost(c);
  if (c.cache_tokens > 0 && c.cache_tokens >= c.cache_block_tokens) {
    const uint64_t slots = static_cast<uint64_t>(c.cache_tokens / c.cache_block_tokens);
    m.cache_fixed = sizeof(BlockCache) + saturating_mul(slots, BlockCache::kSlotBytes);
  }
  m.layer_fixed = sizeof(Layer) + kLayerOverhead +
                  kPerKvHeadOverhead * static_cast<uint64_t>(c.num_kv_heads) + state.per_layer +
                  m.cache_fixed;
  m.chunk_kv = 2 * (static_cast<uint64_t>(KvStore::kChunkTokens) * c.num_kv_heads * c.head_dim *
                        dtype_size(c.dtype) +
                    kAllocationOverhead);
  m.chunk = m.chunk_kv + state.per_chunk;
  if (c.cache_tokens > 0)  // the block map and fetch counts grow with the tokens
    m.chunk += kGrowthRoom * blocks_per_chunk(c.cache_block_tokens) * BlockCache::kBlockBytes;
  return m;
}

uint64_t MemoryCost::sequence_fixed(int32_t layers) const {
  return saturating_mul(layer_fixed, static_cast<uint64_t>(layers));
}

std::string MemoryCost::explain(const pq_config& c) const {
  std::string s = "num_layers " + std::to_string(c.num_layers) + " x " +
                  std::to_string(layer_fixed) + " bytes per layer";
  if (cache_fixed > 0)
    s += ", of which " + std::to_string(cache_fixed) + " are the block cache's " +
         std::to_string(c.cache_tokens / c.cache_block_tokens) +
         " slots (cache_tokens / cache_block_tokens)";
  return s;
}

}  // namespace pq
