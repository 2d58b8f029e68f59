// libpqcache_cuda_fake.so: the CUDA plug-in's C table (src/backend/cuda/cuda_plugin_abi.h)
// implemented over host memory, so that every build, CI included, runs the
// CUDA backend's own logic (src/backend/cuda: the fetch plans, the window
// ring, the resident codes and their delta uploads, the device block cache,
// the stream ordering, the asynchronous prefill) without a GPU. Only the
// kernels themselves need the device; they are replaced here by the CPU code
// they are tested against (src/base/topk.cpp).
//
// It behaves like CUDA where the backend could get it wrong:
//   - work is deferred: a copy or kernel enqueued on a stream runs only when
//     something waits for it (stream_synchronize, event_synchronize, a
//     stream waiting on an event, a synchronising call), so a result read
//     before its wait is missing, as on a GPU;
//   - "device" memory is a registry of allocations, poisoned at allocation
//     (0xCD); kernels and copies check that the pointers they are given are
//     device memory (or pinned, where the ABI allows it), else they fail;
//   - pageable host memory follows cudaMemcpyAsync's rules: a source is read
//     at the call, a destination written synchronously (a host wait);
//   - cudaFree and cudaFreeHost synchronise everything first.
// Counters (pq_fake_cuda_counters) let tests check how many times the host
// waited and how many bytes went up.
#include <algorithm>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "backend/cuda/cuda_plugin_abi.h"
#include "base/dtype.h"
#include "fake_cuda_plugin.h"
#include "pqcache.h"
#include "base/scratch.h"
#include "base/topk.h"
#include "base/vector_math.h"

namespace {

// Everything below is guarded by one recursive mutex: a deferred operation
// may itself run another stream's work (a stream waiting on an event).
std::recursive_mutex g_mutex;
using Lock = std::lock_guard<std::recursive_mutex>;

pq_fake_cuda_counters g_counters;

// Allocations: begin -> bytes.
std::map<uintptr_t, size_t> g_device;
std::map<uintptr_t, size_t> g_pinned;

bool inside(const std::map<uintptr_t, size_t>& m, const void* p, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = m.upper_bound(a);
  if (it == m.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second && a + bytes >= a;
}
bool is_device(const void* p, size_t bytes = 1) { return inside(g_device, p, bytes); }
bool is_pinned(const void* p, size_t bytes = 1) { return inside(g_pinned, p, bytes); }
bool is_pageable(const void* p) { return !is_device(p) && !is_pinned(p); }

struct Stream {
  std::deque<std::function<void()>> queue;
  uint64_t enqueued = 0;  // operations ever enqueued
  uint64_t done = 0;      // operations ever run
  bool capturing = false; // enqueued work goes into `graph`
  std::vector<std::function<void()>> graph;
};
Stream g_legacy;                // the NULL stream
std::set<Stream*> g_streams;    // from stream_create
std::string g_sticky_error;     // a "fault" of a deferred operation

Stream& stream_of(void* s) { return s == nullptr ? g_legacy : *static_cast<Stream*>(s); }
bool valid_stream(void* s) { return s == nullptr || g_streams.count(static_cast<Stream*>(s)) > 0; }

void run_until(Stream& s, uint64_t ticket) {
  while (s.done < ticket && !s.queue.empty()) {
    std::function<void()> op = std::move(s.queue.front());
    s.queue.pop_front();
    op();
    ++s.done;
  }
}
void run_all(Stream& s) { run_until(s, s.enqueued); }
void run_everything() {
  run_all(g_legacy);
  for (Stream* s : g_streams) run_all(*s);
}

void enqueue(void* stream, std::function<void()> op) {
  Stream& s = stream_of(stream);
  if (s.capturing) {
    s.graph.push_back(std::move(op));
    return;
  }
  s.queue.push_back(std::move(op));
  ++s.enqueued;
}

// A capture (global mode) refuses what would wait, allocate or free.
bool any_capturing() {
  if (g_legacy.capturing) return true;
  for (Stream* s : g_streams)
    if (s->capturing) return true;
  return false;
}
int refused_in_capture(const char* what, char* err, size_t len);

struct Event {
  Stream* stream = nullptr;
  uint64_t ticket = 0;
};
std::set<Event*> g_events;

int error(char* err, size_t len, const char* fmt, ...) {
  if (err != nullptr && len > 0) {
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(err, len, fmt, args);
    va_end(args);
  }
  return 1;
}

int refused_in_capture(const char* what, char* err, size_t len) {
  ++g_counters.capture_refusals;
  return error(err, len, "%s: cudaErrorStreamCaptureUnsupported (operation not permitted when "
               "stream is capturing)", what);
}

// Reports (once) a fault of a deferred operation at the next wait.
int take_sticky(char* err, size_t len) {
  if (g_sticky_error.empty()) return 0;
  const std::string e = std::move(g_sticky_error);
  g_sticky_error.clear();
  return error(err, len, "fake CUDA fault in an earlier operation: %s", e.c_str());
}
void fault(const char* what) {
  if (g_sticky_error.empty()) g_sticky_error = what;
}

// --- devices ----------------------------------------------------------------

int device_count() {
  const char* env = std::getenv("PQ_FAKE_CUDA_DEVICES");
  return env != nullptr ? std::atoi(env) : 1;
}
int device_name(int device, char* buf, size_t len) {
  if (device != 0) return 1;
  std::snprintf(buf, len, "pqcache fake CUDA device (host memory)");
  return 0;
}
int set_device(int device, char* err, size_t len) {
  if (device < 0 || device >= device_count())
    return error(err, len, "cudaSetDevice(%d): invalid device", device);
  return 0;
}
int is_device_pointer(const void* p) {
  Lock lock(g_mutex);
  return is_device(p) ? 1 : 0;
}

// --- memory, streams, events, copies ----------------------------------------

int device_alloc(void** ptr, size_t bytes, char* err, size_t len) {
  if (ptr == nullptr) return error(err, len, "device_alloc: ptr is NULL");
  *ptr = nullptr;
  if (bytes == 0) return 0;
  Lock lock(g_mutex);
  if (any_capturing()) return refused_in_capture("cudaMalloc", err, len);
  ++g_counters.device_allocs;
  const char* limit = std::getenv("PQ_FAKE_CUDA_DEVICE_BYTES");
  if (limit != nullptr && g_counters.device_bytes_live + bytes > std::strtoull(limit, nullptr, 10))
    return error(err, len, "cudaMalloc(%zu bytes): cudaErrorMemoryAllocation (fake limit)", bytes);
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (p == nullptr) return error(err, len, "cudaMalloc(%zu bytes): out of memory", bytes);
  std::memset(p, 0xCD, bytes);
  g_device[reinterpret_cast<uintptr_t>(p)] = bytes;
  g_counters.device_bytes_live += bytes;
  *ptr = p;
  return 0;
}
int device_free(void* ptr, char* err, size_t len) {
  if (ptr == nullptr) return 0;
  Lock lock(g_mutex);
  auto it = g_device.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g_device.end()) return error(err, len, "cudaFree: not a device allocation");
  if (any_capturing()) return refused_in_capture("cudaFree", err, len);
  ++g_counters.device_frees;
  run_everything();  // cudaFree synchronises the device
  g_counters.device_bytes_live -= it->second;
  g_device.erase(it);
  std::free(ptr);
  return 0;
}
int host_alloc(void** ptr, size_t bytes, char* err, size_t len) {
  if (ptr == nullptr) return error(err, len, "host_alloc: ptr is NULL");
  *ptr = nullptr;
  if (bytes == 0) return 0;
  Lock lock(g_mutex);
  if (any_capturing()) return refused_in_capture("cudaHostAlloc", err, len);
  ++g_counters.host_allocs;
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (p == nullptr) return error(err, len, "cudaHostAlloc(%zu bytes): out of memory", bytes);
  std::memset(p, 0xCD, bytes);
  g_pinned[reinterpret_cast<uintptr_t>(p)] = bytes;
  *ptr = p;
  return 0;
}
int host_free(void* ptr, char* err, size_t len) {
  if (ptr == nullptr) return 0;
  Lock lock(g_mutex);
  auto it = g_pinned.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g_pinned.end()) return error(err, len, "cudaFreeHost: not a pinned allocation");
  if (any_capturing()) return refused_in_capture("cudaFreeHost", err, len);
  ++g_counters.host_frees;
  run_everything();  // cudaFreeHost synchronises the device
  g_pinned.erase(it);
  std::free(ptr);
  return 0;
}
int stream_create(void** stream, char* err, size_t len) {
  if (stream == nullptr) return error(err, len, "stream_create: stream is NULL");
  Lock lock(g_mutex);
  auto* s = new Stream;
  g_streams.insert(s);
  *stream = s;
  return 0;
}
int stream_destroy(void* stream, char* err, size_t len) {
  if (stream == nullptr) return 0;
  Lock lock(g_mutex);
  if (!valid_stream(stream)) return error(err, len, "cudaStreamDestroy: unknown stream");
  auto* s = static_cast<Stream*>(stream);
  run_all(*s);  // its work still completes
  g_streams.erase(s);
  delete s;
  return 0;
}
int stream_synchronize(void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (!valid_stream(stream)) return error(err, len, "cudaStreamSynchronize: unknown stream");
  if (any_capturing()) return refused_in_capture("cudaStreamSynchronize", err, len);
  ++g_counters.host_waits;
  run_all(stream_of(stream));
  return take_sticky(err, len);
}
int event_create(void** event, char* err, size_t len) {
  if (event == nullptr) return error(err, len, "event_create: event is NULL");
  Lock lock(g_mutex);
  auto* e = new Event;
  g_events.insert(e);
  *event = e;
  return 0;
}
int event_destroy(void* event, char* err, size_t len) {
  if (event == nullptr) return 0;
  Lock lock(g_mutex);
  auto* e = static_cast<Event*>(event);
  if (g_events.erase(e) == 0) return error(err, len, "cudaEventDestroy: unknown event");
  delete e;
  return 0;
}
int event_record(void* event, void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  auto* e = static_cast<Event*>(event);
  if (g_events.count(e) == 0) return error(err, len, "cudaEventRecord: unknown event");
  if (!valid_stream(stream)) return error(err, len, "cudaEventRecord: unknown stream");
  ++g_counters.event_records;
  e->stream = &stream_of(stream);
  e->ticket = e->stream->enqueued;  // complete once what is enqueued so far has run
  return 0;
}
int event_synchronize(void* event, char* err, size_t len) {
  Lock lock(g_mutex);
  auto* e = static_cast<Event*>(event);
  if (g_events.count(e) == 0) return error(err, len, "cudaEventSynchronize: unknown event");
  if (any_capturing()) return refused_in_capture("cudaEventSynchronize", err, len);
  ++g_counters.host_waits;
  if (e->stream != nullptr) run_until(*e->stream, e->ticket);
  return take_sticky(err, len);
}
// Done when the work before the record has run; deferred work has not until
// something waits for it, so a query does not make it run.
int event_query(void* event, char* err, size_t len) {
  Lock lock(g_mutex);
  auto* e = static_cast<Event*>(event);
  if (g_events.count(e) == 0) {
    error(err, len, "cudaEventQuery: unknown event");
    return -1;
  }
  if (any_capturing()) {
    refused_in_capture("cudaEventQuery", err, len);
    return -1;
  }
  return e->stream == nullptr || e->stream->done >= e->ticket ? 1 : 0;
}

