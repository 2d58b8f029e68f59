#include "pq/nearest_centroid.h"

#include <algorithm>
#include <cfloat>
#include <cstring>

#include "base/cpu_dispatch.h"
#include "pq/kmeans.h"
#include "pq/nearest_centroid_avx512.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PQ_KMEANS_HAVE_AVX2 1
#endif

namespace pq {

namespace {

// The reference squared distance: eight partial sums (lane l takes the
// dimensions l, l + 8, ...), combined in a fixed order, then the tail. Every
// caller (nearest_centroid, the tie re-check, k-means++) runs this one
// function, so they all get bit-identical values; the AVX2 build computes
// the same lanes in the same order (no FMA), so results do not depend on
// the CPU either. It is exactly 0 for equal vectors.
PQ_ALWAYS_INLINE float squared_distance_body(const float* a, const float* b, int32_t dim) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int32_t d = 0;
  for (; d + 8 <= dim; d += 8) {
    for (int32_t l = 0; l < 8; ++l) {
      const float diff = a[d + l] - b[d + l];
      lanes[l] += diff * diff;
    }
  }
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
              ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; d < dim; ++d) {
    const float diff = a[d] - b[d];
    sum += diff * diff;
  }
  return sum;
}

PQ_TARGET_AVX2 float squared_distance_avx2(const float* a, const float* b, int32_t dim) {
  return squared_distance_body(a, b, dim);
}
float squared_distance_portable(const float* a, const float* b, int32_t dim) {
  return squared_distance_body(a, b, dim);
}

}  // namespace

__attribute__((noinline)) float squared_distance(const float* a, const float* b, int32_t dim) {
  static const auto impl = cpu_has_avx2() ? squared_distance_avx2 : squared_distance_portable;
  return impl(a, b, dim);
}

namespace {

// weights[i] = min(weights[i], squared_distance(point i, centroid)) for the
// points with a positive weight: the k-means++ D^2 update. Four points at a
// time, each with squared_distance's exact lane order (bit-identical
// values), so the four dependency chains overlap.
PQ_ALWAYS_INLINE void update_min_distances_body(const float* points, int64_t n, int32_t dim,
                                                const float* centroid, float* weights) {
  int64_t i = 0;
  if (dim % 8 == 0) {
    typedef float Lanes __attribute__((vector_size(32)));  // lane l = element l
    for (; i + 4 <= n; i += 4) {
      Lanes acc[4] = {};
      const float* first = points + i * dim;
      for (int32_t d = 0; d < dim; d += 8) {
        Lanes c;
        std::memcpy(&c, centroid + d, sizeof(c));
#pragma GCC unroll 4
        for (int32_t p = 0; p < 4; ++p) {
          Lanes x;
          std::memcpy(&x, first + p * dim + d, sizeof(x));
          const Lanes diff = x - c;
          acc[p] += diff * diff;
        }
      }
      for (int32_t p = 0; p < 4; ++p) {
        const Lanes& lane = acc[p];
        const float distance = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                               ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        if (weights[i + p] > 0.0f) weights[i + p] = std::min(weights[i + p], distance);
      }
    }
  }
  for (; i < n; ++i)
    if (weights[i] > 0.0f)
      weights[i] = std::min(weights[i], squared_distance(points + i * dim, centroid, dim));
}

PQ_TARGET_AVX2 void update_min_distances_avx2(const float* points, int64_t n, int32_t dim,
                                              const float* centroid, float* weights) {
  update_min_distances_body(points, n, dim, centroid, weights);
}
void update_min_distances_portable(const float* points, int64_t n, int32_t dim,
                                   const float* centroid, float* weights) {
  update_min_distances_body(points, n, dim, centroid, weights);
}

}  // namespace

void update_min_distances(const float* points, int64_t n, int32_t dim, const float* centroid,
                          float* weights) {
  static const auto impl =
      cpu_has_avx2() ? update_min_distances_avx2 : update_min_distances_portable;
  impl(points, n, dim, centroid, weights);
}

