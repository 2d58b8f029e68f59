// Memory, streams and copies of the plug-in ABI (src/backend/cuda/cuda_plugin_abi.h): the
// host K/V store in mapped pinned memory, streams and events so that fetches
// overlap with compute, and copy_rows, one cudaMemcpyAsync per contiguous run
// of rows: the baseline the gather kernel (gather.cu) is measured against.
//
// Every argument is checked before the first CUDA call, so a bad argument
// returns its message without touching the device (and without a device).
#include <cstdint>
#include <cstdio>

#include "kernels.h"

namespace pqcuda {

int host_alloc(void** ptr, size_t bytes, char* err, size_t err_len) {
  if (ptr == nullptr) return set_error(err, err_len, "host_alloc: ptr is NULL");
  *ptr = nullptr;
  if (bytes == 0) return 0;
  void* host = nullptr;
  cudaError_t s = cudaHostAlloc(&host, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
  if (s != cudaSuccess) {
    char what[64];
    std::snprintf(what, sizeof what, "cudaHostAlloc(%zu bytes)", bytes);
    return cuda_fail(err, err_len, what, s);
  }
  // Callers hand the host address to kernels: that needs unified addressing,
  // where the mapped device address is the host address itself.
  void* device = nullptr;
  s = cudaHostGetDevicePointer(&device, host, 0);
  if (s != cudaSuccess || device != host) {
    cudaFreeHost(host);
    if (s != cudaSuccess) return cuda_fail(err, err_len, "cudaHostGetDevicePointer", s);
    return set_error(err, err_len,
                     "host_alloc: the device address %p of host memory %p differs "
                     "(no unified addressing)",
                     device, host);
  }
  *ptr = host;
  return 0;
}

int host_free(void* ptr, char* err, size_t err_len) {
  if (ptr == nullptr) return 0;
  cudaError_t s = cudaFreeHost(ptr);
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "cudaFreeHost", s);
}

int stream_create(void** stream, char* err, size_t err_len) {
  if (stream == nullptr) return set_error(err, err_len, "stream_create: stream is NULL");
  *stream = nullptr;
  cudaStream_t s = nullptr;
  cudaError_t status = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (status != cudaSuccess) return cuda_fail(err, err_len, "cudaStreamCreateWithFlags", status);
  *stream = s;
  return 0;
}

int stream_destroy(void* stream, char* err, size_t err_len) {
  if (stream == nullptr) return 0;  // the legacy default stream is never destroyed
  cudaError_t s = cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "cudaStreamDestroy", s);
}

int event_create(void** event, char* err, size_t err_len) {
  if (event == nullptr) return set_error(err, err_len, "event_create: event is NULL");
  *event = nullptr;
  cudaEvent_t e = nullptr;
  cudaError_t s = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (s != cudaSuccess) return cuda_fail(err, err_len, "cudaEventCreateWithFlags", s);
  *event = e;
  return 0;
}

int event_destroy(void* event, char* err, size_t err_len) {
  if (event == nullptr) return 0;
  cudaError_t s = cudaEventDestroy(static_cast<cudaEvent_t>(event));
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "cudaEventDestroy", s);
}

int event_record(void* event, void* stream, char* err, size_t err_len) {
  if (event == nullptr) return set_error(err, err_len, "event_record: event is NULL");
  cudaError_t s =
      cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "cudaEventRecord", s);
}

int event_synchronize(void* event, char* err, size_t err_len) {
  if (event == nullptr) return set_error(err, err_len, "event_synchronize: event is NULL");
  cudaError_t s = cudaEventSynchronize(static_cast<cudaEvent_t>(event));
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "cudaEventSynchronize", s);
}

int event_query(void* event, char* err, size_t err_len) {
  if (event == nullptr) {
    set_error(err, err_len, "event_query: event is NULL");
    return -1;
  }
  const cudaError_t s = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (s == cudaSuccess) return 1;
  if (s == cudaErrorNotReady) return 0;
  cuda_fail(err, err_len, "cudaEventQuery", s);
  return -1;
}

int stream_wait_event(void* stream, void* event, char* err, size_t err_len) {
  if (event == nullptr) return set_error(err, err_len, "stream_wait_event: event is NULL");
  cudaError_t s = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                      static_cast<cudaEvent_t>(event), 0);
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "cudaStreamWaitEvent", s);
}

int copy_async(void* dst, const void* src, size_t bytes, void* stream, char* err,
               size_t err_len) {
  if (bytes == 0) return 0;
  if (dst == nullptr || src == nullptr)
    return set_error(err, err_len, "copy_async: dst %p or src %p is NULL for %zu bytes", dst, src,
                     bytes);
  cudaError_t s = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                  static_cast<cudaStream_t>(stream));
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "cudaMemcpyAsync", s);
}

int copy_rows(const void* const* srcs, void* const* dsts, int64_t rows, size_t row_bytes,
              void* stream, char* err, size_t err_len) {
  if (rows < 0)
    return set_error(err, err_len, "copy_rows: rows is %lld; expected >= 0",
                     static_cast<long long>(rows));
  if (rows == 0 || row_bytes == 0) return 0;
  if (srcs == nullptr || dsts == nullptr)
    return set_error(err, err_len, "copy_rows: srcs %p or dsts %p is NULL for %lld rows",
                     static_cast<const void*>(srcs), static_cast<const void*>(dsts),
                     static_cast<long long>(rows));
  // Every row is checked before the first copy is enqueued: a bad row leaves
  // nothing half done.
  for (int64_t i = 0; i < rows; ++i)
    if (srcs[i] == nullptr || dsts[i] == nullptr)
      return set_error(err, err_len, "copy_rows: row %lld has a NULL source or destination",
                       static_cast<long long>(i));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  int64_t first = 0;  // first row of the current run
  while (first < rows) {
    const char* src = static_cast<const char*>(srcs[first]);
    char* dst = static_cast<char*>(dsts[first]);
    size_t bytes = row_bytes;
    int64_t next = first + 1;
    // The run grows while the next row continues both the source and the
    // destination exactly where the run ends.
    while (next < rows && static_cast<const char*>(srcs[next]) == src + bytes &&
           static_cast<char*>(dsts[next]) == dst + bytes) {
      bytes += row_bytes;
      ++next;
    }
    cudaError_t status = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s);
    if (status != cudaSuccess) {
      char what[96];
      std::snprintf(what, sizeof what, "copy_rows: cudaMemcpyAsync of rows %lld..%lld",
                    static_cast<long long>(first), static_cast<long long>(next - 1));
      return cuda_fail(err, err_len, what, status);
    }
    first = next;
  }
  return 0;
}

}  // namespace pqcuda
