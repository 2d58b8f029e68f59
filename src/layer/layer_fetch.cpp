// A layer's fetch (pq_fetch_kv): the selected K/V rows into the caller's
// buffers, from the device cache and window when the backend has them, and
// the block cache's bookkeeping after it (paper section 3.4).
#include <algorithm>
#include <cstring>
#include <functional>

#include "backend/staging.h"
#include "base/call_args.h"
#include "base/dtype.h"
#include "base/error.h"
#include "layer/layer.h"
#include "base/tensor.h"

namespace pq {

void Layer::fetch(const pq_selection* sel, int64_t max_count, const pq_tensor& out_keys,
                  const pq_tensor& out_values, const SequenceInfo& seq) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  PreparedFetch prepared;
  fetch_prepare(sel, max_count, out_keys, out_values, seq, prepared);
  const DeviceKernels* device = shared_.backend->device_kernels();
  const bool on_device =
      prepared.device_args.has_value() && device && device->fetch_to_device(*prepared.device_args);
  fetch_finish(prepared, on_device, seq);
}

void Layer::fetch_prepare(const pq_selection* sel, int64_t max_count, const pq_tensor& out_keys,
                          const pq_tensor& out_values, const SequenceInfo& seq,
                          PreparedFetch& prepared) {
  require_prefill(seq.id, "pq_fetch_kv");
  require_kv(seq.id, "pq_fetch_kv");
  const int32_t kv_heads = shared_.config.num_kv_heads;
  check_positions(sel, kv_heads, store_->tokens(), layer_index_);
  const Regions r = shared_.regions(store_->tokens(), layer_index_);
  prepared.regions = r;
  prepared.selection = sel;
  prepared.out_keys = &out_keys;
  prepared.out_values = &out_values;
  prepared.rows = 0;
  for (int32_t h = 0; h < kv_heads; ++h) prepared.rows += static_cast<uint64_t>(sel->counts[h]);
  // Every allocation the cache's update needs happens here, before any
  // output is written: past this point the fetch cannot fail halfway.
  if (cache_) {
    cache_->reserve(r.n);
    prepared.sorted_scratch.reserve(static_cast<size_t>(max_count));
  }
  if (out_keys.memory == PQ_MEMORY_DEVICE && out_values.memory == PQ_MEMORY_DEVICE) {
    DeviceFetchArgs& a = prepared.device_args.emplace(
        DeviceFetchArgs{context(seq), *store_, *sel, out_keys, out_values});
    a.cache = cache_.get();
    a.middle = {r.sink_end, r.mid_end};
    a.staged_bytes = &prepared.staged;
  }
}

void Layer::fetch_finish(PreparedFetch& prepared, bool on_device, const SequenceInfo& seq) {
  if (!on_device)
    gather_on_host(prepared.selection, *prepared.out_keys, *prepared.out_values, prepared.rows,
                   seq.stream);
  // Device slots are filled only for device fetches: a host fetch never
  // reads them, so it should not pay their PCIe traffic.
  const CacheCount cached =
      cache_ ? update_cache(prepared.regions, prepared.selection, on_device ? seq.stream : nullptr,
                            on_device, prepared.sorted_scratch)
             : CacheCount{};
  const uint64_t rb = store_->row_bytes();
  for (Counters* c : {&shared_.counters, seq.counters.get()}) {
    c->fetch_calls.fetch_add(1);
    c->bytes_fetched.fetch_add(prepared.rows * rb * 2);
    c->cache_hits.fetch_add(cached.hits);
    c->cache_misses.fetch_add(cached.misses);
    c->bytes_staged.fetch_add(prepared.staged + cached.staged);
  }
}

// The gather into host memory; device outputs are staged through host
// memory (the span is read first so that bytes between the rows the caller
// did not ask for are preserved).
void Layer::gather_on_host(const pq_selection* sel, const pq_tensor& out_keys,
                           const pq_tensor& out_values, uint64_t rows, void* stream) {
  Backend& backend = *shared_.backend;
  const int32_t kv_heads = shared_.config.num_kv_heads;
  StagedTensor k = stage_input(backend, out_keys, stream);
  StagedTensor v = stage_input(backend, out_values, stream);
  const size_t es = dtype_size(shared_.config.dtype);
  // A gather of scattered rows is bound by memory latency, not bandwidth:
  // prefetch a few rows ahead, and split large gathers across the pool.
  auto gather_head = [&](int64_t h64) {
    const int32_t h = static_cast<int32_t>(h64);
    const int32_t* pos = sel->positions + h * sel->capacity;
    if (sel->counts[h] == 0) return;  // an empty output may have no buffer to point into
    store_->gather(h, pos, sel->counts[h], tensor_row_mut(k.view, 0, h, es),
                   static_cast<size_t>(k.view.token_stride) * es, tensor_row_mut(v.view, 0, h, es),
                   static_cast<size_t>(v.view.token_stride) * es);
  };
  if (kv_heads > 1 && rows >= 4096)
    shared_.pool->parallel_for(kv_heads, gather_head);
  else
    for (int32_t h = 0; h < kv_heads; ++h) gather_head(h);
  if (out_keys.memory != PQ_MEMORY_HOST) {
    backend.copy_from_host(out_keys.data, k.buffer.data(), k.buffer.size(), out_keys.memory,
                           stream);
    backend.copy_from_host(out_values.data, v.buffer.data(), v.buffer.size(), out_values.memory,
                           stream);
  }
}

// Counts the fetched middle tokens the block cache held, then updates it
// with them (after the fetch, off its critical path). Sinks and the local
// window are resident anyway and not counted.
Layer::CacheCount Layer::update_cache(const Regions& r, const pq_selection* sel, void* stream,
                                      bool fill_device, std::vector<int32_t>& sorted) {
  CacheCount count;
  for (int32_t h = 0; h < shared_.config.num_kv_heads; ++h) {
    const int32_t* pos = sel->positions + h * sel->capacity;
    const int32_t n = sel->counts[h];
    // A caller's selection may repeat a position: a token is fetched (and
    // counted) once per kv head. pq_decode_select's are ascending already.
    if (std::adjacent_find(pos, pos + n, std::greater_equal<int32_t>()) != pos + n) {
      sorted.assign(pos, pos + n);
      std::sort(sorted.begin(), sorted.end());
      pos = sorted.data();
    }
    for (int32_t i = 0; i < n; ++i) {
      if (pos[i] < r.sink_end || pos[i] >= r.mid_end || (i > 0 && pos[i] == pos[i - 1])) continue;
      if (cache_->record(pos[i]))
        ++count.hits;
      else
        ++count.misses;
    }
  }
  const std::vector<BlockCache::Admission>& admitted = cache_->commit(r.n);
  const DeviceMemory* device = shared_.backend->device_memory();
  if (fill_device && device)
    count.staged = device->fill_cache_blocks(device_.get(), *store_, admitted,
                                             cache_->block_tokens(), stream);
  return count;
}

}  // namespace pq
