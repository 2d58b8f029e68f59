/* What the host fake of the CUDA plug-in (fake_cuda_plugin.cpp) exports
 * besides the plug-in entry point, for the tests that drive the CUDA
 * backend through it. */
#ifndef PQCACHE_FAKE_CUDA_PLUGIN_H
#define PQCACHE_FAKE_CUDA_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pq_fake_cuda_counters {
  uint64_t host_waits;       /* stream/event synchronisations and synchronous copies */
  uint64_t bytes_to_device;  /* host -> device, by copy and copy_async */
  uint64_t bytes_to_host;    /* device -> host */
  uint64_t kernel_launches;  /* pq_scan(_rows), topk(_rows), encode, gather_rows */
  uint64_t device_bytes_live;
  /* Version 6's counters: what a steady decode step must not do. */
  uint64_t device_allocs;    /* cudaMalloc */
  uint64_t device_frees;     /* cudaFree: a wait for the whole device */
  uint64_t host_allocs;      /* cudaHostAlloc */
  uint64_t host_frees;       /* cudaFreeHost: a wait for the whole device */
  uint64_t pageable_copies;  /* copy_async with a pageable host side */
  uint64_t capture_refusals; /* calls a CUDA graph capture refuses, made during one */
  uint64_t event_records;
  uint64_t inline_copies;    /* inline_copies launches (not in kernel_launches; their
                              * payload counts in bytes_to_device) */
  /* Added with ABI 8: K/V rows copied on the device (gather_rows' rows and
   * inline_copies' rows: the window, the store, the cache's slots), which a
   * context that keeps no values must never ask for. */
  uint64_t rows_copied;
} pq_fake_cuda_counters;

/* A snapshot of the counters since the plug-in was loaded. */
void pq_fake_cuda_counters_get(pq_fake_cuda_counters* out);
typedef void (*pq_fake_cuda_counters_get_fn)(pq_fake_cuda_counters* out);

/* Runs every stream's deferred work (as cudaDeviceSynchronize). */
void pq_fake_cuda_synchronize_all(void);
typedef void (*pq_fake_cuda_synchronize_all_fn)(void);

/* Operations enqueued and not yet run, on all streams. */
uint64_t pq_fake_cuda_pending(void);
typedef uint64_t (*pq_fake_cuda_pending_fn)(void);

/* A CUDA graph capture of `stream` (global mode): until the end, what is
 * enqueued on the stream is recorded, not run, and the calls a capture
 * refuses (waits, event queries, allocations, frees, synchronous and
 * pageable copies) fail and count in capture_refusals. The end returns the
 * number of operations captured, or -1 if none was begun; replay enqueues
 * them again on the stream, with the arguments they were captured with, as
 * cudaGraphLaunch does. */
void pq_fake_cuda_capture_begin(void* stream);
int64_t pq_fake_cuda_capture_end(void* stream);
int pq_fake_cuda_graph_replay(void* stream);
typedef void (*pq_fake_cuda_capture_begin_fn)(void* stream);
typedef int64_t (*pq_fake_cuda_capture_end_fn)(void* stream);
typedef int (*pq_fake_cuda_graph_replay_fn)(void* stream);

/* "Device" memory for tests that cannot reach the table (the Python
 * binding's, through ctypes): device_alloc and device_free. It is host
 * memory, so such a test reads and writes it directly once the streams
 * have run (pq_fake_cuda_synchronize_all). NULL on failure. */
void* pq_fake_cuda_malloc(size_t bytes);
void pq_fake_cuda_free(void* ptr);

#ifdef __cplusplus
}
#endif

#endif