// ||x||^2 with eight partial sums (vectorised); only feeds error margins and
// centroid norms, so its summation order is free.
float squared_norm(const float* x, int32_t dim) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int32_t d = 0;
  for (; d + 8 <= dim; d += 8)
    for (int32_t l = 0; l < 8; ++l) lanes[l] += x[d + l] * x[d + l];
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
              ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; d < dim; ++d) sum += x[d] * x[d];
  return sum;
}

namespace {

// The smallest of `padded` scores (a multiple of kLaneWidth; the padding is
// FLT_MAX), with kLaneWidth independent minima that vectorise. The minimum is
// exact, so the order does not matter.
float min_score(const float* scores, int32_t padded) {
  float lanes[kLaneWidth];
  for (int32_t l = 0; l < kLaneWidth; ++l) lanes[l] = scores[l];
  for (int32_t c = kLaneWidth; c < padded; c += kLaneWidth)
    for (int32_t l = 0; l < kLaneWidth; ++l)
      lanes[l] = scores[c + l] < lanes[l] ? scores[c + l] : lanes[l];
  float smallest = lanes[0];
  for (int32_t l = 1; l < kLaneWidth; ++l) smallest = lanes[l] < smallest ? lanes[l] : smallest;
  return smallest;
}

}  // namespace

void prepare_centroids(const float* centroids, int32_t count, int32_t dim,
                       PreparedCentroids* out) {
  out->count = count;
  out->padded = static_cast<int32_t>(padded_centroids(count));
  out->dim = dim;
  out->rows = centroids;
  out->transposed.assign(static_cast<size_t>(dim) * out->padded, 0.0f);
  out->norms.assign(out->padded, FLT_MAX);
  out->max_norm = 0.0f;
  for (int32_t c = 0; c < count; ++c) {
    const float* row = centroids + static_cast<size_t>(c) * dim;
    for (int32_t d = 0; d < dim; ++d) out->transposed[static_cast<size_t>(d) * out->padded + c] = row[d];
    out->norms[c] = squared_norm(row, dim);
    out->max_norm = std::max(out->max_norm, out->norms[c]);
  }
}

namespace {

// scores[p * padded + c] = ||c||^2 - 2 x_p.c for `count` points of row stride
// `stride`. Portable version: tiles of kLaneWidth centroids with a constant
// trip count, which g++ vectorises even at -O2, accumulating in registers.
void score_block_generic(const float* points, int64_t count, int64_t stride,
                         const PreparedCentroids& pc, float* scores) {
  const int32_t padded = pc.padded;
  const float* __restrict transposed = pc.transposed.data();
  const float* __restrict norms = pc.norms.data();
  for (int64_t p = 0; p < count; ++p) {
    const float* __restrict x = points + p * stride;
    float* __restrict out = scores + p * padded;
    for (int32_t c = 0; c < padded; c += kLaneWidth) {
      float acc[kLaneWidth] = {};
      const float* __restrict column = transposed + c;
      for (int32_t d = 0; d < pc.dim; ++d) {
        const float xd = x[d];
        for (int32_t l = 0; l < kLaneWidth; ++l) acc[l] += xd * column[l];
        column += padded;
      }
      for (int32_t l = 0; l < kLaneWidth; ++l) out[c + l] = norms[c + l] - 2.0f * acc[l];
    }
  }
}

#if PQ_KMEANS_HAVE_AVX2
// AVX2+FMA version: a register tile of Points points x 16 centroids
// (2 * Points independent FMA chains, enough to cover the FMA latency), so
// the loop over dimensions loads two centroid vectors and Points broadcasts
// per 16 * Points multiply-adds.
template <int Points>
__attribute__((target("avx2,fma"), always_inline)) inline void score_tile_avx2(
    const float* points, int64_t stride, const PreparedCentroids& pc, float* scores) {
  const int32_t padded = pc.padded;
  const int32_t dim = pc.dim;
  const __m256 minus_two = _mm256_set1_ps(-2.0f);
  for (int32_t c = 0; c < padded; c += 16) {
    __m256 low[Points], high[Points];
#pragma GCC unroll 8
    for (int i = 0; i < Points; ++i) low[i] = high[i] = _mm256_setzero_ps();
    const float* column = pc.transposed.data() + c;
    for (int32_t d = 0; d < dim; ++d) {
      const __m256 r0 = _mm256_loadu_ps(column);
      const __m256 r1 = _mm256_loadu_ps(column + 8);
      column += padded;
#pragma GCC unroll 8
      for (int i = 0; i < Points; ++i) {
        const __m256 b = _mm256_broadcast_ss(points + i * stride + d);
        low[i] = _mm256_fmadd_ps(b, r0, low[i]);
        high[i] = _mm256_fmadd_ps(b, r1, high[i]);
      }
    }
    const __m256 n0 = _mm256_loadu_ps(pc.norms.data() + c);
    const __m256 n1 = _mm256_loadu_ps(pc.norms.data() + c + 8);
#pragma GCC unroll 8
    for (int i = 0; i < Points; ++i) {
      float* out = scores + i * padded + c;
      _mm256_storeu_ps(out, _mm256_fmadd_ps(minus_two, low[i], n0));
      _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(minus_two, high[i], n1));
    }
  }
}

