// Host-side entry points of the plug-in's kernels, shared by the .cu files of
// libpqcache_cuda.so (internal; the ABI in src/cuda_plugin_abi.h wraps them).
// Every function returns 0 on success, else non-zero with a message in err.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace pqcuda {

// printf-style message into err (truncated to err_len; err may be null);
// returns 1, so that `return set_error(...)` reports the failure.
int set_error(char* err, size_t err_len, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
// "what: cudaErrorX (description)" into err; returns 1 for `return fail(...)`.
int cuda_fail(char* err, size_t err_len, const char* what, cudaError_t status);

size_t pq_scan_workspace_size(int32_t kv_heads, int32_t group_size, int32_t subspaces, int64_t n,
                              int32_t combine);
int pq_scan(const float* d_lut, const uint8_t* d_codes, int32_t kv_heads, int32_t group_size,
            int32_t subspaces, int32_t centroids, int64_t codes_stride, int64_t begin, int64_t end,
            int32_t combine, float scale, float* d_scores, void* d_workspace,
            size_t workspace_bytes, void* stream, char* err, size_t err_len);

size_t topk_workspace_size(int32_t rows, int64_t n, int64_t k);
int topk(const float* d_scores, int32_t rows, int64_t n, int64_t k, int64_t first, int32_t* d_out,
         void* d_workspace, size_t workspace_bytes, void* stream, char* err, size_t err_len);

}  // namespace pqcuda