int stream_wait_event(void* stream, void* event, char* err, size_t len) {
  Lock lock(g_mutex);
  auto* e = static_cast<Event*>(event);
  if (g_events.count(e) == 0) return error(err, len, "cudaStreamWaitEvent: unknown event");
  if (!valid_stream(stream)) return error(err, len, "cudaStreamWaitEvent: unknown stream");
  if (e->stream == nullptr) return 0;  // never recorded: nothing to wait for
  Stream* other = e->stream;
  const uint64_t ticket = e->ticket;
  enqueue(stream, [other, ticket] { run_until(*other, ticket); });
  return 0;
}

// cudaMemcpyAsync's rules for pageable memory: a pageable source is read at
// the call; a pageable destination is written synchronously.
int copy_async(void* dst, const void* src, size_t bytes, void* stream, char* err, size_t len) {
  if (bytes == 0) return 0;
  Lock lock(g_mutex);
  if (!valid_stream(stream)) return error(err, len, "cudaMemcpyAsync: unknown stream");
  if (is_device(dst) && !is_device(dst, bytes))
    return error(err, len, "cudaMemcpyAsync: %zu bytes overrun the device allocation", bytes);
  if (is_device(src) && !is_device(src, bytes))
    return error(err, len, "cudaMemcpyAsync: %zu bytes read past the device allocation", bytes);
  if (!is_device(dst) && !is_device(src) && is_pageable(dst) && is_pageable(src))
    return error(err, len, "cudaMemcpyAsync: neither side is device or pinned memory");
  if (is_pageable(src) || is_pageable(dst)) {
    if (stream_of(stream).capturing)
      return refused_in_capture("cudaMemcpyAsync from or to pageable memory", err, len);
    ++g_counters.pageable_copies;
  }
  if (is_device(src) && is_pageable(dst)) {
    ++g_counters.host_waits;  // the call returns once the copy is done
    run_all(stream_of(stream));
    std::memcpy(dst, src, bytes);
    g_counters.bytes_to_host += bytes;
    return take_sticky(err, len);
  }
  if (is_pageable(src)) {
    auto copy = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(src),
                                                       static_cast<const uint8_t*>(src) + bytes);
    g_counters.bytes_to_device += bytes;
    enqueue(stream, [dst, copy] { std::memcpy(dst, copy->data(), copy->size()); });
    return 0;
  }
  if (is_device(dst) && !is_device(src)) g_counters.bytes_to_device += bytes;
  if (!is_device(dst) && is_device(src)) g_counters.bytes_to_host += bytes;
  enqueue(stream, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
  return 0;
}

// cudaMemcpy on the legacy stream: the legacy stream's work first.
int copy(void* dst, const void* src, size_t bytes, int direction, char* err, size_t len) {
  Lock lock(g_mutex);
  if (any_capturing()) return refused_in_capture("cudaMemcpy", err, len);
  const void* device_side = direction == PQ_COPY_DEVICE_TO_HOST ? src : dst;
  if (!is_device(device_side, bytes))
    return error(err, len, "cudaMemcpy: the device side is not %zu bytes of device memory", bytes);
  ++g_counters.host_waits;
  run_all(g_legacy);
  std::memcpy(dst, src, bytes);
  (direction == PQ_COPY_DEVICE_TO_HOST ? g_counters.bytes_to_host : g_counters.bytes_to_device) +=
      bytes;
  return take_sticky(err, len);
}