__attribute__((target("avx2,fma"))) void score_block_avx2(const float* points, int64_t count,
                                                           int64_t stride,
                                                           const PreparedCentroids& pc,
                                                           float* scores) {
  constexpr int kTile = 4;  // 6 measured no faster
  int64_t p = 0;
  for (; p + kTile <= count; p += kTile)
    score_tile_avx2<kTile>(points + p * stride, stride, pc, scores + p * pc.padded);
  for (; p < count; ++p)
    score_tile_avx2<1>(points + p * stride, stride, pc, scores + p * pc.padded);
}

bool cpu_has_avx2_fma() { return cpu_has_avx2(); }  // the AVX2 level includes FMA
#endif

using ScoreBlock = void (*)(const float*, int64_t, int64_t, const PreparedCentroids&, float*);

ScoreBlock choose_score_block() {
#if PQ_KMEANS_HAVE_AVX2
  if (cpu_level() == CpuLevel::kAvx512) return score_block_avx512;
  if (cpu_has_avx2_fma()) return score_block_avx2;
#endif
  return score_block_generic;
}

void score_block(const float* points, int64_t count, int64_t stride, const PreparedCentroids& pc,
                 float* scores) {
  static const ScoreBlock impl = choose_score_block();
  impl(points, count, stride, pc, scores);
}

}  // namespace

void score_against_centroids(const PreparedCentroids& pc, const float* points, int64_t count,
                             int64_t stride, float* scores) {
  score_block(points, count, stride, pc, scores);
}

