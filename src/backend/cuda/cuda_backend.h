// The CUDA backend: the core's Backend and its three device capabilities
// (DeviceMemory, DeviceKernels, DeviceStep; backend.h) over the plug-in's C
// table (cuda_plugin_abi.h). libpqcache.so never links CUDA; every CUDA
// call goes through the plug-in that plugin_loader.cpp opened. Its methods
// are spread over the folder by concept: cuda_backend.cpp (copies, streams,
// the pinned store), cuda_select.cpp (selection on the device),
// cuda_fetch.cpp (the gathers of a fetch), cuda_copies.cpp (the window and
// the block cache's slots), cuda_device_batch.cpp (the device step of a
// batch), cuda_select_multi.cpp (several query tokens in one select),
// cuda_step_tables.cpp (the step a CUDA graph captures).
//
// Device work is stream-ordered on the sequence's stream (pq_sequence_set_
// stream) or the legacy default stream; the host waits only where a result
// must reach it. Nothing is shared by sequences on different streams: the
// working buffers are per stream (StreamScratch), the device state per
// (sequence, layer) under the layer's lock.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/device_kernels.h"
#include "backend/device_memory.h"
#include "backend/device_step.h"
#include "base/error.h"
#include "backend/cuda/cuda_plugin_abi.h"
#include "backend/cuda/device_state.h"
#include "store/kv_store.h"
#include "store/slab_pool.h"

