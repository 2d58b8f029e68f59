// fp8 K/V (0.10) on the CUDA backend through the host fake of its plug-in:
// K/V landed from device memory (their non-finite check runs on the host
// when they land), the lookup table built on the device from an f16 query
// (the query keeps its own dtype; the centroids hold the scaled keys), and
// the device gather, which moves the codes as bytes: selections and fetched
// bytes equal the CPU backend's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "api_test_util.h"
#include "fake_test_util.h"

namespace {

constexpr int32_t kDtype = PQ_DTYPE_FP8_E4M3;

// Finite e4m3 codes (0x7F and 0xFF are NaN), magnitudes up to 2^3.
std::vector<uint8_t> codes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (uint8_t& c : out) c = static_cast<uint8_t>((rng() % 0x58) | (rng() & 0x80));
  return out;
}

pq_tensor view(void* data, int32_t dtype, int64_t tokens, int32_t heads, int32_t layout,
               int32_t memory = PQ_MEMORY_HOST) {
  pq_tensor t;
  EXPECT_EQ(pq_tensor_init(&t, data, dtype, layout, tokens, heads, kDim), PQ_OK);
  t.memory = memory;
  return t;
}

pq_config fp8_config(const std::vector<float>& scales) {
  pq_config c = base_config(kDtype);
  c.kv_scale_count = kKvHeads;
  c.kv_scales = scales.data();
  return c;
}

TEST(FakeCudaFp8, DeviceStepMatchesTheCpuOnCodesAndScales) {
  ASSERT_NE(Fake::get().table, nullptr) << "cannot open " << PQ_FAKE_CUDA_PLUGIN_FILE;
  std::vector<float> scales(static_cast<size_t>(kLayers) * 2 * kKvHeads);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.3f + 0.45f * static_cast<float>(i);
  Ctx cpu(fp8_config(scales));
  Ctx cuda = make_fake_cuda_ctx(fp8_config(scales));
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << pq_last_error();
  constexpr int64_t kTokens = 700;
  for (pq_context* ctx : {cpu.get(), cuda.get()}) ASSERT_EQ(pq_sequence_add(ctx, 1), PQ_OK);
  for (int32_t l = 0; l < kLayers; ++l) {
    std::vector<uint8_t> k = codes(kTokens * kKvHeads * kDim, 10 + l);
    std::vector<uint8_t> v = codes(kTokens * kKvHeads * kDim, 20 + l);
    pq_tensor hk = view(k.data(), kDtype, kTokens, kKvHeads, PQ_LAYOUT_TOKEN_MAJOR);
    pq_tensor hv = view(v.data(), kDtype, kTokens, kKvHeads, PQ_LAYOUT_TOKEN_MAJOR);
    ASSERT_EQ(pq_prefill_layer(cpu, 1, l, &hk, &hv), PQ_OK) << pq_last_error();
    DeviceBuffer dk(k.size()), dv(v.size());
    dk.upload(k.data(), k.size());
    dv.upload(v.data(), v.size());
    pq_tensor tk = view(dk.get(), kDtype, kTokens, kKvHeads, PQ_LAYOUT_TOKEN_MAJOR, PQ_MEMORY_DEVICE);
    pq_tensor tv = view(dv.get(), kDtype, kTokens, kKvHeads, PQ_LAYOUT_TOKEN_MAJOR, PQ_MEMORY_DEVICE);
    ASSERT_EQ(pq_prefill_layer(cuda, 1, l, &tk, &tv), PQ_OK) << pq_last_error();
    ASSERT_EQ(pq_wait_builds(cuda), PQ_OK);  // the device copy has landed before dk goes
  }
  ASSERT_EQ(pq_wait_builds(cpu), PQ_OK);
  for (int64_t step = 0; step < 8; ++step)
    for (int32_t l = 0; l < kLayers; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l) + " step " + std::to_string(step));
      std::vector<uint8_t> k = codes(kKvHeads * kDim, 100 + step), v = codes(kKvHeads * kDim, 200 + step);
      pq_tensor tk = view(k.data(), kDtype, 1, kKvHeads, PQ_LAYOUT_TOKEN_MAJOR);
      pq_tensor tv = view(v.data(), kDtype, 1, kKvHeads, PQ_LAYOUT_TOKEN_MAJOR);
      for (pq_context* ctx : {cpu.get(), cuda.get()})
        ASSERT_EQ(pq_decode_append(ctx, 1, l, &tk, &tv), PQ_OK) << pq_last_error();
      // The query in f16 (its own dtype), on the host for the CPU and on the device.
      HostTensor q = make_tensor(random_normal(kQHeads * kDim, 300 + step), 1, kQHeads, kDim,
                                 PQ_DTYPE_F16);
      const int64_t cap = selection_capacity(cpu, 1, l);
      Sel want(kKvHeads, cap);
      ASSERT_EQ(pq_decode_select(cpu, 1, l, q.get(), want.get()), PQ_OK) << pq_last_error();
      DeviceTensor dq(q);
      // The selection's arrays in device memory (filled by the device, read by its gather).
      DeviceBuffer positions(static_cast<size_t>(kKvHeads * cap) * 4), counts(kKvHeads * 4);
      pq_selection got{static_cast<int32_t*>(positions.get()),
                       static_cast<int32_t*>(counts.get()), cap};
      ASSERT_EQ(pq_decode_select_device(cuda, 1, l, &dq.t, &got), PQ_OK) << pq_last_error();
      const size_t bytes = static_cast<size_t>(cap) * kKvHeads * kDim;  // one byte a code
      std::vector<uint8_t> hk(bytes, 0), hv(bytes, 0), zeros(bytes, 0);
      pq_tensor ok = view(hk.data(), kDtype, cap, kKvHeads, PQ_LAYOUT_HEAD_MAJOR);
      pq_tensor ov = view(hv.data(), kDtype, cap, kKvHeads, PQ_LAYOUT_HEAD_MAJOR);
      ASSERT_EQ(pq_fetch_kv(cpu, 1, l, want.get(), &ok, &ov), PQ_OK) << pq_last_error();
      DeviceBuffer dk(bytes), dv(bytes);
      dk.upload(zeros.data(), bytes);
      dv.upload(zeros.data(), bytes);
      pq_tensor odk = view(dk.get(), kDtype, cap, kKvHeads, PQ_LAYOUT_HEAD_MAJOR, PQ_MEMORY_DEVICE);
      pq_tensor odv = view(dv.get(), kDtype, cap, kKvHeads, PQ_LAYOUT_HEAD_MAJOR, PQ_MEMORY_DEVICE);
      ASSERT_EQ(pq_fetch_kv_device(cuda, 1, l, &got, &odk, &odv), PQ_OK) << pq_last_error();
      char err[256] = {0};
      ASSERT_EQ(Fake::get().table->stream_synchronize(nullptr, err, sizeof err), 0) << err;
      ASSERT_TRUE(dk.download() == hk) << "fetched key codes differ";
      ASSERT_TRUE(dv.download() == hv) << "fetched value codes differ";
      // The host select of the CUDA context chooses the same.
      Sel host(kKvHeads, cap);
      ASSERT_EQ(pq_decode_select(cuda, 1, l, q.get(), host.get()), PQ_OK) << pq_last_error();
      for (int32_t h = 0; h < kKvHeads; ++h) ASSERT_EQ(host.row(h), want.row(h)) << "head " << h;
    }
}

