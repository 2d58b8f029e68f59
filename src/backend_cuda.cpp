// The CUDA backend: the core's Backend over the plug-in's C table
// (cuda_plugin_abi.h). libpqcache.so never links CUDA; every CUDA call goes
// through the plug-in that plugin_loader.cpp opened.
//
// Device work is stream-ordered on the sequence's stream (pq_sequence_set_
// stream) or the legacy default stream; the host waits only where a result
// must reach it (the selected positions: one wait per layer selection).
// Nothing is shared by sequences on different streams: the working buffers
// are per stream (StreamScratch), the device state per (sequence, layer)
// under the layer's lock.
#include "backend_cuda.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend_cuda_state.h"
#include "dtype.h"
#include "error.h"
#include "slab_pool.h"

namespace pq {

namespace {

using namespace cuda_detail;

class CudaBackend final : public Backend {
 public:
  CudaBackend(const pq_cuda_plugin* plugin, int32_t device)
      : k_(plugin),
        device_(device),
        host_(make_cpu_backend()),
        pinned_store_(
            [this](size_t bytes) -> void* {
              char err[512] = {0};
              void* p = nullptr;
              if (k_->set_device(device_, err, sizeof err) != 0 ||
                  k_->host_alloc(&p, bytes, err, sizeof err) != 0)
                return nullptr;
              return p;
            },
            [this](void* p, size_t) {
              char err[512] = {0};
              k_->host_free(p, err, sizeof err);
            },
            "the CUDA backend's page-locked K/V pool (cudaHostAlloc)") {}

  // The K/V store in page-locked, device-mapped memory: the gather kernel
  // reads selected rows across PCIe itself, so a fetch copies nothing on
  // the CPU (a caller's host_alloc hook still wins; its rows are staged).
  HostAllocator store_allocator() const override { return pinned_store_.allocator(); }

  pq_backend kind() const override { return PQ_BACKEND_CUDA; }
  const char* name() const override { return "cuda"; }
  bool supports_streams() const override { return true; }
  bool supports_memory(int32_t memory) const override {
    return memory == PQ_MEMORY_HOST || memory == PQ_MEMORY_DEVICE;
  }

  // Device memory is copied on the sequence's stream: the caller's kernels
  // that wrote it (or will read it) are ordered with the copy. With pageable
  // host memory cudaMemcpyAsync returns once the host side is done.
  void copy_to_host(void* dst, const void* src, size_t bytes, int32_t src_memory,
                    void* stream) override {
    if (src_memory == PQ_MEMORY_HOST) {
      std::memcpy(dst, src, bytes);
      return;
    }
    stream_copy(dst, src, bytes, src, stream);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes, int32_t dst_memory,
                      void* stream) override {
    if (dst_memory == PQ_MEMORY_HOST) {
      std::memcpy(dst, src, bytes);
      return;
    }
    stream_copy(dst, src, bytes, dst, stream);
  }

  // The reads go into one pinned buffer, asynchronously, and one wait
  // covers them all.
  void read_to_host(const std::vector<HostRead>& reads, void* stream) override {
    size_t total = 0;
    for (const HostRead& r : reads) {
      if (!k_->is_device_pointer(r.src))
        fail(PQ_ERR_INVALID_ARGUMENT,
             "a tensor marked PQ_MEMORY_DEVICE points to memory CUDA does not know as device "
             "memory");
      total += r.bytes;
    }
    if (total == 0) return;
    use_device();
    char err[512] = {0};
    StreamScratch& scratch = scratch_for(stream);
    std::lock_guard<std::mutex> lock(scratch.mutex);
    uint8_t* pinned = scratch.reads.acquire(total);
    size_t at = 0;
    for (const HostRead& r : reads) {
      check(k_->copy_async(pinned + at, r.src, r.bytes, stream, err, sizeof err), "device read",
            err);
      at += r.bytes;
    }
    check(k_->stream_synchronize(stream, err, sizeof err), "device reads", err);
    at = 0;
    for (const HostRead& r : reads) {
      std::memcpy(r.host_dst, pinned + at, r.bytes);
      at += r.bytes;
    }
  }

  // Host scoring, for selectors other than PQ's device path.
  void pq_scores(const float* lut, int32_t queries, int32_t subspaces, int32_t centroids,
                 const uint8_t* codes, int64_t tokens, float* out,
                 int64_t out_stride) const override {
    host_->pq_scores(lut, queries, subspaces, centroids, codes, tokens, out, out_stride);
  }

  // Prefill from device tensors: the copy into pinned memory is enqueued on
  // the sequence's stream (after the kernels that produced K/V) and the
  // call returns; the core ingests it once the event has fired.
  std::unique_ptr<HostCopy> copy_to_host_async(const void* src, size_t bytes,
                                               void* stream) const override {
    if (!k_->is_device_pointer(src))
      fail(PQ_ERR_INVALID_ARGUMENT,
           "a tensor marked PQ_MEMORY_DEVICE points to memory CUDA does not know as device memory");
    use_device();
    auto copy = std::make_unique<CudaHostCopy>(k_, bytes);
    copy->start(src, bytes, stream);
    return copy;
  }

  std::unique_ptr<DeviceLayer> make_device_layer(const pq_config& c) const override {
    return std::make_unique<CudaLayer>(k_, c);
  }

