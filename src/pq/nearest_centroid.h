// Nearest-centroid search shared by K-Means training and PQ encoding: the
// reference squared distance, the k-means++ D^2 update, and the blocked
// assignment kernel (the GEMM form ||c||^2 - 2 x.c, with an exact re-check of
// near ties so that the chosen centroid is always the true argmin).
#pragma once

#include <cstdint>
#include <vector>

namespace pq {

constexpr int64_t kScoreBlock = 64;  // points scored at once (scores buffer rows)
constexpr int32_t kLaneWidth = 16;   // centroid padding of the transposed layout

// `count` centroids rounded up to kLaneWidth: the columns of a laid-out set.
constexpr int64_t padded_centroids(int64_t count) {
  return (count + kLaneWidth - 1) / kLaneWidth * kLaneWidth;
}

// Squared L2 distance with a fixed summation order (bit-identical on every
// CPU and code path); exactly 0 for equal vectors.
float squared_distance(const float* a, const float* b, int32_t dim);

// weights[i] = min(weights[i], squared_distance(point i, centroid)) for the
// points with a positive weight: the k-means++ D^2 update.
void update_min_distances(const float* points, int64_t n, int32_t dim, const float* centroid,
                          float* weights);

// ||x||^2 (feeds error margins and centroid norms only).
float squared_norm(const float* x, int32_t dim);

// Centroids of one group laid out for the scoring kernel.
struct PreparedCentroids {
  int32_t count = 0;                  // k
  int32_t padded = 0;                 // k rounded up to kLaneWidth
  int32_t dim = 0;                    // sub_dim
  const float* rows = nullptr;        // [k][dim], the centroids themselves
  std::vector<float> transposed;      // [dim][padded], zero padding
  std::vector<float> norms;           // [padded], padding = FLT_MAX (never wins)
  float max_norm = 0.0f;
};

void prepare_centroids(const float* centroids, int32_t count, int32_t dim,
                       PreparedCentroids* out);

// scores[p * pc.padded + c] = pc.norms[c] - 2 x_p . c for `count` points of
// row stride `stride` (the GEMM form the assignment ranks; AVX-512 or
// AVX2 + FMA by cpu_level()). Padding columns score about FLT_MAX. With norms set to
// 0 the scores rank inner products (ClusterKV's cosine assignment).
void score_against_centroids(const PreparedCentroids& pc, const float* points, int64_t count,
                             int64_t stride, float* scores);

// Assigns `count` points (row stride `stride`) to their nearest centroid:
// codes[p * code_stride] and, if non-null, distances[p]. Returns the sum of
// the distances. `scores` holds min(count, kScoreBlock) * pc.padded floats.
double assign_points(const PreparedCentroids& pc, const float* points, int64_t count,
                     int64_t stride, const float* point_norms, uint8_t* codes,
                     int64_t code_stride, float* distances, float* scores);

// The running choice of assign_points' exact re-check (every level): the
// smallest distance, the lowest index on ties (candidates come in
// ascending order). No candidate (only with NaN or infinite inputs): centroid
// 0, whose distance `first` gives.
struct NearestChoice {
  int32_t index = -1;
  float distance = 0.0f;
  void offer(int32_t c, float d) {
    if (index < 0 || d < distance) {
      index = c;
      distance = d;
    }
  }
  // Writes the choice for one point; returns its distance.
  template <typename First>
  float store(First first, uint8_t* code, float* distance_out) {
    if (index < 0) offer(0, first());
    *code = static_cast<uint8_t>(index);
    if (distance_out) *distance_out = distance;
    return distance;
  }
};

// Nearest centroid of one sub-vector (squared L2; ties: the lowest index).
int32_t nearest_centroid(const float* centroids, int32_t count, int32_t sub_dim,
                         const float* x);

}  // namespace pq
