// pq_context: configuration, sequences, the worker pool, the backend and
// the selector. The C API in api.cpp validates pointers and forwards here.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "adaptive_budget.h"
#include "backend.h"
#include "counters.h"
#include "kv_store.h"
#include "layer.h"
#include "memory_budget.h"
#include "memory_cost.h"
#include "scratch.h"
#include "selectors/selector.h"
#include "thread_pool.h"

namespace pq {

// Throws PQ_ERR_INVALID_ARGUMENT / PQ_ERR_UNSUPPORTED naming the field.
// Returns the configuration with defaults resolved (worker_threads).
pq_config resolve_config(const pq_config* config);

struct Sequence {
  // fixed: the budget held for its layers' fixed state (memory_cost.h).
  Sequence(uint64_t id, const pq_config& c, MemoryBudget* budget, const MemoryCost& cost,
           Reservation fixed, const Backend& backend);
  uint64_t id;
  Reservation fixed;
  std::vector<std::unique_ptr<Layer>> layers;
  std::shared_ptr<Counters> counters = std::make_shared<Counters>();
  // The caller's cudaStream_t for this sequence's device work (NULL: the
  // backend's own stream). Set by pq_sequence_set_stream.
  std::atomic<void*> stream{nullptr};
};

// Positions of the three regions of a layer of n tokens.
struct Regions {
  int64_t sink_end;    // sinks are [0, sink_end)
  int64_t mid_end;     // middle is [sink_end, mid_end), local is [mid_end, n)
  int64_t n;
  int64_t k;           // middle tokens to select
  int64_t count() const { return sink_end + k + (n - mid_end); }
};

class Context {
 public:
  // plugin_path: the caller's cuda_plugin_path (resolve_config drops it).
  Context(const pq_config& resolved, const char* plugin_path);
  ~Context();

  const pq_config& config() const { return config_; }
  const Backend& backend() const { return *backend_; }

  void sequence_add(uint64_t id);
  void sequence_remove(uint64_t id);
  int64_t sequence_length(uint64_t id, int32_t layer) const;
  int64_t sequence_count() const;
  void sequence_set_stream(uint64_t id, void* stream);

  void prefill(uint64_t id, int32_t layer, const pq_tensor* keys, const pq_tensor* values);
  void decode_append(uint64_t id, int32_t layer, const pq_tensor* keys, const pq_tensor* values);
  int64_t selection_capacity(uint64_t id, int32_t layer) const;
  void decode_select(uint64_t id, int32_t layer, const pq_tensor* query, pq_selection* out);
  void fetch(uint64_t id, int32_t layer, const pq_selection* selection, const pq_tensor* keys,
             const pq_tensor* values);

  void prefill_queries(uint64_t id, int32_t layer, const pq_tensor* queries);
  void observe_attention(uint64_t id, int32_t layer, const pq_selection* selection,
                         const float* probs);

  void layer_info(uint64_t id, int32_t layer, pq_layer_info* out) const;
  void index_codes(uint64_t id, int32_t layer, int32_t kv_head, int64_t first, int64_t count,
                   uint8_t* out);
  void index_centroids(uint64_t id, int32_t layer, int32_t kv_head, float* out, int64_t floats);

  void stats(pq_stats* out) const;
  void sequence_stats(uint64_t id, pq_stats* out) const;
  void wait_builds();

 private:
  std::shared_ptr<Sequence> find(uint64_t id) const;
  Layer& layer_of(Sequence& s, int32_t layer) const;
  void check_layer(int32_t layer) const;
  Regions regions(int64_t n, int32_t layer) const;
  struct CacheCount {
    uint64_t hits = 0;
    uint64_t misses = 0;
  };
  // Counts the block cache's hits for a fetched selection, then updates the
  // cache with it and has the backend fill the admitted blocks. Allocates
  // nothing after layer.cache->reserve(r.n) and with `sorted` holding room
  // for the largest count. Layer mutex held.
  CacheCount update_cache(Layer& layer, const Regions& r, const pq_selection* sel, void* stream,
                          bool fill_device, std::vector<int32_t>& sorted);
  void gather_on_host(Layer& layer, const pq_selection* sel, const pq_tensor* out_keys,
                      const pq_tensor* out_values, uint64_t rows);
  void append(uint64_t id, int32_t layer, const pq_tensor* keys, const pq_tensor* values,
              bool is_prefill);
  void store_tokens(Layer& layer, int32_t layer_index, const std::shared_ptr<Sequence>& seq,
                    const pq_tensor& keys, const pq_tensor& values, bool is_prefill);
  bool prefill_async(const std::shared_ptr<Sequence>& seq, int32_t layer_index,
                     const pq_tensor& keys, const pq_tensor& values);
  static void wait_ingests(Layer& layer);
  void schedule_build(Layer& layer, int32_t layer_index, const std::shared_ptr<Sequence>& seq);
  void run_build(BuildTask& task, const KvStore::Snapshot& snapshot, int32_t layer_index,
                 Counters& seq_counters);
  // Codes tokens [index->coded_tokens, end) with the layer's centroids.
  void code_tokens(Layer& layer, int64_t end);
  // Waits for the build and makes sure an index exists. Mutex held.
  void require_index(Layer& layer, uint64_t id, int32_t layer_index);
  int32_t iteration_budget(int64_t tokens, int64_t training_points);
  void add_sequence_sizes(const Sequence& s, pq_stats* out) const;

  const pq_config config_;
  const int32_t group_size_;
  const float scale_;
  MemoryBudget budget_;
  Counters counters_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Selector> selector_;
  const MemoryCost cost_;  // what the budget counts per layer and chunk

  mutable std::shared_mutex sequences_mutex_;
  std::unordered_map<uint64_t, std::shared_ptr<Sequence>> sequences_;

  ScratchPool scratch_pool_;

  std::once_flag profile_once_;
  ClusterTimeModel cluster_model_;

  // Declared last so that it is destroyed first: its destructor joins the
  // workers, which may still reference the members above.
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace pq
