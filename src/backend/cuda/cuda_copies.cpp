// The CUDA backend's copies of store rows into device memory on the
// host's behalf (cuda_backend.h): the sink and local window, the block
// cache's slots.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "base/dtype.h"
#include "base/error.h"

namespace pq {
namespace cuda_detail {

uint64_t CudaBackend::store_window(DeviceLayer* device, const KvTier& tier, int64_t first, int64_t count,
                      void* stream) const {
  auto* layer = static_cast<CudaLayer*>(device);
  // An index-only tier keeps no values: no window (nothing fetches it).
  if (layer == nullptr || count <= 0 || layer->window_slots() == 0 || !tier.keeps_values())
    return 0;
  const KvStore& store = host_rows(tier);
  const int64_t n = first + count;
  // The new tokens that are sinks, and those among the last local ones.
  std::vector<int64_t> positions;
  for (int64_t p = first; p < std::min<int64_t>(n, layer->sink_tokens); ++p) positions.push_back(p);
  for (int64_t p = std::max<int64_t>({first, n - layer->local_tokens, layer->sink_tokens}); p < n; ++p)
    positions.push_back(p);
  if (positions.empty()) return 0;
  use_device();
  const Touch touch(*this, stream);
  ensure_window(*layer);
  RowCopies rows;
  for (const int64_t p : positions) {
    const int64_t w = layer->window_slot(p);
    for (int32_t h = 0; h < layer->kv_heads; ++h) {
      rows.add(store.key_row(p, h), layer->window_row(w, false, h));
      rows.add(store.value_row(p, h), layer->window_row(w, true, h));
    }
    layer->window_pos[static_cast<size_t>(w)] = p;
  }
  // A decode step's token: by value, so that the step stages and waits for
  // nothing.
  if (device_reads(store) && copy_rows_inline(rows, layer->row_bytes, stream)) return 0;
  return copy_rows_to_device(store, rows, layer->row_bytes, layer->window_plan, stream);
}

void CudaBackend::ensure_window(CudaLayer& layer) const {
  if (layer.d_window != nullptr) return;
  const size_t bytes = static_cast<size_t>(layer.window_slots()) * layer.window_slot_bytes();
  size_t got = 0;
  layer.d_window = recycler_.acquire(bytes, false, "the sink and local window", &got);
  layer.window_pos.assign(static_cast<size_t>(layer.window_slots()), -1);
}

bool CudaBackend::append_from_device(DeviceLayer* device, const KvTier& tier, int64_t first,
                                     const pq_tensor& keys, const pq_tensor& values,
                                     void* stream) const {
  auto* layer = static_cast<CudaLayer*>(device);
  // An index-only tier has no store rows to write: its keys go through the
  // host (Layer::append_from_device does not ask).
  if (layer == nullptr || !tier.keeps_values()) return false;
  const KvStore& store = host_rows(tier);
  // The caller's host_alloc memory is not the device's to write; rows past
  // what a kernel parameter carries go through the host.
  if (!device_reads(store) || layer->row_bytes > 4096) return false;
  require_device_memory(keys.data, "keys.data");
  require_device_memory(values.data, "values.data");
  use_device();
  const Touch touch(*this, stream);
  const int64_t count = keys.tokens, n = first + count;
  const size_t es = dtype_size(keys.dtype);
  auto row_of = [es](const pq_tensor& t, int64_t token, int32_t head) {
    return static_cast<const uint8_t*>(t.data) + (token * t.token_stride + head * t.head_stride) * es;
  };
  RowCopies rows;
  for (int64_t t = 0; t < count; ++t)
    for (int32_t h = 0; h < layer->kv_heads; ++h) {
      rows.add(row_of(keys, t, h), const_cast<uint8_t*>(store.key_row(first + t, h)));
      rows.add(row_of(values, t, h), const_cast<uint8_t*>(store.value_row(first + t, h)));
    }
  // The window's rows of the new tokens, from the caller's tensors too.
  if (layer->window_slots() > 0) {
    ensure_window(*layer);
    for (int64_t p = first; p < n; ++p) {
      const bool sink = p < layer->sink_tokens;
      if (!sink && p < n - layer->local_tokens) continue;
      const int64_t w = layer->window_slot(p);
      for (int32_t h = 0; h < layer->kv_heads; ++h) {
        rows.add(row_of(keys, p - first, h), layer->window_row(w, false, h));
        rows.add(row_of(values, p - first, h), layer->window_row(w, true, h));
      }
      layer->window_pos[static_cast<size_t>(w)] = p;
    }
  }
  RowCopies part;
  for (size_t i = 0; i < rows.srcs.size(); i += PQ_INLINE_ROWS) {
    const size_t end = std::min(rows.srcs.size(), i + PQ_INLINE_ROWS);
    part.srcs.assign(rows.srcs.begin() + i, rows.srcs.begin() + end);
    part.dsts.assign(rows.dsts.begin() + i, rows.dsts.begin() + end);
    copy_rows_inline(part, layer->row_bytes, stream);
  }
  char err[512] = {0};
  if (layer->landing_event == nullptr)
    check(k_->event_create(&layer->landing_event, err, sizeof err), "event create", err);
  check(k_->event_record(layer->landing_event, stream, err, sizeof err), "event record", err);
  layer->landing_recorded = true;
  return true;
}

bool CudaBackend::device_writes_landed(DeviceLayer* device) const {
  auto* layer = static_cast<CudaLayer*>(device);
  if (layer == nullptr || !layer->landing_recorded) return true;
  char err[512] = {0};
  return k_->event_query(layer->landing_event, err, sizeof err) == 1;
}

void CudaBackend::wait_device_writes(DeviceLayer* device) const {
  auto* layer = static_cast<CudaLayer*>(device);
  if (layer == nullptr || !layer->landing_recorded) return;
  char err[512] = {0};
  check(k_->event_synchronize(layer->landing_event, err, sizeof err), "device append", err);
}

bool CudaBackend::copy_rows_inline(const RowCopies& rows, size_t row_bytes, void* stream) const {
  const size_t n = rows.srcs.size();
  if (n > PQ_INLINE_ROWS || row_bytes > 4096) return false;
  pq_inline_copies args{};
  args.rows = static_cast<int32_t>(n);
  args.row_bytes = row_bytes;
  for (size_t i = 0; i < n; ++i) {
    args.srcs[i] = rows.srcs[i];
    args.dsts[i] = rows.dsts[i];
  }
  char err[512] = {0};
  check(k_->inline_copies(&args, stream, err, sizeof err), "inline row copies", err);
  return true;
}

void CudaBackend::truncate_device(DeviceLayer* device, const KvTier& tier, int64_t tokens,
                                  void* stream) const {
  auto* layer = static_cast<CudaLayer*>(device);
  if (layer == nullptr) return;
  layer->truncate(tokens);
  // No window without a store (an index-only tier's layer never has one).
  if (layer->d_window == nullptr || layer->local_tokens == 0 || !tier.keeps_values()) return;
  const KvStore& store = host_rows(tier);
  // The last local tokens kept whose ring slots later tokens overwrote come
  // back from the store.
  const int64_t first = std::max<int64_t>(layer->sink_tokens, tokens - layer->local_tokens);
  int64_t missing = first;
  while (missing < tokens &&
         layer->window_pos[static_cast<size_t>(layer->window_slot(missing))] == missing)
    ++missing;
  if (missing < tokens) store_window(device, store, missing, tokens - missing, stream);
}

void CudaBackend::reserve_layer(DeviceLayer* device, const ReserveArgs& a) const {
  auto* layer = static_cast<CudaLayer*>(device);
  if (layer == nullptr) return;
  use_device();
  const Touch touch(*this, a.stream);
  const int32_t kv = layer->kv_heads;
  // The layer's codes and chunk tables for a.tokens tokens.
  if (layer->codes_capacity < a.tokens) grow_codes(*layer, a.tokens, kv, a.subspaces);
  const int64_t chunks = (a.tokens + KvStore::kChunkTokens - 1) / KvStore::kChunkTokens;
  if (layer->table_capacity < chunks) {
    layer->chunk_tables.device(2 * static_cast<size_t>(chunks) * sizeof(const uint8_t*));
    layer->table_capacity = chunks;
    layer->chunks_sent.clear();  // sent whole at the next fetch
  }
  // The stream's working buffers of a selection at that length.
  const int64_t n = std::max<int64_t>(a.middle, 1);
  StreamScratch& scratch = scratch_for(a.stream);
  std::lock_guard<std::mutex> lock(scratch.mutex);
  DeviceArena& arena = scratch.arena;
  arena.get(StreamScratch::kLut, static_cast<size_t>(kv) * a.group_size * a.subspaces *
                                     a.centroids * sizeof(float));
  arena.get(StreamScratch::kScores, static_cast<size_t>(kv) * n * sizeof(float));
  arena.get(StreamScratch::kPositions,
            static_cast<size_t>(kv) * std::max<int64_t>(a.k, 1) * sizeof(int32_t));
  const size_t scan_ws = k_->pq_scan_workspace_size(kv, a.group_size, a.subspaces, n, a.combine);
  if (scan_ws > 0) arena.get(StreamScratch::kScanWorkspace, scan_ws);
  const size_t topk_ws = k_->topk_workspace_size(kv, n, std::max(a.k, a.candidates));
  if (topk_ws > 0) arena.get(StreamScratch::kTopkWorkspace, topk_ws);
  // The step a CUDA graph may capture runs at these sizes.
  layer->step_max_n = std::max(layer->step_max_n, a.middle);
  layer->step_max_count = std::max(layer->step_max_count, a.count);
  const size_t step_scan_ws =
      k_->pq_scan_rows_workspace_size(kv, a.group_size, a.subspaces, layer->step_max_n, a.combine);
  if (step_scan_ws > 0) arena.get(StreamScratch::kStepScanWorkspace, step_scan_ws);
  const size_t step_topk_ws = k_->topk_rows_workspace_size(kv, layer->step_max_n);
  if (step_topk_ws > 0) arena.get(StreamScratch::kStepTopkWorkspace, step_topk_ws);
  arena.get(StreamScratch::kScores, static_cast<size_t>(kv) * layer->step_max_n * sizeof(float));
  // A re-ranking's candidates and workspaces (pq_rerank), at the step's sizes.
  if (a.candidates > a.k) {
    layer->step_max_candidates = std::max(layer->step_max_candidates, a.candidates);
    arena.get(StreamScratch::kCandidates,
              static_cast<size_t>(kv) * layer->step_max_candidates * sizeof(int32_t));
    const size_t rerank_ws =
        k_->pq_rerank_workspace_size(kv, layer->step_max_candidates, a.group_size);
    for (size_t slot : {StreamScratch::kRerankWorkspace, StreamScratch::kStepRerankWorkspace})
      if (rerank_ws > 0) arena.get(slot, rerank_ws);
  }
}

uint64_t CudaBackend::fill_cache_blocks(DeviceLayer* device, const KvTier& tier,
                           const std::vector<BlockCache::Admission>& admissions,
                           int32_t block_tokens, void* stream) const {
  auto* layer = static_cast<CudaLayer*>(device);
  if (layer == nullptr || admissions.empty() || !tier.keeps_values()) return 0;
  const KvStore& store = host_rows(tier);
  use_device();
  char err[512] = {0};
  const Touch touch(*this, stream);
  if (layer->d_slots == nullptr) {
    const size_t bytes = static_cast<size_t>(layer->slot_count) * layer->slot_bytes();
    size_t got = 0;
    layer->d_slots = recycler_.acquire(bytes, false, "the block cache's slots", &got);
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

uint64_t CudaBackend::copy_rows_to_device(const KvStore& store, const RowCopies& rows, size_t rb,
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
  void* d_plan = plan.device(plan_bytes);
  check(k_->copy_async(d_plan, pinned, plan_bytes, stream, err, sizeof err), "row plan upload",
        err);
  check(k_->gather_rows(static_cast<const void* const*>(d_plan),
                        static_cast<void* const*>(d_plan) + n, n, rb, stream, err, sizeof err),
        "row gather", err);
  plan.staging.release(stream);
  return stage_bytes;
}

}  // namespace cuda_detail
}  // namespace pq
