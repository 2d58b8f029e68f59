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

uint64_t CudaBackend::store_window(DeviceLayer* device, const KvStore& store, int64_t first, int64_t count,
                      void* stream) const {
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

uint64_t CudaBackend::fill_cache_blocks(DeviceLayer* device, const KvStore& store,
                           const std::vector<BlockCache::Admission>& admissions,
                           int32_t block_tokens, void* stream) const {
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
  void* d_plan = plan.device(k_, plan_bytes);
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
