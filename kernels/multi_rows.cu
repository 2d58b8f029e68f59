// The rows of a multi-token select on the device (pq_decode_select_multi_
// device; plug-in ABI 8): the per-token selections, made by the device step
// into scratch, written as the caller's rows, padded with -1.
//
//   PER_TOKEN    one launch: each row copied, then padded.
//   PER_HEAD,    three launches over a bitmap of the sequence's n positions
//   PER_REQUEST  per output row (the workspace): cleared, every selected
//                position's bit set (atomicOr), then one block per output
//                row turns its bitmap into ascending positions (a block
//                scan of the words' popcounts, tile by tile) and pads.
// A union is so sorted and unique whatever the order of the inputs, and
// the result does not depend on the schedule: the host's sort + unique.
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "backend/cuda/cuda_plugin_abi.h"
#include "kernels.h"
#include "pqcache.h"

namespace pqcuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;  // grid-stride loops take the rest

__host__ __device__ int64_t words_of(int64_t n) { return (n + 31) / 32; }

int32_t out_rows_of(int32_t form, int32_t tokens, int32_t kv_heads) {
  return form == PQ_ROWS_PER_TOKEN ? tokens * kv_heads : form == PQ_ROWS_PER_HEAD ? kv_heads : 1;
}

unsigned blocks_for(int64_t work) {
  const int64_t b = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : b > kMaxBlocks ? kMaxBlocks : b);
}

__device__ int64_t clamped_count(const int32_t* counts, int64_t row, int64_t capacity) {
  const int64_t c = counts[row];
  return c < 0 ? 0 : c > capacity ? capacity : c;
}

// PER_TOKEN: row r of the output is input row r, padded.
__global__ void __launch_bounds__(kThreads)
    copy_rows_kernel(const int32_t* in, const int32_t* in_counts, int64_t in_capacity,
                     int64_t rows, int32_t* out, int32_t* out_counts, int64_t out_capacity) {
  const int64_t total = rows * out_capacity;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / out_capacity, i = e % out_capacity;
    int64_t count = clamped_count(in_counts, r, in_capacity);
    if (count > out_capacity) count = out_capacity;
    out[e] = i < count ? in[r * in_capacity + i] : -1;
    if (i == 0) out_counts[r] = static_cast<int32_t>(count);
  }
  if (out_capacity == 0)  // no entry: the counts still say so
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
         r += static_cast<int64_t>(gridDim.x) * blockDim.x)
      out_counts[r] = 0;
}

__global__ void __launch_bounds__(kThreads) clear_kernel(uint32_t* bits, int64_t words) {
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < words;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x)
    bits[w] = 0;
}

// Every valid position of every input row sets its bit in its output row's
// bitmap (PER_HEAD: row r's kv head r % kv_heads; PER_REQUEST: the one).
__global__ void __launch_bounds__(kThreads)
    mark_kernel(const int32_t* in, const int32_t* in_counts, int64_t in_capacity, int64_t rows,
                int32_t kv_heads, int32_t form, int64_t n, uint32_t* bits) {
  const int64_t words = words_of(n);
  const int64_t total = rows * in_capacity;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / in_capacity, i = e % in_capacity;
    if (i >= clamped_count(in_counts, r, in_capacity)) continue;
    const int64_t p = in[e];
    if (p < 0 || p >= n) continue;
    const int64_t o = form == PQ_ROWS_PER_HEAD ? r % kv_heads : 0;
    atomicOr(bits + o * words + p / 32, 1u << static_cast<unsigned>(p % 32));
  }
}