  // PQ selection of a whole layer on the GPU: the LUTs of every kv head go
  // up in one copy, the codes stay resident (only tokens coded since the
  // last call go up), one scan + GQA combine and one radix top-k cover every
  // head, and the positions come back with the one wait of the selection.
  bool pq_select_layer(const PqLayerSelectArgs& a, int32_t* out) const override {
    use_device();
    char err[512] = {0};
    void* s = a.stream;
    StreamScratch& scratch = scratch_for(s);
    std::lock_guard<std::mutex> lock(scratch.mutex);
    DeviceArena& arena = scratch.arena;
    const int64_t n = a.end - a.begin;
    const int32_t m = a.subspaces;
    const size_t lut_bytes =
        static_cast<size_t>(a.kv_heads) * a.group_size * m * a.centroids * sizeof(float);
    const size_t out_bytes = static_cast<size_t>(a.kv_heads) * a.k * sizeof(int32_t);
    const size_t scan_ws = k_->pq_scan_workspace_size(a.kv_heads, a.group_size, m, n, a.combine);
    const size_t topk_ws = k_->topk_workspace_size(a.kv_heads, n, a.k);
    void* d_lut = arena.get(StreamScratch::kLut, lut_bytes);
    auto* d_scores = static_cast<float*>(
        arena.get(StreamScratch::kScores, static_cast<size_t>(a.kv_heads) * n * sizeof(float)));
    auto* d_out = static_cast<int32_t*>(arena.get(StreamScratch::kPositions, out_bytes));
    void* d_scan_ws = scan_ws ? arena.get(StreamScratch::kScanWorkspace, scan_ws) : nullptr;
    void* d_topk_ws = topk_ws ? arena.get(StreamScratch::kTopkWorkspace, topk_ws) : nullptr;
    check(k_->copy_async(d_lut, a.lut, lut_bytes, s, err, sizeof err), "LUT upload", err);

    const uint8_t* d_codes = nullptr;
    int64_t stride = 0, begin = a.begin, end = a.end;
    if (auto* layer = static_cast<CudaLayer*>(a.device)) {
      d_codes = resident_codes(*layer, a, s);
      stride = layer->codes_capacity;
    } else {  // no device state: the middle's codes go up at every call
      auto* d = static_cast<uint8_t*>(arena.get(
          StreamScratch::kCodes, static_cast<size_t>(a.kv_heads) * n * m));
      for (int32_t h = 0; h < a.kv_heads; ++h)
        upload_codes(a.codes[h], a.begin, a.end, d + static_cast<size_t>(h) * n * m, s);
      d_codes = d;
      stride = n;
      begin = 0;
      end = n;
    }
    check(k_->pq_scan(static_cast<const float*>(d_lut), d_codes, a.kv_heads, a.group_size, m,
                      a.centroids, stride, begin, end, a.combine, a.scale, d_scores, d_scan_ws,
                      scan_ws, s, err, sizeof err),
          "pq_scan", err);
    check(k_->topk(d_scores, a.kv_heads, n, a.k, a.begin, d_out, d_topk_ws, topk_ws, s, err,
                   sizeof err),
          "topk", err);
    // Through pinned memory: a copy into pageable memory would be a second
    // wait. The earlier positions were read by the host already (below).
    uint8_t* positions = scratch.positions.acquire(out_bytes);
    check(k_->copy_async(positions, d_out, out_bytes, s, err, sizeof err), "positions download",
          err);
    // The positions must reach the host: the one wait of the selection.
    check(k_->stream_synchronize(s, err, sizeof err), "selection", err);
    std::memcpy(out, positions, out_bytes);
    return true;
  }