// Assigns `count` points (row stride `stride`) to their nearest centroid:
// codes[p * code_stride] and, if non-null, distances[p]. Returns the sum of
// the distances. `scores` holds kScoreBlock * pc.padded floats.
namespace {
// The loops around the distance kernel (the minimum, the candidates, the
// exact re-check) are built twice, AVX2 and portable, like the kernels; the
// re-check is squared_distance_body either way, so the values agree bit for
// bit.
PQ_ALWAYS_INLINE double assign_points_body(const PreparedCentroids& pc, const float* points,
                                           int64_t count, int64_t stride,
                                           const float* point_norms, uint8_t* codes,
                                           int64_t code_stride, float* distances,
                                           float* scores) {
  const int32_t k = pc.count;
  const int32_t dim = pc.dim;
  // |expanded score - exact value| <= gamma_(dim+2) (||x|| + ||c||)^2 for any
  // summation order, with or without FMA; the squared difference is off by
  // at most gamma_(dim+1) times the distance. Both are below
  // (dim + 2) * FLT_EPSILON * (||x||^2 + ||c||^2) each, so a margin of four
  // times that (plus a tiny absolute term for subnormals) always keeps the
  // true nearest centroid among the candidates.
  const float margin_factor = 4.0f * static_cast<float>(dim + 2) * FLT_EPSILON;
  double total = 0.0;
  for (int64_t start = 0; start < count; start += kScoreBlock) {
    const int64_t block = std::min<int64_t>(kScoreBlock, count - start);
    const float* block_points = points + start * stride;
    score_block(block_points, block, stride, pc, scores);
    for (int64_t p = 0; p < block; ++p) {
      const float* x = block_points + p * stride;
      const float* s = scores + p * pc.padded;
      const float x_norm = point_norms ? point_norms[start + p] : squared_norm(x, dim);
      const float limit = min_score(s, pc.padded) + margin_factor * (x_norm + pc.max_norm) + FLT_MIN;
      // The candidates as a byte mask, built and counted branch-free (it
      // vectorises); then only the set bytes are visited, in ascending
      // order, 8 at a time: usually one, the nearest centroid itself.
      uint8_t candidate[256 + kLaneWidth];
      int32_t hits = 0;
      for (int32_t c = 0; c < pc.padded; ++c) {
        const uint8_t is = s[c] <= limit ? 1 : 0;
        candidate[c] = is;
        hits += is;
      }
      NearestChoice choice;
      for (int32_t word_start = 0, seen = 0; word_start < k && seen < hits; word_start += 8) {
        uint64_t word;
        std::memcpy(&word, candidate + word_start, sizeof word);
        for (; word != 0; word &= word - 1) {
          const int32_t c = word_start + __builtin_ctzll(word) / 8;
          ++seen;
          if (c >= k) break;
          choice.offer(c, squared_distance_body(x, pc.rows + static_cast<size_t>(c) * dim, dim));
        }
      }
      total += choice.store([&] { return squared_distance_body(x, pc.rows, dim); },
                            codes + (start + p) * code_stride,
                            distances ? distances + start + p : nullptr);
    }
  }
  return total;
}

PQ_TARGET_AVX2 double assign_points_avx2(const PreparedCentroids& pc, const float* points,
                                         int64_t count, int64_t stride, const float* point_norms,
                                         uint8_t* codes, int64_t code_stride, float* distances,
                                         float* scores) {
  return assign_points_body(pc, points, count, stride, point_norms, codes, code_stride,
                            distances, scores);
}
double assign_points_portable(const PreparedCentroids& pc, const float* points, int64_t count,
                              int64_t stride, const float* point_norms, uint8_t* codes,
                              int64_t code_stride, float* distances, float* scores) {
  return assign_points_body(pc, points, count, stride, point_norms, codes, code_stride,
                            distances, scores);
}
}  // namespace

double assign_points(const PreparedCentroids& pc, const float* points, int64_t count,
                     int64_t stride, const float* point_norms, uint8_t* codes,
                     int64_t code_stride, float* distances, float* scores) {
  using Assign = double (*)(const PreparedCentroids&, const float*, int64_t, int64_t,
                            const float*, uint8_t*, int64_t, float*, float*);
  static const Assign impl = [] {
#if PQ_KMEANS_HAVE_AVX2
    if (cpu_level() == CpuLevel::kAvx512) return static_cast<Assign>(assign_points_avx512);
#endif
    return static_cast<Assign>(cpu_has_avx2() ? assign_points_avx2 : assign_points_portable);
  }();
  return impl(pc, points, count, stride, point_norms, codes, code_stride, distances, scores);
}

int32_t nearest_centroid(const float* centroids, int32_t count, int32_t sub_dim, const float* x) {
  int32_t best = 0;
  float best_distance = 0.0f;
  for (int32_t c = 0; c < count; ++c) {
    const float distance = squared_distance(x, centroids + static_cast<size_t>(c) * sub_dim, sub_dim);
    if (c == 0 || distance < best_distance) {
      best = c;
      best_distance = distance;
    }
  }
  return best;
}

}  // namespace pq