namespace pq {

// The backend over a plug-in table of this library's ABI version, on
// device `device`.
std::unique_ptr<Backend> make_cuda_backend(const pq_cuda_plugin* plugin, int32_t device);

namespace cuda_detail {

class CudaBackend final : public Backend,
                          public DeviceMemory,
                          public DeviceKernels,
                          public DeviceStep {
 public:
  CudaBackend(const pq_cuda_plugin* plugin, int32_t device);

  // --- Backend -----------------------------------------------------------

  pq_backend kind() const override { return PQ_BACKEND_CUDA; }
  const char* name() const override { return "cuda"; }
  bool supports_memory(int32_t memory) const override {
    return memory == PQ_MEMORY_HOST || memory == PQ_MEMORY_DEVICE;
  }

  // Device memory is copied on the sequence's stream: the caller's kernels
  // that wrote it (or will read it) are ordered with the copy. With pageable
  // host memory cudaMemcpyAsync returns once the host side is done.
  void copy_to_host(void* dst, const void* src, size_t bytes, int32_t src_memory,
                    void* stream) override;
  void copy_from_host(void* dst, const void* src, size_t bytes, int32_t dst_memory,
                      void* stream) override;

  // The reads go into one pinned buffer, asynchronously, and one wait
  // covers them all.
  void read_to_host(const std::vector<HostRead>& reads, void* stream) override;

  const DeviceMemory* device_memory() const override { return this; }
  const DeviceKernels* device_kernels() const override { return this; }
  const DeviceStep* device_step() const override { return this; }

  // --- DeviceMemory (cuda_backend.cpp, cuda_copies.cpp) ------------------

  // The K/V store in page-locked, device-mapped memory: the gather kernel
  // reads selected rows across PCIe itself, so a fetch copies nothing on
  // the CPU (a caller's host_alloc hook still wins; its rows are staged).
  HostAllocator store_allocator() const override { return pinned_store_.allocator(); }

  // Prefill from device tensors: the copy into pinned memory is enqueued on
  // the sequence's stream (after the kernels that produced K/V) and the
  // call returns; the core ingests it once the event has fired.
  std::unique_ptr<HostCopy> copy_to_host_async(const void* src, size_t bytes,
                                               void* stream) const override;

  std::unique_ptr<DeviceLayer> make_device_layer(const pq_config& c) const override;

  uint64_t store_window(DeviceLayer* device, const KvTier& store, int64_t first, int64_t count,
                        void* stream) const override;

  uint64_t fill_cache_blocks(DeviceLayer* device, const KvTier& store,
                             const std::vector<BlockCache::Admission>& admissions,
                             int32_t block_tokens, void* stream) const override;

  // Device K/V appended without the host: one inline_copies launch per 64
  // rows writes the store rows (mapped pinned memory) and the window rows
  // from the caller's tensors; the layer's landing event follows them.
  bool append_from_device(DeviceLayer* device, const KvTier& store, int64_t first,
                          const pq_tensor& keys, const pq_tensor& values,
                          void* stream) const override;
  bool device_writes_landed(DeviceLayer* device) const override;
  void wait_device_writes(DeviceLayer* device) const override;

  // Keeps the layer's device state over a truncate: the codes and window
  // rows of kept tokens stay, the window rows of the new last tokens that
  // later ones had overwritten come back from the store (one gather), and
  // nothing waits.
  void truncate_device(DeviceLayer* device, const KvTier& store, int64_t tokens,
                       void* stream) const override;

  // pq_sequence_reserve: store blocks, and per layer the device codes, the
  // chunk tables and the stream's working buffers for `tokens` tokens.
  bool reserve_store(size_t block_bytes, size_t blocks) const override;
  void reserve_layer(DeviceLayer* device, const ReserveArgs& args) const override;

  // --- DeviceKernels (cuda_select.cpp, cuda_fetch.cpp) -------------------

  // PQ selection of a whole layer on the GPU: the LUTs of every kv head go
  // up in one copy, the codes stay resident (only tokens coded since the
  // last call go up), one scan + GQA combine and one radix top-k cover every
  // head, and the positions come back with the one wait of the selection.
  bool pq_select_layer(const PqLayerSelectArgs& a, int32_t* out) const override;

  // The selection of one layer for every item of a batch in one launch
  // chain: every item's LUTs and the two row tables go up in one copy, the
  // codes stay resident per layer (only new codes go up), one scan and one
  // top-k cover every kv head of every item, and the positions come back in
  // one copy with the one wait of the call.
  bool pq_select_batch(const std::vector<PqLayerSelectArgs>& items,
                       const std::vector<int32_t*>& outs) const override;

  bool fetch_to_device(const DeviceFetchArgs& a) const override;

  // The rows of the selections of a batch (one item: pq_fetch_kv) into
  // device tensors in one gather launch, K and V together: sinks and local
  // tokens from the device window, block-cache hits from their device
  // slots, the rest straight from the host store, which the kernel reads
  // across PCIe when the store is in the pinned pool. A store in the
  // caller's memory (host_alloc hook) is not device-readable: its rows are
  // first copied into pinned staging, spread over the pool.
  bool fetch_batch_to_device(const std::vector<DeviceFetchArgs>& items) const override;

  // --- DeviceStep (cuda_select.cpp, cuda_fetch.cpp, cuda_device_batch.cpp,
  // cuda_step_tables.cpp) -------------------------------------------------

  // The whole selection of one layer written into device memory with no
  // host wait: the LUT from the device query (pq_lut_ordered, in the
  // codebook's dimension order), the resident codes, one scan, one top-k
  // into scratch (of the candidates, with pq_rerank, which pq_rerank then
  // re-ranks by their keys read from the store in place), then
  // fill_selection writes the sinks, the middle and the local window into
  // the caller's arrays.
  bool select_to_device(const DeviceSelectArgs& a) const override;

  // A selection in device memory gathered in one launch, the store read
  // through device tables of its chunk addresses (sent again only when the
  // chunks changed) and the sink and local rows from the device window.
  bool fetch_device_selection(const DeviceSelectionFetchArgs& a) const override;

  // Those two for the sequences of a batch at one layer
  // (cuda_device_batch.cpp): every selection in four launches (five with
  // pq_rerank), every fetch in one, whatever the batch size.
  bool select_batch_to_device(const std::vector<const DeviceSelectArgs*>& items) const override;
  bool fetch_batch_device_selection(
      const std::vector<const DeviceSelectionFetchArgs*>& items) const override;

  // Several query tokens of one sequence (cuda_select_multi.cpp): every
  // token's selection made by the batched launch chain into the stream's
  // scratch, then multi_rows writes the caller's rows (per token, or the
  // unions per kv head or per request), padded with -1; no host wait.
  bool select_multi_to_device(const DeviceMultiSelectArgs& args) const override;

  // The step a CUDA graph may capture (cuda_step_tables.cpp).
  bool keeps_device_step(const DeviceLayer* device) const override {
    const auto* layer = static_cast<const CudaLayer*>(device);
    return layer != nullptr && (layer->step_selected || layer->step_fetched);
  }
  void refresh_device_step(DeviceLayer* device, const PqLayerSelectArgs& args, int64_t tokens,
                           const KvTier& store, void* stream) const override;

  // --- Shared by the capabilities ------------------------------------------

  // The batched selection's launch chain (LUTs, scan, top-k, re-ranking,
  // fill) over items that share `s`, under the stream scratch's lock; at
  // most 65535 kv heads in all (the kernels' grid).
  void select_batch_chain(const std::vector<const DeviceSelectArgs*>& items,
                          StreamScratch& scratch, void* s) const;

  // What gather_selected needs of a layer's store, window and outputs, for
  // a selection at positions/counts (device addresses) of `capacity` rows.
  pq_selected_gather selected_gather(CudaLayer& layer, const KvStore& store,
                                     const int32_t* positions, const int32_t* counts,
                                     int64_t capacity, const pq_tensor& out_keys,
                                     const pq_tensor& out_values, void* s) const;

  // The fetch without a block cache from stores the device reads: the
  // positions go up (4 bytes a row, instead of a plan's 32) with one
  // pq_selected_gather per item, and one gather_selected_rows launch finds
  // each row in the device window or the store's chunks itself.
  bool gather_by_positions(const std::vector<DeviceFetchArgs>& items, void* s) const;

  // The store's chunk addresses as device tables (K, then V) of the layer,
  // sent again only when the chunks changed.
  const uint8_t* const* chunk_tables(CudaLayer& layer, const KvStore& store, void* s) const;

 private:
  // Rows to copy from the host store into device memory: sources, then
  // their destinations.
  struct RowCopies {
    std::vector<const void*> srcs;
    std::vector<void*> dsts;
    void add(const void* src, void* dst) {
      srcs.push_back(src);
      dsts.push_back(dst);
    }
  };

  // One gather launch on `stream` for all the rows, with its plan (source
  // and destination pointers) uploaded through `plan`. A store in the pinned
  // pool is read by the kernel itself; any other store's rows are copied
  // into the plan's pinned buffer first (mapped: the kernel reads them
  // there). Returns the bytes the CPU copied.
  uint64_t copy_rows_to_device(const KvStore& store, const RowCopies& rows, size_t rb,
                               RowPlan& plan, void* stream) const;

  void require_device_memory(const void* p, const char* name) const;

  // A re-ranking on the device (config.pq_rerank): the store whose keys it
  // reads, which must be one the device reads (else PQ_ERR_UNSUPPORTED);
  // the shape its rows share; and the re-ranking of one layer's `wide`
  // candidates per kv head into d_middle ([kv_head][k]), enqueued.
  const KvStore& rerank_store(const KvTier& tier) const;
  pq_rerank_shape rerank_shape(const DeviceSelectArgs& a, int64_t max_count) const;
  void rerank_on_device(CudaLayer& layer, const DeviceSelectArgs& a, const int32_t* d_candidates,
                        int64_t wide, int32_t* d_middle, StreamScratch& scratch, void* s) const;

  // Whether the device reads the store's rows itself: its chunks are in the
  // pinned pool (not the caller's host_alloc memory).
  bool device_reads(const KvStore& store) const;

  // CUDA's current device is per host thread: every entry makes it ours.
  void use_device() const;

  StreamScratch& scratch_for(void* stream) const;

  // Copies the codes of tokens [first, end) to d, one copy per run of the
  // column (one, unless the sequence is a fork).
  void upload_codes(const CodeColumn& codes, int64_t first, int64_t end, uint8_t* d,
                    void* s) const;

  // The new codes of tokens [from, end) of every kv head in one
  // inline_copies launch (to d, [head][stride][m]); false when they do not
  // fit its payload.
  bool upload_codes_inline(const PqLayerSelectArgs& a, int64_t from, int64_t end, uint8_t* d,
                           int64_t stride, void* s) const;
  // The layer's device codes grown to hold `tokens` per kv head.
  void grow_codes(CudaLayer& layer, int64_t tokens, int32_t kv_heads, int32_t m) const;

  // The layer's codes on the device, tokens [0, a.end) of every kv head
  // present: uploads only what was coded since the last call (a rebuilt
  // index, or a grown buffer, uploads everything again).
  const uint8_t* resident_codes(CudaLayer& layer, const PqLayerSelectArgs& a, void* s) const;

  void stream_copy(void* dst, const void* src, size_t bytes, const void* device_side,
                   void* stream);

  // The layer's sink and local window in device memory, allocated at its
  // first store.
  void ensure_window(CudaLayer& layer) const;

  // The rows of `rows` (at most PQ_INLINE_ROWS) in one inline_copies
  // launch: nothing staged, nothing waited for. False when they do not fit.
  bool copy_rows_inline(const RowCopies& rows, size_t row_bytes, void* stream) const;

  // The step tables' select side at this length (layer.step, host shadow),
  // and the whole table sent where it changed (inline_copies).
  void step_select_rows(CudaLayer& layer, const PqLayerSelectArgs& l, int64_t tokens) const;
  void send_step(CudaLayer& layer, void* s) const;
  // Inside a capture: the step's launches over the tables, after checking
  // that the caller's buffers are those the tables hold.
  bool select_captured(CudaLayer& layer, const DeviceSelectArgs& a, StreamScratch& scratch,
                       void* s) const;
  bool fetch_captured(CudaLayer& layer, const pq_selected_gather& caller, void* s) const;
  bool capturing(void* s) const {
    char err[512] = {0};
    return k_->stream_capturing(s, err, sizeof err) == 1;
  }

  // A device buffer of a layer grown to at least `bytes` (geometrically),
  // the old one handed back fenced; its contents are not kept.
  void grow(void*& ptr, size_t& bytes, size_t want, const char* what) const;

  // Records, when the entry that made it returns (by return or throw), that
  // the work it enqueued on `stream` may touch store and layer memory: what
  // is released after that waits for it.
  class Touch {
   public:
    Touch(const CudaBackend& b, void* stream) : b_(b), stream_(stream) {}
    ~Touch();
   private:
    const CudaBackend& b_;
    void* stream_;
  };

  const pq_cuda_plugin* k_;
  const int32_t device_;
  mutable ReleaseFences fences_;
  mutable Recycler recycler_;
  mutable SlabPool pinned_store_;
  mutable std::mutex scratch_mutex_;  // guards the map only
  mutable std::unordered_map<void*, std::unique_ptr<StreamScratch>> scratch_;
};

}  // namespace cuda_detail
}  // namespace pq