  // The selection of one layer for every item of a batch in one launch
  // chain: every item's LUTs and the two row tables go up in one copy, the
  // codes stay resident per layer (only new codes go up), one scan and one
  // top-k cover every kv head of every item, and the positions come back in
  // one copy with the one wait of the call.
  bool pq_select_batch(const std::vector<PqLayerSelectArgs>& items,
                       const std::vector<int32_t*>& outs) const override {
    if (items.empty()) return true;
    const PqLayerSelectArgs& first = items.front();
    for (const PqLayerSelectArgs& a : items)
      if (a.stream != first.stream || a.device == nullptr || a.kv_heads != first.kv_heads ||
          a.group_size != first.group_size || a.subspaces != first.subspaces ||
          a.centroids != first.centroids || a.combine != first.combine || a.scale != first.scale)
        return false;  // one launch chain needs one stream and one shape
    use_device();
    char err[512] = {0};
    void* s = first.stream;
    StreamScratch& scratch = scratch_for(s);
    std::lock_guard<std::mutex> lock(scratch.mutex);
    const int32_t m = first.subspaces;
    const size_t lut_floats = static_cast<size_t>(first.group_size) * m * first.centroids;
    const size_t rows = items.size() * static_cast<size_t>(first.kv_heads);
    if (rows > 65535) return false;  // the kernels' grid limit: the caller splits
    size_t score_floats = 0, out_ints = 0;
    int64_t max_n = 0;
    for (const PqLayerSelectArgs& a : items) {
      score_floats += static_cast<size_t>(a.kv_heads) * (a.end - a.begin);
      out_ints += static_cast<size_t>(a.kv_heads) * a.k;
      max_n = std::max(max_n, a.end - a.begin);
    }
    // One upload: [LUTs][scan rows][top-k rows], pointers to device memory.
    const size_t lut_bytes = rows * lut_floats * sizeof(float);
    const size_t scan_at = lut_bytes;
    const size_t topk_at = scan_at + rows * sizeof(pq_scan_row);
    const size_t up_bytes = topk_at + rows * sizeof(pq_topk_row);
    uint8_t* up = scratch.batch_staging.acquire(up_bytes);
    auto* d_up = static_cast<uint8_t*>(scratch.arena.get(StreamScratch::kLut, up_bytes));
    auto* d_scores = static_cast<float*>(
        scratch.arena.get(StreamScratch::kScores, std::max<size_t>(score_floats, 1) * sizeof(float)));
    auto* d_out = static_cast<int32_t*>(
        scratch.arena.get(StreamScratch::kPositions, std::max<size_t>(out_ints, 1) * sizeof(int32_t)));
    auto* scan_rows = reinterpret_cast<pq_scan_row*>(up + scan_at);
    auto* topk_rows = reinterpret_cast<pq_topk_row*>(up + topk_at);
    size_t row = 0, score_at = 0, out_at = 0;
    for (const PqLayerSelectArgs& a : items) {
      auto& layer = *static_cast<CudaLayer*>(a.device);
      const uint8_t* d_codes = resident_codes(layer, a, s);
      const int64_t n = a.end - a.begin;
      for (int32_t h = 0; h < a.kv_heads; ++h, ++row) {
        std::memcpy(up + row * lut_floats * sizeof(float), a.lut + h * lut_floats,
                    lut_floats * sizeof(float));
        scan_rows[row] = {reinterpret_cast<const float*>(d_up + row * lut_floats * sizeof(float)),
                          d_codes + static_cast<size_t>(h) * layer.codes_capacity * m,
                          d_scores + score_at, a.begin, a.end};
        topk_rows[row] = {d_scores + score_at, d_out + out_at, n, a.k, a.begin};
        score_at += static_cast<size_t>(n);
        out_at += static_cast<size_t>(a.k);
      }
    }
    check(k_->copy_async(d_up, up, up_bytes, s, err, sizeof err), "batch upload", err);
    scratch.batch_staging.release(s);
    const int32_t r = static_cast<int32_t>(rows);
    const size_t scan_ws = k_->pq_scan_rows_workspace_size(r, first.group_size, m, max_n,
                                                           first.combine);
    const size_t topk_ws = k_->topk_rows_workspace_size(r, max_n);
    void* d_scan_ws = scan_ws ? scratch.arena.get(StreamScratch::kScanWorkspace, scan_ws) : nullptr;
    void* d_topk_ws = topk_ws ? scratch.arena.get(StreamScratch::kTopkWorkspace, topk_ws) : nullptr;
    check(k_->pq_scan_rows(reinterpret_cast<const pq_scan_row*>(d_up + scan_at), r, max_n,
                           first.group_size, m, first.centroids, first.combine, first.scale,
                           d_scan_ws, scan_ws, s, err, sizeof err),
          "pq_scan_rows", err);
    check(k_->topk_rows(reinterpret_cast<const pq_topk_row*>(d_up + topk_at), r, max_n, d_topk_ws,
                        topk_ws, s, err, sizeof err),
          "topk_rows", err);
    const size_t out_bytes = out_ints * sizeof(int32_t);
    uint8_t* positions = scratch.positions.acquire(std::max<size_t>(out_bytes, 1));
    check(k_->copy_async(positions, d_out, out_bytes, s, err, sizeof err), "positions download",
          err);
    check(k_->stream_synchronize(s, err, sizeof err), "batched selection", err);
    out_at = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const size_t bytes = static_cast<size_t>(items[i].kv_heads) * items[i].k * sizeof(int32_t);
      std::memcpy(outs[i], positions + out_at, bytes);
      out_at += bytes;
    }
    return true;
  }

