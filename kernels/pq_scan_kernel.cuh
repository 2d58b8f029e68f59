// The PQ scan kernel of pq_scan.cu (its launches and entry points are
// there): the parameters, the slot and block helpers and the three-stage
// kernel template, one instance per code width. Included by pq_scan.cu
// only; see its top comment for the layout of the work and the floating
// point rules.
#pragma once

#include <cub/block/block_reduce.cuh>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_plugin_abi.h"
#include "cpu_float.cuh"
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

}  // namespace

}  // namespace pqcuda
