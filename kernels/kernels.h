// Host-side entry points of the plug-in's kernels, shared by the .cu files of
// libpqcache_cuda.so (internal; the ABI in src/backend/cuda/cuda_plugin_abi.h wraps them).
// Every function returns 0 on success, else non-zero with a message in err.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_plugin_abi.h"

namespace pqcuda {

// printf-style message into err (truncated to err_len; err may be null);
// returns 1, so that `return set_error(...)` reports the failure.
int set_error(char* err, size_t err_len, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
// "what: cudaErrorX (description)" into err; returns 1 for `return cuda_fail(...)`.
int cuda_fail(char* err, size_t err_len, const char* what, cudaError_t status);

size_t pq_scan_workspace_size(int32_t kv_heads, int32_t group_size, int32_t subspaces, int64_t n,
                              int32_t combine);
int pq_scan(const float* d_lut, const uint8_t* d_codes, int32_t kv_heads, int32_t group_size,
            int32_t subspaces, int32_t centroids, int64_t codes_stride, int64_t begin, int64_t end,
            int32_t combine, float scale, float* d_scores, void* d_workspace,
            size_t workspace_bytes, void* stream, char* err, size_t err_len);

size_t pq_scan_rows_workspace_size(int32_t rows, int32_t group_size, int32_t subspaces,
                                   int64_t max_n, int32_t combine);
int pq_scan_rows(const pq_scan_row* d_rows, int32_t rows, int64_t max_n, int32_t group_size,
                 int32_t subspaces, int32_t centroids, int32_t combine, float scale,
                 void* d_workspace, size_t workspace_bytes, void* stream, char* err,
                 size_t err_len);

size_t topk_workspace_size(int32_t rows, int64_t n, int64_t k);
int topk(const float* d_scores, int32_t rows, int64_t n, int64_t k, int64_t first, int32_t* d_out,
         void* d_workspace, size_t workspace_bytes, void* stream, char* err, size_t err_len);
size_t topk_rows_workspace_size(int32_t rows, int64_t max_n);
int topk_rows(const pq_topk_row* d_rows, int32_t rows, int64_t max_n, void* d_workspace,
              size_t workspace_bytes, void* stream, char* err, size_t err_len);

// memory.cu: mapped pinned host memory, streams, events, asynchronous copies
// and the cudaMemcpyAsync-per-run row copy (the baseline of gather_rows).
int host_alloc(void** ptr, size_t bytes, char* err, size_t err_len);
int host_free(void* ptr, char* err, size_t err_len);
int stream_create(void** stream, char* err, size_t err_len);
int stream_destroy(void* stream, char* err, size_t err_len);
int event_create(void** event, char* err, size_t err_len);
int event_destroy(void* event, char* err, size_t err_len);
int event_record(void* event, void* stream, char* err, size_t err_len);
int event_synchronize(void* event, char* err, size_t err_len);
int event_query(void* event, char* err, size_t err_len);
int stream_wait_event(void* stream, void* event, char* err, size_t err_len);
int copy_async(void* dst, const void* src, size_t bytes, void* stream, char* err, size_t err_len);
int copy_rows(const void* const* srcs, void* const* dsts, int64_t rows, size_t row_bytes,
              void* stream, char* err, size_t err_len);

// gather.cu: the row gather kernel of pq_fetch_kv.
int gather_rows(const void* const* d_srcs, void* const* d_dsts, int64_t rows, size_t row_bytes,
                void* stream, char* err, size_t err_len);

// device_selection.cu: a decode step that stays on the device.
int pq_lut(const void* d_query, int32_t dtype, int64_t head_stride, int32_t kv_heads,
           int32_t group_size, const float* d_centroids, int32_t subspaces, int32_t centroids,
           int32_t sub_dim, float* d_lut, void* stream, char* err, size_t err_len);
int fill_selection(int32_t* d_positions, int32_t* d_counts, int32_t heads, int64_t capacity,
                   int64_t sink_end, const int32_t* d_middle, int64_t k, int64_t mid_end,
                   int64_t n, void* stream, char* err, size_t err_len);
int gather_selected(const pq_selected_gather* args, void* stream, char* err, size_t err_len);
int pq_lut_rows(const pq_lut_row* d_rows, int32_t rows, int32_t dtype, int64_t head_stride,
                int32_t kv_heads, int32_t group_size, int32_t subspaces, int32_t centroids,
                int32_t sub_dim, void* stream, char* err, size_t err_len);
int fill_selection_rows(const pq_fill_row* d_rows, int32_t rows, int32_t heads, int64_t max_count,
                        void* stream, char* err, size_t err_len);
int pq_lut_ordered(const void* d_query, int32_t dtype, int64_t head_stride, int32_t kv_heads,
                   int32_t group_size, const float* d_centroids, int32_t subspaces,
                   int32_t centroids, int32_t sub_dim, int32_t key_rotary, float* d_lut,
                   void* stream, char* err, size_t err_len);
int pq_lut_rows_ordered(const pq_lut_row* d_rows, int32_t rows, int32_t dtype,
                        int64_t head_stride, int32_t kv_heads, int32_t group_size,
                        int32_t subspaces, int32_t centroids, int32_t sub_dim, int32_t key_rotary,
                        void* stream, char* err, size_t err_len);

// rerank.cu: exact re-ranking of the codes' candidates (config.pq_rerank).
size_t pq_rerank_workspace_size(int32_t rows, int64_t max_count, int32_t group_size);
int pq_rerank(const pq_rerank_row* row, int32_t rows, const pq_rerank_shape* shape,
              void* d_workspace, size_t workspace_bytes, void* stream, char* err, size_t err_len);
int pq_rerank_rows(const pq_rerank_row* d_rows, int32_t rows, const pq_rerank_shape* shape,
                   void* d_workspace, size_t workspace_bytes, void* stream, char* err,
                   size_t err_len);
int gather_selected_rows(const pq_selected_gather* d_items, int32_t items, int64_t max_chunks,
                         void* stream, char* err, size_t err_len);

// multi_rows.cu: the rows of a multi-token select (per token, or unions).
size_t multi_rows_workspace_size(int32_t form, int32_t kv_heads, int64_t n);
int multi_rows(const int32_t* d_in, const int32_t* d_in_counts, int64_t in_capacity,
               int32_t tokens, int32_t kv_heads, int32_t form, int64_t n, int32_t* d_out,
               int32_t* d_out_counts, int64_t out_capacity, void* d_workspace,
               size_t workspace_bytes, void* stream, char* err, size_t err_len);

// inline_copies.cu: the small copies of a decode step, passed by value.
int inline_copies(const pq_inline_copies* args, void* stream, char* err, size_t err_len);
int stream_capturing(void* stream, char* err, size_t err_len);

// encode.cu: PQ codes with the CPU's nearest-centroid rule.
int encode(const float* d_keys, int64_t tokens, int64_t key_stride, const float* d_centroids,
           int32_t subspaces, int32_t centroids, int32_t sub_dim, uint8_t* d_codes,
           int64_t code_stride, void* stream, char* err, size_t err_len);

}  // namespace pqcuda
