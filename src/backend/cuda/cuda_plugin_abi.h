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

/* One version at a time: libpqcache.so accepts exactly the version it was
 * built with (the packages pin the plug-in to the same release), so there
 * are no older tables to serve and no fallback modes. Version 4 replaced the
 * layered v1/v2/v3 tables of 0.3; version 5 added the row-table scan and
 * top-k (a batch of sequences in one launch each); version 6 the copies
 * passed by value (inline_copies) and stream_capturing, so that a steady
 * decode step stages nothing and can be captured in a CUDA graph; version 7
 * the lookup tables of a rotary layout and the exact re-ranking, so that the
 * device step serves every setting the host path does; version 8 the rows
 * of a multi-token select (multi_rows), so that it stays on the device. */
#define PQ_CUDA_PLUGIN_ABI_VERSION 8u
#define PQ_CUDA_PLUGIN_ENTRY "pq_cuda_plugin_entry"

enum { PQ_COPY_DEVICE_TO_HOST = 0, PQ_COPY_HOST_TO_DEVICE = 1 };

/* One row of pq_scan_rows: one kv head of one sequence. All pointers are
 * device memory. Token t's codes are codes[t * subspaces ..]; tokens
 * [begin, end) are scored into scores[0 .. end - begin). codes 16-byte
 * aligned take the vector loads, any other address byte loads. */
typedef struct pq_scan_row {
  const float* lut;     /* [group_size][subspaces][centroids] */
  const uint8_t* codes;
  float* scores;
  int64_t begin;
  int64_t end;
} pq_scan_row;

/* What gather_selected reads: a selection in device memory (row h of
 * positions at positions[h * capacity], counts[h] of them), the host K/V
 * store as tables of chunk addresses (device arrays; the chunks are mapped
 * pinned memory, [head][token in chunk][row_bytes] each), the device window
 * of sink and local tokens, and the outputs (byte strides). */
typedef struct pq_selected_gather {
  const int32_t* positions;
  const int32_t* counts;
  int64_t capacity;
  int32_t heads;
  int32_t reserved;
  const uint8_t* const* key_chunks;
  const uint8_t* const* value_chunks;
  int64_t chunk_tokens;
  int64_t tokens;          /* the sequence's length: positions >= tokens are not read */
  uint64_t row_bytes;
  /* Window slot w holds all heads' K rows, then their V rows; sinks in
   * slots [0, sink_tokens), the last local_tokens tokens in a ring after
   * them (slot sink_tokens + p % local_tokens). NULL: no window. */
  const uint8_t* window;
  int64_t sink_tokens;
  int64_t local_tokens;
  uint8_t* out_keys;
  uint8_t* out_values;
  int64_t keys_token_stride, keys_head_stride;     /* bytes */
  int64_t values_token_stride, values_head_stride; /* bytes */
} pq_selected_gather;

/* One row of topk_rows: the top k of n scores, positions first + index,
 * written ascending into out (min(k, n) of them; all n when k >= n;
 * nothing when k or n is 0). Device pointers. */
typedef struct pq_topk_row {
  const float* scores;
  int32_t* out;
  int64_t n;
  int64_t k;
  int64_t first;
} pq_topk_row;

/* Small copies passed by value, as kernel parameters (inline_copies): no
 * pinned staging to fence, no plan to upload, nothing refused in a CUDA
 * graph capture. `rows` rows of row_bytes, row i from srcs[i] to dsts[i],
 * then `pieces` pieces of the payload, piece i (piece_bytes[i] bytes from
 * payload + piece_at[i]) to piece_dst[i]. Every address is device memory
 * or mapped pinned host memory (read or written across PCIe). 2,368 bytes:
 * within the 4 KiB of kernel parameters every CUDA device takes. */
