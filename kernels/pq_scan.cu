// PQ scoring on the GPU (paper section 3.4): for every kv head of a layer,
// the raw score of query head g for token t is sum_j LUT[g][j][code[t][j]],
// and the group's raw scores are combined into one score per token exactly
// as the CPU's combine_group_scores (src/base/topk.cpp) does.
//
// Layout of the work: grid (blocks_per_head, rows), 256 threads; a row is
// one kv head of one sequence (pq_scan: the kv heads of one layer, laid out
// uniformly; pq_scan_rows: a table of rows, e.g. every sequence of a batch,
// each with its own LUT, codes and token range). A block
// copies the LUT of its row into shared memory once, then walks "slots"
// of 16 bytes of codes (16/m tokens; m = 2 gives 8 tokens per uint4 load)
// with a grid-stride loop, so the LUT copy is amortised over several slots
// per thread. Slots are aligned to 16 bytes of the codes array, so the first
// and last slot of a head may be partial: those are read byte by byte, and
// only tokens inside [begin, end) are ever read or written.
//
// MAX and MEAN need one pass (the group folds in registers). SUM_SOFTMAX
// needs, per (kv head, query head), the max and the sum of exp over the
// middle tokens before the final pass, so it runs three launches of the same
// kernel: (1) per-block max -> workspace, (2) every block reduces the
// per-block maxima of its head, then per-block sums of exp -> workspace,
// (3) every block reduces maxima and sums, then writes the combined score.
// Recomputing the raw scores from the codes (m bytes per token, L2-resident)
// is cheaper than storing them (4 bytes per token and query head), and the
// partial reductions are in a fixed order, so results are deterministic.
//
// Floating point: the operations, their order and their rounding follow the
// CPU code one for one (__fadd_rn / __fmul_rn keep nvcc from contracting
// into FMAs, which the CPU build never uses), so MAX and MEAN are
// bit-identical to the CPU; SUM_SOFTMAX differs only in the order of the
// sum of exp (a block tree here, eight lanes there).
#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cuda/cuda_plugin_abi.h"
#include "kernels.h"
#include "pqcache.h"

