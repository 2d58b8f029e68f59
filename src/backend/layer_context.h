// What the work of one layer of one sequence runs against, the same for
// every kv head: the context's configuration, the layer, its device state
// and the sequence's stream. The head shape, the GQA grouping and combine
// are read from the configuration, never passed again beside it.
#pragma once

#include <cmath>
#include <cstdint>

#include "pqcache.h"

namespace pq {

class DeviceLayer;
class ThreadPool;

// The token positions [begin, end).
struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Built by name: LayerContext ctx{config}; ctx.layer = ...;
struct LayerContext {
  const pq_config& config;           // the context's resolved configuration
  int32_t layer = 0;
  DeviceLayer* device = nullptr;     // the layer's device state (CUDA); may be null
  uint64_t index_generation = 0;     // changes when the layer's index is rebuilt
  void* stream = nullptr;            // the sequence's CUDA stream, or null
  ThreadPool* pool = nullptr;        // spreads a large layer's heads; may be null

  int32_t kv_heads() const { return config.num_kv_heads; }
  int32_t group_size() const { return config.num_q_heads / config.num_kv_heads; }  // GQA
  int32_t head_dim() const { return config.head_dim; }
  int32_t dtype() const { return config.dtype; }  // of the stored K/V
  int32_t combine() const { return config.gqa_combine; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(config.head_dim)); }
};

}  // namespace pq
