// The CUDA backend through the public API: device tensors in, device tensors
// out, compared with the CPU backend on the same data. Without a GPU the
// device tests report SKIPPED with the reason; the fallback tests run
// everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <pqcache.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kLayers = 2, kQHeads = 8, kKvHeads = 2, kHeadDim = 64, kTokens = 3000;

int cuda_devices(std::string* why) {
  int n = 0;
  cudaError_t s = cudaGetDeviceCount(&n);
  if (s != cudaSuccess) {
    *why = std::string(cudaGetErrorName(s)) + ": " + cudaGetErrorString(s);
    return 0;
  }
  if (n == 0) *why = "cudaGetDeviceCount reports 0 devices";
  return n;
}

pq_config base_config(int32_t backend) {
  pq_config c;
  pq_config_default(&c);
  c.num_layers = kLayers;
  c.num_q_heads = kQHeads;
  c.num_kv_heads = kKvHeads;
  c.head_dim = kHeadDim;
  c.dtype = PQ_DTYPE_F32;
  c.kmeans_iterations = 8;
  c.backend = backend;
  return c;
}

TEST(CudaBackend, AutoFallsBackToCpuOrUsesTheDevice) {
  std::string why;
  int devices = cuda_devices(&why);
  pq_config c = base_config(PQ_BACKEND_AUTO);
  pq_context* ctx = nullptr;
  ASSERT_EQ(pq_create(&c, &ctx), PQ_OK) << pq_last_error();
  int32_t backend = -1;
  ASSERT_EQ(pq_get_backend(ctx, &backend), PQ_OK);
  EXPECT_EQ(backend, devices > 0 ? PQ_BACKEND_CUDA : PQ_BACKEND_CPU);
  pq_destroy(ctx);
}

TEST(CudaBackend, ExplicitCudaWithoutDeviceIsNotFound) {
  std::string why;
  if (cuda_devices(&why) > 0) GTEST_SKIP() << "a CUDA device is present; this checks the no-GPU path";
  pq_config c = base_config(PQ_BACKEND_CUDA);
  pq_context* ctx = nullptr;
  EXPECT_EQ(pq_create(&c, &ctx), PQ_ERR_NOT_FOUND);
  EXPECT_EQ(ctx, nullptr);
  EXPECT_NE(std::string(pq_last_error()).find("CUDA"), std::string::npos) << pq_last_error();
}

TEST(CudaBackend, MissingPluginIsNotFoundWithThePath) {
  pq_config c = base_config(PQ_BACKEND_CUDA);
  c.cuda_plugin_path = "/nonexistent/libpqcache_cuda.so";
  pq_context* ctx = nullptr;
  EXPECT_EQ(pq_create(&c, &ctx), PQ_ERR_NOT_FOUND);
  EXPECT_NE(std::string(pq_last_error()).find("/nonexistent/libpqcache_cuda.so"), std::string::npos)
      << pq_last_error();
}

template <typename T>
T* device_copy_of(const std::vector<T>& host) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