// One block per output row: the set bits in ascending order, tile by tile
// (a thread a word; the block's exclusive scan of the popcounts places
// them), at most out_capacity of them; then -1 to the end and the count.
__global__ void __launch_bounds__(kThreads)
    compact_kernel(const uint32_t* bits, int64_t n, int32_t* out, int32_t* out_counts,
                   int64_t out_capacity) {
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int64_t written;
  const int64_t words = words_of(n);
  const uint32_t* row_bits = bits + static_cast<int64_t>(blockIdx.x) * words;
  int32_t* row = out + static_cast<int64_t>(blockIdx.x) * out_capacity;
  if (threadIdx.x == 0) written = 0;
  __syncthreads();
  for (int64_t base = 0; base < words; base += kThreads) {
    const int64_t w = base + threadIdx.x;
    const uint32_t word = w < words ? row_bits[w] : 0u;
    int32_t at = 0, tile = 0;
    Scan(scan).ExclusiveSum(__popc(word), at, tile);
    const int64_t first = written;
    uint32_t rest = word;
    for (int64_t j = first + at; rest != 0u; ++j) {
      const int bit = __ffs(rest) - 1;
      rest &= rest - 1u;
      if (j < out_capacity) row[j] = static_cast<int32_t>(w * 32 + bit);
    }
    __syncthreads();  // every thread read `written` and the scan's storage
    if (threadIdx.x == 0) written = first + tile;
    __syncthreads();
  }
  const int64_t count = written < out_capacity ? written : out_capacity;
  for (int64_t i = count + threadIdx.x; i < out_capacity; i += kThreads) row[i] = -1;
  if (threadIdx.x == 0) out_counts[blockIdx.x] = static_cast<int32_t>(count);
}

}  // namespace

size_t multi_rows_workspace_size(int32_t form, int32_t kv_heads, int64_t n) {
  if (form == PQ_ROWS_PER_TOKEN || kv_heads < 1 || n <= 0) return 0;
  const int64_t rows = form == PQ_ROWS_PER_HEAD ? kv_heads : 1;
  return static_cast<size_t>(rows) * static_cast<size_t>(words_of(n)) * sizeof(uint32_t);
}

int multi_rows(const int32_t* d_in, const int32_t* d_in_counts, int64_t in_capacity,
               int32_t tokens, int32_t kv_heads, int32_t form, int64_t n, int32_t* d_out,
               int32_t* d_out_counts, int64_t out_capacity, void* d_workspace,
               size_t workspace_bytes, void* stream, char* err, size_t err_len) {
  if (tokens < 1 || kv_heads < 1 || in_capacity < 0 || out_capacity < 0 || n < 0 ||
      n > INT32_MAX || (form != PQ_ROWS_PER_TOKEN && form != PQ_ROWS_PER_HEAD &&
                        form != PQ_ROWS_PER_REQUEST) ||
      static_cast<int64_t>(tokens) * kv_heads > INT32_MAX)
    return set_error(err, err_len,
                     "multi_rows: bad shape (tokens %d, kv_heads %d, form %d, n %lld, "
                     "capacities %lld and %lld)",
                     tokens, kv_heads, form, static_cast<long long>(n),
                     static_cast<long long>(in_capacity), static_cast<long long>(out_capacity));
  const size_t need = multi_rows_workspace_size(form, kv_heads, n);
  if (need > 0 && (d_workspace == nullptr || workspace_bytes < need))
    return set_error(err, err_len, "multi_rows: the workspace is %zu bytes; %zu needed",
                     workspace_bytes, need);
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t in_rows = static_cast<int64_t>(tokens) * kv_heads;
  const int32_t out_rows = out_rows_of(form, tokens, kv_heads);
  if (form == PQ_ROWS_PER_TOKEN) {
    copy_rows_kernel<<<blocks_for(in_rows * (out_capacity > 0 ? out_capacity : 1)), kThreads, 0,
                       s>>>(d_in, d_in_counts, in_capacity, in_rows, d_out, d_out_counts,
                            out_capacity);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : cuda_fail(err, err_len, "multi_rows (copy) launch", e);
  }
  auto* bits = static_cast<uint32_t*>(d_workspace);
  const int64_t words = static_cast<int64_t>(out_rows) * words_of(n);
  if (words > 0) clear_kernel<<<blocks_for(words), kThreads, 0, s>>>(bits, words);
  if (words > 0 && in_capacity > 0)
    mark_kernel<<<blocks_for(in_rows * in_capacity), kThreads, 0, s>>>(
        d_in, d_in_counts, in_capacity, in_rows, kv_heads, form, n, bits);
  compact_kernel<<<static_cast<unsigned>(out_rows), kThreads, 0, s>>>(bits, n, d_out,
                                                                      d_out_counts, out_capacity);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : cuda_fail(err, err_len, "multi_rows (union) launch", e);
}

}  // namespace pqcuda
