// One (sequence, layer) and everything done to it, under its own lock: its
// K/V store, its selector's state, its block-cache bookkeeping and device
// state, and two parts it owns: the PQ index and its build (IndexBuild,
// index_build.h) and the asynchronous prefills from device memory (Ingest,
// ingest.h). The Context checks the arguments that need no layer, finds the
// layer and calls it; the Layer does the rest.
//
// The methods are spread over files by concept: layer.cpp (stores, ingests,
// introspection), layer_build.cpp (starting the build and coding tokens),
// layer_select.cpp (selection and the inputs selectors learn from),
// layer_fetch.cpp (the fetch and the block cache), layer_attend.cpp
// (pq_attend) with layer_tail.cpp (its tail estimate), layer_device.cpp (the step kept on the device),
// layer_state.cpp (truncate, fork, save and restore).
#pragma once

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/attention.h"
#include "backend/backend.h"
#include "backend/device_kernels.h"
#include "backend/device_memory.h"
#include "backend/device_step.h"
#include "store/block_cache.h"
#include "layer/context_shared.h"
#include "base/counters.h"
#include "store/kv_store.h"
#include "pq/pq_index.h"
#include "pq/tail_estimate.h"
#include "selectors/selection_request.h"
#include "selectors/selector.h"
#include "format/sequence_state.h"
#include "layer/index_build.h"
#include "layer/ingest.h"
#include "layer/layer_mirrors.h"

namespace pq {

class Layer {
 public:
  Layer(ContextShared& shared, int32_t index);
  ~Layer();
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // --- storing (layer.cpp) ------------------------------------------------
  // Appends checked host K/V: a prefill (index rebuilt) or decode tokens.
  // All or nothing.
  void append(const pq_tensor& keys, const pq_tensor& values, bool is_prefill,
              const SequenceInfo& seq);
  // A prefill from device memory, copied on the sequence's stream and
  // stored by a pool task once it landed; `owner` keeps the layer alive
  // until then. False when the backend copies synchronously only.
  // pq_decode_append of device K/V without the host (CUDA backend): the
  // store's rows and the window written by the device on the stream; the
  // values are checked once they have landed (land_device_writes). False
  // when the backend cannot (the caller stages them through the host).
  bool append_from_device(const pq_tensor& keys, const pq_tensor& values,
                          const SequenceInfo& seq);
  bool append_async(const pq_tensor& keys, const pq_tensor& values, const SequenceInfo& seq,
                    std::shared_ptr<void> owner);
  // Waits for the asynchronous prefills in flight and throws the error of
  // one that failed (once). Every call on the layer starts with it; call it
  // without the lock (an ingest in flight takes it).
  void settle();
  // settle() for the steps kept on the device: K/V the device is still
  // appending are not waited for (those steps read no row on the host).
  void settle_device();
  void wait_ingests();

  // --- reading (layer.cpp) ------------------------------------------------
  int64_t tokens() const { return mirrors_.tokens(); }
  // Entries per kv head a selection at the current length needs.
  int64_t capacity() const;
  void info(pq_layer_info* out);
  void codes(int32_t kv_head, int64_t first, int64_t count, uint8_t* out, uint64_t seq_id);
  void centroids(int32_t kv_head, float* out, uint64_t seq_id);
  // What the selector's state of this layer shares with the sequence's other
  // layers, as last published (layer_share.h; lock-free; null until it has
  // something to share).
  std::shared_ptr<const LayerShare> share() const { return mirrors_.share(); }
  // Adds this layer's sizes to statistics (lock-free mirrors).
  void add_sizes(pq_stats* out) const;

  // --- builds (layer_build.cpp) -------------------------------------------
  // Cancels the build in flight (the sequence is going); it stops at its
  // next iteration.
  void cancel_build();
  // Waits for the build in flight and installs it; throws its error.
  void finish_build();

  // --- selection (layer_select.cpp) ---------------------------------------
  // pq_decode_select: queries [q_heads][head_dim] as floats. Returns the
  // entries written per kv head.
  // speculate (pq_decode_speculate): without changing the selector's state
  // (it chooses on a copy unless it never changes it at a select), kept as
  // the layer's hint for the current length; not counted as a select.
  int64_t select(const std::vector<float>& queries, pq_selection* out, const SequenceInfo& seq,
                 bool speculate = false);

