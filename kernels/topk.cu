// Top-k per row on the GPU with the CPU's exact semantics (select_top_k in
// src/base/topk.cpp): the k highest scores, ties to the larger position, output
// positions ascending. Rows of up to INT32_MAX tokens (1M in practice), any k.
//
// An MSD radix select over the order-preserving 32-bit key of each score
// (ordered_key, -0 folded into +0), one byte per pass, then a compaction:
//
//   memset  the per-row histograms [rows][4][256] (workspace)
//   hist(p) for p = 0..3, grid (chunks of 4096, rows), 256 threads: a block
//           first derives the threshold prefix of passes 0..p-1 from the
//           global histograms (a 256-wide block scan per pass, identical in
//           every block), then histograms digit p of the keys that match that
//           prefix in shared memory and adds its non-zero bins to the global
//           histogram of the row with atomics.
//   count   derives the full threshold key T (the k-th largest key), the
//           number `need` of keys equal to T to take and how many equal T in
//           the row; per chunk counts the keys > T and == T.
//   write   every block adds up the counts of the chunks before it (so no
//           separate scan launch), then walks its chunk in 16 rounds of 256
//           with a block scan of (greater, equal) flags: a key > T is taken;
//           a key == T is taken when its rank among the equal keys (in
//           position order) is >= equal_total - need, i.e. the larger
//           positions win. Output slot = taken keys before it, so the
//           positions come out ascending with no sort.
//
// The rescans re-read the row (4 bytes per token per pass, L2-resident at
// 128K x 8 rows) instead of materialising candidate lists; at 1M-token rows
// an AIR-style candidate buffer after pass 0 would save most of passes 1-3.
//
// CUB: cub::BlockScan (the bucket search and the compaction offsets) and
// cub::BlockReduce (chunk counts) are the block-level primitives. The
// device-level ones do not fit: CUDA 13.0's CCCL has no DeviceTopK, and
// DeviceSelect::Flagged works on one sequence per call and could not express
// the tie rank without another pass; the chunk-offset scheme handles all rows
// in one launch per step. Nothing synchronises the device or the host.
#include <cstdio>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "backend/cuda/cuda_plugin_abi.h"
#include "kernels.h"

