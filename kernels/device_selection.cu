// The kernels of a decode step that stays on the device (plug-in ABI 5 on):
// the lookup tables from a query in device memory (pq_lut), the selection
// written whole into device memory (fill_selection) and the fetch that reads
// it there (gather_selected). With them, select and fetch are enqueued on
// the sequence's stream with no host round trip.
#include <cstdint>

#include "cpu_float.cuh"
#include "kernels.h"
#include "pqcache.h"

namespace pqcuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunkBytes = 16;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // the grid-stride loops take the rest

// One LUT entry per thread: (kv head, query head of its group, subspace,
// centroid). The dot product is the CPU's dot() (cpu_float.cuh) over the
// query in the codebook's dimension order: position p reads dimension
// p / 2 + (p % 2) * half under PQ_ROTARY_HALF (half = head_dim / 2; the
// host's rotary_dim_order), p otherwise.
__device__ void lut_entries(const uint8_t* query, int32_t dtype, int64_t head_stride, int32_t group,
                            const float* centroids, int32_t m, int32_t C, int32_t sd,
                            int32_t key_rotary, float* lut, int64_t entries) {
  const size_t es = dtype == PQ_DTYPE_F32 ? 4 : 2;
  const bool half_pairs = key_rotary == PQ_ROTARY_HALF;
  const int32_t half = m * sd / 2;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < entries;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = e % C;
    const int64_t j = (e / C) % m;
    const int64_t g = (e / (static_cast<int64_t>(C) * m)) % group;
    const int64_t h = e / (static_cast<int64_t>(C) * m * group);
    const uint8_t* q = query + (h * group + g) * head_stride;
    const float* y = centroids + ((h * m + j) * C + c) * sd;
    const int32_t first = static_cast<int32_t>(j) * sd;  // the subspace's first position
    lut[e] = cpu_dot(
        [&](int32_t d) {
          const int32_t p = first + d;
          const int32_t dim = half_pairs ? p / 2 + (p % 2) * half : p;
          return load_element(q + dim * es, dtype);
        },
        [&](int32_t d) { return y[d]; }, sd);
  }
}

__global__ void __launch_bounds__(kThreads)
    lut_kernel(const uint8_t* query, int32_t dtype, int64_t head_stride, int32_t group,
               const float* centroids, int32_t m, int32_t C, int32_t sd, int32_t key_rotary,
               float* lut, int64_t entries) {
  lut_entries(query, dtype, head_stride, group, centroids, m, C, sd, key_rotary, lut, entries);
}

// One item's tables per grid row (blockIdx.y).
__global__ void __launch_bounds__(kThreads)
    lut_rows_kernel(const pq_lut_row* rows, int32_t dtype, int64_t head_stride, int32_t group,
                    int32_t m, int32_t C, int32_t sd, int32_t key_rotary, int64_t entries) {
  const pq_lut_row r = rows[blockIdx.y];
  lut_entries(static_cast<const uint8_t*>(r.query), dtype, head_stride, group, r.centroids, m, C,
              sd, key_rotary, r.lut, entries);
}

__device__ void fill_positions(int32_t* positions, int32_t* counts, int32_t heads,
                               int64_t capacity, int64_t sink_end, const int32_t* middle,
                               int64_t k, int64_t mid_end, int64_t n) {
  const int64_t count = sink_end + k + (n - mid_end);
  const int64_t total = static_cast<int64_t>(heads) * count;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t h = e / count;
    const int64_t i = e % count;
    int32_t p;
    if (i < sink_end)
      p = static_cast<int32_t>(i);
    else if (i < sink_end + k)
      p = middle[h * k + (i - sink_end)];
    else
      p = static_cast<int32_t>(mid_end + (i - sink_end - k));
    positions[h * capacity + i] = p;
    if (i == 0) counts[h] = static_cast<int32_t>(count);
  }
  if (count == 0)  // no position at all: the counts still say so
    for (int64_t h = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; h < heads;
         h += static_cast<int64_t>(gridDim.x) * blockDim.x)
      counts[h] = 0;
}

__global__ void __launch_bounds__(kThreads)
    fill_selection_kernel(int32_t* positions, int32_t* counts, int32_t heads, int64_t capacity,
                          int64_t sink_end, const int32_t* middle, int64_t k, int64_t mid_end,
                          int64_t n) {
  fill_positions(positions, counts, heads, capacity, sink_end, middle, k, mid_end, n);
}

