// The CUDA backend's fetch into device memory (cuda_backend.h): by
// positions (no block cache), by a plan of pointers (with one), and of a
// selection kept in device memory.
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

bool CudaBackend::fetch_device_selection(const DeviceSelectionFetchArgs& a) const {
  require_device_memory(a.out_keys.data, "out_keys.data");
  require_device_memory(a.out_values.data, "out_values.data");
  if (a.selection.capacity > 0) require_device_memory(a.selection.positions, "selection->positions");
  require_device_memory(a.selection.counts, "selection->counts");
  if (!device_reads(host_rows(a.store)))
    fail(PQ_ERR_UNSUPPORTED,
         "the K/V store is in the caller's host_alloc memory, which the device cannot read; "
         "a selection in device memory needs the CUDA backend's own store (no host_alloc "
         "hook), or use pq_fetch_kv with host positions");
  auto* layer = static_cast<CudaLayer*>(a.context.device);
  if (layer == nullptr || a.selection.capacity == 0 || host_rows(a.store).tokens() == 0) return true;
  use_device();
  char err[512] = {0};
  void* s = a.context.stream;
  const Touch touch(*this, s);
  if (capturing(s)) {
    // The caller's fields only: the chunk tables and the length are the
    // tables', which appends keep up to date outside the graph.
    const auto es = static_cast<int64_t>(dtype_size(a.out_keys.dtype));
    pq_selected_gather caller{};
    caller.positions = a.selection.positions;
    caller.counts = a.selection.counts;
    caller.capacity = a.selection.capacity;
    caller.out_keys = static_cast<uint8_t*>(a.out_keys.data);
    caller.out_values = static_cast<uint8_t*>(a.out_values.data);
    caller.keys_token_stride = a.out_keys.token_stride * es;
    caller.keys_head_stride = a.out_keys.head_stride * es;
    caller.values_token_stride = a.out_values.token_stride * es;
    caller.values_head_stride = a.out_values.head_stride * es;
    return fetch_captured(*layer, caller, s);
  }
  const pq_selected_gather g =
      selected_gather(*layer, host_rows(a.store), a.selection.positions, a.selection.counts,
                      a.selection.capacity, a.out_keys, a.out_values, s);
  check(k_->gather_selected(&g, s, err, sizeof err), "gather_selected", err);
  if (layer->step_max_n > 0) {  // after a reserve: the gather a graph may capture
    layer->step.gather = g;
    layer->step_fetched = true;
    send_step(*layer, s);
  }
  return true;
}