// --- kernels -----------------------------------------------------------------

// The scan of one row on the host (pq_scan's reference): raw sums of the
// group's LUTs over the codes, then the CPU's combine.
void scan_row(const float* lut, const uint8_t* codes, int64_t n, int32_t group_size,
              int32_t subspaces, int32_t centroids, int32_t combine, float scale, float* out) {
  pq::SelectScratch scratch;
  std::vector<float> raw(static_cast<size_t>(group_size) * n);
  for (int32_t g = 0; g < group_size; ++g) {
    const float* l = lut + static_cast<size_t>(g) * subspaces * centroids;
    for (int64_t t = 0; t < n; ++t) {
      float s = 0.f;
      for (int32_t j = 0; j < subspaces; ++j) s += l[j * centroids + codes[t * subspaces + j]];
      raw[static_cast<size_t>(g) * n + t] = s;
    }
  }
  pq::combine_group_scores(raw.data(), group_size, n, combine, scale, out, scratch);
}

size_t pq_scan_workspace_size(int32_t kv_heads, int32_t group_size, int32_t, int64_t n,
                              int32_t combine) {
  return combine == PQ_GQA_SUM_SOFTMAX && group_size > 1
             ? static_cast<size_t>(kv_heads) * n * sizeof(float)
             : 0;
}

int pq_scan(const float* d_lut, const uint8_t* d_codes, int32_t kv_heads, int32_t group_size,
            int32_t subspaces, int32_t centroids, int64_t codes_stride, int64_t begin, int64_t end,
            int32_t combine, float scale, float* d_scores, void* d_workspace,
            size_t workspace_bytes, void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  const int64_t n = end - begin;
  if (kv_heads < 1 || group_size < 1 || subspaces < 1 || centroids < 1 || centroids > 256 ||
      begin < 0 || n < 1 || end > codes_stride)
    return error(err, len, "pq_scan: bad shape");
  const size_t lut_bytes =
      static_cast<size_t>(kv_heads) * group_size * subspaces * centroids * sizeof(float);
  if (!is_device(d_lut, lut_bytes)) return error(err, len, "pq_scan: d_lut is not device memory");
  if (!is_device(d_codes, static_cast<size_t>(kv_heads) * codes_stride * subspaces))
    return error(err, len, "pq_scan: d_codes is not [kv_heads][codes_stride][m] of device memory");
  if (!is_device(d_scores, static_cast<size_t>(kv_heads) * n * sizeof(float)))
    return error(err, len, "pq_scan: d_scores is not device memory");
  const size_t need = pq_scan_workspace_size(kv_heads, group_size, subspaces, n, combine);
  if (need > 0 && (workspace_bytes < need || !is_device(d_workspace, need)))
    return error(err, len, "pq_scan: the workspace is not %zu bytes of device memory", need);
  if (!valid_stream(stream)) return error(err, len, "pq_scan: unknown stream");
  ++g_counters.kernel_launches;
  enqueue(stream, [=] {
    for (int32_t h = 0; h < kv_heads; ++h)
      scan_row(d_lut + static_cast<size_t>(h) * group_size * subspaces * centroids,
               d_codes + (static_cast<size_t>(h) * codes_stride + begin) * subspaces, n,
               group_size, subspaces, centroids, combine, scale,
               d_scores + static_cast<size_t>(h) * n);
  });
  return 0;
}

size_t pq_scan_rows_workspace_size(int32_t rows, int32_t group_size, int32_t, int64_t max_n,
                                   int32_t combine) {
  return combine == PQ_GQA_SUM_SOFTMAX && group_size > 1
             ? static_cast<size_t>(rows) * max_n * sizeof(float)
             : 0;
}

// The table is read when the "kernel" runs, as on the device: an upload of
// it enqueued before must have run by then.
int pq_scan_rows(const pq_scan_row* d_rows, int32_t rows, int64_t max_n, int32_t group_size,
                 int32_t subspaces, int32_t centroids, int32_t combine, float scale,
                 void* d_workspace, size_t workspace_bytes, void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (rows < 0 || rows > 65535 || max_n < 0 || group_size < 1 || subspaces < 1 ||
      centroids < 1 || centroids > 256)
    return error(err, len, "pq_scan_rows: bad shape");
  if (rows == 0 || max_n == 0) return 0;
  if (!is_device(d_rows, static_cast<size_t>(rows) * sizeof(pq_scan_row)))
    return error(err, len, "pq_scan_rows: d_rows is not %d rows of device memory", rows);
  const size_t need = pq_scan_rows_workspace_size(rows, group_size, subspaces, max_n, combine);
  if (need > 0 && (workspace_bytes < need || !is_device(d_workspace, need)))
    return error(err, len, "pq_scan_rows: the workspace is not %zu bytes of device memory", need);
  if (!valid_stream(stream)) return error(err, len, "pq_scan_rows: unknown stream");
  ++g_counters.kernel_launches;
  enqueue(stream, [=] {
    const size_t lut_bytes = static_cast<size_t>(group_size) * subspaces * centroids * sizeof(float);
    for (int32_t r = 0; r < rows; ++r) {
      const pq_scan_row row = d_rows[r];
      const int64_t n = row.end - row.begin;
      if (n < 0 || n > max_n) return fault("pq_scan_rows: a row's end - begin is not in 0..max_n");
      if (n == 0) continue;
      if (!is_device(row.lut, lut_bytes) ||
          !is_device(row.codes + row.begin * subspaces, static_cast<size_t>(n) * subspaces) ||
          !is_device(row.scores, static_cast<size_t>(n) * sizeof(float)))
        return fault("pq_scan_rows: a row's LUT, codes or scores are not device memory");
      scan_row(row.lut, row.codes + row.begin * subspaces, n, group_size, subspaces, centroids,
               combine, scale, row.scores);
    }
  });
  return 0;
}

size_t topk_workspace_size(int32_t rows, int64_t n, int64_t) {
  return static_cast<size_t>(rows) * n;  // something the backend must provide
}

int topk(const float* d_scores, int32_t rows, int64_t n, int64_t k, int64_t first, int32_t* d_out,
         void* d_workspace, size_t workspace_bytes, void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (rows < 1 || rows > 65535 || n < 1 || k < 0) return error(err, len, "topk: bad shape");
  if (!is_device(d_scores, static_cast<size_t>(rows) * n * sizeof(float)))
    return error(err, len, "topk: d_scores is not device memory");
  const int64_t written = std::min(n, k);
  if (!is_device(d_out, static_cast<size_t>(rows - 1) * k * sizeof(int32_t) +
                            static_cast<size_t>(written) * sizeof(int32_t)))
    return error(err, len, "topk: d_out is not device memory");
  const size_t need = topk_workspace_size(rows, n, k);
  if (workspace_bytes < need || !is_device(d_workspace, need))
    return error(err, len, "topk: the workspace is not %zu bytes of device memory", need);
  if (!valid_stream(stream)) return error(err, len, "topk: unknown stream");
  ++g_counters.kernel_launches;
  enqueue(stream, [=] {
    pq::SelectScratch scratch;
    for (int32_t r = 0; r < rows; ++r) {
      int32_t* out = d_out + static_cast<size_t>(r) * k;
      if (k >= n) {
        for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(first + i);
        continue;
      }
      pq::select_top_k(d_scores + static_cast<size_t>(r) * n, n, k, first, out, scratch);
    }
  });
  return 0;
}