TEST(FakeCudaFp8, ANaNCodeLandedFromTheDeviceIsTheNextCallsError) {
  ASSERT_NE(Fake::get().table, nullptr) << "cannot open " << PQ_FAKE_CUDA_PLUGIN_FILE;
  std::vector<float> scales(static_cast<size_t>(kLayers) * 2 * kKvHeads, 1.f);
  Ctx cuda = make_fake_cuda_ctx(fp8_config(scales));
  ASSERT_TRUE(cuda.ok()) << pq_last_error();
  ASSERT_EQ(pq_sequence_add(cuda, 1), PQ_OK);
  constexpr int64_t kTokens = 40;
  std::vector<uint8_t> k = codes(kTokens * kKvHeads * kDim, 1), v = k;
  k[(7 * kKvHeads + 1) * kDim + 3] = 0xFF;  // token 7, kv head 1: NaN
  DeviceBuffer dk(k.size()), dv(v.size());
  dk.upload(k.data(), k.size());
  dv.upload(v.data(), v.size());
  pq_tensor tk = view(dk.get(), kDtype, kTokens, kKvHeads, PQ_LAYOUT_TOKEN_MAJOR, PQ_MEMORY_DEVICE);
  pq_tensor tv = view(dv.get(), kDtype, kTokens, kKvHeads, PQ_LAYOUT_TOKEN_MAJOR, PQ_MEMORY_DEVICE);
  ASSERT_EQ(pq_prefill_layer(cuda, 1, 0, &tk, &tv), PQ_OK) << "checked when the copy lands";
  HostTensor q = make_tensor(random_normal(kQHeads * kDim, 2), 1, kQHeads, kDim, PQ_DTYPE_F32);
  Sel sel(kKvHeads, kTokens);
  PQ_EXPECT_ERR(pq_decode_select(cuda, 1, 0, q.get(), sel.get()), PQ_ERR_INVALID_ARGUMENT,
                "token 7");
  int64_t n = -1;
  ASSERT_EQ(pq_sequence_length(cuda, 1, 0, &n), PQ_OK);
  EXPECT_EQ(n, 0) << "nothing of the rejected prefill is stored";
}

}  // namespace
