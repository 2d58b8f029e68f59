// The CUDA backend's memory and device state over the plug-in table:
// reusable device buffers, pinned staging guarded by an event, the
// asynchronous device-to-host copy of a prefill, the per-(sequence, layer)
// device state (resident codes, cache slots, the sink and local window) and
// the per-stream working buffers. Internal to the CUDA backend (cuda_backend.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/device_memory.h"
#include "backend/cuda/cuda_plugin_abi.h"
#include "backend/cuda/deferred_release.h"
#include "base/dtype.h"
#include "base/error.h"

namespace pq {
namespace cuda_detail {

// Throws PQ_ERR_BACKEND "<what>: <plug-in message>" for a failed call.
inline void check(int rc, const char* what, const char* err) {
  if (rc != 0) fail(PQ_ERR_BACKEND, std::string(what) + ": " + err);
}

// Device buffers reused across calls, grown geometrically (never shrunk):
// a middle that grows by a token a step regrows them about log2(n) times,
// not at every step, and pq_sequence_reserve grows them ahead. A buffer
// outgrown goes back to the recycler, fenced: never a cudaFree (a wait for
// the whole device) on the decode path.
class DeviceArena {
 public:
  explicit DeviceArena(Recycler* r) : recycler_(r) {}
  ~DeviceArena() {
    for (auto& b : buffers_) recycler_->release(b.ptr, b.bytes, false);
  }
  void* get(size_t slot, size_t bytes) {
    if (buffers_.size() <= slot) buffers_.resize(slot + 1);
    Buffer& b = buffers_[slot];
    recycler_->grow(&b.ptr, &b.bytes, bytes, false, "a working buffer");
    return b.ptr;
  }

 private:
  struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  Recycler* recycler_;
  std::vector<Buffer> buffers_;
};

// Page-locked host memory for staging copies, with the event of the last
// copy that reads it: it is rewritten only after that copy has run.
class PinnedStaging {
 public:
  PinnedStaging(const pq_cuda_plugin* k, Recycler* r) : k_(k), recycler_(r) {}
  ~PinnedStaging() {
    char err[256];
    recycler_->release(ptr_, bytes_, true);
    k_->event_destroy(event_, err, sizeof err);
  }
  // Waits until the previous copy from the buffer is done, then returns at
  // least `bytes` of it.
  uint8_t* acquire(size_t bytes) {
    char err[512] = {0};
    // Waits only when the last copy from the buffer has not run yet (a
    // query first: a wait on a finished event is still a host round trip).
    if (recorded_) {
      const int done = k_->event_query(event_, err, sizeof err);
      if (done < 0) check(1, "staging query", err);
      if (done == 0) check(k_->event_synchronize(event_, err, sizeof err), "staging wait", err);
    }
    recorded_ = false;
    // Doubles: a request that grows by a little re-pins rarely.
    recycler_->grow(&ptr_, &bytes_, bytes, true, "pinned staging");
    return static_cast<uint8_t*>(ptr_);
  }
  // Whether acquire() would not wait (the last copy from it has run).
  bool ready() const {
    if (!recorded_) return true;
    char err[512] = {0};
    return k_->event_query(event_, err, sizeof err) == 1;
  }
  // Marks the copies enqueued on `stream` so far as the buffer's readers.
  void release(void* stream) {
    char err[512] = {0};
    if (event_ == nullptr) check(k_->event_create(&event_, err, sizeof err), "event create", err);
    check(k_->event_record(event_, stream, err, sizeof err), "event record", err);
    recorded_ = true;
  }

