// libpqcache_cuda.so: the CUDA backend plug-in. libpqcache.so opens it with
// dlopen at run time, so the core never links cudart. Its one table
// (src/backend/cuda/cuda_plugin_abi.h) carries device memory, mapped pinned host memory,
// streams, events and copies (memory.cu), the PQ scoring (pq_scan.cu) and
// top-k (topk.cu) kernels, PQ encoding (encode.cu), the row gather of
// pq_fetch_kv (gather.cu) and the kernels of a decode step that stays on the
// device (device_selection.cu, rerank.cu, multi_rows.cu).
#include <cuda_runtime.h>

#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "backend/cuda/cuda_plugin_abi.h"
#include "kernels.h"

namespace pqcuda {

int set_error(char* err, size_t err_len, const char* fmt, ...) {
  if (err != nullptr && err_len > 0) {
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(err, err_len, fmt, args);
    va_end(args);
  }
  return 1;
}

int cuda_fail(char* err, size_t err_len, const char* what, cudaError_t status) {
  return set_error(err, err_len, "%s: %s (%s)", what, cudaGetErrorName(status),
                   cudaGetErrorString(status));
}

}  // namespace pqcuda

namespace {

void write_error(char* err, size_t len, const char* what, cudaError_t status) {
  if (err != nullptr && len > 0)
    std::snprintf(err, len, "%s: %s (%s)", what, cudaGetErrorName(status),
                  cudaGetErrorString(status));
}

int device_count() {
  int count = 0;  // cudaGetDeviceCount leaves it untouched on error
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

int device_name(int device, char* buf, size_t len) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return 1;
  std::snprintf(buf, len, "%s", prop.name);
  return 0;
}

int set_device(int device, char* err, size_t err_len) {
  cudaError_t s = cudaSetDevice(device);
  if (s != cudaSuccess) {
    write_error(err, err_len, "cudaSetDevice", s);
    return 1;
  }
  return 0;
}

int is_device_pointer(const void* ptr) {
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();  // clear the non-sticky error
    return 0;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

int copy(void* dst, const void* src, size_t bytes, int direction, char* err, size_t err_len) {
  cudaMemcpyKind kind =
      direction == PQ_COPY_DEVICE_TO_HOST ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  cudaError_t s = cudaMemcpy(dst, src, bytes, kind);
  if (s != cudaSuccess) {
    write_error(err, err_len, "cudaMemcpy", s);
    return 1;
  }
  // From pageable memory, cudaMemcpy returns once the bytes are staged, with
  // the DMA to the device still queued on the legacy stream, which
  // cudaStreamNonBlocking streams do not wait for: work on such a stream
  // could read the old bytes, or have its writes overwritten by the late
  // DMA (the copy_rows test saw its last rows overwritten so). The ABI
  // promises a copy that has landed, so wait for it.
  if (direction == PQ_COPY_HOST_TO_DEVICE) {
    s = cudaStreamSynchronize(cudaStreamLegacy);
    if (s != cudaSuccess) {
      write_error(err, err_len, "cudaMemcpy (waiting for the DMA)", s);
      return 1;
    }
  }
  return 0;
}

int device_alloc(void** ptr, size_t bytes, char* err, size_t err_len) {
  if (ptr == nullptr) return pqcuda::set_error(err, err_len, "device_alloc: ptr is NULL");
  *ptr = nullptr;
  if (bytes == 0) return 0;
  cudaError_t s = cudaMalloc(ptr, bytes);
  if (s != cudaSuccess) {
    *ptr = nullptr;
    char what[64];
    std::snprintf(what, sizeof what, "cudaMalloc(%zu bytes)", bytes);
    return pqcuda::cuda_fail(err, err_len, what, s);
  }
  return 0;
}

int device_free(void* ptr, char* err, size_t err_len) {
  if (ptr == nullptr) return 0;
  cudaError_t s = cudaFree(ptr);
  return s == cudaSuccess ? 0 : pqcuda::cuda_fail(err, err_len, "cudaFree", s);
}

int stream_synchronize(void* stream, char* err, size_t err_len) {
  cudaError_t s = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  return s == cudaSuccess ? 0 : pqcuda::cuda_fail(err, err_len, "cudaStreamSynchronize", s);
}

// Designated order: the fields in the order cuda_plugin_abi.h declares them.
const pq_cuda_plugin kPlugin = {
    PQ_CUDA_PLUGIN_ABI_VERSION,
    sizeof(pq_cuda_plugin),
    device_count,
    device_name,
    set_device,
    is_device_pointer,
    device_alloc,
    device_free,
    pqcuda::host_alloc,
    pqcuda::host_free,
    pqcuda::stream_create,
    pqcuda::stream_destroy,
    stream_synchronize,
    pqcuda::event_create,
    pqcuda::event_destroy,
    pqcuda::event_record,
    pqcuda::event_synchronize,
    pqcuda::stream_wait_event,
    copy,
    pqcuda::copy_async,
    pqcuda::pq_scan_workspace_size,
    pqcuda::pq_scan,
    pqcuda::topk_workspace_size,
    pqcuda::topk,
    pqcuda::encode,
    pqcuda::gather_rows,
    pqcuda::copy_rows,
    pqcuda::pq_scan_rows_workspace_size,
    pqcuda::pq_scan_rows,
    pqcuda::topk_rows_workspace_size,
    pqcuda::topk_rows,
    pqcuda::pq_lut,
    pqcuda::fill_selection,
    pqcuda::gather_selected,
    pqcuda::event_query,
    pqcuda::gather_selected_rows,
    pqcuda::inline_copies,
    pqcuda::stream_capturing,
    pqcuda::pq_lut_rows,
    pqcuda::fill_selection_rows,
    pqcuda::pq_lut_ordered,
    pqcuda::pq_lut_rows_ordered,
    pqcuda::pq_rerank_workspace_size,
    pqcuda::pq_rerank,
    pqcuda::pq_rerank_rows,
    pqcuda::multi_rows_workspace_size,
    pqcuda::multi_rows,
};

}  // namespace

// Needs no device, so a caller can inspect the table on a machine without a
// GPU. 0 asks for whatever version this is (cuda_plugin_abi.h).
extern "C" __attribute__((visibility("default"))) const pq_cuda_plugin* pq_cuda_plugin_entry(
    uint32_t abi_version) {
  if (abi_version == PQ_CUDA_PLUGIN_ABI_VERSION || abi_version == 0) return &kPlugin;
  return nullptr;
}
