// The adaptive K-Means iteration budget (paper section 3.3) through the API:
// which budget a build gets for the caller's time model, read back from
// pq_layer_info. Only the clip ends are asserted: a budget far below any
// clustering time must give kmeans_min_iterations, one far above must give
// kmeans_max_iterations, whatever machine runs the test.
#include "api_test_util.h"

namespace {

using namespace pqt;

constexpr int32_t kKvHeads = 2, kHeadDim = 32, kTokens = 4096;

pq_layer_info build_with(pq_config c) {
  c.kmeans_tolerance = 0.f;  // run the whole budget: iterations == budget
  Ctx ctx(c);
  EXPECT_TRUE(ctx.ok()) << pq_last_error();
  EXPECT_TRUE(IsOk(pq_sequence_add(ctx, 1)));
  std::vector<float> keys = random_normal(static_cast<size_t>(kTokens) * kKvHeads * kHeadDim, 7);
  HostTensor k = make_tensor(keys, kTokens, kKvHeads, kHeadDim, PQ_DTYPE_F32);
  EXPECT_TRUE(IsOk(pq_prefill_layer(ctx, 1, 0, k.get(), k.get())));
  EXPECT_TRUE(IsOk(pq_wait_builds(ctx)));
  return layer_info(ctx, 1, 0);
}

pq_config adaptive_config() {
  pq_config c = make_config(1, kKvHeads, kKvHeads, kHeadDim);
  c.kmeans_iterations = 0;  // adaptive
  c.kmeans_min_iterations = 3;
  c.kmeans_max_iterations = 17;
  return c;
}

TEST(ApiAdaptive, NoTimeModelUsesTheMaximumAndConvergence) {
  pq_layer_info info = build_with(adaptive_config());
  EXPECT_EQ(info.kmeans_budget, 17);
  EXPECT_EQ(info.kmeans_iterations, 17);
}

TEST(ApiAdaptive, TinyLayerBudgetClipsToTheMinimum) {
  pq_config c = adaptive_config();
  c.layer_time_budget = 1e-9;  // one nanosecond: no iteration fits
  pq_layer_info info = build_with(c);
  EXPECT_EQ(info.kmeans_budget, 3);
  EXPECT_EQ(info.kmeans_iterations, 3);
}

TEST(ApiAdaptive, HugeLayerBudgetClipsToTheMaximum) {
  pq_config c = adaptive_config();
  c.layer_time_budget = 1e4;  // hours per layer
  EXPECT_EQ(build_with(c).kmeans_budget, 17);
}

TEST(ApiAdaptive, ComputeCoefficientsFollowEquationThree) {
  pq_config c = adaptive_config();
  c.compute_gamma = 1e-15;  // a quadratic model far below the clustering time
  EXPECT_EQ(build_with(c).kmeans_budget, 3);
  c.compute_gamma = 0.0;
  c.compute_alpha = 1e4;  // a constant term far above it
  EXPECT_EQ(build_with(c).kmeans_budget, 17);
}

TEST(ApiAdaptive, FixedIterationsOverrideTheTimeModel) {
  pq_config c = adaptive_config();
  c.layer_time_budget = 1e-9;
  c.kmeans_iterations = 9;
  pq_layer_info info = build_with(c);
  EXPECT_EQ(info.kmeans_budget, 9);
  EXPECT_EQ(info.kmeans_iterations, 9);
}

TEST(ApiAdaptive, NegativeOrNonFiniteCoefficientsAreRejected) {
  pq_config c = adaptive_config();
  c.compute_beta = -1.0;
  pq_context* ctx = nullptr;
  EXPECT_TRUE(IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"compute_beta"}));
  c.compute_beta = 0.0;
  c.layer_time_budget = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"layer_time_budget"}));
  c.layer_time_budget = 0.0;
  c.kmeans_min_iterations = 20;  // above the maximum 17
  EXPECT_TRUE(IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"kmeans_max_iterations"}));
  EXPECT_EQ(ctx, nullptr);
}

}  // namespace