  // The whole selection of one layer written into device memory with no
  // host wait: the LUT from the device query (pq_lut), the resident codes,
  // one scan, one top-k into scratch, then fill_selection writes the sinks,
  // the middle and the local window into the caller's arrays.
  bool select_to_device(const DeviceSelectArgs& a) const override {
    const PqLayerSelectArgs& l = a.layer;
    require_device_memory(a.query.data, "query.data");
    if (a.out.capacity > 0) require_device_memory(a.out.positions, "out->positions");
    require_device_memory(a.out.counts, "out->counts");
    use_device();
    char err[512] = {0};
    void* s = l.stream;
    StreamScratch& scratch = scratch_for(s);
    std::lock_guard<std::mutex> lock(scratch.mutex);
    const int64_t n = l.end - l.begin;
    if (l.k == 0 || l.k >= n) {  // nothing to score: the whole middle, or none of it
      const int64_t sinks = l.k == 0 ? l.begin : l.end;
      check(k_->fill_selection(a.out.positions, a.out.counts, l.kv_heads, a.out.capacity, sinks,
                               nullptr, 0, l.end, a.tokens, s, err, sizeof err),
            "fill_selection", err);
      return true;
    }
    auto& layer = *static_cast<CudaLayer*>(l.device);
    const PqCodebook& cb = *a.codebook;
    const size_t centroid_bytes = cb.data.size() * sizeof(float);
    if (layer.centroids_generation != l.index_generation) {
      if (layer.centroids_bytes < centroid_bytes) {
        k_->device_free(layer.d_centroids, err, sizeof err);
        layer.d_centroids = nullptr;
        layer.centroids_bytes = 0;
        if (k_->device_alloc(&layer.d_centroids, centroid_bytes, err, sizeof err) != 0)
          fail(PQ_ERR_OUT_OF_MEMORY, "the " + std::to_string(centroid_bytes) +
                                         " device bytes of the layer's centroids could not be "
                                         "allocated: " + err);
        layer.centroids_bytes = centroid_bytes;
      }
      check(k_->copy_async(layer.d_centroids, cb.data.data(), centroid_bytes, s, err, sizeof err),
            "centroids upload", err);
      layer.centroids_generation = l.index_generation;
    }
    const int32_t m = l.subspaces;
    const size_t lut_bytes =
        static_cast<size_t>(l.kv_heads) * l.group_size * m * l.centroids * sizeof(float);
    auto* d_lut = static_cast<float*>(scratch.arena.get(StreamScratch::kLut, lut_bytes));
    const int64_t head_stride = a.query.head_stride * static_cast<int64_t>(dtype_size(a.query.dtype));
    check(k_->pq_lut(a.query.data, a.query.dtype, head_stride, l.kv_heads, l.group_size,
                     static_cast<const float*>(layer.d_centroids), m, l.centroids, cb.sub_dim,
                     d_lut, s, err, sizeof err),
          "pq_lut", err);
    const uint8_t* d_codes = resident_codes(layer, l, s);
    const size_t scan_ws = k_->pq_scan_workspace_size(l.kv_heads, l.group_size, m, n, l.combine);
    const size_t topk_ws = k_->topk_workspace_size(l.kv_heads, n, l.k);
    auto* d_scores = static_cast<float*>(
        scratch.arena.get(StreamScratch::kScores, static_cast<size_t>(l.kv_heads) * n * sizeof(float)));
    auto* d_middle = static_cast<int32_t*>(scratch.arena.get(
        StreamScratch::kPositions, static_cast<size_t>(l.kv_heads) * l.k * sizeof(int32_t)));
    void* d_scan_ws = scan_ws ? scratch.arena.get(StreamScratch::kScanWorkspace, scan_ws) : nullptr;
    void* d_topk_ws = topk_ws ? scratch.arena.get(StreamScratch::kTopkWorkspace, topk_ws) : nullptr;
    check(k_->pq_scan(d_lut, d_codes, l.kv_heads, l.group_size, m, l.centroids,
                      layer.codes_capacity, l.begin, l.end, l.combine, l.scale, d_scores,
                      d_scan_ws, scan_ws, s, err, sizeof err),
          "pq_scan", err);
    check(k_->topk(d_scores, l.kv_heads, n, l.k, l.begin, d_middle, d_topk_ws, topk_ws, s, err,
                   sizeof err),
          "topk", err);
    check(k_->fill_selection(a.out.positions, a.out.counts, l.kv_heads, a.out.capacity, l.begin,
                             d_middle, l.k, l.end, a.tokens, s, err, sizeof err),
          "fill_selection", err);
    return true;
  }

  // A selection in device memory gathered in one launch, the store read
  // through device tables of its chunk addresses (sent again only when the
  // chunks changed) and the sink and local rows from the device window.
  bool fetch_device_selection(const DeviceSelectionFetchArgs& a) const override {
    require_device_memory(a.out_keys.data, "out_keys.data");
    require_device_memory(a.out_values.data, "out_values.data");
    if (a.selection.capacity > 0) require_device_memory(a.selection.positions, "selection->positions");
    require_device_memory(a.selection.counts, "selection->counts");
    if (!device_reads(a.store))
      fail(PQ_ERR_UNSUPPORTED,
           "the K/V store is in the caller's host_alloc memory, which the device cannot read; "
           "a selection in device memory needs the CUDA backend's own store (no host_alloc "
           "hook), or use pq_fetch_kv with host positions");
    auto* layer = static_cast<CudaLayer*>(a.device);
    if (layer == nullptr || a.selection.capacity == 0 || a.store.tokens() == 0) return true;
    use_device();
    char err[512] = {0};
    const pq_selected_gather g =
        selected_gather(*layer, a.store, a.selection.positions, a.selection.counts,
                        a.selection.capacity, a.out_keys, a.out_values, a.stream);
    check(k_->gather_selected(&g, a.stream, err, sizeof err), "gather_selected", err);
    return true;
  }

  // What gather_selected needs of a layer's store, window and outputs, for
  // a selection at positions/counts (device addresses) of `capacity` rows.
  pq_selected_gather selected_gather(CudaLayer& layer, const KvStore& store,
                                     const int32_t* positions, const int32_t* counts,
                                     int64_t capacity, const pq_tensor& out_keys,
                                     const pq_tensor& out_values, void* s) const {
    const uint8_t* const* d_tables = chunk_tables(layer, store, s);
    const auto es = static_cast<int64_t>(dtype_size(out_keys.dtype));
    pq_selected_gather g{};
    g.positions = positions;
    g.counts = counts;
    g.capacity = capacity;
    g.heads = layer.kv_heads;
    g.key_chunks = d_tables;
    g.value_chunks = d_tables + store.chunk_count();
    g.chunk_tokens = KvStore::kChunkTokens;
    g.tokens = store.tokens();
    g.row_bytes = store.row_bytes();
    g.window = static_cast<const uint8_t*>(layer.d_window);
    g.sink_tokens = layer.sink_tokens;
    g.local_tokens = layer.local_tokens;
    g.out_keys = static_cast<uint8_t*>(out_keys.data);
    g.out_values = static_cast<uint8_t*>(out_values.data);
    g.keys_token_stride = out_keys.token_stride * es;
    g.keys_head_stride = out_keys.head_stride * es;
    g.values_token_stride = out_values.token_stride * es;
    g.values_head_stride = out_values.head_stride * es;
    return g;
  }

