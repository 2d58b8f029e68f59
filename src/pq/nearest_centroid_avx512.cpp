#include "pq/nearest_centroid_avx512.h"

#if PQ_X86_KERNELS
#include <immintrin.h>

#include <algorithm>
#include <cfloat>

#define PQ_TARGET_AVX512_FMA \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))

namespace pq {

namespace {

// A register tile of Points points x (16 * Vecs) centroids: Points * Vecs
// independent FMA chains (16 of the 32 zmm registers at 4 x 4), one load of
// each centroid vector per dimension shared by the Points broadcasts.
template <int Points, int Vecs>
PQ_TARGET_AVX512_FMA inline __attribute__((always_inline)) void score_tile_avx512(
    const float* points, int64_t stride, const PreparedCentroids& pc, int32_t c,
    float* scores) {
  const int32_t padded = pc.padded;
  __m512 acc[Points][Vecs];
#pragma GCC unroll 16
  for (int i = 0; i < Points; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) acc[i][v] = _mm512_setzero_ps();
  const float* column = pc.transposed.data() + c;
  for (int32_t d = 0; d < pc.dim; ++d) {
    __m512 row[Vecs];
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) row[v] = _mm512_loadu_ps(column + 16 * v);
    column += padded;
#pragma GCC unroll 16
    for (int i = 0; i < Points; ++i) {
      const __m512 b = _mm512_set1_ps(points[i * stride + d]);
#pragma GCC unroll 4
      for (int v = 0; v < Vecs; ++v) acc[i][v] = _mm512_fmadd_ps(b, row[v], acc[i][v]);
    }
  }
  const __m512 minus_two = _mm512_set1_ps(-2.0f);
#pragma GCC unroll 4
  for (int v = 0; v < Vecs; ++v) {
    const __m512 norm = _mm512_loadu_ps(pc.norms.data() + c + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < Points; ++i)
      _mm512_storeu_ps(scores + i * padded + c + 16 * v,
                       _mm512_fmadd_ps(minus_two, acc[i][v], norm));
  }
}

template <int Points>
PQ_TARGET_AVX512_FMA inline __attribute__((always_inline)) void score_points_avx512(
    const float* points, int64_t stride, const PreparedCentroids& pc, float* scores) {
  int32_t c = 0;
  for (; c + 64 <= pc.padded; c += 64) score_tile_avx512<Points, 4>(points, stride, pc, c, scores);
  if (c + 32 <= pc.padded) {
    score_tile_avx512<Points, 2>(points, stride, pc, c, scores);
    c += 32;
  }
  if (c < pc.padded) score_tile_avx512<Points, 1>(points, stride, pc, c, scores);
}

}  // namespace

PQ_TARGET_AVX512_FMA void score_block_avx512(const float* points, int64_t count, int64_t stride,
                                             const PreparedCentroids& pc, float* scores) {
  constexpr int kTile = 4;
  int64_t p = 0;
  for (; p + kTile <= count; p += kTile)
    score_points_avx512<kTile>(points + p * stride, stride, pc, scores + p * pc.padded);
  for (; p < count; ++p)
    score_points_avx512<1>(points + p * stride, stride, pc, scores + p * pc.padded);
}

PQ_TARGET_AVX512_FMA double assign_points_avx512(const PreparedCentroids& pc, const float* points,
                                                 int64_t count, int64_t stride,
                                                 const float* point_norms, uint8_t* codes,
                                                 int64_t code_stride, float* distances,
                                                 float* scores) {
  const int32_t k = pc.count;
  const int32_t dim = pc.dim;
  const int32_t padded = pc.padded;  // a multiple of 16 (kLaneWidth)
  // The margin of nearest_centroid.cpp's assign_points_body: it holds for
  // any summation order, with or without FMA, so the true nearest centroid
  // is always a candidate and the exact re-check picks it.
  const float margin_factor = 4.0f * static_cast<float>(dim + 2) * FLT_EPSILON;
  double total = 0.0;
  for (int64_t start = 0; start < count; start += kScoreBlock) {
    const int64_t block = std::min<int64_t>(kScoreBlock, count - start);
    const float* block_points = points + start * stride;
    score_block_avx512(block_points, block, stride, pc, scores);
    for (int64_t p = 0; p < block; ++p) {
      const float* x = block_points + p * stride;
      const float* s = scores + p * padded;
      const float x_norm = point_norms ? point_norms[start + p] : squared_norm(x, dim);
      // min_score's lanes: score < lane ? score : lane, as there.
      __m512 lanes = _mm512_loadu_ps(s);
      for (int32_t c = 16; c < padded; c += 16) {
        const __m512 v = _mm512_loadu_ps(s + c);
        lanes = _mm512_mask_mov_ps(lanes, _mm512_cmp_ps_mask(v, lanes, _CMP_LT_OQ), v);
      }
      alignas(64) float lane[16];
      _mm512_store_ps(lane, lanes);
      float smallest = lane[0];
      for (int l = 1; l < 16; ++l) smallest = lane[l] < smallest ? lane[l] : smallest;
      const float limit = smallest + margin_factor * (x_norm + pc.max_norm) + FLT_MIN;
      const __m512 limit_v = _mm512_set1_ps(limit);
      NearestChoice choice;
      for (int32_t c = 0; c < k; c += 16) {
        // Candidates in ascending order; ties keep the lowest index.
        uint32_t mask = _mm512_cmp_ps_mask(_mm512_loadu_ps(s + c), limit_v, _CMP_LE_OQ);
        for (; mask != 0; mask &= mask - 1) {
          const int32_t index = c + __builtin_ctz(mask);
          if (index >= k) break;
          choice.offer(index, squared_distance(x, pc.rows + static_cast<size_t>(index) * dim, dim));
        }
      }
      total += choice.store([&] { return squared_distance(x, pc.rows, dim); },
                            codes + (start + p) * code_stride,
                            distances ? distances + start + p : nullptr);
    }
  }
  return total;
}

}  // namespace pq
#endif