 private:
  const pq_cuda_plugin* k_;
  Recycler* recycler_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  void* event_ = nullptr;
  bool recorded_ = false;
};

// Pinned staging for the tables of batched device steps: one step per layer
// follows another on the stream before the first has run, so one buffer
// would make each wait for the last. A ring of them grows (to about the
// layers of a token) until one is always free, then stays.
class StagingRing {
 public:
  StagingRing(const pq_cuda_plugin* k, Recycler* r) : k_(k), recycler_(r) {}
  // A buffer whose last copy has run (a new one when none has, up to
  // kMaxSlots; past that the oldest is waited for), with `bytes`.
  PinnedStaging& acquire(size_t bytes, uint8_t** out) {
    PinnedStaging* pick = nullptr;
    for (size_t i = 0; i < slots_.size() && pick == nullptr; ++i) {
      PinnedStaging& s = *slots_[(next_ + i) % slots_.size()];
      if (s.ready()) pick = &s;
    }
    if (pick == nullptr && slots_.size() < kMaxSlots) {
      slots_.push_back(std::make_unique<PinnedStaging>(k_, recycler_));
      pick = slots_.back().get();
    }
    if (pick == nullptr) pick = slots_[next_ % slots_.size()].get();
    next_ = (next_ + 1) % std::max<size_t>(slots_.size(), 1);
    *out = pick->acquire(bytes);
    return *pick;
  }

 private:
  static constexpr size_t kMaxSlots = 256;
  const pq_cuda_plugin* k_;
  Recycler* recycler_;
  std::vector<std::unique_ptr<PinnedStaging>> slots_;
  size_t next_ = 0;
};

// The plan of a row gather issued on the host's behalf (a window store, a
// cache fill): pinned staging for the pointers (and staged rows), and the
// device buffer the kernel reads them from, grown geometrically.
class RowPlan {
 public:
  RowPlan(const pq_cuda_plugin* k, Recycler* r) : staging(k, r), recycler_(r) {}
  ~RowPlan() { recycler_->release(device_, bytes_, false); }
  // At least `bytes` of device memory. Called after staging.acquire(): the
  // previous gather that read the buffer has run by then.
  void* device(size_t bytes) {
    recycler_->grow(&device_, &bytes_, bytes, false, "a row plan");
    return device_;
  }
  size_t device_bytes() const { return bytes_; }
  PinnedStaging staging;

 private:
  Recycler* recycler_;
  void* device_ = nullptr;
  size_t bytes_ = 0;
};

// A device-to-host copy into its own pinned buffer, with the event that
// says it has landed.
class CudaHostCopy final : public HostCopy {
 public:
  CudaHostCopy(const pq_cuda_plugin* k, size_t bytes) : k_(k) {
    char err[512] = {0};
    if (k_->host_alloc(&ptr_, bytes, err, sizeof err) != 0)
      fail(PQ_ERR_OUT_OF_MEMORY, std::string("pinned host allocation for the prefill copy "
                                             "failed: ") + err);
    check(k_->event_create(&event_, err, sizeof err), "event create", err);
  }
  ~CudaHostCopy() override {
    char err[256];
    k_->event_destroy(event_, err, sizeof err);
    k_->host_free(ptr_, err, sizeof err);
  }
  void start(const void* src, size_t bytes, void* stream) {
    char err[512] = {0};
    check(k_->copy_async(ptr_, src, bytes, stream, err, sizeof err), "prefill copy", err);
    check(k_->event_record(event_, stream, err, sizeof err), "event record", err);
  }
  void wait() override {
    char err[512] = {0};
    check(k_->event_synchronize(event_, err, sizeof err), "prefill copy", err);
  }
  const void* data() const override { return ptr_; }