size_t topk_rows_workspace_size(int32_t rows, int64_t max_n) {
  return static_cast<size_t>(rows) * max_n;  // something the backend must provide
}

int topk_rows(const pq_topk_row* d_rows, int32_t rows, int64_t max_n, void* d_workspace,
              size_t workspace_bytes, void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (rows < 0 || rows > 65535 || max_n < 0) return error(err, len, "topk_rows: bad shape");
  if (rows == 0 || max_n == 0) return 0;
  if (!is_device(d_rows, static_cast<size_t>(rows) * sizeof(pq_topk_row)))
    return error(err, len, "topk_rows: d_rows is not %d rows of device memory", rows);
  const size_t need = topk_rows_workspace_size(rows, max_n);
  if (workspace_bytes < need || !is_device(d_workspace, need))
    return error(err, len, "topk_rows: the workspace is not %zu bytes of device memory", need);
  if (!valid_stream(stream)) return error(err, len, "topk_rows: unknown stream");
  ++g_counters.kernel_launches;
  enqueue(stream, [=] {
    pq::SelectScratch scratch;
    for (int32_t r = 0; r < rows; ++r) {
      const pq_topk_row row = d_rows[r];
      if (row.n < 0 || row.n > max_n || row.k < 0)
        return fault("topk_rows: a row's n is not in 0..max_n, or its k is negative");
      const int64_t written = std::min(row.n, row.k);
      if (written == 0) continue;
      if (!is_device(row.scores, static_cast<size_t>(row.n) * sizeof(float)) ||
          !is_device(row.out, static_cast<size_t>(written) * sizeof(int32_t)))
        return fault("topk_rows: a row's scores or output are not device memory");
      if (row.k >= row.n) {
        for (int64_t i = 0; i < row.n; ++i) row.out[i] = static_cast<int32_t>(row.first + i);
        continue;
      }
      pq::select_top_k(row.scores, row.n, row.k, row.first, row.out, scratch);
    }
  });
  return 0;
}

int encode(const float* d_keys, int64_t tokens, int64_t key_stride, const float* d_centroids,
           int32_t subspaces, int32_t centroids, int32_t sub_dim, uint8_t* d_codes,
           int64_t code_stride, void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (tokens < 0 || subspaces < 1 || centroids < 1 || centroids > 256 || sub_dim < 1 ||
      key_stride < static_cast<int64_t>(subspaces) * sub_dim || code_stride < subspaces)
    return error(err, len, "encode: bad shape");
  if (tokens == 0) return 0;
  if (!is_device(d_keys) || !is_device(d_centroids) || !is_device(d_codes))
    return error(err, len, "encode: a pointer is not device memory");
  ++g_counters.kernel_launches;
  enqueue(stream, [=] {
    for (int64_t t = 0; t < tokens; ++t)
      for (int32_t j = 0; j < subspaces; ++j) {
        const float* x = d_keys + t * key_stride + j * sub_dim;
        int32_t best = 0;
        float best_d = 0.f;
        for (int32_t c = 0; c < centroids; ++c) {
          const float* y = d_centroids + (static_cast<size_t>(j) * centroids + c) * sub_dim;
          float d = 0.f;
          for (int32_t i = 0; i < sub_dim; ++i) d += (x[i] - y[i]) * (x[i] - y[i]);
          if (c == 0 || d < best_d) {
            best = c;
            best_d = d;
          }
        }
        d_codes[t * code_stride + j] = static_cast<uint8_t>(best);
      }
  });
  return 0;
}

// --- fetch -------------------------------------------------------------------

int gather_rows(const void* const* d_srcs, void* const* d_dsts, int64_t rows, size_t row_bytes,
                void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (rows < 0) return error(err, len, "gather_rows: rows < 0");
  if (rows == 0) return 0;
  if (!is_device(d_srcs, static_cast<size_t>(rows) * sizeof(void*)) ||
      !is_device(d_dsts, static_cast<size_t>(rows) * sizeof(void*)))
    return error(err, len, "gather_rows: the pointer arrays are not device memory");
  if (!valid_stream(stream)) return error(err, len, "gather_rows: unknown stream");
  ++g_counters.kernel_launches;
  g_counters.rows_copied += static_cast<uint64_t>(rows);
  // The pointers are read when the kernel runs, as on the device.
  enqueue(stream, [=] {
    for (int64_t i = 0; i < rows; ++i) {
      const void* src = d_srcs[i];
      void* dst = d_dsts[i];
      if (!(is_device(src, row_bytes) || is_pinned(src, row_bytes)) ||
          !is_device(dst, row_bytes)) {
        fault("gather_rows: a row's source is not device or pinned memory, or its destination "
              "not device memory");
        return;
      }
      std::memcpy(dst, src, row_bytes);
    }
  });
  return 0;
}

int copy_rows(const void* const* srcs, void* const* dsts, int64_t rows, size_t row_bytes,
              void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (rows < 0) return error(err, len, "copy_rows: rows < 0");
  for (int64_t i = 0; i < rows; ++i) {
    if (copy_async(dsts[i], srcs[i], row_bytes, stream, err, len) != 0) return 1;
  }
  return 0;
}

// --- selections in device memory -------------------------------------------

// The LUTs of one query (pq_lut's layouts) as the kernel computes them:
// each query head as float, read in the codebook's dimension order (under
// PQ_ROTARY_HALF position p holds dimension p / 2 + (p % 2) * head_dim / 2,
// the host's rotary_dim_order), dot() per (subspace, centroid).
void query_luts(const uint8_t* query, int32_t dtype, int64_t head_stride, int32_t q_heads,
                int32_t group_size, const float* centroids, int32_t subspaces, int32_t C,
                int32_t sub_dim, int32_t key_rotary, float* lut) {
  const int32_t head_dim = subspaces * sub_dim;
  std::vector<float> q(static_cast<size_t>(head_dim)), ordered(q.size());
  for (int32_t qh = 0; qh < q_heads; ++qh) {
    pq::to_float(query + qh * head_stride, dtype, head_dim, q.data());
    for (int32_t p = 0; p < head_dim; ++p)
      ordered[static_cast<size_t>(p)] = q[static_cast<size_t>(
          key_rotary == PQ_ROTARY_HALF ? p / 2 + (p % 2) * (head_dim / 2) : p)];
    const int32_t h = qh / group_size;
    for (int32_t j = 0; j < subspaces; ++j)
      for (int32_t c = 0; c < C; ++c)
        lut[(static_cast<size_t>(qh) * subspaces + j) * C + c] = pq::dot(
            ordered.data() + j * sub_dim,
            centroids + ((static_cast<size_t>(h) * subspaces + j) * C + c) * sub_dim, sub_dim);
  }
}