// One selection per grid row (blockIdx.y); a row that does not make a
// selection (checked on the host for the table it wrote) writes nothing.
__global__ void __launch_bounds__(kThreads)
    fill_selection_rows_kernel(const pq_fill_row* rows, int32_t heads) {
  const pq_fill_row r = rows[blockIdx.y];
  if (r.sink_end < 0 || r.k < 0 || r.mid_end < r.sink_end || r.n < r.mid_end ||
      r.sink_end + r.k + (r.n - r.mid_end) > r.capacity)
    return;
  fill_positions(r.positions, r.counts, heads, r.capacity, r.sink_end, r.middle, r.k, r.mid_end,
                 r.n);
}

// Chunk c of selection a's work: one 16-byte chunk of a (row, K or V) pair,
// over every head's capacity; rows past a head's count do nothing.
__device__ void gather_chunk(const pq_selected_gather& a, int64_t chunks_per_row, int64_t c) {
  const int64_t chunk = c % chunks_per_row;
  const int64_t pair = c / chunks_per_row;  // (head, i, K or V)
  const bool value = pair % 2 == 1;
  const int64_t slot = pair / 2;
  const int64_t h = slot / a.capacity;
  const int64_t i = slot % a.capacity;
  int64_t count = a.counts[h];
  if (count > a.capacity) count = a.capacity;
  if (i >= count) return;
  const int64_t p = a.positions[h * a.capacity + i];
  const int64_t rb = static_cast<int64_t>(a.row_bytes);
  uint8_t* dst = value ? a.out_values + i * a.values_token_stride + h * a.values_head_stride
                       : a.out_keys + i * a.keys_token_stride + h * a.keys_head_stride;
  const int64_t offset = chunk * kChunkBytes;
  const int bytes = static_cast<int>(rb - offset < kChunkBytes ? rb - offset : kChunkBytes);
  dst += offset;
  if (p < 0 || p >= a.tokens) {
    for (int b = 0; b < bytes; ++b) dst[b] = 0;
    return;
  }
  const uint8_t* src;
  int64_t w = -1;
  if (a.window != nullptr) {
    if (p < a.sink_tokens)
      w = p;
    else if (a.local_tokens > 0 && p >= a.tokens - a.local_tokens)
      w = a.sink_tokens + p % a.local_tokens;
  }
  if (w >= 0) {
    src = a.window + (w * 2 * a.heads + (value ? a.heads : 0) + h) * rb;
  } else {
    const uint8_t* const* chunks = value ? a.value_chunks : a.key_chunks;
    src = chunks[p / a.chunk_tokens] + (h * a.chunk_tokens + p % a.chunk_tokens) * rb;
  }
  src += offset;
  const uintptr_t addresses = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst);
  if (bytes == kChunkBytes && addresses % 16 == 0) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  } else {
    for (int b = 0; b < bytes; ++b) dst[b] = src[b];
  }
}

int64_t chunks_per_row(const pq_selected_gather& a) {
  return (static_cast<int64_t>(a.row_bytes) + kChunkBytes - 1) / kChunkBytes;
}

__global__ void __launch_bounds__(kThreads)
    gather_selected_kernel(pq_selected_gather a, int64_t per_row, int64_t total) {
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < total;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    gather_chunk(a, per_row, c);
}

// One selection per grid row (blockIdx.y), each with its own work.
__global__ void __launch_bounds__(kThreads)
    gather_selected_rows_kernel(const pq_selected_gather* items) {
  const pq_selected_gather a = items[blockIdx.y];
  const int64_t per_row = (static_cast<int64_t>(a.row_bytes) + kChunkBytes - 1) / kChunkBytes;
  const int64_t total = static_cast<int64_t>(a.heads) * a.capacity * 2 * per_row;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < total;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    gather_chunk(a, per_row, c);
}

unsigned blocks_for(int64_t work) {
  int64_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

}  // namespace

int pq_lut(const void* d_query, int32_t dtype, int64_t head_stride, int32_t kv_heads,
           int32_t group_size, const float* d_centroids, int32_t subspaces, int32_t centroids,
           int32_t sub_dim, float* d_lut, void* stream, char* err, size_t err_len) {
  return pq_lut_ordered(d_query, dtype, head_stride, kv_heads, group_size, d_centroids, subspaces,
                        centroids, sub_dim, PQ_ROTARY_NONE, d_lut, stream, err, err_len);
}

