// The Jacobi eigen solver of InfiniGen's skew (base/symmetric_eigen.h):
// a = V diag(values) V^T with V orthonormal, on a 2 x 2 case worked by hand
// and on Q^T Q of random queries of head_dim 64 and 256.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "base/symmetric_eigen.h"

namespace {

// max |a - V diag V^T| and max |V^T V - I|.
std::pair<double, double> residuals(const std::vector<double>& a, const pq::SymmetricEigen& e,
                                    int n) {
  double rebuilt = 0, orthogonal = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      double r = 0, o = 0;
      for (int k = 0; k < n; ++k) {
        r += e.vectors[i * n + k] * e.values[k] * e.vectors[j * n + k];
        o += e.vectors[k * n + i] * e.vectors[k * n + j];
      }
      rebuilt = std::max(rebuilt, std::fabs(r - a[i * n + j]));
      orthogonal = std::max(orthogonal, std::fabs(o - (i == j ? 1.0 : 0.0)));
    }
  return {rebuilt, orthogonal};
}

TEST(SymmetricEigen, TwoByTwoByHand) {
  // [[2, 1], [1, 2]]: eigenvalues 1 and 3, vectors (1, -1) and (1, 1) / sqrt 2.
  const pq::SymmetricEigen e = pq::symmetric_eigen({2, 1, 1, 2}, 2);
  std::vector<double> values = e.values;
  std::sort(values.begin(), values.end());
  EXPECT_NEAR(values[0], 1.0, 1e-12);
  EXPECT_NEAR(values[1], 3.0, 1e-12);
  for (int j = 0; j < 2; ++j) {
    const double x = e.vectors[0 * 2 + j], y = e.vectors[1 * 2 + j];
    EXPECT_NEAR(std::fabs(x), 1 / std::sqrt(2.0), 1e-12);
    EXPECT_NEAR(x * y, e.values[j] > 2 ? 0.5 : -0.5, 1e-12);
  }
}

TEST(SymmetricEigen, GramMatricesOfQueries) {
  for (int n : {1, 7, 64, 256}) {
    SCOPED_TRACE(n);
    std::mt19937 rng(n);
    std::normal_distribution<double> normal;
    const int rows = 96;
    std::vector<double> q(static_cast<size_t>(rows) * n);
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < n; ++i) q[r * n + i] = normal(rng) * (1.0 + (i % 5));  // skewed
    std::vector<double> a(static_cast<size_t>(n) * n, 0.0);
    double scale = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        for (int r = 0; r < rows; ++r) a[i * n + j] += q[r * n + i] * q[r * n + j];
        scale = std::max(scale, std::fabs(a[i * n + j]));
      }
    const pq::SymmetricEigen e = pq::symmetric_eigen(a, n);
    const auto [rebuilt, orthogonal] = residuals(a, e, n);
    EXPECT_LT(rebuilt, 1e-10 * scale);
    EXPECT_LT(orthogonal, 1e-10);
    for (double v : e.values) EXPECT_GT(v, -1e-9 * scale);  // a Gram matrix
  }
}

}  // namespace
