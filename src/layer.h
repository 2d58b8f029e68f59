// The state of one (sequence, layer): its K/V store, its PQ index and the
// build in flight. Every member is guarded by `mutex` except the atomics,
// which mirror sizes for lock-free statistics.
#pragma once

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>

#include "backend.h"
#include "block_cache.h"
#include "kv_store.h"
#include "pq_index.h"
#include "selectors/selector.h"

namespace pq {

// What a build shares with the layer. The future is kept beside it, not in
// it: libstdc++ stores the packaged callable (which owns this object) in the
// future's shared state, so holding the future here would be a cycle.
struct BuildTask {
  std::atomic<bool> cancel{false};
  std::unique_ptr<PqIndex> result; // set by the task when it finished
  int64_t tokens = 0;
};

struct Layer {
  Layer(int32_t kv_heads, int32_t head_dim, int32_t dtype, MemoryBudget* budget,
        uint64_t chunk_charge)
      : store(kv_heads, head_dim, dtype, budget, chunk_charge) {}

  std::mutex mutex;
  KvStore store;
  int64_t prefill_tokens = 0;
  std::shared_ptr<BuildTask> pending;  // null when no build is in flight
  std::future<void> pending_done;      // carries the build's exception, if any
  std::unique_ptr<PqIndex> index;
  std::unique_ptr<SelectorState> selector_state;  // the selector's, if it keeps one
  std::unique_ptr<BlockCache> cache;  // null when config.cache_tokens is 0
  std::unique_ptr<DeviceLayer> device;  // the backend's state (CUDA); may be null
  uint64_t index_generation = 0;        // bumped at every installed build
  uint64_t last_select_bytes = 0;
  std::string build_error;  // why the last build failed, if it did
  int32_t last_iterations = 0;
  int32_t last_budget = 0;
  double last_build_seconds = 0.0;

  // Asynchronous prefills from device memory (CUDA): the last one's
  // completion (each waits for the one before), and the error of one that
  // failed, reported by the next call on the layer. Guarded by
  // ingest_mutex, never by `mutex` (an ingest takes `mutex` to store).
  std::mutex ingest_mutex;
  std::shared_future<void> ingest_done;
  std::string ingest_error;
  pq_status ingest_status = PQ_OK;

  std::atomic<int64_t> tokens_mirror{0};
  std::atomic<uint64_t> kv_bytes_mirror{0};
  std::atomic<uint64_t> charged_bytes_mirror{0};  // the store's chunks' budget charge
  std::atomic<uint64_t> index_bytes_mirror{0};

  // Waits for the pending build, if any, and installs its result. Throws
  // the build's error. Call with mutex held.
  void finish_build();
  // finish_build() only if the pending build is already done.
  void poll_build();
  // Re-reads the sizes into the mirrors. Call with mutex held.
  void update_mirrors();
};

}  // namespace pq