  bool fetch_to_device(const DeviceFetchArgs& a) const override {
    return fetch_batch_to_device(std::vector<DeviceFetchArgs>{a});
  }

  // The rows of the selections of a batch (one item: pq_fetch_kv) into
  // device tensors in one gather launch, K and V together: sinks and local
  // tokens from the device window, block-cache hits from their device
  // slots, the rest straight from the host store, which the kernel reads
  // across PCIe when the store is in the pinned pool. A store in the
  // caller's memory (host_alloc hook) is not device-readable: its rows are
  // first copied into pinned staging, spread over the pool.
  bool fetch_batch_to_device(const std::vector<DeviceFetchArgs>& items) const override {
    if (items.empty()) return true;
    void* s = items.front().stream;
    for (const DeviceFetchArgs& a : items)
      if (a.stream != s || a.store.row_bytes() != items.front().store.row_bytes()) return false;
    for (const DeviceFetchArgs& a : items)
      for (const pq_tensor* t : {&a.out_keys, &a.out_values})
        if (!k_->is_device_pointer(t->data))
          fail(PQ_ERR_INVALID_ARGUMENT,
               std::string(t == &a.out_keys ? "out_keys" : "out_values") +
                   " is marked PQ_MEMORY_DEVICE but points to memory CUDA does not know as "
                   "device memory");
    use_device();
    bool by_positions = true;  // no block cache, stores the device reads
    for (const DeviceFetchArgs& a : items)
      by_positions = by_positions && a.cache == nullptr && a.device != nullptr &&
                     device_reads(a.store);
    if (by_positions) return gather_by_positions(items, s);
    char err[512] = {0};
    const size_t rb = items.front().store.row_bytes();
    int64_t rows = 0, unreadable_rows = 0;
    for (const DeviceFetchArgs& a : items) {
      int64_t item_rows = 0;
      for (int32_t h = 0; h < a.out_keys.heads; ++h) item_rows += a.selection.counts[h];
      rows += item_rows;
      if (!device_reads(a.store)) unreadable_rows += item_rows;
    }
    if (rows == 0) return true;

    StreamScratch& scratch = scratch_for(s);
    std::lock_guard<std::mutex> lock(scratch.mutex);
    // Pinned: the plan, sources then destinations, K rows then V rows
    // (4 x rows pointers); then room for the staged K and V rows of stores
    // the device cannot read.
    const size_t plan_bytes = 4 * static_cast<size_t>(rows) * sizeof(void*);
    uint8_t* staging =
        scratch.fetch_staging.acquire(plan_bytes + 2 * static_cast<size_t>(unreadable_rows) * rb);
    auto* d_plan = static_cast<void**>(scratch.arena.get(StreamScratch::kFetchPlan, plan_bytes));
    void** src_k = reinterpret_cast<void**>(staging);
    void** src_v = src_k + rows;
    void** dst_k = src_k + 2 * rows;
    void** dst_v = src_k + 3 * rows;
    uint8_t* stage = staging + plan_bytes;
    // Rows that must be staged: (plan row, store, position, head).
    struct Miss {
      int64_t row, position;
      const KvStore* store;
      int32_t head;
      uint64_t* staged_bytes;
    };
    std::vector<Miss> misses;
    int64_t row = 0;
    for (const DeviceFetchArgs& a : items) {
      auto* layer = static_cast<CudaLayer*>(a.device);
      const size_t es = dtype_size(a.out_keys.dtype);
      const bool readable = device_reads(a.store);
      const bool use_cache = a.cache != nullptr && layer != nullptr && layer->d_slots != nullptr;
      if (use_cache && layer->fill_recorded)  // slot fills of earlier fetches, maybe on another stream
        check(k_->stream_wait_event(s, layer->fill_event, err, sizeof err), "cache wait", err);
      for (int32_t h = 0; h < a.out_keys.heads; ++h) {
        const int32_t* pos = a.selection.positions + h * a.selection.capacity;
        for (int32_t i = 0; i < a.selection.counts[h]; ++i, ++row) {
          const int64_t p = pos[i];
          dst_k[row] = static_cast<uint8_t*>(a.out_keys.data) +
                       (i * a.out_keys.token_stride + h * a.out_keys.head_stride) * es;
          dst_v[row] = static_cast<uint8_t*>(a.out_values.data) +
                       (i * a.out_values.token_stride + h * a.out_values.head_stride) * es;
          if (layer != nullptr && layer->d_window != nullptr &&
              (p < a.mid_begin || p >= a.mid_end)) {
            const int64_t w = layer->window_slot(p);
            if (w >= 0 && layer->window_pos[static_cast<size_t>(w)] == p) {
              src_k[row] = layer->window_row(w, false, h);
              src_v[row] = layer->window_row(w, true, h);
              continue;
            }
          }
          int32_t slot = -1;
          if (use_cache && p >= a.mid_begin && p < a.mid_end) slot = a.cache->lookup(p);
          if (slot >= 0 &&
              layer->slot_block[static_cast<size_t>(slot)] == p / layer->block_tokens) {
            const int64_t offset = p % layer->block_tokens;
            src_k[row] = layer->slot_row(slot, false, h, offset);
            src_v[row] = layer->slot_row(slot, true, h, offset);
            continue;
          }
          if (readable) {
            src_k[row] = const_cast<uint8_t*>(a.store.key_row(p, h));
            src_v[row] = const_cast<uint8_t*>(a.store.value_row(p, h));
          } else {
            misses.push_back({row, p, &a.store, h, a.staged_bytes});
          }
        }
      }
    }
    if (!misses.empty()) {
      // Staged in blocks of rows over the pool; the kernel reads the pinned
      // staging itself (mapped memory), so nothing else is copied.
      const int64_t n = static_cast<int64_t>(misses.size());
      constexpr int64_t kBlock = 512;
      auto stage_block = [&](int64_t b) {
        for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
          const Miss& m = misses[static_cast<size_t>(i)];
          uint8_t* k_row = stage + static_cast<size_t>(i) * rb;
          uint8_t* v_row = stage + static_cast<size_t>(n + i) * rb;
          std::memcpy(k_row, m.store->key_row(m.position, m.head), rb);
          std::memcpy(v_row, m.store->value_row(m.position, m.head), rb);
          src_k[m.row] = k_row;
          src_v[m.row] = v_row;
        }
      };
      const int64_t blocks = (n + kBlock - 1) / kBlock;
      ThreadPool* pool = items.front().pool;
      if (pool != nullptr && blocks > 1)
        pool->parallel_for(blocks, stage_block);
      else
        for (int64_t b = 0; b < blocks; ++b) stage_block(b);
      for (const Miss& m : misses)
        if (m.staged_bytes != nullptr) *m.staged_bytes += 2 * static_cast<uint64_t>(rb);
    }
    check(k_->copy_async(d_plan, staging, plan_bytes, s, err, sizeof err), "fetch plan upload", err);
    check(k_->gather_rows(const_cast<const void* const*>(d_plan), d_plan + 2 * rows, 2 * rows, rb,
                          s, err, sizeof err),
          "gather", err);
    // After the gather: the next fetch on this stream rewrites the staging
    // (the plan, and rows the kernel reads from it) only once it has run.
    scratch.fetch_staging.release(s);
    return true;
  }