namespace pqcuda {

namespace {

constexpr int kThreads = 256;
// Slots per thread that one block covers on average: 4 x 16 bytes of codes
// per thread (8 KB per block at m = 2) against one LUT copy of the head.
constexpr int kSlotsPerThread = 4;
// LUT floats kept in shared memory (32 KB). A group whose LUT is larger is
// processed in chunks of query heads; one head larger than this (m * 2^b >
// 8192, i.e. more than 32 subspaces at 8 bits) reads the LUT from global
// memory through the caches instead.
constexpr int kLutBudget = 8192;
constexpr int kMaxGroup = 1024;

enum Stage : int { kStageFinal = 0, kStageMax = 1, kStageSum = 2 };
enum Mode : int { kModeMax = 0, kModeMean = 1, kModeSoftmax = 2 };

// The CPU's exp_nonpositive (src/base/topk.cpp), operation for operation, so that
// the softmax numerators are the same floats on both sides.
__device__ __forceinline__ float exp_nonpositive(float x) {
  int32_t magnitude = __float_as_int(x) & 0x7fffffff;
  magnitude = magnitude < 0x42ae0000 ? magnitude : 0x42ae0000;  // |x| <= 87
  x = __int_as_float(magnitude | static_cast<int32_t>(0x80000000u));
  const float log2e = 1.44269504088896341f;
  const float shifter = 12582912.0f;
  float n = __fsub_rn(__fadd_rn(__fmul_rn(x, log2e), shifter), shifter);
  float r = __fsub_rn(x, __fmul_rn(n, 0.693359375f));
  r = __fsub_rn(r, __fmul_rn(n, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = __fadd_rn(__fmul_rn(p, r), 1.3981999507e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 8.3334519073e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 4.1665795894e-2f);
  p = __fadd_rn(__fmul_rn(p, r), 1.6666665459e-1f);
  p = __fadd_rn(__fmul_rn(p, r), 5.0000001201e-1f);
  p = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(p, r), r), r), 1.0f);
  float scale = __int_as_float((static_cast<int32_t>(n) + 127) << 23);
  return __fmul_rn(p, scale);
}

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct ScanParams {
  // Rows from a table (pq_scan_rows), or, when null, uniform rows (pq_scan):
  // row r is kv head r of lut [kv][group][m][C], codes [kv][stride][m] and
  // out [kv][n].
  const pq_scan_row* rows;
  const float* lut;
  const uint8_t* codes;
  float* out;
  float* part_max;       // [row][group][bph] per-block max of raw (softmax only)
  float* part_sum;       // [row][group][bph] per-block sum of exp (softmax only)
  int64_t stride, begin, n;
  int32_t group, m, C;
  int32_t heads_per_chunk;  // query heads whose LUT is in shared memory at once
  int32_t chunks;           // ceil(group / heads_per_chunk)
  int32_t smem_lut;         // 0: read the LUT from global memory
  int32_t lut_floats;       // shared floats reserved for the LUT
  int32_t mode;             // Mode
  float scale;              // logit scale
  float mean_scale;         // scale / group, computed on the host as the CPU does
};

// Slots are 16 bytes of codes when m divides 16 (M = m, a compile-time
// constant); any other m (M = 0) uses one token per slot with byte loads.
__host__ __device__ constexpr int tokens_per_slot(int M) { return M > 0 ? 16 / M : 1; }

__host__ __device__ int vector_width(int32_t m) {
  return (m == 1 || m == 2 || m == 4 || m == 8 || m == 16) ? m : 0;
}

// Blocks per row for n tokens. A row of a table (pq_scan_rows) gets exactly
// the blocks a single row of its n gets (the grid's extra blocks return), so
// its partial sums, and with them its SUM_SOFTMAX scores, are bit for bit
// those of the same row scored alone.
__host__ __device__ int32_t blocks_per_head(int32_t m, int64_t n) {
  const int M = vector_width(m);
  const int64_t per_block = static_cast<int64_t>(kThreads) * kSlotsPerThread * tokens_per_slot(M);
  const int64_t b = (n + 16 + per_block - 1) / per_block;  // +16: a partial slot at each end
  return static_cast<int32_t>(b < 1 ? 1 : b);
}

template <int M>
__global__ void __launch_bounds__(kThreads) pq_scan_kernel(ScanParams p, int stage) {
  constexpr int TPT = tokens_per_slot(M);
  constexpr int kPad = TPT > 1 ? TPT + 1 : 1;  // odd row pitch: no bank conflicts on the transpose
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage reduce_tmp;
  extern __shared__ float smem[];
  float* lut_s = smem;                             // [heads_per_chunk][m][C]
  float* outbuf = smem + p.lut_floats;             // [kThreads][kPad]
  float* stat_max = outbuf + kThreads * kPad;      // [group] max logit per query head
  float* stat_inv = stat_max + p.group;            // [group] 1 / sum of exp per query head

  const int tid = threadIdx.x;
  const int m = M > 0 ? M : p.m;
  const int C = p.C;
  const uint32_t code_mask = static_cast<uint32_t>(C - 1);  // C is a power of two
  const int mC = m * C;
  const int kv = blockIdx.y;  // the row
  const int stride = gridDim.x;  // of the partial arrays: blocks of the longest row
  // The row: its LUT, the codes its token indices count from, its first and
  // end token (T0, T1) and its scores.
  const float* lut_head;
  const uint8_t* codes;
  float* out_row;
  int64_t T0, T1;
  if (p.rows != nullptr) {
    const pq_scan_row r = p.rows[kv];
    lut_head = r.lut;
    codes = r.codes;
    out_row = r.scores;
    T0 = r.begin;
    T1 = r.end > r.begin ? r.end : r.begin;
  } else {
    lut_head = p.lut + static_cast<size_t>(kv) * p.group * mC;
    codes = p.codes;
    out_row = p.out + static_cast<size_t>(kv) * p.n;
    T0 = static_cast<int64_t>(kv) * p.stride + p.begin;
    T1 = T0 + p.n;
  }
  const int64_t n = T1 - T0;
  const int bph = p.rows != nullptr ? blocks_per_head(m, n) : stride;
  if (static_cast<int>(blockIdx.x) >= bph) return;  // a shorter row's spare block
  // uint4 loads need 16-byte aligned codes (slot boundaries are multiples of
  // 16 bytes from `codes`); otherwise every slot takes the byte path.
  const bool aligned = reinterpret_cast<uintptr_t>(codes) % 16 == 0;
  const int64_t A = T0 - T0 % TPT;  // the 16-byte aligned slot boundary at or before T0
  const int64_t slots = (T1 - A + TPT - 1) / TPT;
  const int64_t per_iter = static_cast<int64_t>(bph) * kThreads;
  const int64_t iters = (slots + per_iter - 1) / per_iter;  // uniform over the block

  auto load_chunk = [&](int ch) {
    const int g0 = ch * p.heads_per_chunk;
    const int heads = min(p.heads_per_chunk, p.group - g0);
    const float* src = lut_head + static_cast<size_t>(g0) * mC;
    for (int i = tid; i < heads * mC; i += kThreads) lut_s[i] = src[i];
  };
  auto lut_of = [&](int g, int g0) -> const float* {
    return p.smem_lut ? lut_s + (g - g0) * mC : lut_head + static_cast<size_t>(g) * mC;
  };

  // The 16 code bytes of a slot as four words (vector path). Tokens outside
  // [T0, T1) read as code 0 and are never written or reduced.
  uint32_t w[4];
  auto load_slot = [&](int64_t slot) {
    const int64_t t_first = A + slot * TPT;
    if (aligned && t_first >= T0 && t_first + TPT <= T1) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(codes + t_first * M));
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
      w[0] = w[1] = w[2] = w[3] = 0u;
#pragma unroll
      for (int idx = 0; idx < 16; ++idx) {
        const int64_t t = t_first + idx / (M > 0 ? M : 16);
        if (t >= T0 && t < T1)
          w[idx / 4] |= static_cast<uint32_t>(codes[t * (M > 0 ? M : 1) + idx % (M > 0 ? M : 16)])
                        << (8 * (idx % 4));
      }
    }
  };
  // Raw score of token t (0 <= t < TPT) of the slot for the LUT L: the CPU's
  // summation order (m == 2: l0 + l1; otherwise 0 + l0 + l1 + ...).
  auto raw_score = [&](const float* L, int t, int64_t slot) -> float {
    if constexpr (M > 0) {
      auto code = [&](int j) {
        const int idx = t * M + j;
        return ((w[idx / 4] >> (8 * (idx % 4))) & 0xffu) & code_mask;
      };
      float s = L[code(0)];
      if (M != 2) s = __fadd_rn(0.f, s);
#pragma unroll
      for (int j = 1; j < M; ++j) s = __fadd_rn(s, L[j * C + code(j)]);
      return s;
    } else {
      const uint8_t* c = codes + (A + slot) * m;
      float s = L[c[0] & code_mask];
      if (m != 2) s = __fadd_rn(0.f, s);
      for (int j = 1; j < m; ++j) s = __fadd_rn(s, L[j * C + (c[j] & code_mask)]);
      return s;
    }
  };
  auto token_valid = [&](int64_t slot, int t) {
    const int64_t tok = A + slot * TPT + t;
    return tok >= T0 && tok < T1;
  };

  // Softmax statistics of the earlier launches: every block reduces the
  // per-block partials of its head in the same fixed order.
  if (p.mode == kModeSoftmax && stage != kStageMax) {
    for (int g = 0; g < p.group; ++g) {
      const size_t row = (static_cast<size_t>(kv) * p.group + g) * stride;
      float v = -INFINITY;
      for (int b = tid; b < bph; b += kThreads) v = fmaxf(v, p.part_max[row + b]);
      v = Reduce(reduce_tmp).Reduce(v, MaxOp());
      if (tid == 0) stat_max[g] = __fmul_rn(v, p.scale);  // CPU: max_raw * scale
      __syncthreads();
      if (stage == kStageFinal) {
        float s = 0.f;
        for (int b = tid; b < bph; b += kThreads) s += p.part_sum[row + b];
        s = Reduce(reduce_tmp).Sum(s);
        if (tid == 0) stat_inv[g] = __fdiv_rn(1.0f, s);
        __syncthreads();
      }
    }
  }

  if (stage != kStageFinal) {
    // Statistics pass: query heads outermost, one block reduction per head.
    for (int ch = 0; ch < p.chunks; ++ch) {
      const int g0 = ch * p.heads_per_chunk;
      const int g1 = min(p.group, g0 + p.heads_per_chunk);
      if (p.smem_lut) {
        __syncthreads();
        load_chunk(ch);
        __syncthreads();
      }
      for (int g = g0; g < g1; ++g) {
        const float* L = lut_of(g, g0);
        const float max_logit = stage == kStageSum ? stat_max[g] : 0.f;
        float local = stage == kStageMax ? -INFINITY : 0.f;
        for (int64_t it = 0; it < iters; ++it) {
          const int64_t slot = (it * bph + blockIdx.x) * kThreads + tid;
          if (slot >= slots) continue;
          if constexpr (M > 0) load_slot(slot);
#pragma unroll
          for (int t = 0; t < TPT; ++t) {
            if (!token_valid(slot, t)) continue;
            const float s = raw_score(L, t, slot);
            if (stage == kStageMax)
              local = fmaxf(local, s);
            else
              local += exp_nonpositive(__fsub_rn(__fmul_rn(s, p.scale), max_logit));
          }
        }
        const size_t at = (static_cast<size_t>(kv) * p.group + g) * stride + blockIdx.x;
        if (stage == kStageMax) {
          local = Reduce(reduce_tmp).Reduce(local, MaxOp());
          if (tid == 0) p.part_max[at] = local;
        } else {
          local = Reduce(reduce_tmp).Sum(local);
          if (tid == 0) p.part_sum[at] = local;
        }
        __syncthreads();  // reduce_tmp is reused by the next head
      }
    }
    return;
  }

  // Final pass: slots outermost, the group folded in registers.
  if (p.smem_lut && p.chunks == 1) {
    load_chunk(0);
    __syncthreads();
  }
  for (int64_t it = 0; it < iters; ++it) {
    const int64_t tile = it * bph + blockIdx.x;
    const int64_t slot = tile * kThreads + tid;
    const bool live = slot < slots;
    if constexpr (M > 0) {
      if (live) load_slot(slot);
    }
    float acc[TPT];
#pragma unroll
    for (int t = 0; t < TPT; ++t) acc[t] = 0.f;
    for (int ch = 0; ch < p.chunks; ++ch) {
      const int g0 = ch * p.heads_per_chunk;
      const int g1 = min(p.group, g0 + p.heads_per_chunk);
      if (p.smem_lut && p.chunks > 1) {
        __syncthreads();
        load_chunk(ch);
        __syncthreads();
      }
      if (!live) continue;
      for (int g = g0; g < g1; ++g) {
        const float* L = lut_of(g, g0);
#pragma unroll
        for (int t = 0; t < TPT; ++t) {
          if (M == 0 && !token_valid(slot, t)) continue;  // byte loads: never read outside
          const float s = raw_score(L, t, slot);
          if (p.mode == kModeMax) {  // CPU: out = raw*scale; out = std::max(out, r*scale)
            const float v = __fmul_rn(s, p.scale);
            acc[t] = (g == 0 || acc[t] < v) ? v : acc[t];
          } else if (p.mode == kModeMean) {  // CPU: out = raw; out += r; out *= scale/group
            acc[t] = g == 0 ? s : __fadd_rn(acc[t], s);
          } else {  // CPU: out = 0; out += exp(raw*scale - max_logit) * (1/sum)
            const float e = exp_nonpositive(__fsub_rn(__fmul_rn(s, p.scale), stat_max[g]));
            acc[t] = __fadd_rn(acc[t], __fmul_rn(e, stat_inv[g]));
          }
        }
      }
    }
    if (p.mode == kModeMean) {
#pragma unroll
      for (int t = 0; t < TPT; ++t) acc[t] = __fmul_rn(acc[t], p.mean_scale);
    }
    // Transpose through shared memory so that the stores are coalesced
    // (a thread's TPT outputs are consecutive, the warp's are 32 x TPT apart).
    __syncthreads();  // the previous tile's readers are done
#pragma unroll
    for (int t = 0; t < TPT; ++t) outbuf[tid * kPad + t] = acc[t];
    __syncthreads();
    const int64_t tile_first = A + tile * kThreads * TPT - T0;  // output index of element 0
    for (int e = tid; e < kThreads * TPT; e += kThreads) {
      const int64_t i = tile_first + e;
      if (i >= 0 && i < n) out_row[i] = outbuf[(e / TPT) * kPad + e % TPT];
    }
  }
}

