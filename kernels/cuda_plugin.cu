// libpqcache_cuda.so: the CUDA backend plug-in. libpqcache.so opens it with
// dlopen at run time, so the core never links cudart. ABI version 1 moves
// tensors between device and host memory; version 2 adds device memory
// helpers and the PQ scoring (pq_scan.cu) and top-k (topk.cu) kernels;
// version 3 adds mapped pinned host memory, streams, events and copies
// (memory.cu), the row gather of pq_fetch_kv (gather.cu) and PQ encoding
// (encode.cu).
#include <cuda_runtime.h>

#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "cuda_plugin_abi.h"
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

const pq_cuda_plugin_v1 kPluginV1 = {
    PQ_CUDA_PLUGIN_ABI_VERSION, sizeof(pq_cuda_plugin_v1), device_count, device_name,
    set_device, is_device_pointer, copy,
};

const pq_cuda_plugin_v2 kPluginV2 = {
    PQ_CUDA_PLUGIN_ABI_VERSION_2,
    sizeof(pq_cuda_plugin_v2),
    device_count,
    device_name,
    set_device,
    is_device_pointer,
    copy,
    device_alloc,
    device_free,
    stream_synchronize,
    pqcuda::pq_scan_workspace_size,
    pqcuda::pq_scan,
    pqcuda::topk_workspace_size,
    pqcuda::topk,
};

const pq_cuda_plugin_v3 kPluginV3 = {
    PQ_CUDA_PLUGIN_ABI_VERSION_3,
    sizeof(pq_cuda_plugin_v3),
    device_count,
    device_name,
    set_device,
    is_device_pointer,
    copy,
    device_alloc,
    device_free,
    stream_synchronize,
    pqcuda::pq_scan_workspace_size,
    pqcuda::pq_scan,
    pqcuda::topk_workspace_size,
    pqcuda::topk,
    pqcuda::host_alloc,
    pqcuda::host_free,
    pqcuda::stream_create,
    pqcuda::stream_destroy,
    pqcuda::event_create,
    pqcuda::event_destroy,
    pqcuda::event_record,
    pqcuda::event_synchronize,
    pqcuda::stream_wait_event,
    pqcuda::copy_async,
    pqcuda::gather_rows,
    pqcuda::copy_rows,
    pqcuda::encode,
};

// A v2 or v3 table is read through a v1 pointer until the caller checks the
// version, and a v3 table may be read through a v2 pointer: the common fields
// must sit at the same offsets.
#define PQ_SAME_OFFSET(older, newer, field) \
  static_assert(offsetof(older, field) == offsetof(newer, field), #newer "." #field)
#define PQ_SAME_V1_FIELDS(newer)                      \
  PQ_SAME_OFFSET(pq_cuda_plugin_v1, newer, abi_version);  \
  PQ_SAME_OFFSET(pq_cuda_plugin_v1, newer, struct_size);  \
  PQ_SAME_OFFSET(pq_cuda_plugin_v1, newer, device_count); \
  PQ_SAME_OFFSET(pq_cuda_plugin_v1, newer, device_name);  \
  PQ_SAME_OFFSET(pq_cuda_plugin_v1, newer, set_device);   \
  PQ_SAME_OFFSET(pq_cuda_plugin_v1, newer, is_device_pointer); \
  PQ_SAME_OFFSET(pq_cuda_plugin_v1, newer, copy)
PQ_SAME_V1_FIELDS(pq_cuda_plugin_v2);
PQ_SAME_V1_FIELDS(pq_cuda_plugin_v3);
PQ_SAME_OFFSET(pq_cuda_plugin_v2, pq_cuda_plugin_v3, device_alloc);
PQ_SAME_OFFSET(pq_cuda_plugin_v2, pq_cuda_plugin_v3, device_free);
PQ_SAME_OFFSET(pq_cuda_plugin_v2, pq_cuda_plugin_v3, stream_synchronize);
PQ_SAME_OFFSET(pq_cuda_plugin_v2, pq_cuda_plugin_v3, pq_scan_workspace_size);
PQ_SAME_OFFSET(pq_cuda_plugin_v2, pq_cuda_plugin_v3, pq_scan);
PQ_SAME_OFFSET(pq_cuda_plugin_v2, pq_cuda_plugin_v3, topk_workspace_size);
PQ_SAME_OFFSET(pq_cuda_plugin_v2, pq_cuda_plugin_v3, topk);
static_assert(sizeof(pq_cuda_plugin_v2) == offsetof(pq_cuda_plugin_v3, host_alloc),
              "version 3 appends to version 2");
#undef PQ_SAME_V1_FIELDS
#undef PQ_SAME_OFFSET

}  // namespace

// Serves versions 1, 2 and 3; needs no device, so a caller can inspect the
// table on a machine without a GPU.
extern "C" __attribute__((visibility("default"))) const pq_cuda_plugin_v1* pq_cuda_plugin_entry(
    uint32_t abi_version) {
  if (abi_version == PQ_CUDA_PLUGIN_ABI_VERSION) return &kPluginV1;
  if (abi_version == PQ_CUDA_PLUGIN_ABI_VERSION_2)
    return reinterpret_cast<const pq_cuda_plugin_v1*>(&kPluginV2);
  if (abi_version == PQ_CUDA_PLUGIN_ABI_VERSION_3)
    return reinterpret_cast<const pq_cuda_plugin_v1*>(&kPluginV3);
  return nullptr;
}