int pq_lut_ordered(const void* d_query, int32_t dtype, int64_t head_stride, int32_t kv_heads,
                   int32_t group_size, const float* d_centroids, int32_t subspaces,
                   int32_t centroids, int32_t sub_dim, int32_t key_rotary, float* d_lut,
                   void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (kv_heads < 1 || group_size < 1 || subspaces < 1 || centroids < 1 || sub_dim < 1 ||
      head_stride < 0 ||
      (dtype != PQ_DTYPE_F32 && dtype != PQ_DTYPE_F16 && dtype != PQ_DTYPE_BF16) ||
      (key_rotary == PQ_ROTARY_HALF && (subspaces * sub_dim) % 2 != 0))
    return error(err, len, "pq_lut: bad shape");
  const int32_t head_dim = subspaces * sub_dim;
  const size_t es = dtype == PQ_DTYPE_F32 ? 4 : 2;
  const int32_t q_heads = kv_heads * group_size;
  if (!is_device(d_query, static_cast<size_t>(q_heads - 1) * head_stride + head_dim * es))
    return error(err, len, "pq_lut: the query is not device memory");
  if (!is_device(d_centroids,
                 static_cast<size_t>(kv_heads) * subspaces * centroids * sub_dim * sizeof(float)) ||
      !is_device(d_lut, static_cast<size_t>(q_heads) * subspaces * centroids * sizeof(float)))
    return error(err, len, "pq_lut: the centroids or the LUT are not device memory");
  if (!valid_stream(stream)) return error(err, len, "pq_lut: unknown stream");
  ++g_counters.kernel_launches;
  enqueue(stream, [=] {
    query_luts(static_cast<const uint8_t*>(d_query), dtype, head_stride, q_heads, group_size,
               d_centroids, subspaces, centroids, sub_dim, key_rotary, d_lut);
  });
  return 0;
}

int pq_lut(const void* d_query, int32_t dtype, int64_t head_stride, int32_t kv_heads,
           int32_t group_size, const float* d_centroids, int32_t subspaces, int32_t centroids,
           int32_t sub_dim, float* d_lut, void* stream, char* err, size_t len) {
  return pq_lut_ordered(d_query, dtype, head_stride, kv_heads, group_size, d_centroids, subspaces,
                        centroids, sub_dim, PQ_ROTARY_NONE, d_lut, stream, err, len);
}

int fill_selection(int32_t* d_positions, int32_t* d_counts, int32_t heads, int64_t capacity,
                   int64_t sink_end, const int32_t* d_middle, int64_t k, int64_t mid_end,
                   int64_t n, void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  const int64_t count = sink_end + k + (n - mid_end);
  if (heads < 1 || sink_end < 0 || k < 0 || mid_end < sink_end || n < mid_end || count > capacity)
    return error(err, len, "fill_selection: bad shape");
  if (!is_device(d_positions, static_cast<size_t>(heads) * capacity * sizeof(int32_t)) ||
      !is_device(d_counts, static_cast<size_t>(heads) * sizeof(int32_t)) ||
      (k > 0 && !is_device(d_middle, static_cast<size_t>(heads) * k * sizeof(int32_t))))
    return error(err, len, "fill_selection: an array is not device memory");
  if (!valid_stream(stream)) return error(err, len, "fill_selection: unknown stream");
  ++g_counters.kernel_launches;
  enqueue(stream, [=] {
    for (int32_t h = 0; h < heads; ++h) {
      int32_t* row = d_positions + h * capacity;
      int64_t w = 0;
      for (int64_t p = 0; p < sink_end; ++p) row[w++] = static_cast<int32_t>(p);
      for (int64_t i = 0; i < k; ++i) row[w++] = d_middle[h * k + i];
      for (int64_t p = mid_end; p < n; ++p) row[w++] = static_cast<int32_t>(p);
      d_counts[h] = static_cast<int32_t>(count);
    }
  });
  return 0;
}

// One selection's gather on the host, as the kernel does it.
void run_gather_selected(const pq_selected_gather& a);

int gather_selected(const pq_selected_gather* args, void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (args == nullptr) return error(err, len, "gather_selected: args is NULL");
  const pq_selected_gather a = *args;  // read at the call
  if (a.heads < 1 || a.capacity < 0 || a.chunk_tokens < 1 || a.row_bytes == 0)
    return error(err, len, "gather_selected: bad shape");
  if (a.capacity == 0) return 0;
  const size_t rows = static_cast<size_t>(a.heads) * a.capacity;
  if (!is_device(a.positions, rows * sizeof(int32_t)) ||
      !is_device(a.counts, static_cast<size_t>(a.heads) * sizeof(int32_t)) ||
      !is_device(a.key_chunks) || !is_device(a.value_chunks))
    return error(err, len, "gather_selected: the selection or the chunk tables are not device memory");
  if (!valid_stream(stream)) return error(err, len, "gather_selected: unknown stream");
  ++g_counters.kernel_launches;
  // Everything the "kernel" reads is read when it runs, as on the device.
  enqueue(stream, [=] { run_gather_selected(a); });
  return 0;
}

int gather_selected_rows(const pq_selected_gather* d_items, int32_t items, int64_t max_chunks,
                         void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (items < 0 || items > 65535 || max_chunks < 0)
    return error(err, len, "gather_selected_rows: bad shape");
  if (items == 0 || max_chunks == 0) return 0;
  if (!is_device(d_items, static_cast<size_t>(items) * sizeof(pq_selected_gather)))
    return error(err, len, "gather_selected_rows: d_items is not device memory");
  if (!valid_stream(stream)) return error(err, len, "gather_selected_rows: unknown stream");
  ++g_counters.kernel_launches;
  enqueue(stream, [=] {
    for (int32_t i = 0; i < items; ++i) {
      const pq_selected_gather a = d_items[i];  // the table, read when the kernel runs
      const int64_t chunks = static_cast<int64_t>(a.heads) * a.capacity * 2 *
                             ((static_cast<int64_t>(a.row_bytes) + 15) / 16);
      if (chunks > max_chunks) return fault("gather_selected_rows: an item exceeds max_chunks");
      if (!is_device(a.positions) || !is_device(a.counts) || !is_device(a.key_chunks) ||
          !is_device(a.value_chunks))
        return fault("gather_selected_rows: an item's arrays are not device memory");
      run_gather_selected(a);
    }
  });
  return 0;
}

void run_gather_selected(const pq_selected_gather& a) {
  {
    const int64_t rb = static_cast<int64_t>(a.row_bytes);
    for (int32_t h = 0; h < a.heads; ++h) {
      const int64_t count = std::min<int64_t>(a.counts[h], a.capacity);
      for (int64_t i = 0; i < count; ++i) {
        const int64_t p = a.positions[h * a.capacity + i];
        for (int v = 0; v < 2; ++v) {
          uint8_t* dst = v ? a.out_values + i * a.values_token_stride + h * a.values_head_stride
                           : a.out_keys + i * a.keys_token_stride + h * a.keys_head_stride;
          if (!is_device(dst, a.row_bytes))
            return fault("gather_selected: an output row is not device memory");
          if (p < 0 || p >= a.tokens) {
            std::memset(dst, 0, a.row_bytes);
            continue;
          }
          int64_t w = -1;
          if (a.window != nullptr) {
            if (p < a.sink_tokens)
              w = p;
            else if (a.local_tokens > 0 && p >= a.tokens - a.local_tokens)
              w = a.sink_tokens + p % a.local_tokens;
          }
          const uint8_t* src =
              w >= 0 ? a.window + (w * 2 * a.heads + (v ? a.heads : 0) + h) * rb
                     : (v ? a.value_chunks : a.key_chunks)[p / a.chunk_tokens] +
                           (h * a.chunk_tokens + p % a.chunk_tokens) * rb;
          if (!(is_device(src, a.row_bytes) || is_pinned(src, a.row_bytes)))
            return fault("gather_selected: a source row is not device or pinned memory");
          std::memcpy(dst, src, a.row_bytes);
        }
      }
    }
  }
}