  // The fetch without a block cache from stores the device reads: the
  // positions go up (4 bytes a row, instead of a plan's 32) with one
  // pq_selected_gather per item, and one gather_selected_rows launch finds
  // each row in the device window or the store's chunks itself.
  bool gather_by_positions(const std::vector<DeviceFetchArgs>& items, void* s) const {
    char err[512] = {0};
    StreamScratch& scratch = scratch_for(s);
    std::lock_guard<std::mutex> lock(scratch.mutex);
    const size_t n = items.size();
    // Pinned layout: the gather table, then per item its counts and its
    // positions [heads][widest count].
    std::vector<int64_t> width(n, 0);
    size_t bytes = n * sizeof(pq_selected_gather);
    int64_t max_chunks = 0;
    for (size_t i = 0; i < n; ++i) {
      const DeviceFetchArgs& a = items[i];
      for (int32_t h = 0; h < a.out_keys.heads; ++h)
        width[i] = std::max<int64_t>(width[i], a.selection.counts[h]);
      bytes += static_cast<size_t>(a.out_keys.heads) * (1 + width[i]) * sizeof(int32_t);
      max_chunks = std::max<int64_t>(max_chunks, int64_t{a.out_keys.heads} * width[i] * 2 *
                                                     ((static_cast<int64_t>(a.store.row_bytes()) + 15) / 16));
    }
    if (max_chunks == 0) return true;
    uint8_t* pinned = scratch.fetch_staging.acquire(bytes);
    auto* d_up = static_cast<uint8_t*>(scratch.arena.get(StreamScratch::kFetchPlan, bytes));
    auto* table = reinterpret_cast<pq_selected_gather*>(pinned);
    size_t at = n * sizeof(pq_selected_gather);
    for (size_t i = 0; i < n; ++i) {
      const DeviceFetchArgs& a = items[i];
      auto* layer = static_cast<CudaLayer*>(a.device);
      const int32_t heads = a.out_keys.heads;
      auto* counts = reinterpret_cast<int32_t*>(pinned + at);
      int32_t* positions = counts + heads;
      for (int32_t h = 0; h < heads; ++h) {
        counts[h] = a.selection.counts[h];
        std::memcpy(positions + h * width[i], a.selection.positions + h * a.selection.capacity,
                    static_cast<size_t>(counts[h]) * sizeof(int32_t));
      }
      const auto* d_counts = reinterpret_cast<const int32_t*>(d_up + at);
      table[i] = selected_gather(*layer, a.store, d_counts + heads, d_counts, width[i],
                                 a.out_keys, a.out_values, s);
      at += static_cast<size_t>(heads) * (1 + width[i]) * sizeof(int32_t);
    }
    check(k_->copy_async(d_up, pinned, bytes, s, err, sizeof err), "fetch positions upload", err);
    check(k_->gather_selected_rows(reinterpret_cast<const pq_selected_gather*>(d_up),
                                   static_cast<int32_t>(n), max_chunks, s, err, sizeof err),
          "gather_selected_rows", err);
    scratch.fetch_staging.release(s);
    return true;
  }

