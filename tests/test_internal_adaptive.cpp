// The adaptive K-Means iteration budget (src/pq/adaptive_budget.cpp).
#include <gtest/gtest.h>

#include "pq/adaptive_budget.h"
#include "base/thread_pool.h"

namespace {

pq::ClusterTimeModel fitted(double alpha1, double beta1) {
  pq::ClusterTimeModel model;
  model.alpha1 = alpha1;
  model.beta1 = beta1;
  model.fitted = true;
  return model;
}

pq::ComputeTimeModel compute(double alpha2, double beta2, double gamma2) {
  pq::ComputeTimeModel model;
  model.alpha2 = alpha2;
  model.beta2 = beta2;
  model.gamma2 = gamma2;
  return model;
}

TEST(AdaptiveBudget, Equation3OnHandPickedCoefficients) {
  // Powers of two keep the arithmetic exact.
  // compute = 0.5 + 2^-10 * 1024 + 2^-20 * 1024^2 = 2.5 s
  // T = (2.5 - 0.5) / (2^-12 * 512) = 2 / 0.125 = 16
  EXPECT_EQ(pq::adaptive_iterations(fitted(0.5, 0x1p-12), compute(0.5, 0x1p-10, 0x1p-20), 1024,
                                    512, 1, 100),
            16);
  // Not an integer: floor. (2.5 - 0.5) / (2^-12 * 768) = 10.67 -> 10
  EXPECT_EQ(pq::adaptive_iterations(fitted(0.5, 0x1p-12), compute(0.5, 0x1p-10, 0x1p-20), 1024,
                                    768, 1, 100),
            10);
  // Only the quadratic term: s = 2048 -> 4 s; T = 4 / (2^-12 * 1024) = 16
  EXPECT_EQ(pq::adaptive_iterations(fitted(0.0, 0x1p-12), compute(0, 0, 0x1p-20), 2048, 1024, 2, 25),
            16);
}

TEST(AdaptiveBudget, ClipsAtBothEnds) {
  // T = 2 / 0.125 = 16, clipped to [2, 10] -> 10.
  EXPECT_EQ(pq::adaptive_iterations(fitted(0.5, 0x1p-12), compute(0.5, 0x1p-10, 0x1p-20), 1024,
                                    512, 2, 10),
            10);
  // T = 16 clipped to [20, 25] -> 20.
  EXPECT_EQ(pq::adaptive_iterations(fitted(0.5, 0x1p-12), compute(0.5, 0x1p-10, 0x1p-20), 1024,
                                    512, 20, 25),
            20);
  // Clustering overhead larger than the compute time: negative T -> min.
  EXPECT_EQ(pq::adaptive_iterations(fitted(10.0, 0x1p-12), compute(1.0, 0, 0), 1024, 512, 2, 25), 2);
}

TEST(AdaptiveBudget, EmptyComputeModelGivesMax) {
  EXPECT_EQ(pq::adaptive_iterations(fitted(0.5, 1e-6), pq::ComputeTimeModel{}, 4096, 4096, 2, 25),
            25);
}

TEST(AdaptiveBudget, LayerBudgetStandsInForEmptyCoefficients) {
  pq::ComputeTimeModel budget;
  budget.layer_budget = 1.5;
  // T = (1.5 - 0.5) / (2^-10 * 256) = 4
  EXPECT_EQ(pq::adaptive_iterations(fitted(0.5, 0x1p-10), budget, 100000, 256, 1, 25), 4);
  // Non-zero coefficients win over the layer budget: T = (2.5 - 0.5) / 0.25 = 8
  pq::ComputeTimeModel both = compute(2.5, 0, 0);
  both.layer_budget = 1.5;
  EXPECT_EQ(pq::adaptive_iterations(fitted(0.5, 0x1p-10), both, 100000, 256, 1, 25), 8);
}

TEST(AdaptiveBudget, UnfittedClusterModelGivesMax) {
  pq::ClusterTimeModel unfitted;
  EXPECT_EQ(pq::adaptive_iterations(unfitted, compute(0.5, 0x1p-10, 0x1p-20), 1024, 512, 2, 17), 17);
  pq::ComputeTimeModel budget;
  budget.layer_budget = 1.0;
  EXPECT_EQ(pq::adaptive_iterations(unfitted, budget, 1024, 512, 2, 17), 17);
}

TEST(AdaptiveBudget, ProfileFitsAPositiveSlope) {
  pq::ThreadPool pool(2);
  pq::KMeansParams params;
  params.subspaces = 2;
  params.bits = 6;
  const pq::ClusterTimeModel model = pq::profile_cluster_time(2, 64, params, pool);
  EXPECT_TRUE(model.fitted);
  EXPECT_GT(model.beta1, 0.0);
  EXPECT_GE(model.alpha1, 0.0);
  // One iteration over a million training points cannot take an hour.
  EXPECT_LT(model.alpha1 + model.beta1 * 1e6, 3600.0);
  // The fitted model drives the budget: a generous compute time gives more
  // iterations than a tiny one.
  const int32_t generous =
      pq::adaptive_iterations(model, compute(10.0, 0, 0), 4096, 4096, 1, 1000000);
  const int32_t tiny = pq::adaptive_iterations(model, compute(1e-9, 0, 0), 4096, 4096, 1, 1000000);
  EXPECT_EQ(tiny, 1);
  EXPECT_GT(generous, tiny);
}

}  // namespace