#define PQ_INLINE_ROWS 64
#define PQ_INLINE_PIECES 32
#define PQ_INLINE_BYTES 1024
typedef struct pq_inline_copies {
  int32_t rows;
  int32_t pieces;
  uint64_t row_bytes;
  const void* srcs[PQ_INLINE_ROWS];
  void* dsts[PQ_INLINE_ROWS];
  void* piece_dst[PQ_INLINE_PIECES];
  uint16_t piece_at[PQ_INLINE_PIECES];
  uint16_t piece_bytes[PQ_INLINE_PIECES];
  uint8_t payload[PQ_INLINE_BYTES];
} pq_inline_copies;

/* One item of pq_lut_rows (device pointers): an item's query, its layer's
 * centroids, its LUTs, with pq_lut's layouts. */
typedef struct pq_lut_row {
  const void* query;
  const float* centroids;
  float* lut;
} pq_lut_row;

/* One selection of fill_selection_rows, with fill_selection's meaning. */
typedef struct pq_fill_row {
  int32_t* positions;
  int32_t* counts;
  const int32_t* middle;
  int64_t capacity;
  int64_t sink_end;
  int64_t k;
  int64_t mid_end;
  int64_t n;
} pq_fill_row;

/* One row of pq_rerank_rows: the exact re-ranking of one kv head of one
 * sequence. Device pointers; the key chunks are the store's (mapped pinned
 * memory), chunk c's keys [head][chunk_tokens][head_dim] elements. */
typedef struct pq_rerank_row {
  const void* query;                /* query head g of the group at query + g * query_head_stride */
  const int32_t* candidates;        /* count positions, ascending */
  int32_t* out;                     /* the best k of them, written ascending */
  const uint8_t* const* key_chunks; /* device table of chunk addresses */
  int32_t head;                     /* the kv head whose key rows are read */
  int32_t reserved;
  int64_t count;                    /* 1 <= k <= count <= max_count, else nothing is written */
  int64_t k;
} pq_rerank_row;

/* What every row of a re-ranking shares; read at the call. */
typedef struct pq_rerank_shape {
  int32_t group_size;
  int32_t head_dim;
  int32_t query_dtype;        /* pq_dtype: f32, f16 or bf16 */
  int32_t key_dtype;
  int32_t combine;            /* pq_gqa_combine */
  float scale;                /* logits raw * scale */
  int64_t query_head_stride;  /* bytes */
  int64_t chunk_tokens;
  int64_t max_count;          /* >= every row's count */
} pq_rerank_shape;

/* Every function returns 0 on success, else non-zero and a message in err
 * (err_len bytes, NUL-terminated), except where noted.
 *
 * Kernels and *_async calls are stream-ordered: they enqueue on `stream` (a
 * stream from stream_create, or NULL for the legacy default stream) and
 * return without synchronising; results reach the host after
 * stream_synchronize or event_synchronize. An error return covers argument
 * checks and launch errors; a fault during execution shows at the next
 * synchronisation. Pointers named d_* are device memory of the current
 * device (or mapped pinned host memory where said). */