// --- version 6 -----------------------------------------------------------------

// The arguments are copied at the call, as kernel parameters are.
int inline_copies(const pq_inline_copies* args, void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (args == nullptr) return error(err, len, "inline_copies: args is NULL");
  if (args->rows < 0 || args->rows > PQ_INLINE_ROWS || args->pieces < 0 ||
      args->pieces > PQ_INLINE_PIECES || (args->rows > 0 && (args->row_bytes == 0 ||
                                                             args->row_bytes > 4096)))
    return error(err, len, "inline_copies: bad shape");
  for (int32_t p = 0; p < args->pieces; ++p)
    if (uint32_t{args->piece_at[p]} + args->piece_bytes[p] > PQ_INLINE_BYTES)
      return error(err, len, "inline_copies: piece %d is outside the payload", p);
  if (!valid_stream(stream)) return error(err, len, "inline_copies: unknown stream");
  ++g_counters.inline_copies;
  g_counters.rows_copied += static_cast<uint64_t>(args->rows);
  for (int32_t p = 0; p < args->pieces; ++p) g_counters.bytes_to_device += args->piece_bytes[p];
  auto a = std::make_shared<pq_inline_copies>(*args);
  enqueue(stream, [a] {
    auto addressable = [](const void* p, size_t n) { return is_device(p, n) || is_pinned(p, n); };
    for (int32_t r = 0; r < a->rows; ++r) {
      if (!addressable(a->srcs[r], a->row_bytes) || !addressable(a->dsts[r], a->row_bytes))
        return fault("inline_copies: a row's source or destination is not device or pinned "
                     "memory");
      std::memcpy(a->dsts[r], a->srcs[r], a->row_bytes);
    }
    for (int32_t p = 0; p < a->pieces; ++p) {
      if (!addressable(a->piece_dst[p], a->piece_bytes[p]))
        return fault("inline_copies: a piece's destination is not device or pinned memory");
      std::memcpy(a->piece_dst[p], a->payload + a->piece_at[p], a->piece_bytes[p]);
    }
  });
  return 0;
}

int stream_capturing(void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (!valid_stream(stream)) {
    error(err, len, "cudaStreamIsCapturing: unknown stream");
    return -1;
  }
  return stream_of(stream).capturing ? 1 : 0;
}

// The tables are read when the "kernel" runs, as on the device.
int pq_lut_rows_ordered(const pq_lut_row* d_rows, int32_t rows, int32_t dtype,
                        int64_t head_stride, int32_t kv_heads, int32_t group_size,
                        int32_t subspaces, int32_t centroids, int32_t sub_dim, int32_t key_rotary,
                        void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (rows < 0 || rows > 65535 || kv_heads < 1 || group_size < 1 || subspaces < 1 ||
      centroids < 1 || centroids > 256 || sub_dim < 1 || head_stride < 0 ||
      (dtype != PQ_DTYPE_F32 && dtype != PQ_DTYPE_F16 && dtype != PQ_DTYPE_BF16) ||
      (key_rotary == PQ_ROTARY_HALF && (subspaces * sub_dim) % 2 != 0))
    return error(err, len, "pq_lut_rows: bad shape");
  if (rows == 0) return 0;
  if (!is_device(d_rows, static_cast<size_t>(rows) * sizeof(pq_lut_row)))
    return error(err, len, "pq_lut_rows: d_rows is not %d rows of device memory", rows);
  if (!valid_stream(stream)) return error(err, len, "pq_lut_rows: unknown stream");
  ++g_counters.kernel_launches;
  enqueue(stream, [=] {
    const int32_t head_dim = subspaces * sub_dim;
    const size_t es = dtype == PQ_DTYPE_F32 ? 4 : 2;
    const int32_t q_heads = kv_heads * group_size;
    for (int32_t r = 0; r < rows; ++r) {
      const pq_lut_row row = d_rows[r];
      if (!is_device(row.query, static_cast<size_t>(q_heads - 1) * head_stride + head_dim * es) ||
          !is_device(row.centroids, static_cast<size_t>(kv_heads) * subspaces * centroids *
                                        sub_dim * sizeof(float)) ||
          !is_device(row.lut, static_cast<size_t>(q_heads) * subspaces * centroids * sizeof(float)))
        return fault("pq_lut_rows: a row's query, centroids or LUT are not device memory");
      query_luts(static_cast<const uint8_t*>(row.query), dtype, head_stride, q_heads, group_size,
                 row.centroids, subspaces, centroids, sub_dim, key_rotary, row.lut);
    }
  });
  return 0;
}

int pq_lut_rows(const pq_lut_row* d_rows, int32_t rows, int32_t dtype, int64_t head_stride,
                int32_t kv_heads, int32_t group_size, int32_t subspaces, int32_t centroids,
                int32_t sub_dim, void* stream, char* err, size_t len) {
  return pq_lut_rows_ordered(d_rows, rows, dtype, head_stride, kv_heads, group_size, subspaces,
                             centroids, sub_dim, PQ_ROTARY_NONE, stream, err, len);
}

int fill_selection_rows(const pq_fill_row* d_rows, int32_t rows, int32_t heads, int64_t max_count,
                        void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (rows < 0 || rows > 65535 || heads < 1 || max_count < 0)
    return error(err, len, "fill_selection_rows: bad shape");
  if (rows == 0) return 0;
  if (!is_device(d_rows, static_cast<size_t>(rows) * sizeof(pq_fill_row)))
    return error(err, len, "fill_selection_rows: d_rows is not %d rows of device memory", rows);
  if (!valid_stream(stream)) return error(err, len, "fill_selection_rows: unknown stream");
  ++g_counters.kernel_launches;
  enqueue(stream, [=] {
    for (int32_t r = 0; r < rows; ++r) {
      const pq_fill_row f = d_rows[r];
      const int64_t count = f.sink_end + f.k + (f.n - f.mid_end);
      if (f.sink_end < 0 || f.k < 0 || f.mid_end < f.sink_end || f.n < f.mid_end ||
          count > f.capacity)
        continue;  // not a selection: nothing written, as on the device
      if (count > max_count) return fault("fill_selection_rows: a row exceeds max_count");
      if (!is_device(f.positions, static_cast<size_t>(heads) * f.capacity * sizeof(int32_t)) ||
          !is_device(f.counts, static_cast<size_t>(heads) * sizeof(int32_t)) ||
          (f.k > 0 && !is_device(f.middle, static_cast<size_t>(heads) * f.k * sizeof(int32_t))))
        return fault("fill_selection_rows: a row's arrays are not device memory");
      for (int32_t h = 0; h < heads; ++h) {
        int32_t* row = f.positions + h * f.capacity;
        int64_t w = 0;
        for (int64_t p = 0; p < f.sink_end; ++p) row[w++] = static_cast<int32_t>(p);
        for (int64_t i = 0; i < f.k; ++i) row[w++] = f.middle[h * f.k + i];
        for (int64_t p = f.mid_end; p < f.n; ++p) row[w++] = static_cast<int32_t>(p);
        f.counts[h] = static_cast<int32_t>(count);
      }
    }
  });
  return 0;
}

// --- version 7: exact re-ranking ----------------------------------------------