TEST(CudaBackend, DeviceTensorsMatchTheCpuBackend) {
  std::string why;
  if (cuda_devices(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  // Head-major [heads][tokens][dim], as Hugging Face keeps it.
  std::vector<float> keys(static_cast<size_t>(kKvHeads) * kTokens * kHeadDim), values(keys.size());
  for (auto& x : keys) x = normal(rng);
  for (auto& x : values) x = normal(rng);
  std::vector<float> query(static_cast<size_t>(kQHeads) * kHeadDim);
  for (auto& x : query) x = normal(rng);

  pq_config cpu_cfg = base_config(PQ_BACKEND_CPU), gpu_cfg = base_config(PQ_BACKEND_CUDA);
  pq_context *cpu = nullptr, *gpu = nullptr;
  ASSERT_EQ(pq_create(&cpu_cfg, &cpu), PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_create(&gpu_cfg, &gpu), PQ_OK) << pq_last_error();
  for (pq_context* ctx : {cpu, gpu}) ASSERT_EQ(pq_sequence_add(ctx, 1), PQ_OK);

  float* d_keys = device_copy_of(keys);
  float* d_values = device_copy_of(values);
  float* d_query = device_copy_of(query);
  pq_tensor hk, hv, hq, dk, dv, dq;
  pq_tensor_init(&hk, keys.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, kTokens, kKvHeads, kHeadDim);
  pq_tensor_init(&hv, values.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, kTokens, kKvHeads, kHeadDim);
  pq_tensor_init(&hq, query.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 1, kQHeads, kHeadDim);
  dk = hk, dv = hv, dq = hq;
  dk.data = d_keys, dv.data = d_values, dq.data = d_query;
  dk.memory = dv.memory = dq.memory = PQ_MEMORY_DEVICE;

  ASSERT_EQ(pq_prefill_layer(cpu, 1, 1, &hk, &hv), PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_prefill_layer(gpu, 1, 1, &dk, &dv), PQ_OK) << pq_last_error();

  int64_t cap = 0;
  ASSERT_EQ(pq_selection_capacity(gpu, 1, 1, &cap), PQ_OK);
  std::vector<int32_t> cpu_pos(kKvHeads * cap), gpu_pos(kKvHeads * cap), cpu_n(kKvHeads), gpu_n(kKvHeads);
  pq_selection cpu_sel{cpu_pos.data(), cpu_n.data(), cap}, gpu_sel{gpu_pos.data(), gpu_n.data(), cap};
  ASSERT_EQ(pq_decode_select(cpu, 1, 1, &hq, &cpu_sel), PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_decode_select(gpu, 1, 1, &dq, &gpu_sel), PQ_OK) << pq_last_error();
  EXPECT_EQ(cpu_n, gpu_n);
  EXPECT_EQ(cpu_pos, gpu_pos);

  // Device outputs with a padded token stride: the padding must survive.
  const int64_t stride = kHeadDim + 16;
  std::vector<float> sentinel(static_cast<size_t>(kKvHeads) * cap * stride, -7.0f);
  float* d_out_k = device_copy_of(sentinel);
  float* d_out_v = device_copy_of(sentinel);
  pq_tensor ok{d_out_k, PQ_DTYPE_F32, PQ_MEMORY_DEVICE, cap, kKvHeads, kHeadDim, stride, cap * stride};
  pq_tensor ov = ok;
  ov.data = d_out_v;
  ASSERT_EQ(pq_fetch_kv(gpu, 1, 1, &gpu_sel, &ok, &ov), PQ_OK) << pq_last_error();
  std::vector<float> got_k(sentinel.size()), got_v(sentinel.size());
  ASSERT_EQ(cudaMemcpy(got_k.data(), d_out_k, got_k.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got_v.data(), d_out_v, got_v.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int h = 0; h < kKvHeads; ++h)
    for (int64_t i = 0; i < cap; ++i) {
      const float* rk = got_k.data() + (h * cap + i) * stride;
      const float* rv = got_v.data() + (h * cap + i) * stride;
      if (i < gpu_n[h]) {
        int32_t p = gpu_pos[h * cap + i];
        ASSERT_EQ(std::memcmp(rk, keys.data() + (static_cast<size_t>(h) * kTokens + p) * kHeadDim, kHeadDim * 4), 0);
        ASSERT_EQ(std::memcmp(rv, values.data() + (static_cast<size_t>(h) * kTokens + p) * kHeadDim, kHeadDim * 4), 0);
      }
      for (int64_t d = kHeadDim; d < stride; ++d) ASSERT_EQ(rk[d], -7.0f) << "padding overwritten";
    }

  // A host pointer labelled device memory is refused with a message.
  pq_tensor lie = hq;
  lie.memory = PQ_MEMORY_DEVICE;
  EXPECT_EQ(pq_decode_select(gpu, 1, 1, &lie, &gpu_sel), PQ_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pq_last_error()).find("device"), std::string::npos) << pq_last_error();

  for (void* p : {static_cast<void*>(d_keys), static_cast<void*>(d_values), static_cast<void*>(d_query),
                  static_cast<void*>(d_out_k), static_cast<void*>(d_out_v)})
    cudaFree(p);
  pq_destroy(cpu);
  pq_destroy(gpu);
}

}  // namespace

namespace {

// PQ selection through the plug-in's kernels (scan, GQA combine, radix top-k
// on the GPU) against the CPU backend on the same data: with MAX the scores
// are bit-identical, so the sets must be equal; with the softmax combine the
// sums differ in order, so near ties may swap.
TEST(CudaBackend, PqSelectionOnTheGpuMatchesTheCpu) {
  std::string why;
  if (cuda_devices(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  constexpr int kKv = 4, kQ = 16, kDim = 64, kN = 20000;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> keys(static_cast<size_t>(kN) * kKv * kDim);
  for (auto& x : keys) x = normal(rng);
  std::vector<float> query(static_cast<size_t>(kQ) * kDim);
  for (auto& x : query) x = normal(rng);
  pq_tensor k, q;
  pq_tensor_init(&k, keys.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, kN, kKv, kDim);
  pq_tensor_init(&q, query.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 1, kQ, kDim);
  // Also the 0.7 index options: rotary pairs (the host builds the lookup
  // table) and exact re-ranking of the device's candidates on the host.
  for (int32_t variant : {0, 1})
  for (int32_t combine : {PQ_GQA_MAX, PQ_GQA_MEAN, PQ_GQA_SUM_SOFTMAX}) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    std::vector<std::vector<int32_t>> rows[2];
    for (int32_t backend : {PQ_BACKEND_CPU, PQ_BACKEND_CUDA}) {
      pq_config c;
      pq_config_default(&c);
      c.num_layers = 1, c.num_q_heads = kQ, c.num_kv_heads = kKv, c.head_dim = kDim;
      c.dtype = PQ_DTYPE_F32, c.kmeans_iterations = 4, c.gqa_combine = combine;
      c.backend = backend;
      if (variant == 1) c.key_rotary = PQ_ROTARY_HALF, c.pq_rerank = 0.5f;
      pq_context* ctx = nullptr;
      ASSERT_EQ(pq_create(&c, &ctx), PQ_OK) << pq_last_error();
      ASSERT_EQ(pq_sequence_add(ctx, 1), PQ_OK);
      ASSERT_EQ(pq_prefill_layer(ctx, 1, 0, &k, &k), PQ_OK) << pq_last_error();
      int64_t cap = 0;
      ASSERT_EQ(pq_selection_capacity(ctx, 1, 0, &cap), PQ_OK);
      std::vector<int32_t> pos(kKv * cap), cnt(kKv);
      pq_selection sel{pos.data(), cnt.data(), cap};
      ASSERT_EQ(pq_decode_select(ctx, 1, 0, &q, &sel), PQ_OK) << pq_last_error();
      for (int h = 0; h < kKv; ++h)
        rows[backend == PQ_BACKEND_CUDA].emplace_back(pos.begin() + h * cap,
                                                      pos.begin() + h * cap + cnt[h]);
      pq_destroy(ctx);
    }
    for (int h = 0; h < kKv; ++h) {
      ASSERT_EQ(rows[0][h].size(), rows[1][h].size());
      if (combine != PQ_GQA_SUM_SOFTMAX) {
        EXPECT_EQ(rows[0][h], rows[1][h]) << "combine " << combine << " head " << h;
      } else {
        std::vector<int32_t> common;
        std::set_intersection(rows[0][h].begin(), rows[0][h].end(), rows[1][h].begin(),
                              rows[1][h].end(), std::back_inserter(common));
        EXPECT_GE(common.size(), rows[0][h].size() * 995 / 1000) << "head " << h;
      }
    }
  }
}

}  // namespace

namespace {

// Decode steps on the GPU path with everything the plug-in does: resident codes
// extended as tokens leave the local window, the caller's stream, and
// pq_fetch_kv into device memory through the block cache. Every step's
// selection must equal the CPU backend's (MAX combine: identical scores),
// every fetched row must equal the appended data, and the cache must hit.
TEST(CudaBackend, DecodeStepsWithResidentCodesStreamAndBlockCache) {
  std::string why;
  if (cuda_devices(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  constexpr int kKv = 2, kQ = 8, kDim = 64, kPrompt = 4096, kSteps = 40;
  std::mt19937 rng(23);
  std::normal_distribution<float> normal;
  const int total = kPrompt + kSteps;
  std::vector<float> keys(static_cast<size_t>(total) * kKv * kDim), values(keys.size());
  for (auto& x : keys) x = normal(rng);
  for (auto& x : values) x = normal(rng);
  std::vector<float> query(static_cast<size_t>(kQ) * kDim);
  for (auto& x : query) x = normal(rng);

  pq_context* ctx[2] = {nullptr, nullptr};
  for (int b = 0; b < 2; ++b) {
    pq_config c;
    pq_config_default(&c);
    c.num_layers = 1, c.num_q_heads = kQ, c.num_kv_heads = kKv, c.head_dim = kDim;
    c.dtype = PQ_DTYPE_F32, c.kmeans_iterations = 4, c.gqa_combine = PQ_GQA_MAX;
    c.local_tokens = 16, c.cache_tokens = 1024, c.cache_block_tokens = 128;
    c.backend = b ? PQ_BACKEND_CUDA : PQ_BACKEND_CPU;
    ASSERT_EQ(pq_create(&c, &ctx[b]), PQ_OK) << pq_last_error();
    ASSERT_EQ(pq_sequence_add(ctx[b], 1), PQ_OK);
  }
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(pq_sequence_set_stream(ctx[1], 1, stream), PQ_OK) << pq_last_error();

  pq_tensor k, v, q;
  pq_tensor_init(&k, keys.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, kPrompt, kKv, kDim);
  pq_tensor_init(&v, values.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, kPrompt, kKv, kDim);
  pq_tensor_init(&q, query.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 1, kQ, kDim);
  for (pq_context* c : ctx) ASSERT_EQ(pq_prefill_layer(c, 1, 0, &k, &v), PQ_OK) << pq_last_error();

  for (int step = 0; step < kSteps; ++step) {
    const size_t at = static_cast<size_t>(kPrompt + step) * kKv * kDim;
    pq_tensor k1, v1;
    pq_tensor_init(&k1, keys.data() + at, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 1, kKv, kDim);
    pq_tensor_init(&v1, values.data() + at, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 1, kKv, kDim);
    int64_t cap = 0;
    std::vector<int32_t> pos[2], cnt[2];
    for (int b = 0; b < 2; ++b) {
      ASSERT_EQ(pq_decode_append(ctx[b], 1, 0, &k1, &v1), PQ_OK) << pq_last_error();
      ASSERT_EQ(pq_selection_capacity(ctx[b], 1, 0, &cap), PQ_OK);
      pos[b].assign(kKv * cap, -1);
      cnt[b].assign(kKv, 0);
      pq_selection sel{pos[b].data(), cnt[b].data(), cap};
      ASSERT_EQ(pq_decode_select(ctx[b], 1, 0, &q, &sel), PQ_OK) << pq_last_error();
    }
    ASSERT_EQ(pos[0], pos[1]) << "step " << step;

    std::vector<float> out(static_cast<size_t>(kKv) * cap * kDim);
    float* d_k = nullptr;
    float* d_v = nullptr;
    ASSERT_EQ(cudaMalloc(&d_k, out.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_v, out.size() * 4), cudaSuccess);
    pq_tensor ok, ov;
    pq_tensor_init(&ok, d_k, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, cap, kKv, kDim);
    pq_tensor_init(&ov, d_v, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, cap, kKv, kDim);
    ok.memory = ov.memory = PQ_MEMORY_DEVICE;
    pq_selection sel{pos[1].data(), cnt[1].data(), cap};
    ASSERT_EQ(pq_fetch_kv(ctx[1], 1, 0, &sel, &ok, &ov), PQ_OK) << pq_last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<float> got_k(out.size()), got_v(out.size());
    ASSERT_EQ(cudaMemcpy(got_k.data(), d_k, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(got_v.data(), d_v, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int h = 0; h < kKv; ++h)
      for (int i = 0; i < cnt[1][h]; ++i) {
        const size_t src = (static_cast<size_t>(pos[1][h * cap + i]) * kKv + h) * kDim;
        const size_t dst = (static_cast<size_t>(h) * cap + i) * kDim;
        ASSERT_EQ(std::memcmp(got_k.data() + dst, keys.data() + src, kDim * 4), 0)
            << "step " << step << " head " << h << " row " << i;
        ASSERT_EQ(std::memcmp(got_v.data() + dst, values.data() + src, kDim * 4), 0)
            << "step " << step << " head " << h << " row " << i;
      }
    cudaFree(d_k);
    cudaFree(d_v);
  }
  pq_stats s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  ASSERT_EQ(pq_stats_get(ctx[1], &s), PQ_OK);
  EXPECT_GT(s.cache_hits, 0u) << "the same query every step must hit the cache";
  ASSERT_EQ(pq_sequence_set_stream(ctx[1], 1, nullptr), PQ_OK);
  cudaStreamDestroy(stream);
  for (pq_context* c : ctx) pq_destroy(c);
}

}  // namespace

namespace {

// An asynchronous prefill from device memory whose keys hold a NaN: the
// call returns PQ_OK (the copy is in flight), the next call on the layer
// reports the NaN once, nothing was stored, and the layer stays usable.
TEST(CudaBackend, AsynchronousPrefillReportsBadDataAtTheNextCall) {
  std::string why;
  if (cuda_devices(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  pq_config c = base_config(PQ_BACKEND_CUDA);
  pq_context* ctx = nullptr;
  ASSERT_EQ(pq_create(&c, &ctx), PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_sequence_add(ctx, 1), PQ_OK);
  std::vector<float> keys(static_cast<size_t>(kTokens) * kKvHeads * kHeadDim, 0.5f);
  keys[12345] = std::nanf("");
  float* d_keys = device_copy_of(keys);
  keys[12345] = 0.5f;
  float* d_good = device_copy_of(keys);
  pq_tensor k, v;
  pq_tensor_init(&k, d_keys, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, kTokens, kKvHeads, kHeadDim);
  pq_tensor_init(&v, d_good, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, kTokens, kKvHeads, kHeadDim);
  k.memory = v.memory = PQ_MEMORY_DEVICE;
  ASSERT_EQ(pq_prefill_layer(ctx, 1, 0, &k, &v), PQ_OK) << pq_last_error();
  int64_t length = -1;
  EXPECT_EQ(pq_sequence_length(ctx, 1, 0, &length), PQ_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pq_last_error()).find("asynchronous"), std::string::npos) << pq_last_error();
  ASSERT_EQ(pq_sequence_length(ctx, 1, 0, &length), PQ_OK) << "reported once";
  EXPECT_EQ(length, 0) << "nothing stored";
  k.data = d_good;
  ASSERT_EQ(pq_prefill_layer(ctx, 1, 0, &k, &v), PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_sequence_length(ctx, 1, 0, &length), PQ_OK) << pq_last_error();
  EXPECT_EQ(length, kTokens);
  cudaFree(d_keys);
  cudaFree(d_good);
  pq_destroy(ctx);
}

}  // namespace
