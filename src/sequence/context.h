// pq_context: the sequences and the dispatch of every call to a layer. The
// C API (src/api/) checks pointers and forwards here; Context checks what
// needs no layer (layer index, tensor shapes, selections), finds the
// sequence and calls its Layer, which does the rest under its own lock.
//
// context.cpp holds the sequences, the per-sequence calls and statistics;
// context_batch.cpp the calls over a batch of sequences; context_device.cpp
// the decode step kept on the device; context_state.cpp truncate, fork,
// save and restore.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/call_args.h"
#include "layer/context_shared.h"
#include "layer/layer.h"
#include "store/memory_budget.h"
#include "pqcache.h"

namespace pq {

// A restore begun with pq_sequence_restore_begin whose K/V are arriving.
struct RestoreProgress {
  std::mutex mutex;     // serialises pq_sequence_restore_kv calls
  SectionOrder order;   // the sections read so far
  uint64_t offset = 0;  // bytes of the state read so far
  std::string failure;  // why a K/V section could not be loaded, if one could not
};

// What one item of a batched call came to: its status and, on failure,
// the message (context_batch.cpp).
struct BatchOutcome {
  pq_status status = PQ_OK;
  std::string message;
};

struct Sequence {
  // fixed: the budget held for its layers' fixed state (memory_cost.h).
  Sequence(uint64_t id, ContextShared& shared, Reservation fixed);
  SequenceInfo info() const { return SequenceInfo{id, counters, stream.load(), &layers}; }

  const uint64_t id;
  Reservation fixed;
  std::vector<std::unique_ptr<Layer>> layers;
  std::shared_ptr<Counters> counters = std::make_shared<Counters>();
  // The caller's cudaStream_t for this sequence's device work (NULL: the
  // backend's own stream). Set by pq_sequence_set_stream.
  std::atomic<void*> stream{nullptr};
  // Set before the sequence is published by pq_sequence_restore_begin, and
  // kept: the K/V sections still to come are read against it.
  std::unique_ptr<RestoreProgress> restoring;
};

class Context {
 public:
  // paths: the caller's cuda_plugin_path and kv_disk_path (resolve_config
  // drops them). pool: the caller's shared pool (pq_pool), or null for one
  // of its own.
  Context(const pq_config& resolved, const CallerPaths& paths, const Hooks& hooks = Hooks{},
          std::shared_ptr<ThreadPool> pool = nullptr);
  ~Context();

  const pq_config& config() const { return shared_.config; }
  const Backend& backend() const { return *shared_.backend; }
  // The log hook: a failed call's message (PQ_LOG_ERROR), and sequence
  // events (PQ_LOG_DEBUG; the message is built only when someone listens).
  void log_failure(const char* message) const { shared_.log(PQ_LOG_ERROR, message); }
  template <typename Message>
  void debug(Message&& message) const {
    if (shared_.logs(PQ_LOG_DEBUG)) shared_.log(PQ_LOG_DEBUG, message());
  }

  void sequence_add(uint64_t id);
  void sequence_remove(uint64_t id);
  int64_t sequence_length(uint64_t id, int32_t layer) const;
  int64_t sequence_count() const;
  void sequence_set_stream(uint64_t id, void* stream);

  void prefill(uint64_t id, int32_t layer, const pq_tensor* keys, const pq_tensor* values);
  void decode_append(uint64_t id, int32_t layer, const pq_tensor* keys, const pq_tensor* values);
  int64_t selection_capacity(uint64_t id, int32_t layer) const;
  int64_t selection_capacity_for(int32_t layer, int64_t tokens) const;
  // speculate: pq_decode_speculate (Layer::select says what differs).
  void decode_select(uint64_t id, int32_t layer, const pq_tensor* query, pq_selection* out,
                     bool speculate = false);
  void fetch(uint64_t id, int32_t layer, const pq_selection* selection, const pq_tensor* keys,
             const pq_tensor* values);

  // The decode step kept on the device (context_device.cpp).
  void decode_select_device(uint64_t id, int32_t layer, const pq_tensor* query,
                            pq_selection* out);
  void fetch_kv_device(uint64_t id, int32_t layer, const pq_selection* selection,
                       const pq_tensor* out_keys, const pq_tensor* out_values);

  // pq_decode_attend, and with tail_only pq_decode_tail (the tail estimate
  // alone).
  void decode_attend(uint64_t id, int32_t layer, const pq_tensor* query, const pq_selection* sel,
                     float scale, float* out, float* out_lse, bool tail_only = false);

  // What a serving engine calls beyond the dense API (context_engine.cpp):
  // keys from its paged pool, several query tokens in one select.
  void append_paged(uint64_t id, int32_t layer, const pq_paged_keys* keys, bool is_prefill);
  void selection_capacity_multi(uint64_t id, int32_t layer, int64_t query_tokens, int32_t rows,
                                int64_t* out_rows, int64_t* out_capacity) const;
  void decode_select_multi(uint64_t id, int32_t layer, const pq_tensor* queries, int32_t rows,
                           const pq_paged_keys* keys, pq_selection* out);
  void decode_select_multi_device(uint64_t id, int32_t layer, const pq_tensor* queries,
                                  int32_t rows, pq_selection* out);
  // PQ_ERR_UNSUPPORTED for a call that reads K/V an index-only context
  // (PQ_KV_TIER_CALLER) does not keep.
  void require_kv_kept() const;

  // The batched calls (context_batch.cpp): every item's status is written;
  // the first failing item's error is thrown, naming it, after all ran.
  void decode_select_batch(int32_t layer, pq_select_item* items, int64_t count);
  void fetch_batch(int32_t layer, pq_fetch_item* items, int64_t count);