  // pq_decode_select in two halves around the choice of the middle, so that
  // a batch can have the middles of many sequences' layers chosen in one
  // device call (Context::decode_select_batch). The caller holds mutex()
  // (after settle()) across both halves. select_prepare() checks, codes the
  // tokens that left the window and brings the selector's state up to
  // date; select_finish() writes the sinks, the chosen middle and the local
  // window, and counts the call.
  struct PreparedSelect {
    Regions regions{};
    std::optional<LayerSelection> request;  // refers to this layer: valid under its lock
    std::vector<int32_t> middle;            // [kv_heads][k], chosen by the selector
    std::vector<int32_t> head_counts;       // [kv_heads]: entries of each head's row of middle
    LayerShares layer_shares;               // for a selector that reads them
    uint64_t bytes = 0;                     // what the selector read to choose it
  };
  std::mutex& mutex() { return mutex_; }
  // host_out false: out's arrays are device memory, never written here.
  // exact_keys: where the selector reads exact keys (an index-only layer's
  // re-rank reads the caller's pool), else the layer's tier.
  void select_prepare(const std::vector<float>& queries, pq_selection* out,
                      const SequenceInfo& seq, PreparedSelect& prepared, bool host_out = true,
                      const KvTier* exact_keys = nullptr);
  int64_t select_finish(const PreparedSelect& prepared, pq_selection* out,
                        const SequenceInfo& seq, bool counted = true);

  // pq_decode_select_multi (layer_select_multi.cpp): queries [q][q_heads]
  // [head_dim], one select per token under one lock, rows merged as `rows`
  // (pq_select_rows) says into out (capacity checked by the caller);
  // `pool`: the caller's keys for an index-only layer's re-rank, or null.
  void select_multi(const std::vector<float>& queries, int64_t q, int32_t rows,
                    const class PoolKeys* pool, pq_selection* out, const SequenceInfo& seq);
  // Rows and entries per row pq_decode_select_multi needs now.
  void multi_capacity(int64_t q, int32_t rows, int64_t* out_rows, int64_t* out_capacity) const;

  // --- the decode step kept on the device (layer_device.cpp) ---------------
  // pq_decode_select_device: the selection written into out's device arrays
  // on the sequence's stream. pq_fetch_kv_device: a device selection
  // gathered on the device. UNSUPPORTED where the backend has no such path.
  void select_to_device(const pq_tensor& query, const pq_selection& out, const SequenceInfo& seq);
  // pq_decode_select_multi_device: queries [q][q_heads][head_dim] in device
  // memory, each token selected as select_to_device would, the rows written
  // as `rows` says into out's device arrays (capacity checked here).
  void select_multi_to_device(const pq_tensor& queries, int32_t rows, const pq_selection& out,
                              const SequenceInfo& seq);
  void fetch_device_selection(const pq_selection& sel, const pq_tensor& out_keys,
                              const pq_tensor& out_values, const SequenceInfo& seq);
  // pq_prefill_queries: the last w queries [w][q_heads][head_dim].
  void prefill_queries(const std::vector<float>& queries, int64_t w, uint64_t seq_id);
  // pq_observe_attention, on the copied selection (call_args.h) and probs
  // laid out as its rows.
  void observe(const pq_selection* sel, const float* probs, uint64_t seq_id);
  // pq_sequence_token_classes, checked, in two steps so that a refusal
  // changes no layer: the bytes this layer's share of it may add to the
  // memory limit, then the call, which takes what it adds from `room`.
  uint64_t token_classes_room(int64_t end);
  void token_classes(int64_t first, int64_t count, const uint8_t* classes, Reservation& room);

  // --- attention (layer_attend.cpp) ---------------------------------------
  // pq_decode_attend, on the copied selection: queries [q_heads][head_dim].
  // tail_only: the tail estimate alone (pq_decode_tail), no row read.
  void attend(const std::vector<float>& queries, const pq_selection* sel, float scale, float* out,
              float* out_lse, uint64_t seq_id, bool tail_only = false);

  // --- the tail estimate of the attention (layer_tail.cpp) ----------------
  // Under mutex_, with config.tail_estimate: the index's codes and the
  // value sums brought to the middle of r (the sums charged to the memory
  // limit). Throws what require_index throws.
  void prepare_tail(const Regions& r, uint64_t seq_id);
  // The estimated part of kv head h's attention over the coded middle of r
  // that row h of `sel` leaves out (prepare_tail first; safe to run for
  // several heads at once): queries are h's group, [group][head_dim].
  void tail_part(int32_t h, const Regions& r, const pq_selection* sel, const float* queries,
                 float scale, AttentionPart part) const;