size_t pq_rerank_workspace_size(int32_t rows, int64_t max_count, int32_t group_size) {
  if (rows <= 0 || max_count <= 0 || group_size < 1) return 0;
  // The kernel's: raw scores, exp terms, scores and indices, the top-k's.
  return static_cast<size_t>(rows) * max_count * (group_size + 3) * sizeof(float) +
         static_cast<size_t>(rows) * sizeof(pq_topk_row) +
         topk_rows_workspace_size(rows, max_count);
}

// One row as the kernels compute it, which is the host's PqSelector::rerank:
// exact raw scores by dot(), the host's combine over the candidates, the
// best k (ties to the larger index, i.e. position), ascending positions.
void rerank_row(const pq_rerank_row& x, const pq_rerank_shape& s) {
  if (x.k < 1 || x.k > x.count || x.count > s.max_count) return;  // nothing written, as there
  const int64_t n = x.count;
  if (!is_device(x.candidates, static_cast<size_t>(n) * sizeof(int32_t)) ||
      !is_device(x.out, static_cast<size_t>(x.k) * sizeof(int32_t)) || !is_device(x.key_chunks))
    return fault("pq_rerank: a row's candidates, output or chunk table are not device memory");
  const int32_t G = s.group_size, D = s.head_dim;
  const size_t row_bytes = static_cast<size_t>(D) * pq::dtype_size(s.key_dtype);
  std::vector<float> q(static_cast<size_t>(G) * D), key(static_cast<size_t>(D));
  for (int32_t g = 0; g < G; ++g) {
    const uint8_t* at = static_cast<const uint8_t*>(x.query) + g * s.query_head_stride;
    if (!is_device(at, static_cast<size_t>(D) * pq::dtype_size(s.query_dtype)))
      return fault("pq_rerank: a row's query is not device memory");
    pq::to_float(at, s.query_dtype, D, q.data() + static_cast<size_t>(g) * D);
  }
  std::vector<float> raw(static_cast<size_t>(G) * n), scores(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = x.candidates[i];
    const uint8_t* chunk = x.key_chunks[p / s.chunk_tokens];
    const uint8_t* src = chunk + (x.head * s.chunk_tokens + p % s.chunk_tokens) * row_bytes;
    if (!(is_device(src, row_bytes) || is_pinned(src, row_bytes)))
      return fault("pq_rerank: a key row is not device or pinned memory");
    pq::to_float(src, s.key_dtype, D, key.data());
    for (int32_t g = 0; g < G; ++g)
      raw[static_cast<size_t>(g) * n + i] = pq::dot(q.data() + static_cast<size_t>(g) * D, key.data(), D);
  }
  pq::SelectScratch scratch;
  pq::combine_group_scores(raw.data(), G, n, s.combine, s.scale, scores.data(), scratch);
  std::vector<int32_t> best(static_cast<size_t>(x.k));
  pq::select_top_k(scores.data(), n, x.k, 0, best.data(), scratch);
  for (int64_t i = 0; i < x.k; ++i) x.out[i] = x.candidates[best[static_cast<size_t>(i)]];
}

int rerank_checks(int32_t rows, const pq_rerank_shape* shape, void* d_workspace,
                  size_t workspace_bytes, void* stream, const char* name, char* err, size_t len) {
  if (shape == nullptr) return error(err, len, "%s: shape is NULL", name);
  const pq_rerank_shape& s = *shape;
  auto dtype_ok = [](int32_t d) {
    return d == PQ_DTYPE_F32 || d == PQ_DTYPE_F16 || d == PQ_DTYPE_BF16;
  };
  if (rows < 0 || rows > 65535 || s.group_size < 1 || s.head_dim < 1 ||
      !dtype_ok(s.query_dtype) || !dtype_ok(s.key_dtype) || s.combine < PQ_GQA_SUM_SOFTMAX ||
      s.combine > PQ_GQA_MEAN || s.query_head_stride < 0 || s.chunk_tokens < 1 ||
      s.max_count < 0 || s.max_count > INT32_MAX)
    return error(err, len, "%s: bad shape", name);
  const size_t need = pq_rerank_workspace_size(rows, s.max_count, s.group_size);
  if (need > 0 && (workspace_bytes < need || !is_device(d_workspace, need)))
    return error(err, len, "%s: the workspace is not %zu bytes of device memory", name, need);
  if (!valid_stream(stream)) return error(err, len, "%s: unknown stream", name);
  return 0;
}

// *row is read at the call (kernel parameters); what it points to when the
// "kernels" run.
int pq_rerank(const pq_rerank_row* row, int32_t rows, const pq_rerank_shape* shape,
              void* d_workspace, size_t workspace_bytes, void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (row == nullptr) return error(err, len, "pq_rerank: row is NULL");
  if (rerank_checks(rows, shape, d_workspace, workspace_bytes, stream, "pq_rerank", err, len))
    return 1;
  if (rows == 0 || shape->max_count == 0) return 0;
  ++g_counters.kernel_launches;
  const pq_rerank_row first = *row;
  const pq_rerank_shape s = *shape;
  enqueue(stream, [=] {
    for (int32_t r = 0; r < rows; ++r) {
      pq_rerank_row x = first;
      x.query = static_cast<const uint8_t*>(x.query) +
                static_cast<int64_t>(r) * s.group_size * s.query_head_stride;
      x.candidates += static_cast<int64_t>(r) * x.count;
      x.out += static_cast<int64_t>(r) * x.k;
      x.head += r;
      rerank_row(x, s);
    }
  });
  return 0;
}

// The table is read when the "kernels" run, as on the device.
int pq_rerank_rows(const pq_rerank_row* d_rows, int32_t rows, const pq_rerank_shape* shape,
                   void* d_workspace, size_t workspace_bytes, void* stream, char* err,
                   size_t len) {
  Lock lock(g_mutex);
  if (rerank_checks(rows, shape, d_workspace, workspace_bytes, stream, "pq_rerank_rows", err,
                    len))
    return 1;
  if (rows == 0 || shape->max_count == 0) return 0;
  if (!is_device(d_rows, static_cast<size_t>(rows) * sizeof(pq_rerank_row)))
    return error(err, len, "pq_rerank_rows: d_rows is not %d rows of device memory", rows);
  ++g_counters.kernel_launches;
  const pq_rerank_shape s = *shape;
  enqueue(stream, [=] {
    for (int32_t r = 0; r < rows; ++r) rerank_row(d_rows[r], s);
  });
  return 0;
}

// --- version 8: the rows of a multi-token select ----------------------------

size_t multi_rows_workspace_size(int32_t form, int32_t kv_heads, int64_t n) {
  if (form == PQ_ROWS_PER_TOKEN || kv_heads < 1 || n <= 0) return 0;
  const int64_t rows = form == PQ_ROWS_PER_HEAD ? kv_heads : 1;
  return static_cast<size_t>(rows) * static_cast<size_t>((n + 31) / 32) * sizeof(uint32_t);
}

