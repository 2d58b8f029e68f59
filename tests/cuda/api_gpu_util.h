// What the tests of the CUDA backend through the public API on a real GPU
// share (test_cuda_device_step.cpp, test_cuda_engine_step.cpp): the shape
// they run at and their context, the reason a test skips without a device,
// device memory through cudart, and random f16 data.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <pqcache.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int32_t kQHeads = 32, kKvHeads = 8, kDim = 128;

std::string no_device() {
  int n = 0;
  cudaError_t s = cudaGetDeviceCount(&n);
  if (s != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorName(s);
  return n == 0 ? "no CUDA device: cudaGetDeviceCount reports 0" : "";
}
#define REQUIRE_GPU()                                 \
  do {                                                \
    const std::string why_ = no_device();             \
    if (!why_.empty()) GTEST_SKIP() << why_;          \
  } while (0)

// Device memory freed at scope exit (zeros unless copied from `host`).
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count, const T* host = nullptr) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)), cudaSuccess);
    if (host != nullptr)
      EXPECT_EQ(cudaMemcpy(p, host, count * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    else
      EXPECT_EQ(cudaMemset(p, 0, count * sizeof(T)), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

// A one-layer f16 context on the CUDA backend of the shape above, with
// `combine`, `key_rotary`, `rerank` and `kv_tier`; NULL (and a failure)
// when pq_create fails.
pq_context* make_context(int32_t combine, int32_t key_rotary = PQ_ROTARY_NONE,
                         float rerank = 0.f, int32_t kv_tier = PQ_KV_TIER_HOST) {
  pq_config c;
  pq_config_default(&c);
  c.num_layers = 1, c.num_q_heads = kQHeads, c.num_kv_heads = kKvHeads, c.head_dim = kDim;
  c.dtype = PQ_DTYPE_F16, c.kmeans_iterations = 4, c.gqa_combine = combine;
  c.key_rotary = key_rotary, c.pq_rerank = rerank, c.kv_tier = kv_tier;
  c.backend = PQ_BACKEND_CUDA;
  pq_context* ctx = nullptr;
  EXPECT_EQ(pq_create(&c, &ctx), PQ_OK) << pq_last_error();
  return ctx;
}

std::vector<uint16_t> random_f16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> mant(0, 1023), sign(0, 1), ex(12, 16);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = static_cast<uint16_t>((sign(rng) << 15) | (ex(rng) << 10) | mant(rng));
  return v;
}

}  // namespace
