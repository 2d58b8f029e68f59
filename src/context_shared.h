// What every layer of a context shares: the resolved configuration and what
// follows from it, the backend, the selector, the memory budget and its
// costs, the counters, the selection scratch, the K-Means time model and
// the worker pool. The Context owns it; the layers hold a reference, valid
// as long as any call on them runs (pq_destroy must not race with calls).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "adaptive_budget.h"
#include "backend.h"
#include "counters.h"
#include "memory_budget.h"
#include "memory_cost.h"
#include "pqcache.h"
#include "scratch.h"
#include "selectors/selector.h"
#include "thread_pool.h"

namespace pq {

// Positions of the three regions of a layer of n tokens.
struct Regions {
  int64_t sink_end;    // sinks are [0, sink_end)
  int64_t mid_end;     // middle is [sink_end, mid_end), local is [mid_end, n)
  int64_t n;
  int64_t k;           // middle tokens to select
  int64_t count() const { return sink_end + k + (n - mid_end); }
};

struct ContextShared {
  // plugin_path: the caller's cuda_plugin_path (resolve_config drops it).
  ContextShared(const pq_config& resolved, const char* plugin_path);

  // The regions of a layer of n tokens (the selector may vary k by layer).
  Regions regions(int64_t n, int32_t layer) const;
  // K-Means iterations for a build over `tokens` tokens (paper section 3.3).
  int32_t iteration_budget(int64_t tokens, int64_t training_points);

  const pq_config config;
  const int32_t group_size;  // query heads per kv head
  const float scale;         // 1 / sqrt(head_dim)
  MemoryBudget budget;
  Counters counters;
  const std::unique_ptr<Backend> backend;
  const std::unique_ptr<Selector> selector;
  const MemoryCost cost;
  ScratchPool scratch;

 private:
  std::once_flag profile_once_;
  ClusterTimeModel cluster_model_;

 public:
  // Last, so that its workers are joined before the members above go.
  const std::unique_ptr<ThreadPool> pool;
};

}  // namespace pq
