// Regression tests for the second hostile-caller study (issue 23): outputs
// that overlap the call's own inputs, a removed sequence still counted
// against the memory limit, a write callback that calls back into the
// sequence it saves, and configuration messages. The state-format defects
// of the same study (D3, D4) are in test_api_state.cpp. Each test failed
// (or crashed, or hung) before its fix; docs/reliability.md lists them.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"

using namespace pqt;

namespace {

constexpr int32_t kQ = 4, kKv = 2, kDim = 16;

pq_config hostile_config(int32_t selector = PQ_SELECTOR_EXACT) {
  pq_config c = make_config(1, kQ, kKv, kDim, PQ_DTYPE_F32);
  c.selector = selector;
  c.sink_tokens = 4;
  c.local_tokens = 4;
  c.topk_tokens = 4;
  c.pq_bits = 2;
  c.kmeans_iterations = 2;
  c.worker_threads = 2;
  return c;
}

// ---------------------------------------------------------------------------
// D7: configuration messages
// ---------------------------------------------------------------------------

TEST(Hostile, ConfigMessagesNameTheCallAndTheExactBound) {
  pq_context* out = nullptr;
  pq_config c = hostile_config();
  c.compute_gamma = 1e308;
  PQ_EXPECT_ERR(pq_create(&c, &out), PQ_ERR_INVALID_ARGUMENT, "compute_gamma");
  std::string message = pq_last_error();
  EXPECT_EQ(message,
            "pq_create: config.compute_gamma is 1e+308; expected a finite value in [0, 1e+300]");
  PQ_EXPECT_ERR(pq_create_with_hooks(&c, nullptr, &out), PQ_ERR_INVALID_ARGUMENT,
                "compute_gamma");
  EXPECT_EQ(std::string(pq_last_error()).rfind("pq_create_with_hooks: ", 0), 0u);
  c = hostile_config();
  c.pyramid_ratio = 1.5f;
  PQ_EXPECT_ERR(pq_create(&c, &out), PQ_ERR_INVALID_ARGUMENT, "pyramid_ratio");
  EXPECT_EQ(std::string(pq_last_error()),
            "pq_create: config.pyramid_ratio is 1.5; expected a value in (0, 1]");
  c = hostile_config();
  c.kmeans_tolerance = -0.1f;  // a float field prints as the float it is
  PQ_EXPECT_ERR(pq_create(&c, &out), PQ_ERR_INVALID_ARGUMENT, "kmeans_tolerance");
  EXPECT_EQ(std::string(pq_last_error()),
            "pq_create: config.kmeans_tolerance is -0.1; expected a finite value in [0, 1e+300]");
  EXPECT_EQ(out, nullptr);
}

}  // namespace