  // --- fetch (layer_fetch.cpp) --------------------------------------------
  // pq_fetch_kv, on the copied selection, after the output tensors' checks.
  void fetch(const pq_selection* sel, int64_t max_count, const pq_tensor& out_keys,
             const pq_tensor& out_values, const SequenceInfo& seq);
  // pq_fetch_kv in two halves around the gather, so that a batch's device
  // fetches run in one launch (Context::fetch_batch), under mutex() as for
  // select_prepare. fetch_prepare() checks and reserves what the block
  // cache's update needs and, for device outputs, says what the backend's
  // gather needs; fetch_finish() gathers on the host if the device did not
  // (on_device false), updates the cache and counts.
  struct PreparedFetch {
    Regions regions{};
    const pq_selection* selection = nullptr;
    const pq_tensor* out_keys = nullptr;
    const pq_tensor* out_values = nullptr;
    uint64_t rows = 0;    // selected rows, all kv heads
    uint64_t staged = 0;  // bytes the backend staged on the CPU
    std::vector<int32_t> sorted_scratch;
    std::optional<DeviceFetchArgs> device_args;  // for device outputs; points at `staged`
    PreparedFetch() = default;
    PreparedFetch(const PreparedFetch&) = delete;  // device_args points into it
    PreparedFetch& operator=(const PreparedFetch&) = delete;
  };
  void fetch_prepare(const pq_selection* sel, int64_t max_count, const pq_tensor& out_keys,
                     const pq_tensor& out_values, const SequenceInfo& seq,
                     PreparedFetch& prepared);
  void fetch_finish(PreparedFetch& prepared, bool on_device, const SequenceInfo& seq);

  // --- sequence state (layer_state.cpp) ------------------------------------
  // pq_sequence_truncate: keeps the first `tokens` tokens (fewer than held).
  void truncate(int64_t tokens, const SequenceInfo& seq);
  // pq_sequence_reserve: the layer's device buffers and its stream's
  // working buffers for `tokens` tokens. Returns the store blocks the layer
  // will open on its way there (K and V of each chunk).
  int64_t reserve(int64_t tokens, const SequenceInfo& seq);
  // pq_decode_select_device and pq_fetch_kv_device in halves, for a batch
  // whose device work is one launch chain (Context::decode_select_device_
  // batch): the caller holds mutex() after settle() across them.
  void device_select_prepare(pq_selection* out, const SequenceInfo& seq, PreparedSelect& prepared);
  void device_select_finish(PreparedSelect& prepared, const SequenceInfo& seq);
  DeviceSelectionFetchArgs device_fetch_args(const pq_selection& sel, const pq_tensor& out_keys,
                                             const pq_tensor& out_values, const SequenceInfo& seq);
  void count_device_fetch(const pq_selection& sel, const SequenceInfo& seq);
  // After the layer's length changed (an append, a truncate), under mutex_:
  // the row tables of a step a CUDA graph may have captured follow the new
  // length (DeviceStep::refresh_device_step); nothing when the backend keeps
  // none for this layer.
  void refresh_device_step(const SequenceInfo& seq);
  // The bytes of one chunk's K (or V) block in host memory (0 when the
  // tier keeps no host store), what pq_sequence_reserve pins.
  size_t store_block_bytes() const {
    return store_->host_store() != nullptr ? store_->host_store()->block_bytes() : 0;
  }
  // pq_sequence_fork: makes this new, empty layer hold what `parent` holds.
  void fork_from(Layer& parent, uint64_t parent_id);
  // pq_sequence_save, in two parts so that every layer's index comes before
  // any K/V (a reader can select before the K/V arrive): save_index waits
  // for the build in flight, then writes the layer, index and selector
  // state sections and returns the tokens they describe; save_kv writes the
  // K/V of those tokens.
  int64_t save_index(StateWriter& out, uint64_t seq_id);
  void save_kv(StateWriter& out, int64_t tokens);
  // pq_sequence_restore into this new, empty layer, from checked sections;
  // without a keys-and-values section (pq_sequence_restore_begin) the layer
  // holds its tokens' room, its index and selector state, selects (PQ) and
  // waits for restore_kv; every call that reads or changes K/V is
  // PQ_ERR_BAD_STATE until then.
  void restore(const LayerImage& image, const SequenceInfo& seq);
  void restore_kv(const SectionView& keys_values, const SequenceInfo& seq);

