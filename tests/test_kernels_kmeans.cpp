// The K-Means distance kernels (score_against_centroids, assign_points) of
// the level PQ_CPU_LEVEL asks (tests/kernel_level.h) against a scalar
// double-precision reference written here: scores within the rounding
// bound, codes the reference's nearest centroid wherever it is unambiguous,
// and always the exact argmin of squared_distance (lowest index on ties),
// which is what makes every level assign the same codes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernel_level.h"
#include "pq/nearest_centroid.h"

namespace {

struct Case {
  int32_t dim;
  int32_t k;
  int64_t count;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int32_t dim : {16, 32, 64})
    for (int32_t k : {16, 64, 256})
      for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{133}}) out.push_back({dim, k, count});
  return out;
}

// Points of row stride dim + 3 (as in a head's row), centroids near some of
// them so that distances vary in scale.
struct Data {
  int64_t stride;
  std::vector<float> points, centroids;
};

Data make_data(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Data data;
  data.stride = c.dim + 3;
  data.points.resize(static_cast<size_t>(c.count * data.stride));
  for (float& v : data.points) v = normal(rng);
  data.centroids.resize(static_cast<size_t>(c.k) * c.dim);
  for (float& v : data.centroids) v = normal(rng);
  return data;
}

double reference_distance(const float* x, const float* c, int32_t dim) {
  double sum = 0.0;
  for (int32_t d = 0; d < dim; ++d) sum += (double(x[d]) - c[d]) * (double(x[d]) - c[d]);
  return sum;
}

TEST(KernelKmeans, ScoresMatchTheDoubleReference) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  for (const Case& c : cases()) {
    const Data data = make_data(c, 17u + static_cast<uint32_t>(c.dim * c.k + c.count));
    pq::PreparedCentroids pc;
    pq::prepare_centroids(data.centroids.data(), c.k, c.dim, &pc);
    std::vector<float> scores(static_cast<size_t>(c.count) * pc.padded);
    pq::score_against_centroids(pc, data.points.data(), c.count, data.stride, scores.data());
    for (int64_t p = 0; p < c.count; ++p) {
      const float* x = data.points.data() + p * data.stride;
      double x_norm = 0.0;
      for (int32_t d = 0; d < c.dim; ++d) x_norm += double(x[d]) * x[d];
      for (int32_t j = 0; j < c.k; ++j) {
        const float* cj = data.centroids.data() + static_cast<size_t>(j) * c.dim;
        double dot = 0.0, c_norm = 0.0;
        for (int32_t d = 0; d < c.dim; ++d) {
          dot += double(x[d]) * cj[d];
          c_norm += double(cj[d]) * cj[d];
        }
        const double want = c_norm - 2.0 * dot;
        const double bound = 4.0 * (c.dim + 2) * 1.2e-7 * (x_norm + c_norm) + 1e-30;
        ASSERT_NEAR(scores[static_cast<size_t>(p) * pc.padded + j], want, bound)
            << "dim " << c.dim << " k " << c.k << " point " << p << " centroid " << j;
      }
      for (int32_t j = c.k; j < pc.padded; ++j)  // padding never wins
        EXPECT_GT(scores[static_cast<size_t>(p) * pc.padded + j], 1e37f);
    }
  }
}