  // The store's chunk addresses as device tables (K, then V) of the layer,
  // sent again only when the chunks changed.
  const uint8_t* const* chunk_tables(CudaLayer& layer, const KvStore& store, void* s) const {
    char err[512] = {0};
    const size_t chunks = store.chunk_count();
    std::vector<const uint8_t*> table(2 * chunks);
    for (size_t c = 0; c < chunks; ++c) {
      table[c] = store.chunk_keys(c);
      table[chunks + c] = store.chunk_values(c);
    }
    if (table != layer.chunks_sent) {
      const size_t bytes = table.size() * sizeof(const uint8_t*);
      uint8_t* pinned = layer.chunk_tables.staging.acquire(bytes);
      std::memcpy(pinned, table.data(), bytes);
      void* d_table = layer.chunk_tables.device(k_, bytes);
      check(k_->copy_async(d_table, pinned, bytes, s, err, sizeof err), "chunk table upload", err);
      layer.chunk_tables.staging.release(s);
      layer.chunks_sent = std::move(table);
    }
    return static_cast<const uint8_t* const*>(layer.chunk_tables.device(k_, 0));
  }

  uint64_t store_window(DeviceLayer* device, const KvStore& store, int64_t first, int64_t count,
                        void* stream) const override {
    auto* layer = static_cast<CudaLayer*>(device);
    if (layer == nullptr || count <= 0 || layer->window_slots() == 0) return 0;
    const int64_t n = first + count;
    // The new tokens that are sinks, and those among the last local ones.
    std::vector<int64_t> positions;
    for (int64_t p = first; p < std::min<int64_t>(n, layer->sink_tokens); ++p) positions.push_back(p);
    for (int64_t p = std::max<int64_t>({first, n - layer->local_tokens, layer->sink_tokens}); p < n; ++p)
      positions.push_back(p);
    if (positions.empty()) return 0;
    use_device();
    char err[512] = {0};
    if (layer->d_window == nullptr) {
      const size_t bytes = static_cast<size_t>(layer->window_slots()) * layer->window_slot_bytes();
      if (k_->device_alloc(&layer->d_window, bytes, err, sizeof err) != 0)
        fail(PQ_ERR_OUT_OF_MEMORY, "the " + std::to_string(bytes) +
                                       " device bytes of the sink and local window could not "
                                       "be allocated: " + err);
      layer->window_pos.assign(static_cast<size_t>(layer->window_slots()), -1);
    }
    RowCopies rows;
    for (const int64_t p : positions) {
      const int64_t w = layer->window_slot(p);
      for (int32_t h = 0; h < layer->kv_heads; ++h) {
        rows.add(store.key_row(p, h), layer->window_row(w, false, h));
        rows.add(store.value_row(p, h), layer->window_row(w, true, h));
      }
      layer->window_pos[static_cast<size_t>(w)] = p;
    }
    return copy_rows_to_device(store, rows, layer->row_bytes, layer->window_plan, stream);
  }