int pq_lut_ordered(const void* d_query, int32_t dtype, int64_t head_stride, int32_t kv_heads,
                   int32_t group_size, const float* d_centroids, int32_t subspaces,
                   int32_t centroids, int32_t sub_dim, int32_t key_rotary, float* d_lut,
                   void* stream, char* err, size_t err_len) {
  if (dtype != PQ_DTYPE_F32 && dtype != PQ_DTYPE_F16 && dtype != PQ_DTYPE_BF16)
    return set_error(err, err_len, "pq_lut: dtype is %d; expected f32, f16 or bf16", dtype);
  if (kv_heads < 1 || group_size < 1 || subspaces < 1 || centroids < 1 || centroids > 256 ||
      sub_dim < 1)
    return set_error(err, err_len,
                     "pq_lut: kv_heads %d, group_size %d, subspaces %d, centroids %d, sub_dim "
                     "%d; expected each >= 1 and centroids <= 256",
                     kv_heads, group_size, subspaces, centroids, sub_dim);
  if (head_stride < 0) return set_error(err, err_len, "pq_lut: head_stride is negative");
  if (key_rotary == PQ_ROTARY_HALF && (subspaces * sub_dim) % 2 != 0)
    return set_error(err, err_len, "pq_lut: key_rotary is PQ_ROTARY_HALF and head_dim %d is odd",
                     subspaces * sub_dim);
  if (d_query == nullptr || d_centroids == nullptr || d_lut == nullptr)
    return set_error(err, err_len, "pq_lut: d_query, d_centroids and d_lut must not be NULL");
  const int64_t entries =
      static_cast<int64_t>(kv_heads) * group_size * subspaces * static_cast<int64_t>(centroids);
  lut_kernel<<<blocks_for(entries), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint8_t*>(d_query), dtype, head_stride, group_size, d_centroids,
      subspaces, centroids, sub_dim, key_rotary, d_lut, entries);
  cudaError_t s = cudaGetLastError();
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "pq_lut: launch", s);
}

int fill_selection(int32_t* d_positions, int32_t* d_counts, int32_t heads, int64_t capacity,
                   int64_t sink_end, const int32_t* d_middle, int64_t k, int64_t mid_end,
                   int64_t n, void* stream, char* err, size_t err_len) {
  if (heads < 1 || sink_end < 0 || k < 0 || mid_end < sink_end || n < mid_end ||
      n > INT32_MAX || sink_end + k + (n - mid_end) > capacity)
    return set_error(err, err_len,
                     "fill_selection: heads %d, sinks [0, %lld), k %lld, local [%lld, %lld), "
                     "capacity %lld do not make a selection",
                     heads, static_cast<long long>(sink_end), static_cast<long long>(k),
                     static_cast<long long>(mid_end), static_cast<long long>(n),
                     static_cast<long long>(capacity));
  if (d_positions == nullptr || d_counts == nullptr || (k > 0 && d_middle == nullptr))
    return set_error(err, err_len, "fill_selection: a device array is NULL");
  const int64_t work = static_cast<int64_t>(heads) * (sink_end + k + (n - mid_end));
  fill_selection_kernel<<<blocks_for(work > heads ? work : heads), kThreads, 0,
                          static_cast<cudaStream_t>(stream)>>>(d_positions, d_counts, heads,
                                                               capacity, sink_end, d_middle, k,
                                                               mid_end, n);
  cudaError_t s = cudaGetLastError();
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "fill_selection: launch", s);
}

int gather_selected(const pq_selected_gather* args, void* stream, char* err, size_t err_len) {
  if (args == nullptr) return set_error(err, err_len, "gather_selected: args is NULL");
  const pq_selected_gather& a = *args;
  if (a.heads < 1 || a.capacity < 0 || a.chunk_tokens < 1 || a.tokens < 0 || a.row_bytes == 0 ||
      a.row_bytes > (uint64_t{1} << 30) || a.sink_tokens < 0 || a.local_tokens < 0)
    return set_error(err, err_len,
                     "gather_selected: heads %d, capacity %lld, chunk_tokens %lld, tokens %lld, "
                     "row_bytes %llu: not a selection over a store",
                     a.heads, static_cast<long long>(a.capacity),
                     static_cast<long long>(a.chunk_tokens), static_cast<long long>(a.tokens),
                     static_cast<unsigned long long>(a.row_bytes));
  if (a.capacity == 0) return 0;
  if (a.positions == nullptr || a.counts == nullptr || a.key_chunks == nullptr ||
      a.value_chunks == nullptr || a.out_keys == nullptr || a.out_values == nullptr)
    return set_error(err, err_len, "gather_selected: a pointer is NULL");
  const int64_t per_row = chunks_per_row(a);
  const int64_t total = static_cast<int64_t>(a.heads) * a.capacity * 2 * per_row;
  gather_selected_kernel<<<blocks_for(total), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      a, per_row, total);
  cudaError_t s = cudaGetLastError();
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "gather_selected: launch", s);
}