 private:
  const pq_cuda_plugin* k_;
  void* ptr_ = nullptr;
  void* event_ = nullptr;
};

// The device state of one (sequence, layer), used under the layer's lock.
class CudaLayer final : public DeviceLayer {
 public:
  CudaLayer(const pq_cuda_plugin* k, const pq_config& c, Recycler* r)
      : k_(k),
        recycler(r),
        kv_heads(c.num_kv_heads),
        row_bytes(static_cast<size_t>(c.head_dim) * dtype_size(c.dtype)),
        block_tokens(c.cache_block_tokens),
        slot_count(c.cache_tokens / c.cache_block_tokens),
        fill_plan(k, r),
        sink_tokens(c.sink_tokens),
        local_tokens(c.local_tokens),
        window_plan(k, r),
        chunk_tables(k, r) {}
  // Handed back fenced: a remove or truncate never waits for the device.
  ~CudaLayer() override {
    char err[256];
    recycler->release(d_codes, codes_bytes, false);
    recycler->release(d_slots, slot_count * slot_bytes(), false);
    recycler->release(d_window, window_slots() * window_slot_bytes(), false);
    recycler->release(d_centroids, centroids_bytes, false);
    recycler->release(d_step, step_bytes, false);
    k_->event_destroy(fill_event, err, sizeof err);
    k_->event_destroy(landing_event, err, sizeof err);
  }
  // Keeps what stays valid when the sequence is cut to `tokens`: the codes
  // of the tokens kept (with an unchanged index), the window rows of kept
  // tokens, the buffers. The block cache starts empty.
  void truncate(int64_t tokens) {
    codes_uploaded = std::min(codes_uploaded, tokens);
    for (int64_t& p : window_pos)
      if (p >= tokens) p = -1;
    std::fill(slot_block.begin(), slot_block.end(), -1);
  }
  // One slot: K then V, each [kv_head][block_tokens][row_bytes].
  size_t slot_bytes() const { return 2 * static_cast<size_t>(kv_heads) * block_tokens * row_bytes; }
  uint8_t* slot_row(int32_t slot, bool value, int32_t head, int64_t offset) const {
    return static_cast<uint8_t*>(d_slots) + static_cast<size_t>(slot) * slot_bytes() +
           ((static_cast<size_t>(value ? kv_heads : 0) + head) * block_tokens + offset) * row_bytes;
  }

  // The window: sink tokens in slots [0, sink_tokens), the last
  // local_tokens tokens in a ring after them. A slot holds all kv heads'
  // K rows, then their V rows.
  int64_t window_slots() const { return static_cast<int64_t>(sink_tokens) + local_tokens; }
  size_t window_slot_bytes() const { return 2 * static_cast<size_t>(kv_heads) * row_bytes; }
  int64_t window_slot(int64_t position) const {
    if (position < sink_tokens) return position;
    return local_tokens > 0 ? sink_tokens + position % local_tokens : -1;
  }
  uint8_t* window_row(int64_t slot, bool value, int32_t head) const {
    return static_cast<uint8_t*>(d_window) + static_cast<size_t>(slot) * window_slot_bytes() +
           (static_cast<size_t>(value ? kv_heads : 0) + head) * row_bytes;
  }