 private:
  // What this layer's selection and fetch for `seq` run against.
  LayerContext context(const SequenceInfo& seq) const;
  // Under mutex_ from here on.
  // The statistics of one selection: the mirrors' last select bytes and the counters.
  void count_selection(uint64_t bytes, const SequenceInfo& seq);
  void store_tokens(const pq_tensor& keys, const pq_tensor& values, bool is_prefill,
                    const SequenceInfo& seq);
  // Whether a prefill of the layer as it now is (its tokens stored) builds.
  bool prefill_builds() const;
  void require_prefill(uint64_t seq_id, const char* call) const;
  // BAD_STATE while a restore waits for this layer's K/V.
  void require_kv(uint64_t seq_id, const char* call) const;
  void fill_kv(const SectionView& keys_values, const SequenceInfo& seq);
  void require_index(uint64_t seq_id);
  // pq_rebuild_share: queues a background rebuild over every stored token
  // when the tokens past the index's build pass that share of the sequence.
  void rebuild_for_long_output(const SequenceInfo& seq);
  // A fresh block cache and device state (after the tokens changed under
  // them), with the window sent again.
  void reset_cache_and_device(void* stream);
  // The build's installation (IndexBuild), with the size mirrors updated.
  void poll_build();
  void install_build();
  // Codes tokens [index->coded_tokens, end) with the layer's centroids.
  void code_tokens(int64_t end);
  // Bookkeeping of the block cache after a fetch; allocates nothing after
  // cache_->reserve(r.n) and with `sorted` holding room for the largest count.
  struct CacheCount {
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t staged = 0;  // bytes the CPU copied to fill device slots
  };
  CacheCount update_cache(const Regions& r, const pq_selection* sel, void* stream,
                          bool fill_device, std::vector<int32_t>& sorted);
  void gather_on_host(const pq_selection* sel, const pq_tensor& out_keys,
                      const pq_tensor& out_values, uint64_t rows, void* stream);
  void update_mirrors();
  // Under mutex_: once the device's appends have landed (waiting for them
  // when `wait`), checks their values; a non-finite one drops every token
  // appended from the device since the last check, and throws
  // PQ_ERR_INVALID_ARGUMENT saying so (once).
  void land_device_writes(bool wait);
  // Makes charges_.caller_state hold what the selector's state says it holds for
  // the caller (SelectorState::caller_bytes): what it gives back is
  // released, what it adds comes from `room` when given, else the budget.
  void charge_caller_state(Reservation* room);
  // The coverage of the last hint by a select's middle at the hint's length
  // (pq_stats.hint_tokens, hint_covered); forgets the hint.
  void count_hint(const PreparedSelect& prepared, const SequenceInfo& seq);
  // Publishes share() anew from the selector's state, after the state
  // changed other than by appends (which leave what it shares as it was).
  void publish_share();

  ContextShared& shared_;
  const int32_t layer_index_;

  std::mutex mutex_;
  std::unique_ptr<KvTier> store_;  // where the K/V rows live (kv_tier.h)
  int64_t prefill_tokens_ = 0;
  IndexBuild build_;  // the PQ index and its build in flight
  std::unique_ptr<SelectorState> selector_state_;
  std::unique_ptr<BlockCache> cache_;     // null when config.cache_tokens is 0
  std::unique_ptr<DeviceLayer> device_;   // the backend's state (CUDA); may be null
  // What the layer holds of config.host_memory_limit besides its store's
  // chunks.
  struct Charges {
    // A fork's share of the per-chunk state (codes, selector and cache
    // state) of the chunks it shares: the chunks' own charge stays with them.
    Reservation fork_state;
    // What the selector's state holds apart from the stored tokens
    // (SelectorState::caller_bytes: FastGen's token classes).
    Reservation caller_state;
  };
  Charges charges_;
  // pq_decode_attend's tail estimate (config.tail_estimate): the values'
  // sums by first code, and what they hold of the memory limit.
  struct TailSums {
    CodeValueSums sums;
    Reservation charge;
  };
  TailSums tail_;
  // Restored without its K/V yet (pq_sequence_restore_begin): the store's
  // rows are allocated but not written, and nothing may read them.
  bool awaiting_kv_ = false;
  // Tokens [first, end) were appended from device memory
  // (append_from_device) and may not have landed: the host reads them only
  // after land_device_writes (-1: none pending). Atomic: settle() looks
  // before taking the lock.
  struct DeviceAppends {
    std::atomic<int64_t> first{-1};
    void* stream = nullptr;  // the stream they were enqueued on
  };
  DeviceAppends device_appends_;
  // The last pq_decode_speculate's middle rows ([kv_heads][k], counts per
  // head) and the length it was made at (-1: none). Held, and charged to
  // the memory limit, from the speculation to the next select or truncate.
  struct Hint {
    int64_t tokens = -1;
    int64_t local_begin = 0;  // its local window: [local_begin, tokens)
    int64_t k = 0;
    std::vector<int32_t> middle;
    std::vector<int32_t> counts;
    Reservation charge;
  };
  Hint hint_;

  // Asynchronous prefills from device memory; never under mutex_ (an
  // ingest takes mutex_ to store).
  Ingest ingest_;

  // Sizes, the last select's bytes and the share, for lock-free readers.
  LayerMirrors mirrors_;
};

}  // namespace pq