typedef struct pq_cuda_plugin {
  /* These two fields stay first in every version, so that a loader can
   * tell which version a plug-in speaks. */
  uint32_t abi_version; /* PQ_CUDA_PLUGIN_ABI_VERSION */
  uint32_t struct_size; /* sizeof(pq_cuda_plugin) */

  /* --- devices ---------------------------------------------------------- */
  /* Number of usable devices; 0 on any error (no driver, no device). */
  int (*device_count)(void);
  /* Name of a device into buf. */
  int (*device_name)(int device, char* buf, size_t len);
  /* Makes `device` current for the calling thread. */
  int (*set_device)(int device, char* err, size_t err_len);
  /* 1 if ptr is device (or managed) memory as CUDA knows it, else 0. */
  int (*is_device_pointer)(const void* ptr);

  /* --- memory, streams, events, copies ---------------------------------- */
  /* cudaMalloc / cudaFree on the current device. *ptr is NULL for
   * bytes == 0. Freeing NULL is a no-op. */
  int (*device_alloc)(void** ptr, size_t bytes, char* err, size_t err_len);
  int (*device_free)(void* ptr, char* err, size_t err_len);
  /* Page-locked host memory mapped into the device address space
   * (cudaHostAllocPortable | cudaHostAllocMapped): copies from it run at
   * full PCIe speed and kernels read it directly (UVA). */
  int (*host_alloc)(void** ptr, size_t bytes, char* err, size_t err_len);
  int (*host_free)(void* ptr, char* err, size_t err_len);
  /* Streams (cudaStreamNonBlocking) and events (cudaEventDisableTiming).
   * Destroying NULL is a no-op. */
  int (*stream_create)(void** stream, char* err, size_t err_len);
  int (*stream_destroy)(void* stream, char* err, size_t err_len);
  int (*stream_synchronize)(void* stream, char* err, size_t err_len);
  int (*event_create)(void** event, char* err, size_t err_len);
  int (*event_destroy)(void* event, char* err, size_t err_len);
  int (*event_record)(void* event, void* stream, char* err, size_t err_len);
  int (*event_synchronize)(void* event, char* err, size_t err_len);
  int (*stream_wait_event)(void* stream, void* event, char* err, size_t err_len);
  /* Synchronous copy on the legacy default stream (cudaMemcpy): returns
   * once the bytes have landed, so that work on any stream, non-blocking
   * ones included, sees them (a pageable host-to-device cudaMemcpy alone
   * returns with its DMA still queued). */
  int (*copy)(void* dst, const void* src, size_t bytes, int direction, char* err, size_t err_len);
  /* cudaMemcpyAsync with cudaMemcpyDefault (any direction, UVA). */
  int (*copy_async)(void* dst, const void* src, size_t bytes, void* stream, char* err,
                    size_t err_len);

  /* --- PQ selection ------------------------------------------------------ */
  /* PQ scoring of the middle tokens of one layer, every kv head in one call.
   *   d_lut    float [kv_heads][group_size][subspaces][centroids]: query
   *            sub-vector x centroid dot products (paper section 3.4)
   *   d_codes  uint8 [kv_heads][codes_stride][subspaces], token-major per head
   *   tokens [begin, end) of every head are scored; n = end - begin
   *   d_scores float [kv_heads][n]: the group's raw sums combined by
   *            `combine` (pq_gqa_combine) with logits raw * scale, exactly as
   *            the CPU's combine_group_scores does
   * centroids is a power of two <= 256. SUM_SOFTMAX with group_size > 1 needs
   * pq_scan_workspace_size(...) bytes of device workspace (other modes: 0). */
  size_t (*pq_scan_workspace_size)(int32_t kv_heads, int32_t group_size, int32_t subspaces,
                                   int64_t n, int32_t combine);
  int (*pq_scan)(const float* d_lut, const uint8_t* d_codes, int32_t kv_heads,
                 int32_t group_size, int32_t subspaces, int32_t centroids, int64_t codes_stride,
                 int64_t begin, int64_t end, int32_t combine, float scale, float* d_scores,
                 void* d_workspace, size_t workspace_bytes, void* stream, char* err,
                 size_t err_len);
  /* Top k of each of `rows` rows of d_scores (float [rows][n]), with the
   * CPU's select_top_k semantics: the k highest scores, ties to the larger
   * position, positions (first + index) written ascending into d_out
   * (int32 [rows][k], row stride k). For k >= n every row gets its n
   * positions (first .. first+n-1) and the rest of the row is untouched.
   * rows <= 65535, n <= INT32_MAX, positions must fit in int32. */
  size_t (*topk_workspace_size)(int32_t rows, int64_t n, int64_t k);
  int (*topk)(const float* d_scores, int32_t rows, int64_t n, int64_t k, int64_t first,
              int32_t* d_out, void* d_workspace, size_t workspace_bytes, void* stream, char* err,
              size_t err_len);
  /* PQ encoding: codes of `tokens` keys with the CPU's nearest-centroid rule.
   *   d_keys      float [tokens][key_stride] (head_dim = subspaces * sub_dim
   *               floats at the row start)
   *   d_centroids float [subspaces][centroids][sub_dim]
   *   d_codes     uint8, code of token t, subspace j at d_codes[t * code_stride + j]
   * centroids in 1..256, key_stride >= subspaces * sub_dim, code_stride >=
   * subspaces; other bytes of a code row are left untouched. Ties go to the
   * lowest index, as on the CPU. */
  int (*encode)(const float* d_keys, int64_t tokens, int64_t key_stride, const float* d_centroids,
                int32_t subspaces, int32_t centroids, int32_t sub_dim, uint8_t* d_codes,
                int64_t code_stride, void* stream, char* err, size_t err_len);

  /* --- fetch -------------------------------------------------------------- */
  /* Row gather, the fetch kernel: for i < rows, copies row_bytes from
   * srcs[i] to dsts[i]. d_srcs and d_dsts are DEVICE arrays of pointers; a
   * source may be device memory or mapped pinned host memory, a destination
   * device memory. */
  int (*gather_rows)(const void* const* d_srcs, void* const* d_dsts, int64_t rows,
                     size_t row_bytes, void* stream, char* err, size_t err_len);
  /* The baseline gather_rows is measured against: runs of rows contiguous
   * at both ends merged, one cudaMemcpyAsync each. HOST pointer arrays. */
  int (*copy_rows)(const void* const* srcs, void* const* dsts, int64_t rows, size_t row_bytes,
                   void* stream, char* err, size_t err_len);

  /* --- batches (version 5) ------------------------------------------------ */
  /* pq_scan over a table of rows (d_rows: `rows` pq_scan_row in DEVICE
   * memory, e.g. the kv heads of every sequence of a batch), one launch per
   * pass whatever the rows: grid (blocks for max_n tokens, rows). Every
   * row's end - begin must be <= max_n; group_size, subspaces, centroids,
   * combine and scale are shared, with pq_scan's meaning. SUM_SOFTMAX with
   * group_size > 1 needs pq_scan_rows_workspace_size(...) bytes. */
  size_t (*pq_scan_rows_workspace_size)(int32_t rows, int32_t group_size, int32_t subspaces,
                                        int64_t max_n, int32_t combine);
  int (*pq_scan_rows)(const pq_scan_row* d_rows, int32_t rows, int64_t max_n,
                      int32_t group_size, int32_t subspaces, int32_t centroids, int32_t combine,
                      float scale, void* d_workspace, size_t workspace_bytes, void* stream,
                      char* err, size_t err_len);
  /* topk over a table of rows (d_rows: `rows` pq_topk_row in DEVICE
   * memory), each with its own n, k and first (n <= max_n <= INT32_MAX):
   * one launch per step for every row, topk's semantics per row. */
  size_t (*topk_rows_workspace_size)(int32_t rows, int64_t max_n);
  int (*topk_rows)(const pq_topk_row* d_rows, int32_t rows, int64_t max_n, void* d_workspace,
                   size_t workspace_bytes, void* stream, char* err, size_t err_len);

  /* --- selections in device memory (version 5) ---------------------------- */
  /* The lookup tables of a layer from a query in device memory:
   *   d_lut[h][g][j][c] = q[h * group_size + g][j * sub_dim ..] . centroid[h][j][c]
   * with q head i at d_query + i * head_stride bytes (dtype pq_dtype: f32,
   * f16 or bf16, converted to float exactly) and d_centroids float
   * [kv_heads][subspaces][centroids][sub_dim], each dot product summed as
   * the CPU's dot() (eight lanes, then the tail), so the table is
   * bit-identical to the host's. */
  int (*pq_lut)(const void* d_query, int32_t dtype, int64_t head_stride, int32_t kv_heads,
                int32_t group_size, const float* d_centroids, int32_t subspaces,
                int32_t centroids, int32_t sub_dim, float* d_lut, void* stream, char* err,
                size_t err_len);
  /* Writes a whole selection of `heads` rows into device memory: row h of
   * d_positions (stride capacity) gets 0 .. sink_end-1, then the k middle
   * positions d_middle[h * k ..], then mid_end .. n-1; d_counts[h] gets
   * sink_end + k + n - mid_end (<= capacity). */
  int (*fill_selection)(int32_t* d_positions, int32_t* d_counts, int32_t heads, int64_t capacity,
                        int64_t sink_end, const int32_t* d_middle, int64_t k, int64_t mid_end,
                        int64_t n, void* stream, char* err, size_t err_len);
  /* The fetch of a selection in device memory, in one launch: for each head
   * h and i < min(counts[h], capacity), position p's K and V rows to
   * out + i * token_stride + h * head_stride, from the window when p is a
   * sink or one of the last local_tokens tokens (and the window is given),
   * else from the store's chunks. A position outside [0, tokens) is not
   * read; its rows are zero-filled. *args is read at the call. */
  int (*gather_selected)(const pq_selected_gather* args, void* stream, char* err,
                         size_t err_len);
  /* Whether the work before the event's record has run (cudaEventQuery):
   * 1 done (or never recorded), 0 not yet, -1 an error (in err). Never
   * waits. */
  int (*event_query)(void* event, char* err, size_t err_len);
  /* gather_selected for `items` selections in one launch: d_items is a
   * DEVICE array of pq_selected_gather (their pointers device memory too);
   * max_chunks >= every item's heads * capacity * 2 * ceil(row_bytes / 16). */
  int (*gather_selected_rows)(const pq_selected_gather* d_items, int32_t items,
                              int64_t max_chunks, void* stream, char* err, size_t err_len);

  /* --- a decode step with no staging (version 6) -------------------------- */
  /* The copies of *args in one launch; *args is read at the call (its
   * bytes travel as kernel parameters). row_bytes <= 4096. */
  int (*inline_copies)(const pq_inline_copies* args, void* stream, char* err, size_t err_len);
  /* Whether work enqueued on `stream` is being captured into a CUDA graph
   * (cudaStreamIsCapturing): 1 yes, 0 no, -1 an error (in err). A capture
   * refuses waits, allocations, frees, event queries and pageable copies. */
  int (*stream_capturing)(void* stream, char* err, size_t err_len);
  /* pq_lut for `rows` items in one launch (d_rows: DEVICE array), all of
   * one shape: the batched device step's tables. */
  int (*pq_lut_rows)(const pq_lut_row* d_rows, int32_t rows, int32_t dtype, int64_t head_stride,
                     int32_t kv_heads, int32_t group_size, int32_t subspaces, int32_t centroids,
                     int32_t sub_dim, void* stream, char* err, size_t err_len);
  /* fill_selection for `rows` selections of `heads` heads in one launch
   * (d_rows: DEVICE array); max_count >= every row's sink_end + k + n -
   * mid_end. A row that does not make a selection writes nothing. */
  int (*fill_selection_rows)(const pq_fill_row* d_rows, int32_t rows, int32_t heads,
                             int64_t max_count, void* stream, char* err, size_t err_len);

  /* --- every setting of the host path (version 7) -------------------------- */
  /* pq_lut and pq_lut_rows under a rotary layout (pq_key_rotary): the
   * codebook reads query dimension order(p) at its position p, where
   * order(p) = p / 2 + (p % 2) * head_dim / 2 under PQ_ROTARY_HALF (each
   * subspace holds whole rotate-half pairs, the host's rotary_dim_order)
   * and p otherwise. Same sums, so the table is the host's bit for bit.
   * pq_lut and pq_lut_rows are these with PQ_ROTARY_NONE. */
  int (*pq_lut_ordered)(const void* d_query, int32_t dtype, int64_t head_stride, int32_t kv_heads,
                        int32_t group_size, const float* d_centroids, int32_t subspaces,
                        int32_t centroids, int32_t sub_dim, int32_t key_rotary, float* d_lut,
                        void* stream, char* err, size_t err_len);
  int (*pq_lut_rows_ordered)(const pq_lut_row* d_rows, int32_t rows, int32_t dtype,
                             int64_t head_stride, int32_t kv_heads, int32_t group_size,
                             int32_t subspaces, int32_t centroids, int32_t sub_dim,
                             int32_t key_rotary, void* stream, char* err, size_t err_len);
  /* Exact re-ranking (config.pq_rerank), the host's PqSelector::rerank:
   * for each row, raw[g][i] = q_g . key(candidates[i]) summed as the CPU's
   * dot() (eight lanes, then the tail; keys and queries converted to float
   * exactly), the group combined by `combine` over the row's candidates as
   * combine_group_scores does it (its SUM_SOFTMAX sums in its eight lanes
   * too: the scores are the host's bit for bit), then the best k of them
   * (ties to the larger position) written ascending into out. A few
   * launches, no host wait. pq_rerank_rows reads `rows` rows from d_rows (a
   * DEVICE array) when it runs; pq_rerank takes *row (read at the call) as
   * kv head 0 of `rows` uniform rows: row h reads query + h * group_size *
   * query_head_stride, candidates + h * count, head row.head + h and
   * writes out + h * k. Both need pq_rerank_workspace_size(rows,
   * max_count, group_size) bytes of device workspace. rows <= 65535. */
  size_t (*pq_rerank_workspace_size)(int32_t rows, int64_t max_count, int32_t group_size);
  int (*pq_rerank)(const pq_rerank_row* row, int32_t rows, const pq_rerank_shape* shape,
                   void* d_workspace, size_t workspace_bytes, void* stream, char* err,
                   size_t err_len);
  int (*pq_rerank_rows)(const pq_rerank_row* d_rows, int32_t rows, const pq_rerank_shape* shape,
                        void* d_workspace, size_t workspace_bytes, void* stream, char* err,
                        size_t err_len);

  /* --- several query tokens in one select (version 8) --------------------- */
  /* The rows of a multi-token select (pq_decode_select_multi_device) from
   * the per-token selections in device memory: input row r = t * kv_heads +
   * h (query token t, kv head h) holds d_in_counts[r] positions (taken in
   * 0..in_capacity), ascending and unique, at d_in + r * in_capacity. By
   * `form` (pq_select_rows): PQ_ROWS_PER_TOKEN writes input row r as output
   * row r (tokens * kv_heads rows); PQ_ROWS_PER_HEAD output row h the union
   * of kv head h's rows over the tokens (kv_heads rows); PQ_ROWS_PER_REQUEST
   * output row 0 the union of every row. A union is ascending and unique
   * and holds the positions of [0, n) only. Output row o (d_out + o *
   * out_capacity) gets its positions, at most out_capacity of them, then -1
   * up to out_capacity; d_out_counts[o] their number. A few launches, no
   * host wait. The unions need multi_rows_workspace_size(form, kv_heads, n)
   * bytes of device workspace (a bitmap of n bits per output row);
   * PQ_ROWS_PER_TOKEN none. tokens * kv_heads <= INT32_MAX, n <= INT32_MAX. */
  size_t (*multi_rows_workspace_size)(int32_t form, int32_t kv_heads, int64_t n);
  int (*multi_rows)(const int32_t* d_in, const int32_t* d_in_counts, int64_t in_capacity,
                    int32_t tokens, int32_t kv_heads, int32_t form, int64_t n, int32_t* d_out,
                    int32_t* d_out_counts, int64_t out_capacity, void* d_workspace,
                    size_t workspace_bytes, void* stream, char* err, size_t err_len);
} pq_cuda_plugin;

/* The entry point: the table when asked for PQ_CUDA_PLUGIN_ABI_VERSION, or
 * for 0 (whatever version the plug-in speaks: the loader then names it in
 * its refusal); NULL for any other version. Works without a device. */
typedef const pq_cuda_plugin* (*pq_cuda_plugin_entry_fn)(uint32_t abi_version);

#ifdef __cplusplus
}
#endif

#endif