namespace pqcuda {

namespace {

constexpr int kThreads = 256;
constexpr int kItems = 16;
constexpr int kTile = kThreads * kItems;  // elements per block (chunk)
constexpr int kBins = 256;
constexpr int kPasses = 4;
static_assert(kThreads == kBins, "the bucket search gives one bin to each thread");

using Scan = cub::BlockScan<uint32_t, kThreads>;
using Reduce32 = cub::BlockReduce<uint32_t, kThreads>;
using Reduce64 = cub::BlockReduce<unsigned long long, kThreads>;

union TempStorage {
  typename Scan::TempStorage scan;
  typename Reduce32::TempStorage r32;
  typename Reduce64::TempStorage r64;
};

// src/base/topk.cpp's ordered_key: unsigned order of the key = float order.
__device__ __forceinline__ uint32_t ordered_key(float f) {
  f = __fadd_rn(f, 0.0f);  // -0 becomes +0: equal scores share a bucket
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The rows of a launch: a table (topk_rows: each row its own scores, n, k,
// first and output), or, when null, `rows` uniform rows (topk: row r at
// scores + r * n, out + r * k).
struct Rows {
  const pq_topk_row* table;
  const float* scores;
  int32_t* out;
  int64_t n, k, first;
};

__device__ __forceinline__ pq_topk_row row_of(const Rows& r, int row) {
  if (r.table != nullptr) return r.table[row];
  pq_topk_row x;
  x.scores = r.scores + static_cast<size_t>(row) * r.n;
  x.out = r.out + static_cast<size_t>(row) * r.k;
  x.n = r.n;
  x.k = r.k;
  x.first = r.first;
  return x;
}

// Whether block (chunk) of row R takes part in the select passes: rows with
// k == 0 or n == 0 write nothing, rows with k >= n are written whole by the
// write kernel, and chunks past a shorter row's end have nothing to do.
// Block-uniform, so a block may return on it before any barrier.
__device__ __forceinline__ bool selects(const pq_topk_row& R, int64_t base) {
  return R.k > 0 && R.n > 0 && R.k < R.n && base < R.n;
}

// Mask of the top `digits` bytes of a key (digits in 0..4).
__device__ __forceinline__ uint32_t high_mask(int digits) {
  return digits == 0 ? 0u : ~0u << (32 - 8 * digits);
}

struct Threshold {
  uint32_t prefix;        // the digits of the k-th largest key found so far
  uint32_t need;          // how many keys with this prefix still have to be taken
  uint32_t bucket_count;  // how many keys of the row share the prefix
};

// Replays the bucket search of passes 0..passes-1 from the row's global
// histograms. Block-wide (every thread returns the same value); every block
// of the row computes the same result, so no launch is needed to publish it.
__device__ Threshold derive(const uint32_t* hist_row, int passes, uint32_t k, TempStorage& tmp,
                            uint32_t* shared3) {
  Threshold th{0u, k, 0u};
  for (int p = 0; p < passes; ++p) {
    // Thread t holds bin 255 - t, so the inclusive scan is the count at or
    // above the bin; exactly one bin has above < need <= above + count.
    const uint32_t bin = kBins - 1 - threadIdx.x;
    const uint32_t c = hist_row[p * kBins + bin];
    uint32_t at_or_above;
    Scan(tmp.scan).InclusiveSum(c, at_or_above);
    const uint32_t above = at_or_above - c;
    if (above < th.need && th.need <= at_or_above) {
      shared3[0] = bin;
      shared3[1] = above;
      shared3[2] = c;
    }
    __syncthreads();
    th.prefix |= shared3[0] << (24 - 8 * p);
    th.need -= shared3[1];
    th.bucket_count = shared3[2];
    __syncthreads();  // shared3 and tmp are reused
  }
  return th;
}

__global__ void __launch_bounds__(kThreads)
    topk_hist_kernel(Rows rows, uint32_t* __restrict__ hist, int pass) {
  __shared__ TempStorage tmp;
  __shared__ uint32_t shared3[3];
  __shared__ uint32_t bins[kBins];
  const int row = blockIdx.y;
  const pq_topk_row R = row_of(rows, row);
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kTile;
  if (!selects(R, base)) return;
  const float* __restrict__ s = R.scores;
  const int64_t n = R.n;
  uint32_t* hist_row = hist + static_cast<size_t>(row) * kPasses * kBins;
  const Threshold th = derive(hist_row, pass, static_cast<uint32_t>(R.k), tmp, shared3);
  bins[threadIdx.x] = 0u;
  // All loads first (independent, in flight together), then the atomics.
  float v[kItems];
#pragma unroll
  for (int r = 0; r < kItems; ++r) {
    const int64_t i = base + r * kThreads + threadIdx.x;
    v[r] = i < n ? s[i] : 0.f;
  }
  __syncthreads();
  const uint32_t mask = high_mask(pass);
  const int shift = 24 - 8 * pass;
#pragma unroll
  for (int r = 0; r < kItems; ++r) {
    const int64_t i = base + r * kThreads + threadIdx.x;
    const uint32_t key = ordered_key(v[r]);
    if (i < n && ((key ^ th.prefix) & mask) == 0u) atomicAdd(&bins[(key >> shift) & 0xffu], 1u);
  }
  __syncthreads();
  const uint32_t c = bins[threadIdx.x];
  if (c != 0u) atomicAdd(&hist_row[pass * kBins + threadIdx.x], c);
}

__global__ void __launch_bounds__(kThreads)
    topk_count_kernel(Rows rows, const uint32_t* __restrict__ hist, uint2* __restrict__ counts) {
  __shared__ TempStorage tmp;
  __shared__ uint32_t shared3[3];
  const int row = blockIdx.y;
  const pq_topk_row R = row_of(rows, row);
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kTile;
  if (!selects(R, base)) return;
  const float* __restrict__ s = R.scores;
  const int64_t n = R.n;
  const Threshold th = derive(hist + static_cast<size_t>(row) * kPasses * kBins, kPasses,
                              static_cast<uint32_t>(R.k), tmp, shared3);
  uint32_t greater = 0, equal = 0;
#pragma unroll
  for (int r = 0; r < kItems; ++r) {
    const int64_t i = base + r * kThreads + threadIdx.x;
    if (i < n) {
      const uint32_t key = ordered_key(s[i]);
      greater += key > th.prefix;
      equal += key == th.prefix;
    }
  }
  // Both counts are <= kTile < 2^16: one packed reduction.
  const uint32_t total = Reduce32(tmp.r32).Sum(greater | (equal << 16));
  if (threadIdx.x == 0)
    counts[static_cast<size_t>(row) * gridDim.x + blockIdx.x] = make_uint2(total & 0xffffu, total >> 16);
}

__global__ void __launch_bounds__(kThreads)
    topk_write_kernel(Rows rows, const uint32_t* __restrict__ hist,
                      const uint2* __restrict__ counts) {
  __shared__ TempStorage tmp;
  __shared__ uint32_t shared3[3];
  __shared__ unsigned long long before_shared;
  const int row = blockIdx.y;
  const pq_topk_row R = row_of(rows, row);
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t n = R.n;
  const int64_t first = R.first;
  int32_t* __restrict__ out_row = R.out;
  if (R.k > 0 && n > 0 && R.k >= n && base < n) {  // k >= n: every position (topk_rows only)
    for (int r = 0; r < kItems; ++r) {
      const int64_t i = base + r * kThreads + threadIdx.x;
      if (i < n) out_row[i] = static_cast<int32_t>(first + i);
    }
    return;
  }
  if (!selects(R, base)) return;
  const float* __restrict__ s = R.scores;
  const uint32_t k = static_cast<uint32_t>(R.k);
  const Threshold th = derive(hist + static_cast<size_t>(row) * kPasses * kBins, kPasses, k, tmp,
                              shared3);
  // Equal keys with rank >= skip (in position order) are taken: the last `need`.
  const uint32_t skip = th.bucket_count - th.need;

  // Keys > T and == T in the chunks before this one (each count < 2^32).
  unsigned long long mine = 0;
  const uint2* row_counts = counts + static_cast<size_t>(row) * gridDim.x;
  for (unsigned c = threadIdx.x; c < blockIdx.x; c += kThreads)
    mine += row_counts[c].x | (static_cast<unsigned long long>(row_counts[c].y) << 32);
  const unsigned long long before = Reduce64(tmp.r64).Sum(mine);
  if (threadIdx.x == 0) before_shared = before;
  __syncthreads();
  uint32_t run_greater = static_cast<uint32_t>(before_shared & 0xffffffffu);
  uint32_t run_equal = static_cast<uint32_t>(before_shared >> 32);

  float v[kItems];
#pragma unroll
  for (int r = 0; r < kItems; ++r) {
    const int64_t i = base + r * kThreads + threadIdx.x;
    v[r] = i < n ? s[i] : 0.f;
  }
#pragma unroll
  for (int r = 0; r < kItems; ++r) {
    // Round r covers positions base + r*256 .. +255 in thread order, so a
    // block scan per round keeps the position order across the whole chunk.
    const int64_t i = base + r * kThreads + threadIdx.x;
    const uint32_t key = ordered_key(v[r]);
    const bool greater = i < n && key > th.prefix;
    const bool equal = i < n && key == th.prefix;
    uint32_t before_me, round_total;  // packed: greater in bits 0-15, equal in 16-31
    Scan(tmp.scan).ExclusiveSum(static_cast<uint32_t>(greater) | (static_cast<uint32_t>(equal) << 16),
                                before_me, round_total);
    const uint32_t equal_rank = run_equal + (before_me >> 16);
    const uint32_t greater_before = run_greater + (before_me & 0xffffu);
    if (greater || (equal && equal_rank >= skip)) {
      const uint32_t slot = greater_before + (equal_rank > skip ? equal_rank - skip : 0u);
      out_row[slot] = static_cast<int32_t>(first + i);
    }
    run_greater += round_total & 0xffffu;
    run_equal += round_total >> 16;
    __syncthreads();  // tmp is reused by the next round's scan
  }
}

// k >= n: every position, ascending (select_top_k's shortcut).
__global__ void topk_all_kernel(int64_t n, int64_t k, int64_t first, int32_t* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[static_cast<size_t>(blockIdx.y) * k + i] = static_cast<int32_t>(first + i);
}

size_t align_up(size_t x) { return (x + 255) & ~static_cast<size_t>(255); }

int64_t chunks_of(int64_t n) { return (n + kTile - 1) / kTile; }

// The histograms, then the per-chunk counts, for `rows` rows of up to n keys.
size_t select_workspace_size(int32_t rows, int64_t n) {
  return align_up(sizeof(uint32_t) * static_cast<size_t>(rows) * kPasses * kBins) +
         sizeof(uint2) * static_cast<size_t>(rows) * static_cast<size_t>(chunks_of(n));
}

// The select passes over `rows` rows of up to n keys: one memset and six
// launches whatever the rows.
int run_select(const Rows& r, int32_t rows, int64_t n, void* d_workspace, cudaStream_t s,
               const char* fn, char* err, size_t err_len) {
  uint32_t* hist = static_cast<uint32_t*>(d_workspace);
  const size_t hist_bytes = sizeof(uint32_t) * static_cast<size_t>(rows) * kPasses * kBins;
  uint2* counts = reinterpret_cast<uint2*>(static_cast<char*>(d_workspace) + align_up(hist_bytes));
  const dim3 grid(static_cast<unsigned>(chunks_of(n)), static_cast<unsigned>(rows));
  char what[64];
  cudaError_t e = cudaMemsetAsync(hist, 0, hist_bytes, s);
  if (e != cudaSuccess) {
    std::snprintf(what, sizeof what, "%s: cudaMemsetAsync of the histograms", fn);
    return cuda_fail(err, err_len, what, e);
  }
  for (int pass = 0; pass < kPasses; ++pass) {
    topk_hist_kernel<<<grid, kThreads, 0, s>>>(r, hist, pass);
    if ((e = cudaGetLastError()) != cudaSuccess) {
      std::snprintf(what, sizeof what, "%s: histogram kernel", fn);
      return cuda_fail(err, err_len, what, e);
    }
  }
  topk_count_kernel<<<grid, kThreads, 0, s>>>(r, hist, counts);
  if ((e = cudaGetLastError()) != cudaSuccess) {
    std::snprintf(what, sizeof what, "%s: count kernel", fn);
    return cuda_fail(err, err_len, what, e);
  }
  topk_write_kernel<<<grid, kThreads, 0, s>>>(r, hist, counts);
  if ((e = cudaGetLastError()) != cudaSuccess) {
    std::snprintf(what, sizeof what, "%s: write kernel", fn);
    return cuda_fail(err, err_len, what, e);
  }
  return 0;
}

}  // namespace

size_t topk_workspace_size(int32_t rows, int64_t n, int64_t k) {
  if (rows <= 0 || n <= 0 || k <= 0 || k >= n) return 0;
  return select_workspace_size(rows, n);
}

int topk(const float* d_scores, int32_t rows, int64_t n, int64_t k, int64_t first, int32_t* d_out,
         void* d_workspace, size_t workspace_bytes, void* stream, char* err, size_t err_len) {
  if (rows < 0 || rows > 65535)
    return set_error(err, err_len, "topk: rows is %d; expected 0..65535", rows);
  if (n < 0 || n > INT32_MAX)
    return set_error(err, err_len, "topk: n is %lld; expected 0..INT32_MAX",
                     static_cast<long long>(n));
  if (k < 0) return set_error(err, err_len, "topk: k is %lld; expected >= 0", static_cast<long long>(k));
  if (n > 0 && (first < INT32_MIN || first > static_cast<int64_t>(INT32_MAX) - (n - 1)))
    return set_error(err, err_len, "topk: positions first = %lld .. first + n - 1 do not fit in int32",
                     static_cast<long long>(first));
  if (rows == 0 || n == 0 || k == 0) return 0;
  if (d_scores == nullptr || d_out == nullptr)
    return set_error(err, err_len, "topk: d_scores and d_out must not be NULL");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (k >= n) {
    const dim3 grid(static_cast<unsigned>((n + 255) / 256), static_cast<unsigned>(rows));
    topk_all_kernel<<<grid, 256, 0, s>>>(n, k, first, d_out);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : cuda_fail(err, err_len, "topk: k >= n fill kernel", e);
  }
  const size_t need = topk_workspace_size(rows, n, k);
  if (d_workspace == nullptr || workspace_bytes < need)
    return set_error(err, err_len, "topk: workspace of %zu bytes at %p; needs %zu", workspace_bytes,
                     d_workspace, need);
  const Rows r{nullptr, d_scores, d_out, n, k, first};
  return run_select(r, rows, n, d_workspace, s, "topk", err, err_len);
}

size_t topk_rows_workspace_size(int32_t rows, int64_t max_n) {
  if (rows <= 0 || max_n <= 0) return 0;
  return select_workspace_size(rows, max_n);
}

int topk_rows(const pq_topk_row* d_rows, int32_t rows, int64_t max_n, void* d_workspace,
              size_t workspace_bytes, void* stream, char* err, size_t err_len) {
  if (rows < 0 || rows > 65535)
    return set_error(err, err_len, "topk_rows: rows is %d; expected 0..65535", rows);
  if (max_n < 0 || max_n > INT32_MAX)
    return set_error(err, err_len, "topk_rows: max_n is %lld; expected 0..INT32_MAX",
                     static_cast<long long>(max_n));
  if (rows == 0 || max_n == 0) return 0;
  if (d_rows == nullptr) return set_error(err, err_len, "topk_rows: d_rows is NULL");
  const size_t need = topk_rows_workspace_size(rows, max_n);
  if (d_workspace == nullptr || workspace_bytes < need)
    return set_error(err, err_len, "topk_rows: workspace of %zu bytes at %p; needs %zu",
                     workspace_bytes, d_workspace, need);
  const Rows r{d_rows, nullptr, nullptr, 0, 0, 0};
  return run_select(r, rows, max_n, d_workspace, static_cast<cudaStream_t>(stream), "topk_rows",
                    err, err_len);
}

}  // namespace pqcuda