  const pq_cuda_plugin* k_;
  Recycler* const recycler;
  const int32_t kv_heads;
  const size_t row_bytes;
  // The PQ codes resident on the device, one buffer for the layer,
  // [kv_head][codes_capacity][subspaces]: tokens [0, codes_uploaded) of
  // index `codes_generation` (a rebuilt index starts over).
  void* d_codes = nullptr;
  size_t codes_bytes = 0;
  int64_t codes_capacity = 0;
  int64_t codes_uploaded = 0;
  uint64_t codes_generation = 0;
  // The block cache's slots.
  const int32_t block_tokens;
  const int64_t slot_count;
  void* d_slots = nullptr;            // allocated at the first admission
  std::vector<int64_t> slot_block;    // block whose data a slot holds, -1 none
  void* landing_event = nullptr;      // recorded after the last append_from_device
  bool landing_recorded = false;
  void* fill_event = nullptr;         // recorded after the last slot fill
  bool fill_recorded = false;
  RowPlan fill_plan;
  // The sink and local window.
  const int32_t sink_tokens;
  const int32_t local_tokens;
  void* d_window = nullptr;           // allocated at the first store
  std::vector<int64_t> window_pos;    // position a window slot holds, -1 none
  RowPlan window_plan;
  // For the decode step kept on the device: the index's centroids, and the
  // store's chunk addresses as device tables, K at [0, table_capacity), V
  // at [table_capacity, 2 x table_capacity). Entries that changed are sent
  // (a new chunk every 256 tokens: two pointers); a grown table is sent
  // whole.
  void* d_centroids = nullptr;
  size_t centroids_bytes = 0;
  uint64_t centroids_generation = ~uint64_t{0};
  std::vector<const uint8_t*> chunks_sent;  // chunk c's K and V at [2c], [2c + 1]
  // The step a CUDA graph may capture (cuda_step_tables.cpp): the row
  // tables of its scan, top-k, fill and gather in device memory, read by
  // the kernels when they run, so that a replay follows the lengths each
  // append writes there. `step` is what the device table should hold,
  // `step_sent` what was last sent. The caller's fields (query, selection,
  // outputs) come from the last uncaptured select and fetch; a capture with
  // other buffers is refused.
  struct StepTables {
    std::vector<pq_scan_row> scan;  // one per kv head
    std::vector<pq_topk_row> topk;
    pq_fill_row fill{};
    pq_selected_gather gather{};
    std::vector<pq_rerank_row> rerank;  // one per kv head; count 0 when not re-ranking
  };
  StepTables step;
  std::vector<uint8_t> step_sent;
  void* d_step = nullptr;
  size_t step_bytes = 0;
  bool step_selected = false;  // an uncaptured select filled the select side
  bool step_fetched = false;   // an uncaptured fetch filled the gather
  const void* step_query = nullptr;
  int32_t step_query_dtype = 0;
  int64_t step_query_stride = 0;
  float* step_lut = nullptr;
  float* step_scores = nullptr;   // [kv_head][step_max_n]
  int32_t* step_middle = nullptr; // [kv_head][k]
  int32_t* step_candidates = nullptr;  // [kv_head][candidates] of a re-ranking
  const uint8_t* const* step_key_chunks = nullptr;  // the chunk tables a re-ranking reads
  int64_t step_max_n = 0;      // the middle pq_sequence_reserve made room for (0: none)
  int64_t step_max_count = 0;  // the selection's entries per kv head there
  int64_t step_max_candidates = 0;  // a re-ranking's candidates per kv head there (0: none)
  int64_t table_capacity = 0;               // chunks the device table holds
  RowPlan chunk_tables;
};

// Working buffers of the device work issued on one stream. Work on one
// stream runs in order, so a buffer is reused only after the work that
// read it; the mutex serialises host threads that issue on the same stream
// (sequences sharing it), never those on different streams.
struct StreamScratch {
  StreamScratch(const pq_cuda_plugin* k, Recycler* r)
      : arena(r), fetch_staging(k, r), positions(k, r), batch_staging(k, r), reads(k, r),
        device_tables(k, r) {}
  enum Slot {
    kLut, kCodes, kScores, kPositions, kScanWorkspace, kTopkWorkspace, kFetchPlan,
    kBatchTables, kBatchLut, kBatchScores, kBatchMiddle, kBatchScanWorkspace,
    kBatchTopkWorkspace, kBatchFetchTables, kStepScanWorkspace, kStepTopkWorkspace,
    kCandidates, kRerankWorkspace, kStepRerankWorkspace, kBatchCandidates, kBatchRerankWorkspace,
    kMultiPositions, kMultiCounts, kMultiWorkspace
  };
  std::mutex mutex;
  DeviceArena arena;
  PinnedStaging fetch_staging;  // a fetch's plan and staged rows
  PinnedStaging positions;      // a selection's positions on their way to the host
  PinnedStaging batch_staging;  // a batched selection's LUTs and row tables
  PinnedStaging reads;          // device reads on their way to the host
  StagingRing device_tables;    // the row tables of batched device steps
};

}  // namespace cuda_detail
}  // namespace pq
