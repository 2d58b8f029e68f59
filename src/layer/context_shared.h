// What every layer of a context shares: the resolved configuration and what
// follows from it, the backend, the selector, the memory budget and its
// costs, the counters, the selection scratch, the K-Means time model and
// the caller's hooks and the worker pool (the context's own, or one the
// caller shares between contexts). The Context owns it; the layers hold a
// reference, valid as long as any call on them runs (pq_destroy must not
// race with calls) and any task of theirs is queued or running.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pq/adaptive_budget.h"
#include "backend/backend.h"
#include "base/counters.h"
#include "base/hooks.h"
#include "store/memory_budget.h"
#include "layer/memory_cost.h"
#include "pqcache.h"
#include "base/scratch.h"
#include "selectors/selector.h"
#include "base/thread_pool.h"
#include "config/config.h"
#include "store/chunk_file.h"
#include "store/slab_pool.h"

namespace pq {

// Positions of the three regions of a layer of n tokens.
struct Regions {
  int64_t sink_end;    // sinks are [0, sink_end)
  int64_t mid_end;     // middle is [sink_end, mid_end), local is [mid_end, n)
  int64_t n;
  int64_t k;           // middle tokens one kv head may select (the selection's capacity)
  int64_t k_mean;      // middle tokens per kv head over the layer (k, unless heads differ: AdaKV)
  int64_t count() const { return sink_end + k + (n - mid_end); }
};

struct ContextShared {
  // paths: the caller's cuda_plugin_path and kv_disk_path (resolve_config
  // drops them). shared_pool: the caller's pool, or null for a pool of the
  // context's own (config.worker_threads threads).
  ContextShared(const pq_config& resolved, const CallerPaths& paths, const Hooks& hooks,
                std::shared_ptr<ThreadPool> shared_pool);

  // The regions of a layer of n tokens (the selector may vary k by layer).
  Regions regions(int64_t n, int32_t layer) const;
  // K-Means iterations for a build over `tokens` tokens (paper section 3.3).
  int32_t iteration_budget(int64_t tokens, int64_t training_points);

  // Queues a task of this context on the pool, counted until `after` (run
  // once the task's future is ready) has returned; wait_tasks() waits for
  // none to be left, since a shared pool outlives the context.
  std::future<void> submit(std::function<void()> task, std::function<void()> after = nullptr);
  void wait_tasks();
  // Builds cancelled while they ran (BuildTask::stop), counted until they
  // let go of their K/V; pq_wait_builds waits for none to be left, so that
  // a removed sequence is no longer counted when it returns.
  void add_draining_build();
  void remove_draining_build();
  void wait_draining_builds();
  void log(int32_t level, const std::string& message) const noexcept { hooks.emit(level, message); }
  bool logs(int32_t level) const { return hooks.logs(level); }

  // fp8 scales: the caller's copy ([num_layers][2][kv_scale_count], which
  // config.kv_scales points at) and per kv head ([num_layers][2][kv_heads],
  // empty unless the dtype is fp8). Before config, which points into them.
  const std::vector<float> kv_scale_copy;
  const std::vector<float> kv_head_scales;
  // Layer l's scales per kv head, K then V ([2][num_kv_heads]); null when
  // the dtype is not fp8 (every scale 1).
  const float* layer_scales(int32_t layer) const {
    return kv_head_scales.empty()
               ? nullptr
               : kv_head_scales.data() + static_cast<size_t>(layer) * 2 * config.num_kv_heads;
  }

  const pq_config config;
  const int32_t group_size;  // query heads per kv head
  const float scale;         // 1 / sqrt(head_dim)
  MemoryBudget budget;
  Counters counters;
  const std::unique_ptr<Backend> backend;
  const std::unique_ptr<Selector> selector;
  const MemoryCost cost;
  ScratchPool scratch;
  const Hooks hooks;
  // The disk tier's file (PQ_KV_TIER_DISK), shared by every layer of every
  // sequence; null for the host tier.
  const std::shared_ptr<ChunkFile> chunk_file;
  // The host tier's K/V blocks on 2 MiB slabs (store/host_slabs.h): the CPU
  // backend without a host_alloc hook; null otherwise.
  const std::unique_ptr<SlabPool> host_slabs;

 private:
  std::once_flag profile_once_;
  ClusterTimeModel cluster_model_;
  std::mutex tasks_mutex_;
  std::condition_variable tasks_done_;
  int64_t tasks_ = 0;  // queued or running, this context's
  int64_t draining_builds_ = 0;  // under tasks_mutex_, signalled by tasks_done_ too

 public:
  const bool owns_pool;
  // Last, so that its workers (when it is the context's own) are joined
  // before the members above go.
  const std::shared_ptr<ThreadPool> pool;
};

}  // namespace pq