// What the kernels compute (kernels/multi_rows.cu): a row copied, or the
// sorted unique union of the rows of positions in [0, n); at most
// out_capacity written, then -1.
int multi_rows(const int32_t* d_in, const int32_t* d_in_counts, int64_t in_capacity,
               int32_t tokens, int32_t kv_heads, int32_t form, int64_t n, int32_t* d_out,
               int32_t* d_out_counts, int64_t out_capacity, void* d_workspace,
               size_t workspace_bytes, void* stream, char* err, size_t len) {
  Lock lock(g_mutex);
  if (tokens < 1 || kv_heads < 1 || in_capacity < 0 || out_capacity < 0 || n < 0 ||
      n > INT32_MAX ||
      (form != PQ_ROWS_PER_TOKEN && form != PQ_ROWS_PER_HEAD && form != PQ_ROWS_PER_REQUEST) ||
      static_cast<int64_t>(tokens) * kv_heads > INT32_MAX)
    return error(err, len, "multi_rows: bad shape");
  const int64_t in_rows = static_cast<int64_t>(tokens) * kv_heads;
  const int64_t out_rows = form == PQ_ROWS_PER_TOKEN ? in_rows
                           : form == PQ_ROWS_PER_HEAD ? kv_heads
                                                      : 1;
  if (!is_device(d_in_counts, static_cast<size_t>(in_rows) * sizeof(int32_t)) ||
      (in_capacity > 0 &&
       !is_device(d_in, static_cast<size_t>(in_rows * in_capacity) * sizeof(int32_t))))
    return error(err, len, "multi_rows: the input rows are not device memory");
  if (!is_device(d_out_counts, static_cast<size_t>(out_rows) * sizeof(int32_t)) ||
      (out_capacity > 0 &&
       !is_device(d_out, static_cast<size_t>(out_rows * out_capacity) * sizeof(int32_t))))
    return error(err, len, "multi_rows: the output rows are not device memory");
  const size_t need = multi_rows_workspace_size(form, kv_heads, n);
  if (need > 0 && (workspace_bytes < need || !is_device(d_workspace, need)))
    return error(err, len, "multi_rows: the workspace is not %zu bytes of device memory", need);
  if (!valid_stream(stream)) return error(err, len, "multi_rows: unknown stream");
  ++g_counters.kernel_launches;
  enqueue(stream, [=] {
    auto count_of = [&](int64_t r) {
      return std::clamp<int64_t>(d_in_counts[r], 0, in_capacity);
    };
    auto write = [&](int64_t o, const int32_t* from, int64_t count) {
      count = std::min(count, out_capacity);
      int32_t* row = d_out + o * out_capacity;
      std::copy(from, from + count, row);
      std::fill(row + count, row + out_capacity, -1);
      d_out_counts[o] = static_cast<int32_t>(count);
    };
    if (form == PQ_ROWS_PER_TOKEN) {
      for (int64_t r = 0; r < in_rows; ++r) write(r, d_in + r * in_capacity, count_of(r));
      return;
    }
    for (int64_t o = 0; o < out_rows; ++o) {
      std::vector<int32_t> merged;
      for (int64_t r = 0; r < in_rows; ++r) {
        if (form == PQ_ROWS_PER_HEAD && r % kv_heads != o) continue;
        for (int64_t i = 0; i < count_of(r); ++i) {
          const int32_t p = d_in[r * in_capacity + i];
          if (p >= 0 && p < n) merged.push_back(p);
        }
      }
      std::sort(merged.begin(), merged.end());
      merged.erase(std::unique(merged.begin(), merged.end()), merged.end());
      write(o, merged.data(), static_cast<int64_t>(merged.size()));
    }
  });
  return 0;
}

const pq_cuda_plugin kTable = {
    PQ_CUDA_PLUGIN_ABI_VERSION,
    sizeof(pq_cuda_plugin),
    device_count,
    device_name,
    set_device,
    is_device_pointer,
    device_alloc,
    device_free,
    host_alloc,
    host_free,
    stream_create,
    stream_destroy,
    stream_synchronize,
    event_create,
    event_destroy,
    event_record,
    event_synchronize,
    stream_wait_event,
    copy,
    copy_async,
    pq_scan_workspace_size,
    pq_scan,
    topk_workspace_size,
    topk,
    encode,
    gather_rows,
    copy_rows,
    pq_scan_rows_workspace_size,
    pq_scan_rows,
    topk_rows_workspace_size,
    topk_rows,
    pq_lut,
    fill_selection,
    gather_selected,
    event_query,
    gather_selected_rows,
    inline_copies,
    stream_capturing,
    pq_lut_rows,
    fill_selection_rows,
    pq_lut_ordered,
    pq_lut_rows_ordered,
    pq_rerank_workspace_size,
    pq_rerank,
    pq_rerank_rows,
    multi_rows_workspace_size,
    multi_rows,
};

}  // namespace

extern "C" {

// PQ_FAKE_CUDA_ABI=<n> makes it a plug-in of ABI n (the table otherwise
// unchanged), for the loader's refusal of another version; n = 5, 6 and 7
// also give those ABIs' table sizes, so that libpqcache 0.7, 0.8 and 0.9
// run over it.
__attribute__((visibility("default"))) const pq_cuda_plugin* pq_cuda_plugin_entry(
    uint32_t abi_version) {
  static const pq_cuda_plugin table = [] {
    pq_cuda_plugin t = kTable;
    if (const char* abi = std::getenv("PQ_FAKE_CUDA_ABI")) {
      t.abi_version = static_cast<uint32_t>(std::atoi(abi));
      // ABI 5's table is version 6's without its last four entries: a
      // library of 0.7 then runs over this fake (the hazard tests of 0.8
      // against the code they fixed).
      if (t.abi_version == 5) t.struct_size = offsetof(pq_cuda_plugin, inline_copies);
      if (t.abi_version == 6) t.struct_size = offsetof(pq_cuda_plugin, pq_lut_ordered);
      if (t.abi_version == 7) t.struct_size = offsetof(pq_cuda_plugin, multi_rows_workspace_size);
    }
    return t;
  }();
  if (abi_version == table.abi_version || abi_version == 0) return &table;
  return nullptr;
}

__attribute__((visibility("default"))) void pq_fake_cuda_counters_get(
    pq_fake_cuda_counters* out) {
  Lock lock(g_mutex);
  *out = g_counters;
}

__attribute__((visibility("default"))) void pq_fake_cuda_synchronize_all(void) {
  Lock lock(g_mutex);
  run_everything();
}

__attribute__((visibility("default"))) void pq_fake_cuda_capture_begin(void* stream) {
  Lock lock(g_mutex);
  Stream& s = stream_of(stream);
  s.capturing = true;
  s.graph.clear();
}

__attribute__((visibility("default"))) int64_t pq_fake_cuda_capture_end(void* stream) {
  Lock lock(g_mutex);
  Stream& s = stream_of(stream);
  if (!s.capturing) return -1;
  s.capturing = false;
  return static_cast<int64_t>(s.graph.size());
}

__attribute__((visibility("default"))) int pq_fake_cuda_graph_replay(void* stream) {
  Lock lock(g_mutex);
  Stream& s = stream_of(stream);
  if (s.capturing) return 1;
  for (const auto& op : s.graph) enqueue(stream, op);
  return 0;
}

__attribute__((visibility("default"))) void* pq_fake_cuda_malloc(size_t bytes) {
  void* p = nullptr;
  char err[256];
  return device_alloc(&p, bytes, err, sizeof err) == 0 ? p : nullptr;
}

__attribute__((visibility("default"))) void pq_fake_cuda_free(void* ptr) {
  char err[256];
  device_free(ptr, err, sizeof err);
}

__attribute__((visibility("default"))) uint64_t pq_fake_cuda_pending(void) {
  Lock lock(g_mutex);
  uint64_t pending = g_legacy.queue.size();
  for (Stream* s : g_streams) pending += s->queue.size();
  return pending;
}

}  // extern "C"