template <int M>
int launch(const ScanParams& p, int32_t kv_heads, int32_t bph, cudaStream_t stream, char* err,
           size_t err_len) {
  constexpr int kPad = tokens_per_slot(M) > 1 ? tokens_per_slot(M) + 1 : 1;
  const size_t smem =
      sizeof(float) * (static_cast<size_t>(p.lut_floats) + kThreads * kPad + 2 * p.group);
  if (smem > 48 * 1024) {  // above 48 KB a kernel must opt in to dynamic shared memory
    cudaError_t s = cudaFuncSetAttribute(pq_scan_kernel<M>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (s != cudaSuccess) return cuda_fail(err, err_len, "pq_scan: cudaFuncSetAttribute", s);
  }
  const dim3 grid(static_cast<unsigned>(bph), static_cast<unsigned>(kv_heads));
  const int stages[3] = {kStageMax, kStageSum, kStageFinal};
  const char* names[3] = {"pq_scan softmax max pass", "pq_scan softmax sum pass",
                          "pq_scan final pass"};
  for (int i = p.mode == kModeSoftmax ? 0 : 2; i < 3; ++i) {
    pq_scan_kernel<M><<<grid, kThreads, smem, stream>>>(p, stages[i]);
    cudaError_t s = cudaGetLastError();
    if (s != cudaSuccess) return cuda_fail(err, err_len, names[i], s);
  }
  return 0;
}

// The checks both entry points share; 0 or the error.
int check_shared(const char* fn, int32_t group_size, int32_t subspaces, int32_t centroids,
                 int32_t combine, float scale, char* err, size_t err_len) {
  if (group_size < 1 || group_size > kMaxGroup)
    return set_error(err, err_len, "%s: group_size is %d; expected 1..%d", fn, group_size,
                     kMaxGroup);
  if (subspaces < 1)
    return set_error(err, err_len, "%s: subspaces is %d; expected >= 1", fn, subspaces);
  if (centroids < 1 || centroids > 256 || (centroids & (centroids - 1)) != 0)
    return set_error(err, err_len, "%s: centroids is %d; expected a power of two <= 256", fn,
                     centroids);
  if (combine != PQ_GQA_SUM_SOFTMAX && combine != PQ_GQA_MAX && combine != PQ_GQA_MEAN)
    return set_error(err, err_len, "%s: combine is %d; not a pq_gqa_combine", fn, combine);
  if (!(scale > 0.f) || !std::isfinite(scale))
    return set_error(err, err_len, "%s: scale is %g; expected finite and > 0", fn,
                     static_cast<double>(scale));
  return 0;
}

size_t workspace_size(int32_t rows, int32_t group_size, int32_t subspaces, int64_t n,
                      int32_t combine) {
  if (combine != PQ_GQA_SUM_SOFTMAX || group_size <= 1 || rows <= 0 || subspaces <= 0 || n <= 0)
    return 0;
  return 2 * sizeof(float) * static_cast<size_t>(rows) * static_cast<size_t>(group_size) *
         static_cast<size_t>(blocks_per_head(subspaces, n));
}

// Fills the shared parameters, checks the workspace and launches every pass
// over `rows` rows of at most n tokens.
int run(ScanParams& p, int32_t rows, int64_t n, int32_t group_size, int32_t subspaces,
        int32_t centroids, int32_t combine, float scale, void* d_workspace,
        size_t workspace_bytes, void* stream, const char* fn, char* err, size_t err_len) {
  const size_t need = workspace_size(rows, group_size, subspaces, n, combine);
  if (need > 0 && (d_workspace == nullptr || workspace_bytes < need))
    return set_error(err, err_len, "%s: workspace of %zu bytes at %p; SUM_SOFTMAX needs %zu", fn,
                     workspace_bytes, d_workspace, need);
  p.group = group_size;
  p.m = subspaces;
  p.C = centroids;
  const int64_t mC = static_cast<int64_t>(subspaces) * centroids;
  p.smem_lut = mC <= kLutBudget;
  p.heads_per_chunk = p.smem_lut ? static_cast<int32_t>(std::min<int64_t>(group_size, kLutBudget / mC))
                                 : group_size;
  p.chunks = (group_size + p.heads_per_chunk - 1) / p.heads_per_chunk;
  p.lut_floats = p.smem_lut ? static_cast<int32_t>(p.heads_per_chunk * mC) : 0;
  // A single head's softmax is its logit order (combine_group_scores does the same).
  p.mode = combine == PQ_GQA_MAX ? kModeMax
           : (combine == PQ_GQA_MEAN || group_size == 1) ? kModeMean
                                                         : kModeSoftmax;
  p.scale = scale;
  p.mean_scale = scale / static_cast<float>(group_size);
  const int32_t bph = blocks_per_head(subspaces, n);
  if (p.mode == kModeSoftmax) {
    p.part_max = static_cast<float*>(d_workspace);
    p.part_sum = p.part_max + static_cast<size_t>(rows) * group_size * bph;
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (vector_width(subspaces)) {
    case 1: return launch<1>(p, rows, bph, s, err, err_len);
    case 2: return launch<2>(p, rows, bph, s, err, err_len);
    case 4: return launch<4>(p, rows, bph, s, err, err_len);
    case 8: return launch<8>(p, rows, bph, s, err, err_len);
    case 16: return launch<16>(p, rows, bph, s, err, err_len);
    default: return launch<0>(p, rows, bph, s, err, err_len);
  }
}

}  // namespace

size_t pq_scan_workspace_size(int32_t kv_heads, int32_t group_size, int32_t subspaces, int64_t n,
                              int32_t combine) {
  return workspace_size(kv_heads, group_size, subspaces, n, combine);
}

int pq_scan(const float* d_lut, const uint8_t* d_codes, int32_t kv_heads, int32_t group_size,
            int32_t subspaces, int32_t centroids, int64_t codes_stride, int64_t begin, int64_t end,
            int32_t combine, float scale, float* d_scores, void* d_workspace,
            size_t workspace_bytes, void* stream, char* err, size_t err_len) {
  if (kv_heads < 1 || kv_heads > 65535)
    return set_error(err, err_len, "pq_scan: kv_heads is %d; expected 1..65535", kv_heads);
  if (const int rc = check_shared("pq_scan", group_size, subspaces, centroids, combine, scale,
                                  err, err_len))
    return rc;
  if (begin < 0 || end < begin || end > codes_stride)
    return set_error(err, err_len,
                     "pq_scan: token range [%lld, %lld) is not inside [0, codes_stride = %lld)",
                     static_cast<long long>(begin), static_cast<long long>(end),
                     static_cast<long long>(codes_stride));
  if (end - begin > INT32_MAX)
    return set_error(err, err_len, "pq_scan: %lld tokens; at most INT32_MAX",
                     static_cast<long long>(end - begin));
  const int64_t n = end - begin;
  if (n == 0) return 0;
  if (d_lut == nullptr || d_codes == nullptr || d_scores == nullptr)
    return set_error(err, err_len, "pq_scan: d_lut, d_codes and d_scores must not be NULL");
  ScanParams p{};
  p.lut = d_lut;
  p.codes = d_codes;
  p.out = d_scores;
  p.stride = codes_stride;
  p.begin = begin;
  p.n = n;
  return run(p, kv_heads, n, group_size, subspaces, centroids, combine, scale, d_workspace,
             workspace_bytes, stream, "pq_scan", err, err_len);
}

size_t pq_scan_rows_workspace_size(int32_t rows, int32_t group_size, int32_t subspaces,
                                   int64_t max_n, int32_t combine) {
  return workspace_size(rows, group_size, subspaces, max_n, combine);
}

int pq_scan_rows(const pq_scan_row* d_rows, int32_t rows, int64_t max_n, int32_t group_size,
                 int32_t subspaces, int32_t centroids, int32_t combine, float scale,
                 void* d_workspace, size_t workspace_bytes, void* stream, char* err,
                 size_t err_len) {
  if (rows < 0 || rows > 65535)
    return set_error(err, err_len, "pq_scan_rows: rows is %d; expected 0..65535", rows);
  if (max_n < 0 || max_n > INT32_MAX)
    return set_error(err, err_len, "pq_scan_rows: max_n is %lld; expected 0..INT32_MAX",
                     static_cast<long long>(max_n));
  if (const int rc = check_shared("pq_scan_rows", group_size, subspaces, centroids, combine,
                                  scale, err, err_len))
    return rc;
  if (rows == 0 || max_n == 0) return 0;
  if (d_rows == nullptr) return set_error(err, err_len, "pq_scan_rows: d_rows is NULL");
  ScanParams p{};
  p.rows = d_rows;
  return run(p, rows, max_n, group_size, subspaces, centroids, combine, scale, d_workspace,
             workspace_bytes, stream, "pq_scan_rows", err, err_len);
}

}  // namespace pqcuda
