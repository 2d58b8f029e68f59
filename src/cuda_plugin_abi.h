/* The C interface between libpqcache.so and its CUDA plug-in
 * libpqcache_cuda.so. Plain C so that the two can be built by different
 * compilers (g++ and nvcc); versioned so that a stale plug-in is refused
 * rather than misused. Internal: not installed. */
#ifndef PQCACHE_CUDA_PLUGIN_ABI_H
#define PQCACHE_CUDA_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PQ_CUDA_PLUGIN_ABI_VERSION 1u
#define PQ_CUDA_PLUGIN_ENTRY "pq_cuda_plugin_entry"

enum { PQ_COPY_DEVICE_TO_HOST = 0, PQ_COPY_HOST_TO_DEVICE = 1 };

/* Functions return 0 on success, else non-zero and a message in err. */
typedef struct pq_cuda_plugin_v1 {
  uint32_t abi_version; /* PQ_CUDA_PLUGIN_ABI_VERSION */
  uint32_t struct_size; /* sizeof(pq_cuda_plugin_v1) */
  /* Number of usable devices; 0 on any error (no driver, no device). */
  int (*device_count)(void);
  /* Name of a device into buf. */
  int (*device_name)(int device, char* buf, size_t len);
  /* Makes `device` current for the calling thread. */
  int (*set_device)(int device, char* err, size_t err_len);
  /* 1 if ptr is device (or managed) memory as CUDA knows it, else 0. */
  int (*is_device_pointer)(const void* ptr);
  /* Synchronous copy on the legacy default stream of the current device. */
  int (*copy)(void* dst, const void* src, size_t bytes, int direction, char* err, size_t err_len);
} pq_cuda_plugin_v1;

typedef const pq_cuda_plugin_v1* (*pq_cuda_plugin_entry_fn)(uint32_t abi_version);

#ifdef __cplusplus
}
#endif

#endif