TEST(KernelKmeans, AssignmentsAreTheExactNearestCentroid) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  for (const Case& c : cases()) {
    const Data data = make_data(c, 99u + static_cast<uint32_t>(c.dim * c.k + c.count));
    pq::PreparedCentroids pc;
    pq::prepare_centroids(data.centroids.data(), c.k, c.dim, &pc);
    std::vector<float> scores(static_cast<size_t>(pq::kScoreBlock) * pc.padded);
    const int64_t code_stride = 2;
    std::vector<uint8_t> codes(static_cast<size_t>(c.count * code_stride), 0xEE);
    std::vector<float> distances(static_cast<size_t>(c.count));
    const double total = pq::assign_points(pc, data.points.data(), c.count, data.stride, nullptr,
                                           codes.data(), code_stride, distances.data(),
                                           scores.data());
    double sum = 0.0;
    for (int64_t p = 0; p < c.count; ++p) {
      const float* x = data.points.data() + p * data.stride;
      const int32_t got = codes[static_cast<size_t>(p * code_stride)];
      ASSERT_LT(got, c.k);
      // The exact argmin of squared_distance, lowest index on ties.
      int32_t exact = 0;
      float exact_distance = 0.0f;
      std::vector<double> ref(static_cast<size_t>(c.k));
      for (int32_t j = 0; j < c.k; ++j) {
        const float* cj = data.centroids.data() + static_cast<size_t>(j) * c.dim;
        const float dj = pq::squared_distance(x, cj, c.dim);
        if (j == 0 || dj < exact_distance) {
          exact = j;
          exact_distance = dj;
        }
        ref[static_cast<size_t>(j)] = reference_distance(x, cj, c.dim);
      }
      EXPECT_EQ(got, exact) << "dim " << c.dim << " k " << c.k << " point " << p;
      EXPECT_EQ(distances[static_cast<size_t>(p)], exact_distance);
      // The double reference agrees where its nearest centroid is unambiguous.
      int32_t best = 0;
      for (int32_t j = 1; j < c.k; ++j)
        if (ref[static_cast<size_t>(j)] < ref[static_cast<size_t>(best)]) best = j;
      double second = INFINITY;
      for (int32_t j = 0; j < c.k; ++j)
        if (j != best) second = std::min(second, ref[static_cast<size_t>(j)]);
      const double d_best = ref[static_cast<size_t>(best)];
      if (second - d_best > 1e-4 * (1.0 + d_best)) EXPECT_EQ(got, best);
      EXPECT_NEAR(distances[static_cast<size_t>(p)], d_best, 1e-5 * (1.0 + d_best));
      sum += distances[static_cast<size_t>(p)];
    }
    EXPECT_NEAR(total, sum, 1e-9 * (1.0 + sum));
  }
}

// Duplicated centroids (exact ties: the lowest index) and points that are
// centroids (distance exactly 0), with counts that straddle the score block.
TEST(KernelKmeans, TiesTakeTheLowestIndexAndCentroidsAreTheirOwnNearest) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  for (int32_t dim : {16, 32, 64}) {
    const int32_t k = 64;
    Data data = make_data({dim, k, 1}, 5u + static_cast<uint32_t>(dim));
    for (int32_t j = 32; j < k; ++j)  // centroid j repeats centroid j - 32
      for (int32_t d = 0; d < dim; ++d)
        data.centroids[static_cast<size_t>(j) * dim + d] =
            data.centroids[static_cast<size_t>(j - 32) * dim + d];
    const int64_t count = 2 * pq::kScoreBlock + 5;
    std::vector<float> points(static_cast<size_t>(count) * dim);
    for (int64_t p = 0; p < count; ++p)
      for (int32_t d = 0; d < dim; ++d)
        points[static_cast<size_t>(p) * dim + d] =
            data.centroids[static_cast<size_t>(p % k) * dim + d];
    pq::PreparedCentroids pc;
    pq::prepare_centroids(data.centroids.data(), k, dim, &pc);
    std::vector<float> scores(static_cast<size_t>(pq::kScoreBlock) * pc.padded);
    std::vector<uint8_t> codes(static_cast<size_t>(count));
    std::vector<float> distances(static_cast<size_t>(count));
    pq::assign_points(pc, points.data(), count, dim, nullptr, codes.data(), 1, distances.data(),
                      scores.data());
    for (int64_t p = 0; p < count; ++p) {
      EXPECT_EQ(codes[static_cast<size_t>(p)], (p % k) % 32) << "dim " << dim << " point " << p;
      EXPECT_EQ(distances[static_cast<size_t>(p)], 0.0f);
    }
  }
}

}  // namespace