  void prefill_queries(uint64_t id, int32_t layer, const pq_tensor* queries);
  void observe_attention(uint64_t id, int32_t layer, const pq_selection* selection,
                         const float* probs);
  void token_classes(uint64_t id, int64_t first, int64_t count, const uint8_t* classes);

  void layer_info(uint64_t id, int32_t layer, pq_layer_info* out) const;
  void index_codes(uint64_t id, int32_t layer, int32_t kv_head, int64_t first, int64_t count,
                   uint8_t* out);
  void index_centroids(uint64_t id, int32_t layer, int32_t kv_head, float* out, int64_t floats);

  // Sequence state (context_state.cpp).
  void sequence_truncate(uint64_t id, int64_t tokens);
  void sequence_reserve(uint64_t id, int64_t tokens);
  void decode_select_device_batch(int32_t layer, pq_select_item* items, int64_t count);
  void fetch_kv_device_batch(int32_t layer, pq_fetch_item* items, int64_t count);
  void sequence_fork(uint64_t parent, uint64_t child);
  // Returns the bytes written; write may be null (the size alone).
  uint64_t sequence_save(uint64_t id, pq_write_fn write, void* user);
  void sequence_restore(uint64_t id, const uint8_t* data, uint64_t size);
  // pq_sequence_restore_begin and pq_sequence_restore_kv: return the bytes
  // read; throw NeedMore when `size` is short.
  uint64_t sequence_restore_begin(uint64_t id, const uint8_t* data, uint64_t size);
  uint64_t sequence_restore_kv(uint64_t id, const uint8_t* data, uint64_t size);

  void stats(pq_stats* out) const;
  void sequence_stats(uint64_t id, pq_stats* out) const;
  void wait_builds();

 private:
  std::shared_ptr<Sequence> find(uint64_t id) const;
  // UNSUPPORTED unless this is the CUDA backend and t is device memory.
  void require_device_step(const char* call, const pq_tensor& t, const char* name) const;
  // The work of a batch under every item's layer lock (context_batch.cpp):
  // items (indices), their layers and sequences, in the same order.
  using BatchRun = std::function<void(const std::vector<size_t>& items,
                                      const std::vector<Layer*>& layers,
                                      const std::vector<SequenceInfo>& infos)>;
  bool run_batch_locked(int32_t layer, const std::vector<uint64_t>& ids,
                        std::vector<BatchOutcome>& outcomes, std::atomic<uint64_t> Counters::*time,
                        const BatchRun& run, bool device_step = false);
  // decode_select_batch's path for a backend that chooses every item's
  // middle in one call; false when it does not apply (context_batch.cpp).
  // The checks of pq_decode_select_device and pq_fetch_kv_device, on
  // copies of the descriptors (context_device.cpp).
  pq_tensor device_select_checks(const pq_tensor* query, const pq_selection* out,
                                 pq_selection* sel) const;
  void device_fetch_checks(const pq_selection* selection, const pq_tensor* out_keys,
                           const pq_tensor* out_values, pq_selection* sel, pq_tensor* keys,
                           pq_tensor* values) const;
  bool select_batch_on_device(int32_t layer, const std::vector<pq_select_item>& local,
                              const std::vector<pq_tensor>& queries,
                              std::vector<pq_selection>& outs, std::vector<BatchOutcome>& outcomes);
  struct FetchArgs;
  // fetch_batch's path for a backend that gathers every item in one launch.
  bool fetch_batch_on_device(int32_t layer, const std::vector<pq_fetch_item>& local,
                             const std::vector<FetchArgs>& args,
                             std::vector<BatchOutcome>& outcomes);
  // A new sequence with its fixed state reserved, not yet in the map;
  // `what` names the call for the memory limit's message.
  std::shared_ptr<Sequence> new_sequence(uint64_t id, const std::string& what);
  // Adds it to the map; INVALID_ARGUMENT if the id is taken.
  void insert(std::shared_ptr<Sequence> seq);
  void require_absent(uint64_t id) const;
  void check_layer(int32_t layer) const;
  void check_kv_head(int32_t kv_head) const;
  void append(uint64_t id, int32_t layer, const pq_tensor* keys, const pq_tensor* values,
              bool is_prefill);
  // The checks of pq_decode_select that need no sequence: *out is read once
  // into *copy, which the call then uses; returns the checked query's
  // descriptor (read_query reads it, on the sequence's stream).
  pq_tensor select_args(const pq_tensor* query, const pq_selection* out,
                        pq_selection* copy) const;
  std::vector<float> read_query(const pq_tensor& query, const Sequence& seq) const;
  // The checks of pq_fetch_kv that need no sequence, on copies of the
  // arguments (call_args.h) that the call then uses.
  struct FetchArgs {
    SelectionCopy selection;
    pq_tensor keys, values;
  };
  FetchArgs fetch_args(const pq_selection* sel, const pq_tensor* out_keys,
                       const pq_tensor* out_values) const;
  // PQ_ERR_BAD_STATE when this thread is inside a pq_write_fn saving `id`
  // (context_state.cpp): a call on it would wait for the save.
  void require_not_saving(uint64_t id) const;
  // The same for pq_wait_builds, which waits for every sequence's builds.
  void require_no_save_on_this_thread() const;

  // First: the layers refer to it, and it outlives them.
  ContextShared shared_;
  mutable std::shared_mutex sequences_mutex_;
  std::unordered_map<uint64_t, std::shared_ptr<Sequence>> sequences_;
};

}  // namespace pq