pq_selected_gather CudaBackend::selected_gather(CudaLayer& layer, const KvStore& store,
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
  g.value_chunks = d_tables + layer.table_capacity;
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

bool CudaBackend::fetch_to_device(const DeviceFetchArgs& a) const {
  return fetch_batch_to_device(std::vector<DeviceFetchArgs>{a});
}

bool CudaBackend::fetch_batch_to_device(const std::vector<DeviceFetchArgs>& items) const {
  if (items.empty()) return true;
  void* s = items.front().context.stream;
  for (const DeviceFetchArgs& a : items)
    if (a.context.stream != s || host_rows(a.store).row_bytes() != host_rows(items.front().store).row_bytes()) return false;
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
    by_positions = by_positions && a.cache == nullptr && a.context.device != nullptr &&
                   device_reads(host_rows(a.store));
  if (by_positions) return gather_by_positions(items, s);
  char err[512] = {0};
  const size_t rb = host_rows(items.front().store).row_bytes();
  int64_t rows = 0, unreadable_rows = 0;
  for (const DeviceFetchArgs& a : items) {
    int64_t item_rows = 0;
    for (int32_t h = 0; h < a.out_keys.heads; ++h) item_rows += a.selection.counts[h];
    rows += item_rows;
    if (!device_reads(host_rows(a.store))) unreadable_rows += item_rows;
  }
  if (rows == 0) return true;

  StreamScratch& scratch = scratch_for(s);
  std::lock_guard<std::mutex> lock(scratch.mutex);
  const Touch touch(*this, s);
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
  // The plan, one task per (item, kv head): 32 bytes a row, 4 ms of one
  // core at 128K tokens, so spread over the pool when it is large. Tasks
  // write disjoint rows; a store the device cannot read leaves each task's
  // misses in its own list.
  struct Task {
    const DeviceFetchArgs* a;
    int32_t head;
    int64_t first_row;
  };
  std::vector<Task> tasks;
  int64_t row = 0;
  for (const DeviceFetchArgs& a : items) {
    auto* layer = static_cast<CudaLayer*>(a.context.device);
    const bool use_cache = a.cache != nullptr && layer != nullptr && layer->d_slots != nullptr;
    if (use_cache && layer->fill_recorded)  // slot fills of earlier fetches, maybe on another stream
      check(k_->stream_wait_event(s, layer->fill_event, err, sizeof err), "cache wait", err);
    for (int32_t h = 0; h < a.out_keys.heads; ++h) {
      tasks.push_back({&a, h, row});
      row += a.selection.counts[h];
    }
  }
  std::vector<std::vector<Miss>> task_misses(tasks.size());
  auto plan_task = [&](int64_t t) {
    const Task& task = tasks[static_cast<size_t>(t)];
    const DeviceFetchArgs& a = *task.a;
    const int32_t h = task.head;
    auto* layer = static_cast<CudaLayer*>(a.context.device);
    const size_t es = dtype_size(a.out_keys.dtype);
    const KvStore& store = host_rows(a.store);
    const bool readable = device_reads(store);
    const bool use_cache = a.cache != nullptr && layer != nullptr && layer->d_slots != nullptr;
    const int32_t* pos = a.selection.positions + h * a.selection.capacity;
    int64_t r = task.first_row;
    for (int32_t i = 0; i < a.selection.counts[h]; ++i, ++r) {
      const int64_t p = pos[i];
      dst_k[r] = static_cast<uint8_t*>(a.out_keys.data) +
                 (i * a.out_keys.token_stride + h * a.out_keys.head_stride) * es;
      dst_v[r] = static_cast<uint8_t*>(a.out_values.data) +
                 (i * a.out_values.token_stride + h * a.out_values.head_stride) * es;
      if (layer != nullptr && layer->d_window != nullptr &&
          (p < a.middle.begin || p >= a.middle.end)) {
        const int64_t w = layer->window_slot(p);
        if (w >= 0 && layer->window_pos[static_cast<size_t>(w)] == p) {
          src_k[r] = layer->window_row(w, false, h);
          src_v[r] = layer->window_row(w, true, h);
          continue;
        }
      }
      int32_t slot = -1;
      if (use_cache && p >= a.middle.begin && p < a.middle.end) slot = a.cache->lookup(p);
      if (slot >= 0 && layer->slot_block[static_cast<size_t>(slot)] == p / layer->block_tokens) {
        const int64_t offset = p % layer->block_tokens;
        src_k[r] = layer->slot_row(slot, false, h, offset);
        src_v[r] = layer->slot_row(slot, true, h, offset);
        continue;
      }
      if (readable) {
        src_k[r] = const_cast<uint8_t*>(store.key_row(p, h));
        src_v[r] = const_cast<uint8_t*>(store.value_row(p, h));
      } else {
        task_misses[static_cast<size_t>(t)].push_back({r, p, &store, h, a.staged_bytes});
      }
    }
  };
  ThreadPool* plan_pool = items.front().context.pool;
  constexpr int64_t kParallelPlanRows = 8192;
  if (plan_pool != nullptr && plan_pool->size() > 1 && rows >= kParallelPlanRows)
    plan_pool->parallel_for(static_cast<int64_t>(tasks.size()), plan_task);
  else
    for (size_t t = 0; t < tasks.size(); ++t) plan_task(static_cast<int64_t>(t));
  for (auto& m : task_misses) misses.insert(misses.end(), m.begin(), m.end());
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
    ThreadPool* pool = items.front().context.pool;
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

bool CudaBackend::gather_by_positions(const std::vector<DeviceFetchArgs>& items, void* s) const {
  char err[512] = {0};
  StreamScratch& scratch = scratch_for(s);
  std::lock_guard<std::mutex> lock(scratch.mutex);
  const Touch touch(*this, s);
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
                                                   ((static_cast<int64_t>(host_rows(a.store).row_bytes()) + 15) / 16));
  }
  if (max_chunks == 0) return true;
  uint8_t* pinned = scratch.fetch_staging.acquire(bytes);
  auto* d_up = static_cast<uint8_t*>(scratch.arena.get(StreamScratch::kFetchPlan, bytes));
  auto* table = reinterpret_cast<pq_selected_gather*>(pinned);
  size_t at = n * sizeof(pq_selected_gather);
  for (size_t i = 0; i < n; ++i) {
    const DeviceFetchArgs& a = items[i];
    auto* layer = static_cast<CudaLayer*>(a.context.device);
    const int32_t heads = a.out_keys.heads;
    auto* counts = reinterpret_cast<int32_t*>(pinned + at);
    int32_t* positions = counts + heads;
    for (int32_t h = 0; h < heads; ++h) {
      counts[h] = a.selection.counts[h];
      std::memcpy(positions + h * width[i], a.selection.positions + h * a.selection.capacity,
                  static_cast<size_t>(counts[h]) * sizeof(int32_t));
    }
    const auto* d_counts = reinterpret_cast<const int32_t*>(d_up + at);
    table[i] = selected_gather(*layer, host_rows(a.store), d_counts + heads, d_counts, width[i],
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

const uint8_t* const* CudaBackend::chunk_tables(CudaLayer& layer, const KvStore& store, void* s) const {
  char err[512] = {0};
  const size_t chunks = store.chunk_count();
  std::vector<const uint8_t*>& sent = layer.chunks_sent;  // [K of chunk c, V of chunk c] pairs
  if (static_cast<int64_t>(chunks) > layer.table_capacity) {
    // Grown (geometrically, or by pq_sequence_reserve): sent whole.
    const int64_t capacity = std::max<int64_t>({static_cast<int64_t>(chunks),
                                                2 * layer.table_capacity, 16});
    layer.chunk_tables.device(2 * static_cast<size_t>(capacity) * sizeof(const uint8_t*));
    layer.table_capacity = capacity;
    sent.clear();
  }
  auto* d_table = static_cast<const uint8_t**>(layer.chunk_tables.device(0));
  const size_t cap = static_cast<size_t>(layer.table_capacity);
  // The entries that changed: a decode step's new chunk is two pointers,
  // sent by value; more (a first fetch, a fork, a truncate) go up staged.
  std::vector<size_t> changed;
  for (size_t c = 0; c < chunks; ++c)
    if (2 * c + 1 >= sent.size() || sent[2 * c] != store.chunk_keys(c) ||
        sent[2 * c + 1] != store.chunk_values(c))
      changed.push_back(c);
  if (changed.empty()) return d_table;
  sent.resize(2 * std::max(chunks, sent.size() / 2));
  for (size_t c : changed) {
    sent[2 * c] = store.chunk_keys(c);
    sent[2 * c + 1] = store.chunk_values(c);
  }
  if (2 * changed.size() <= PQ_INLINE_PIECES) {
    pq_inline_copies inline_args{};
    for (size_t c : changed)
      for (int v = 0; v < 2; ++v) {
        const int32_t i = inline_args.pieces++;
        const uint16_t at = static_cast<uint16_t>(i * sizeof(const uint8_t*));
        std::memcpy(inline_args.payload + at, &sent[2 * c + v], sizeof(const uint8_t*));
        inline_args.piece_dst[i] = d_table + (v ? cap : 0) + c;
        inline_args.piece_at[i] = at;
        inline_args.piece_bytes[i] = sizeof(const uint8_t*);
      }
    check(k_->inline_copies(&inline_args, s, err, sizeof err), "chunk table update", err);
    return d_table;
  }
  const size_t bytes = 2 * cap * sizeof(const uint8_t*);
  auto* pinned = reinterpret_cast<const uint8_t**>(layer.chunk_tables.staging.acquire(bytes));
  std::fill(pinned, pinned + 2 * cap, nullptr);
  for (size_t c = 0; c < chunks; ++c) {
    pinned[c] = sent[2 * c];
    pinned[cap + c] = sent[2 * c + 1];
  }
  check(k_->copy_async(d_table, pinned, bytes, s, err, sizeof err), "chunk table upload", err);
  layer.chunk_tables.staging.release(s);
  return d_table;
}

}  // namespace cuda_detail
}  // namespace pq