  uint64_t fill_cache_blocks(DeviceLayer* device, const KvStore& store,
                             const std::vector<BlockCache::Admission>& admissions,
                             int32_t block_tokens, void* stream) const override {
    auto* layer = static_cast<CudaLayer*>(device);
    if (layer == nullptr || admissions.empty()) return 0;
    use_device();
    char err[512] = {0};
    if (layer->d_slots == nullptr) {
      const size_t bytes = static_cast<size_t>(layer->slot_count) * layer->slot_bytes();
      if (k_->device_alloc(&layer->d_slots, bytes, err, sizeof err) != 0)
        fail(PQ_ERR_OUT_OF_MEMORY, "the block cache's " + std::to_string(bytes) +
                                       " device bytes could not be allocated: " + err);
      layer->slot_block.assign(static_cast<size_t>(layer->slot_count), -1);
    }
    RowCopies rows;
    for (const BlockCache::Admission& adm : admissions) {
      for (int32_t h = 0; h < layer->kv_heads; ++h)
        for (int32_t t = 0; t < block_tokens; ++t) {
          const int64_t p = adm.block * block_tokens + t;
          rows.add(store.key_row(p, h), layer->slot_row(adm.slot, false, h, t));
          rows.add(store.value_row(p, h), layer->slot_row(adm.slot, true, h, t));
        }
      layer->slot_block[static_cast<size_t>(adm.slot)] = adm.block;
    }
    const uint64_t staged = copy_rows_to_device(store, rows, layer->row_bytes, layer->fill_plan, stream);
    if (layer->fill_event == nullptr)
      check(k_->event_create(&layer->fill_event, err, sizeof err), "event create", err);
    check(k_->event_record(layer->fill_event, stream, err, sizeof err), "event record", err);
    layer->fill_recorded = true;
    return staged;
  }

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
                               RowPlan& plan, void* stream) const {
    char err[512] = {0};
    const int64_t n = static_cast<int64_t>(rows.srcs.size());
    if (n == 0) return 0;
    const bool readable = device_reads(store);
    const size_t plan_bytes = 2 * static_cast<size_t>(n) * sizeof(void*);
    const size_t stage_bytes = readable ? 0 : static_cast<size_t>(n) * rb;
    uint8_t* pinned = plan.staging.acquire(plan_bytes + stage_bytes);
    auto** srcs = reinterpret_cast<const void**>(pinned);
    auto** dsts = reinterpret_cast<void**>(pinned) + n;
    std::memcpy(dsts, rows.dsts.data(), static_cast<size_t>(n) * sizeof(void*));
    if (readable) {
      std::memcpy(srcs, rows.srcs.data(), static_cast<size_t>(n) * sizeof(void*));
    } else {
      for (int64_t i = 0; i < n; ++i) {
        uint8_t* staged = pinned + plan_bytes + static_cast<size_t>(i) * rb;
        std::memcpy(staged, rows.srcs[static_cast<size_t>(i)], rb);
        srcs[i] = staged;
      }
    }
    void* d_plan = plan.device(k_, plan_bytes);
    check(k_->copy_async(d_plan, pinned, plan_bytes, stream, err, sizeof err), "row plan upload",
          err);
    check(k_->gather_rows(static_cast<const void* const*>(d_plan),
                          static_cast<void* const*>(d_plan) + n, n, rb, stream, err, sizeof err),
          "row gather", err);
    plan.staging.release(stream);
    return stage_bytes;
  }

  void require_device_memory(const void* p, const char* name) const {
    if (!k_->is_device_pointer(p))
      fail(PQ_ERR_UNSUPPORTED, std::string(name) + " is not memory CUDA knows as device memory "
                                                   "(a decode step on the device reads and "
                                                   "writes device arrays only)");
  }

  // Whether the device reads the store's rows itself: its chunks are in the
  // pinned pool (not the caller's host_alloc memory).
  bool device_reads(const KvStore& store) const {
    return store.allocator().user == pinned_store_.allocator().user;
  }

  // CUDA's current device is per host thread: every entry makes it ours.
  void use_device() const {
    char err[512] = {0};
    check(k_->set_device(device_, err, sizeof err), "cudaSetDevice", err);
  }

  StreamScratch& scratch_for(void* stream) const {
    std::lock_guard<std::mutex> lock(scratch_mutex_);
    std::unique_ptr<StreamScratch>& slot = scratch_[stream];
    if (!slot) slot = std::make_unique<StreamScratch>(k_);
    return *slot;
  }

  // Copies the codes of tokens [first, end) to d, one copy per run of the
  // column (one, unless the sequence is a fork).
  void upload_codes(const CodeColumn& codes, int64_t first, int64_t end, uint8_t* d,
                    void* s) const {
    char err[512] = {0};
    const int32_t m = codes.code_bytes();
    codes.for_each_run(first, end, [&](int64_t run_first, int64_t n, const uint8_t* p) {
      check(k_->copy_async(d + (run_first - first) * m, p, static_cast<size_t>(n) * m, s, err,
                           sizeof err),
            "codes upload", err);
    });
  }

  // The layer's codes on the device, tokens [0, a.end) of every kv head
  // present: uploads only what was coded since the last call (a rebuilt
  // index, or a grown buffer, uploads everything again).
  const uint8_t* resident_codes(CudaLayer& layer, const PqLayerSelectArgs& a, void* s) const {
    char err[512] = {0};
    const int32_t m = a.subspaces;
    if (layer.codes_generation != a.index_generation) {
      layer.codes_generation = a.index_generation;
      layer.codes_uploaded = 0;
    }
    if (layer.codes_capacity < a.end) {
      // A multiple of 16 tokens: every kv head's codes then start 16-byte
      // aligned (the scan's vector loads, row by row).
      const int64_t grown = (std::max<int64_t>({a.end, 2 * layer.codes_capacity, 4096}) + 15) / 16 * 16;
      k_->device_free(layer.d_codes, err, sizeof err);
      layer.d_codes = nullptr;
      layer.codes_capacity = layer.codes_uploaded = 0;
      const size_t bytes = static_cast<size_t>(grown) * a.kv_heads * m;
      if (k_->device_alloc(&layer.d_codes, bytes, err, sizeof err) != 0)
        fail(PQ_ERR_OUT_OF_MEMORY, "the " + std::to_string(bytes) +
                                       " device bytes of the layer's PQ codes could not be "
                                       "allocated: " + err);
      layer.codes_capacity = grown;
    }
    if (layer.codes_uploaded < a.end) {
      auto* d = static_cast<uint8_t*>(layer.d_codes);
      const int64_t from = layer.codes_uploaded;
      for (int32_t h = 0; h < a.kv_heads; ++h)
        upload_codes(a.codes[h], from, a.end,
                     d + (static_cast<size_t>(h) * layer.codes_capacity + from) * m, s);
      layer.codes_uploaded = a.end;
    }
    return static_cast<const uint8_t*>(layer.d_codes);
  }

  void stream_copy(void* dst, const void* src, size_t bytes, const void* device_side,
                   void* stream) {
    char err[512] = {0};
    if (!k_->is_device_pointer(device_side))
      fail(PQ_ERR_INVALID_ARGUMENT,
           "a tensor marked PQ_MEMORY_DEVICE points to memory CUDA does not know as device memory");
    use_device();
    check(k_->copy_async(dst, src, bytes, stream, err, sizeof err), "device copy", err);
  }

  const pq_cuda_plugin* k_;
  const int32_t device_;
  std::unique_ptr<Backend> host_;
  mutable SlabPool pinned_store_;
  mutable std::mutex scratch_mutex_;  // guards the map only
  mutable std::unordered_map<void*, std::unique_ptr<StreamScratch>> scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const pq_cuda_plugin* plugin, int32_t device) {
  return std::make_unique<CudaBackend>(plugin, device);
}

}  // namespace pq
