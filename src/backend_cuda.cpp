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

#include "dtype.h"
#include "error.h"

namespace pq {

namespace {

// Throws PQ_ERR_BACKEND "<what>: <plug-in message>" for a failed call.
void check(int rc, const char* what, const char* err) {
  if (rc != 0) fail(PQ_ERR_BACKEND, std::string(what) + ": " + err);
}

// Device buffers reused across calls, grown on demand (never shrunk).
class DeviceArena {
 public:
  explicit DeviceArena(const pq_cuda_plugin* k) : k_(k) {}
  ~DeviceArena() {
    char err[256];
    for (auto& b : buffers_) k_->device_free(b.ptr, err, sizeof err);
  }
  void* get(size_t slot, size_t bytes) {
    if (buffers_.size() <= slot) buffers_.resize(slot + 1);
    Buffer& b = buffers_[slot];
    if (b.bytes < bytes) {
      char err[512] = {0};
      k_->device_free(b.ptr, err, sizeof err);
      b = Buffer{};
      if (k_->device_alloc(&b.ptr, bytes, err, sizeof err) != 0)
        fail(PQ_ERR_OUT_OF_MEMORY, std::string("device allocation failed: ") + err);
      b.bytes = bytes;
    }
    return b.ptr;
  }

 private:
  struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  const pq_cuda_plugin* k_;
  std::vector<Buffer> buffers_;
};

// Page-locked host memory for staging copies, with the event of the last
// copy that reads it: it is rewritten only after that copy has run.
class PinnedStaging {
 public:
  explicit PinnedStaging(const pq_cuda_plugin* k) : k_(k) {}
  ~PinnedStaging() {
    char err[256];
    k_->host_free(ptr_, err, sizeof err);
    k_->event_destroy(event_, err, sizeof err);
  }
  // Waits until the previous copy from the buffer is done, then returns at
  // least `bytes` of it.
  uint8_t* acquire(size_t bytes) {
    char err[512] = {0};
    if (recorded_) check(k_->event_synchronize(event_, err, sizeof err), "staging wait", err);
    recorded_ = false;
    if (bytes_ < bytes) {
      k_->host_free(ptr_, err, sizeof err);
      ptr_ = nullptr;
      bytes_ = 0;
      const size_t grown = std::max(bytes, bytes_ * 2);
      if (k_->host_alloc(&ptr_, grown, err, sizeof err) != 0)
        fail(PQ_ERR_OUT_OF_MEMORY, std::string("pinned host allocation failed: ") + err);
      bytes_ = grown;
    }
    return static_cast<uint8_t*>(ptr_);
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
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  void* event_ = nullptr;
  bool recorded_ = false;
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
  CudaLayer(const pq_cuda_plugin* k, const pq_config& c)
      : k_(k),
        kv_heads(c.num_kv_heads),
        row_bytes(static_cast<size_t>(c.head_dim) * dtype_size(c.dtype)),
        block_tokens(c.cache_block_tokens),
        slot_count(c.cache_tokens / c.cache_block_tokens),
        fill_staging(k),
        sink_tokens(c.sink_tokens),
        local_tokens(c.local_tokens),
        window_staging(k) {}
  ~CudaLayer() override {
    char err[256];
    k_->device_free(d_codes, err, sizeof err);
    k_->device_free(d_slots, err, sizeof err);
    k_->device_free(d_window, err, sizeof err);
    k_->event_destroy(fill_event, err, sizeof err);
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
  const int32_t kv_heads;
  const size_t row_bytes;
  // The PQ codes resident on the device, one buffer for the layer,
  // [kv_head][codes_capacity][subspaces]: tokens [0, codes_uploaded) of
  // index `codes_generation` (a rebuilt index starts over).
  void* d_codes = nullptr;
  int64_t codes_capacity = 0;
  int64_t codes_uploaded = 0;
  uint64_t codes_generation = 0;
  // The block cache's slots.
  const int32_t block_tokens;
  const int64_t slot_count;
  void* d_slots = nullptr;            // allocated at the first admission
  std::vector<int64_t> slot_block;    // block whose data a slot holds, -1 none
  void* fill_event = nullptr;         // recorded after the last slot fill
  bool fill_recorded = false;
  PinnedStaging fill_staging;
  // The sink and local window.
  const int32_t sink_tokens;
  const int32_t local_tokens;
  void* d_window = nullptr;           // allocated at the first store
  std::vector<int64_t> window_pos;    // position a window slot holds, -1 none
  PinnedStaging window_staging;
};

// Working buffers of the device work issued on one stream. Work on one
// stream runs in order, so a buffer is reused only after the work that
// read it; the mutex serialises host threads that issue on the same stream
// (sequences sharing it), never those on different streams.
struct StreamScratch {
  explicit StreamScratch(const pq_cuda_plugin* k) : arena(k), fetch_staging(k), positions(k) {}
  enum Slot { kLut, kCodes, kScores, kPositions, kScanWorkspace, kTopkWorkspace, kFetchRows,
              kFetchPlan };
  std::mutex mutex;
  DeviceArena arena;
  PinnedStaging fetch_staging;  // a fetch's miss rows and plan
  PinnedStaging positions;      // a selection's positions on their way to the host
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const pq_cuda_plugin* plugin, int32_t device)
      : k_(plugin), device_(device), host_(make_cpu_backend()) {}

  pq_backend kind() const override { return PQ_BACKEND_CUDA; }
  const char* name() const override { return "cuda"; }
  bool supports_streams() const override { return true; }
  bool supports_memory(int32_t memory) const override {
    return memory == PQ_MEMORY_HOST || memory == PQ_MEMORY_DEVICE;
  }

  void copy_to_host(void* dst, const void* src, size_t bytes, int32_t src_memory) override {
    if (src_memory == PQ_MEMORY_HOST) {
      std::memcpy(dst, src, bytes);
      return;
    }
    device_copy(dst, src, bytes, PQ_COPY_DEVICE_TO_HOST);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes, int32_t dst_memory) override {
    if (dst_memory == PQ_MEMORY_HOST) {
      std::memcpy(dst, src, bytes);
      return;
    }
    device_copy(dst, src, bytes, PQ_COPY_HOST_TO_DEVICE);
  }

  // Host scoring, for selectors other than PQ's device path.
  void pq_scores(const float* lut, int32_t queries, int32_t subspaces, int32_t centroids,
                 const uint8_t* codes, int64_t tokens, float* out) const override {
    host_->pq_scores(lut, queries, subspaces, centroids, codes, tokens, out);
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
        check(k_->copy_async(d + static_cast<size_t>(h) * n * m, a.codes[h] + a.begin * m,
                             static_cast<size_t>(n) * m, s, err, sizeof err),
              "codes upload", err);
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

  bool fetch_to_device(const DeviceFetchArgs& a) const override {
    for (const pq_tensor* t : {&a.out_keys, &a.out_values})
      if (!k_->is_device_pointer(t->data))
        fail(PQ_ERR_INVALID_ARGUMENT, std::string(t == &a.out_keys ? "out_keys" : "out_values") +
                                          " is marked PQ_MEMORY_DEVICE but points to memory "
                                          "CUDA does not know as device memory");
    use_device();
    char err[512] = {0};
    void* s = a.stream;
    auto* layer = static_cast<CudaLayer*>(a.device);
    const int32_t kv_heads = a.out_keys.heads;
    const size_t rb = a.store.row_bytes();
    const size_t es = dtype_size(a.out_keys.dtype);
    int64_t rows = 0;
    for (int32_t h = 0; h < kv_heads; ++h) rows += a.selection.counts[h];
    if (rows == 0) return true;

    StreamScratch& scratch = scratch_for(s);
    std::lock_guard<std::mutex> lock(scratch.mutex);
    // Pinned layout: misses' K rows, misses' V rows, then the plan:
    // K sources, K destinations, V sources, V destinations (rows each).
    const size_t data_bytes = 2 * static_cast<size_t>(rows) * rb;
    const size_t plan_bytes = 4 * static_cast<size_t>(rows) * sizeof(void*);
    uint8_t* staging = scratch.fetch_staging.acquire(data_bytes + plan_bytes);
    auto* d_data = static_cast<uint8_t*>(scratch.arena.get(StreamScratch::kFetchRows, data_bytes));
    auto* d_plan = static_cast<void**>(scratch.arena.get(StreamScratch::kFetchPlan, plan_bytes));
    uint8_t* miss_k = staging;
    uint8_t* miss_v = staging + static_cast<size_t>(rows) * rb;
    void** plan = reinterpret_cast<void**>(staging + data_bytes);
    void** src_k = plan;
    void** dst_k = plan + rows;
    void** src_v = plan + 2 * rows;
    void** dst_v = plan + 3 * rows;

    const bool use_cache = a.cache != nullptr && layer != nullptr && layer->d_slots != nullptr;
    if (use_cache && layer->fill_recorded)  // slot fills of earlier fetches, maybe on another stream
      check(k_->stream_wait_event(s, layer->fill_event, err, sizeof err), "cache wait", err);
    int64_t row = 0, misses = 0;
    for (int32_t h = 0; h < kv_heads; ++h) {
      const int32_t* pos = a.selection.positions + h * a.selection.capacity;
      for (int32_t i = 0; i < a.selection.counts[h]; ++i, ++row) {
        const int64_t p = pos[i];
        dst_k[row] = static_cast<uint8_t*>(a.out_keys.data) +
                     (i * a.out_keys.token_stride + h * a.out_keys.head_stride) * es;
        dst_v[row] = static_cast<uint8_t*>(a.out_values.data) +
                     (i * a.out_values.token_stride + h * a.out_values.head_stride) * es;
        if (layer != nullptr && layer->d_window != nullptr && (p < a.mid_begin || p >= a.mid_end)) {
          const int64_t w = layer->window_slot(p);
          if (w >= 0 && layer->window_pos[static_cast<size_t>(w)] == p) {
            src_k[row] = layer->window_row(w, false, h);
            src_v[row] = layer->window_row(w, true, h);
            continue;
          }
        }
        int32_t slot = -1;
        if (use_cache && p >= a.mid_begin && p < a.mid_end) slot = a.cache->lookup(p);
        if (slot >= 0 && layer->slot_block[static_cast<size_t>(slot)] == p / layer->block_tokens) {
          const int64_t offset = p % layer->block_tokens;
          src_k[row] = layer->slot_row(slot, false, h, offset);
          src_v[row] = layer->slot_row(slot, true, h, offset);
          continue;
        }
        std::memcpy(miss_k + misses * rb, a.store.key_row(p, h), rb);
        std::memcpy(miss_v + misses * rb, a.store.value_row(p, h), rb);
        src_k[row] = d_data + misses * rb;
        src_v[row] = d_data + (rows + misses) * rb;
        ++misses;
      }
    }
    if (misses > 0) {
      check(k_->copy_async(d_data, miss_k, static_cast<size_t>(misses) * rb, s, err, sizeof err),
            "fetch upload (K)", err);
      check(k_->copy_async(d_data + rows * rb, miss_v, static_cast<size_t>(misses) * rb, s, err,
                           sizeof err),
            "fetch upload (V)", err);
    }
    check(k_->copy_async(d_plan, plan, plan_bytes, s, err, sizeof err), "fetch plan upload", err);
    check(k_->gather_rows(const_cast<const void* const*>(d_plan), d_plan + rows, rows, rb, s, err,
                          sizeof err),
          "gather (K)", err);
    check(k_->gather_rows(const_cast<const void* const*>(d_plan + 2 * rows), d_plan + 3 * rows,
                          rows, rb, s, err, sizeof err),
          "gather (V)", err);
    // After the gathers: the next fetch on this stream rewrites the staging
    // only once these have run.
    scratch.fetch_staging.release(s);
    return true;
  }

  void store_window(DeviceLayer* device, const KvStore& store, int64_t first, int64_t count,
                    void* stream) const override {
    auto* layer = static_cast<CudaLayer*>(device);
    if (layer == nullptr || count <= 0 || layer->window_slots() == 0) return;
    const int64_t n = first + count;
    // The new tokens that are sinks, and those among the last local ones.
    std::vector<int64_t> positions;
    for (int64_t p = first; p < std::min<int64_t>(n, layer->sink_tokens); ++p) positions.push_back(p);
    for (int64_t p = std::max<int64_t>({first, n - layer->local_tokens, layer->sink_tokens}); p < n; ++p)
      positions.push_back(p);
    if (positions.empty()) return;
    use_device();
    char err[512] = {0};
    const size_t slot_bytes = layer->window_slot_bytes();
    if (layer->d_window == nullptr) {
      const size_t bytes = static_cast<size_t>(layer->window_slots()) * slot_bytes;
      if (k_->device_alloc(&layer->d_window, bytes, err, sizeof err) != 0)
        fail(PQ_ERR_OUT_OF_MEMORY, "the " + std::to_string(bytes) +
                                       " device bytes of the sink and local window could not "
                                       "be allocated: " + err);
      layer->window_pos.assign(static_cast<size_t>(layer->window_slots()), -1);
    }
    const size_t rb = layer->row_bytes;
    uint8_t* staging = layer->window_staging.acquire(positions.size() * slot_bytes);
    for (size_t i = 0; i < positions.size(); ++i) {
      const int64_t p = positions[i];
      const int64_t w = layer->window_slot(p);
      uint8_t* slot = staging + i * slot_bytes;
      for (int32_t h = 0; h < layer->kv_heads; ++h) {
        std::memcpy(slot + static_cast<size_t>(h) * rb, store.key_row(p, h), rb);
        std::memcpy(slot + (static_cast<size_t>(layer->kv_heads) + h) * rb, store.value_row(p, h), rb);
      }
      check(k_->copy_async(layer->window_row(w, false, 0), slot, slot_bytes, stream, err,
                           sizeof err),
            "window store", err);
      layer->window_pos[static_cast<size_t>(w)] = p;
    }
    layer->window_staging.release(stream);
  }

  void fill_cache_blocks(DeviceLayer* device, const KvStore& store,
                         const std::vector<BlockCache::Admission>& admissions,
                         int32_t block_tokens, void* stream) const override {
    auto* layer = static_cast<CudaLayer*>(device);
    if (layer == nullptr || admissions.empty()) return;
    use_device();
    char err[512] = {0};
    if (layer->d_slots == nullptr) {
      const size_t bytes = static_cast<size_t>(layer->slot_count) * layer->slot_bytes();
      if (k_->device_alloc(&layer->d_slots, bytes, err, sizeof err) != 0)
        fail(PQ_ERR_OUT_OF_MEMORY, "the block cache's " + std::to_string(bytes) +
                                       " device bytes could not be allocated: " + err);
      layer->slot_block.assign(static_cast<size_t>(layer->slot_count), -1);
    }
    const size_t rb = layer->row_bytes;
    const size_t slot_bytes = layer->slot_bytes();
    uint8_t* staging = layer->fill_staging.acquire(admissions.size() * slot_bytes);
    for (size_t a = 0; a < admissions.size(); ++a) {
      const BlockCache::Admission& adm = admissions[a];
      uint8_t* block = staging + a * slot_bytes;
      for (int32_t v = 0; v < 2; ++v)
        for (int32_t h = 0; h < layer->kv_heads; ++h)
          for (int32_t t = 0; t < block_tokens; ++t) {
            const int64_t p = adm.block * block_tokens + t;
            std::memcpy(block + ((static_cast<size_t>(v) * layer->kv_heads + h) * block_tokens + t) * rb,
                        v ? store.value_row(p, h) : store.key_row(p, h), rb);
          }
      check(k_->copy_async(layer->slot_row(adm.slot, false, 0, 0), block, slot_bytes, stream, err,
                           sizeof err),
            "cache fill", err);
      layer->slot_block[static_cast<size_t>(adm.slot)] = adm.block;
    }
    layer->fill_staging.release(stream);
    if (layer->fill_event == nullptr)
      check(k_->event_create(&layer->fill_event, err, sizeof err), "event create", err);
    check(k_->event_record(layer->fill_event, stream, err, sizeof err), "event record", err);
    layer->fill_recorded = true;
  }

 private:
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
      const int64_t grown = std::max<int64_t>({a.end, 2 * layer.codes_capacity, 4096});
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
        check(k_->copy_async(d + (static_cast<size_t>(h) * layer.codes_capacity + from) * m,
                             a.codes[h] + from * m, static_cast<size_t>(a.end - from) * m, s, err,
                             sizeof err),
              "codes upload", err);
      layer.codes_uploaded = a.end;
    }
    return static_cast<const uint8_t*>(layer.d_codes);
  }

  void device_copy(void* dst, const void* src, size_t bytes, int direction) {
    char err[512] = {0};
    const void* device_ptr = direction == PQ_COPY_DEVICE_TO_HOST ? src : dst;
    if (!k_->is_device_pointer(device_ptr))
      fail(PQ_ERR_INVALID_ARGUMENT,
           "a tensor marked PQ_MEMORY_DEVICE points to memory CUDA does not know as device memory");
    use_device();
    check(k_->copy(dst, src, bytes, direction, err, sizeof err), "device copy", err);
  }

  const pq_cuda_plugin* k_;
  const int32_t device_;
  std::unique_ptr<Backend> host_;
  mutable std::mutex scratch_mutex_;  // guards the map only
  mutable std::unordered_map<void*, std::unique_ptr<StreamScratch>> scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const pq_cuda_plugin* plugin, int32_t device) {
  return std::make_unique<CudaBackend>(plugin, device);
}

}  // namespace pq