int gather_selected_rows(const pq_selected_gather* d_items, int32_t items, int64_t max_chunks,
                         void* stream, char* err, size_t err_len) {
  if (items < 0 || items > 65535)
    return set_error(err, err_len, "gather_selected_rows: items is %d; expected 0..65535", items);
  if (max_chunks < 0)
    return set_error(err, err_len, "gather_selected_rows: max_chunks is negative");
  if (items == 0 || max_chunks == 0) return 0;
  if (d_items == nullptr) return set_error(err, err_len, "gather_selected_rows: d_items is NULL");
  const dim3 grid(blocks_for(max_chunks), static_cast<unsigned>(items));
  gather_selected_rows_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(d_items);
  cudaError_t s = cudaGetLastError();
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "gather_selected_rows: launch", s);
}

int pq_lut_rows(const pq_lut_row* d_rows, int32_t rows, int32_t dtype, int64_t head_stride,
                int32_t kv_heads, int32_t group_size, int32_t subspaces, int32_t centroids,
                int32_t sub_dim, void* stream, char* err, size_t err_len) {
  return pq_lut_rows_ordered(d_rows, rows, dtype, head_stride, kv_heads, group_size, subspaces,
                             centroids, sub_dim, PQ_ROTARY_NONE, stream, err, err_len);
}

int pq_lut_rows_ordered(const pq_lut_row* d_rows, int32_t rows, int32_t dtype,
                        int64_t head_stride, int32_t kv_heads, int32_t group_size,
                        int32_t subspaces, int32_t centroids, int32_t sub_dim, int32_t key_rotary,
                        void* stream, char* err, size_t err_len) {
  if (rows < 0 || rows > 65535)
    return set_error(err, err_len, "pq_lut_rows: rows is %d; expected 0..65535", rows);
  if (dtype != PQ_DTYPE_F32 && dtype != PQ_DTYPE_F16 && dtype != PQ_DTYPE_BF16)
    return set_error(err, err_len, "pq_lut_rows: dtype is %d; expected f32, f16 or bf16", dtype);
  if (kv_heads < 1 || group_size < 1 || subspaces < 1 || centroids < 1 || centroids > 256 ||
      sub_dim < 1 || head_stride < 0)
    return set_error(err, err_len, "pq_lut_rows: kv_heads %d, group_size %d, subspaces %d, "
                     "centroids %d, sub_dim %d: expected each >= 1, centroids <= 256",
                     kv_heads, group_size, subspaces, centroids, sub_dim);
  if (key_rotary == PQ_ROTARY_HALF && (subspaces * sub_dim) % 2 != 0)
    return set_error(err, err_len,
                     "pq_lut_rows: key_rotary is PQ_ROTARY_HALF and head_dim %d is odd",
                     subspaces * sub_dim);
  if (rows == 0) return 0;
  if (d_rows == nullptr) return set_error(err, err_len, "pq_lut_rows: d_rows is NULL");
  const int64_t entries =
      static_cast<int64_t>(kv_heads) * group_size * subspaces * static_cast<int64_t>(centroids);
  const dim3 grid(blocks_for(entries), static_cast<unsigned>(rows));
  lut_rows_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      d_rows, dtype, head_stride, group_size, subspaces, centroids, sub_dim, key_rotary, entries);
  cudaError_t s = cudaGetLastError();
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "pq_lut_rows: launch", s);
}

int fill_selection_rows(const pq_fill_row* d_rows, int32_t rows, int32_t heads, int64_t max_count,
                        void* stream, char* err, size_t err_len) {
  if (rows < 0 || rows > 65535 || heads < 1 || max_count < 0)
    return set_error(err, err_len, "fill_selection_rows: rows %d, heads %d, max_count %lld: "
                     "expected rows 0..65535, heads >= 1, max_count >= 0", rows, heads,
                     static_cast<long long>(max_count));
  if (rows == 0) return 0;
  if (d_rows == nullptr) return set_error(err, err_len, "fill_selection_rows: d_rows is NULL");
  const int64_t work = static_cast<int64_t>(heads) * max_count;
  const dim3 grid(blocks_for(work > heads ? work : heads), static_cast<unsigned>(rows));
  fill_selection_rows_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(d_rows,
                                                                                       heads);
  cudaError_t s = cudaGetLastError();
  return s == cudaSuccess ? 0 : cuda_fail(err, err_len, "fill_selection_rows: launch", s);
}

}  // namespace pqcuda
