// libpqcache_cuda.so: the CUDA backend plug-in. libpqcache.so opens it with
// dlopen at run time, so the core never links cudart. ABI version 1 moves
// tensors between device and host memory; version 2 adds device memory
// helpers and the PQ scoring (pq_scan.cu) and top-k (topk.cu) kernels. The
// fetch kernels and the GPU block cache come later with the CUDA backend issue.
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

// A v2 table is read through a v1 pointer until the caller checks the
// version: the common fields must sit at the same offsets.
#define PQ_SAME_OFFSET(field) \
  static_assert(offsetof(pq_cuda_plugin_v1, field) == offsetof(pq_cuda_plugin_v2, field), #field)
PQ_SAME_OFFSET(abi_version);
PQ_SAME_OFFSET(struct_size);
PQ_SAME_OFFSET(device_count);
PQ_SAME_OFFSET(device_name);
PQ_SAME_OFFSET(set_device);
PQ_SAME_OFFSET(is_device_pointer);
PQ_SAME_OFFSET(copy);
#undef PQ_SAME_OFFSET

}  // namespace

// Serves version 1 (what plugin_loader.cpp asks for) and version 2; needs no
// device, so a caller can inspect the table on a machine without a GPU.
extern "C" __attribute__((visibility("default"))) const pq_cuda_plugin_v1* pq_cuda_plugin_entry(
    uint32_t abi_version) {
  if (abi_version == PQ_CUDA_PLUGIN_ABI_VERSION) return &kPluginV1;
  if (abi_version == PQ_CUDA_PLUGIN_ABI_VERSION_2)
    return reinterpret_cast<const pq_cuda_plugin_v1*>(&kPluginV2);
  return nullptr;
}
