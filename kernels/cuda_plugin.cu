// libpqcache_cuda.so: the CUDA backend plug-in. libpqcache.so opens it with
// dlopen at run time, so the core never links cudart. This first version
// moves tensors between device and host memory; the scoring, top-k and fetch
// kernels and the GPU block cache come with the CUDA backend issue.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "cuda_plugin_abi.h"

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

const pq_cuda_plugin_v1 kPlugin = {
    PQ_CUDA_PLUGIN_ABI_VERSION, sizeof(pq_cuda_plugin_v1), device_count, device_name,
    set_device, is_device_pointer, copy,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const pq_cuda_plugin_v1* pq_cuda_plugin_entry(
    uint32_t abi_version) {
  return abi_version == PQ_CUDA_PLUGIN_ABI_VERSION ? &kPlugin : nullptr;
}
