// Index-only contexts (config.kv_tier PQ_KV_TIER_CALLER) on the CUDA
// backend (issue 42), through the host fake of the plug-in: the codes and
// centroids go to the device and the device step selects from them, single
// and batched, with the rotate-half pairing, what a host-tier context on
// the CPU backend selects; keys come as prefill and appends from device
// memory with no values. Nothing that needs K/V rows on the device runs:
// the fake copies no row (no window, no store, no cache slot), across a
// reserve, a truncate and the steps. Re-ranking, which needs the exact keys
// in the caller's pool, is refused by the device selects, naming the host
// call that takes the pool.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "api_test_util.h"
#include "fake_test_util.h"

namespace {

pq_config index_config(int32_t dtype, int32_t tier) {
  pq_config c = base_config(dtype);
  c.cache_tokens = 0;  // an index-only context caches no K/V
  c.key_rotary = PQ_ROTARY_HALF;
  c.kv_tier = tier;
  return c;
}

// A sequence on `host` (host tier: K/V from host memory) and on `index`
// (index-only: the same keys from device memory, values NULL), every layer.
void add_both(pq_context* host, pq_context* index, uint64_t id, int64_t tokens, int32_t dtype,
              uint64_t seed) {
  add_prefilled(host, id, tokens, dtype, seed);
  ASSERT_EQ(pq_sequence_add(index, id), PQ_OK);
  for (int32_t l = 0; l < kLayers; ++l) {
    DeviceTensor dk(prompt_kv(l, tokens, dtype, seed).k);
    ASSERT_EQ(pq_prefill_layer(index, id, l, &dk.t, nullptr), PQ_OK) << pq_last_error();
    ASSERT_EQ(pq_wait_builds(index), PQ_OK);  // the device keys are read before they go
  }
}

// One decode token: K/V on the host tier, the key from device memory on the
// index-only context (copied to the host, where it is coded).
void append_both(pq_context* host, pq_context* index, uint64_t id, int32_t l, Step& d) {
  ASSERT_EQ(pq_decode_append(host, id, l, d.k.get(), d.v.get()), PQ_OK) << pq_last_error();
  DeviceTensor dk(d.k);
  ASSERT_EQ(pq_decode_append(index, id, l, &dk.t, nullptr), PQ_OK) << pq_last_error();
}

TEST(FakeCudaIndexOnly, TheDeviceSelectsWhatAHostTierSelectsAndCopiesNoRow) {
  ASSERT_NE(Fake::get().table, nullptr) << "cannot open " << PQ_FAKE_CUDA_PLUGIN_FILE;
  for (int32_t dtype : {PQ_DTYPE_F32, PQ_DTYPE_BF16}) {
    SCOPED_TRACE("dtype " + std::to_string(dtype));
    Ctx host(index_config(dtype, PQ_KV_TIER_HOST));
    Ctx index = make_fake_cuda_ctx(index_config(dtype, PQ_KV_TIER_CALLER));
    ASSERT_TRUE(host.ok() && index.ok()) << pq_last_error();
    const pq_fake_cuda_counters start = Fake::get().counters();
    const int64_t prompt = 700, steps = 8;
    add_both(host, index, 1, prompt, dtype, 31);
    if (HasFatalFailure()) return;
    // The step's tables after a reserve (they follow each append), and a
    // truncate of decode tokens half-way.
    ASSERT_EQ(pq_sequence_reserve(index, 1, prompt + 2 * steps), PQ_OK) << pq_last_error();
    for (int64_t step = 0; step < steps; ++step) {
      if (step == steps / 2)
        for (pq_context* ctx : {host.get(), index.get()})
          ASSERT_EQ(pq_sequence_truncate(ctx, 1, prompt + step - 2), PQ_OK) << pq_last_error();
      for (int32_t l = 0; l < kLayers; ++l) {
        SCOPED_TRACE("layer " + std::to_string(l) + " step " + std::to_string(step));
        Step d = step_data(l, step, dtype, 31);
        append_both(host, index, 1, l, d);
        if (HasFatalFailure()) return;
        const int64_t cap = selection_capacity(host, 1, l);
        ASSERT_EQ(selection_capacity(index, 1, l), cap);
        Sel want(kKvHeads, cap);
        ASSERT_EQ(pq_decode_select(host, 1, l, d.q.get(), want.get()), PQ_OK) << pq_last_error();
        DeviceTensor dq(d.q);
        DeviceSel got(cap);
        const pq_fake_cuda_counters before = Fake::get().counters();
        ASSERT_EQ(pq_decode_select_device(index, 1, l, &dq.t, &got.s), PQ_OK) << pq_last_error();
        const pq_fake_cuda_counters used = counters_since(before);
        EXPECT_EQ(used.host_waits, 0u) << "the selection stays on the device";
        EXPECT_EQ(used.kernel_launches, 4u);  // LUT, scan, top-k, fill
        Fake::get().synchronize_all();
        for (int32_t h = 0; h < kKvHeads; ++h) ASSERT_EQ(got.row(h), want.row(h)) << "head " << h;
        // The host-positions select on the device backend too.
        Sel positions(kKvHeads, cap);
        ASSERT_EQ(pq_decode_select(index, 1, l, d.q.get(), positions.get()), PQ_OK);
        EXPECT_EQ(positions.positions, want.positions);
      }
    }
    EXPECT_EQ(counters_since(start).rows_copied, 0u)
        << "an index-only context keeps no K/V rows on the device";
  }
  // The counter is not vacuous: a host-tier context fills its window.
  Ctx stores = make_fake_cuda_ctx(index_config(PQ_DTYPE_F32, PQ_KV_TIER_HOST));
  const pq_fake_cuda_counters before = Fake::get().counters();
  add_prefilled(stores, 1, 300, PQ_DTYPE_F32, 5);
  EXPECT_GT(counters_since(before).rows_copied, 0u);
}

TEST(FakeCudaIndexOnly, OneBatchedLaunchChainSelectsForEverySequence) {
  ASSERT_NE(Fake::get().table, nullptr);
  Ctx host(index_config(PQ_DTYPE_F16, PQ_KV_TIER_HOST));
  Ctx index = make_fake_cuda_ctx(index_config(PQ_DTYPE_F16, PQ_KV_TIER_CALLER));
  ASSERT_TRUE(host.ok() && index.ok()) << pq_last_error();
  const pq_fake_cuda_counters start = Fake::get().counters();
  const int64_t lengths[] = {700, 333, 40, 512};  // 40: a middle shorter than k
  for (size_t i = 0; i < kBatchIds.size(); ++i)
    add_both(host, index, kBatchIds[i], lengths[i], PQ_DTYPE_F16, 3 * kBatchIds[i]);
  if (HasFatalFailure()) return;
  for (int64_t step = 0; step < 4; ++step) {
    const int32_t l = static_cast<int32_t>(step % kLayers);
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<Step> data;
    int64_t cap = 0;
    for (size_t i = 0; i < kBatchIds.size(); ++i) {
      data.push_back(step_data(l, step, PQ_DTYPE_F16, kBatchIds[i]));
      append_both(host, index, kBatchIds[i], l, data[i]);
      if (HasFatalFailure()) return;
      cap = std::max(cap, selection_capacity(host, kBatchIds[i], l));
    }
    std::vector<std::unique_ptr<DeviceTensor>> dq;
    std::vector<std::unique_ptr<DeviceSel>> got;
    std::vector<pq_select_item> items;
    for (size_t i = 0; i < kBatchIds.size(); ++i) {
      dq.push_back(std::make_unique<DeviceTensor>(data[i].q));
      got.push_back(std::make_unique<DeviceSel>(cap));
      items.push_back(pq_select_item{kBatchIds[i], dq.back()->t, got.back()->s, PQ_OK});
    }
    const pq_fake_cuda_counters before = Fake::get().counters();
    ASSERT_EQ(pq_decode_select_device_batch(index, l, items.data(),
                                            static_cast<int64_t>(items.size())),
              PQ_OK)
        << pq_last_error();
    const pq_fake_cuda_counters used = counters_since(before);
    EXPECT_EQ(used.host_waits, 0u);
    EXPECT_EQ(used.kernel_launches, 4u) << "LUTs, scan, top-k and fill of every item";
    Fake::get().synchronize_all();
    for (size_t i = 0; i < kBatchIds.size(); ++i) {
      Sel want(kKvHeads, cap);
      ASSERT_EQ(pq_decode_select(host, kBatchIds[i], l, data[i].q.get(), want.get()), PQ_OK);
      for (int32_t h = 0; h < kKvHeads; ++h)
        ASSERT_EQ(got[i]->row(h), want.row(h)) << "seq " << kBatchIds[i] << " head " << h;
    }
  }
  EXPECT_EQ(counters_since(start).rows_copied, 0u);
}

// Re-ranking reads exact keys, which an index-only context does not keep
// and the device calls are not given: refused there by name, with the way
// out (pq_decode_select_multi with the pool as keys), which selects what
// a host tier that re-ranks selects. What reads K/V stays refused.
TEST(FakeCudaIndexOnly, ReRankingOnTheDeviceIsRefusedNamingTheHostCall) {
  ASSERT_NE(Fake::get().table, nullptr);
  pq_config c = index_config(PQ_DTYPE_F32, PQ_KV_TIER_CALLER);
  c.pq_rerank = 1.f;
  Ctx index = make_fake_cuda_ctx(c);
  c.kv_tier = PQ_KV_TIER_HOST;
  Ctx host(c);
  ASSERT_TRUE(host.ok() && index.ok()) << pq_last_error();
  const int64_t n = 600;
  const std::vector<float> keys = random_normal(n * kKvHeads * kDim, 77);
  HostTensor k = make_tensor(keys, n, kKvHeads, kDim, PQ_DTYPE_F32);
  for (pq_context* ctx : {host.get(), index.get()}) {
    ASSERT_EQ(pq_sequence_add(ctx, 1), PQ_OK);
    ASSERT_EQ(pq_prefill_layer(ctx, 1, 0, k.get(), k.get()), PQ_OK) << pq_last_error();
  }
  Step d = step_data(0, 0, PQ_DTYPE_F32, 77);
  DeviceTensor dq(d.q);
  const int64_t cap = selection_capacity(host, 1, 0);
  DeviceSel sel(cap);
  PQ_EXPECT_ERR(pq_decode_select_device(index, 1, 0, &dq.t, &sel.s), PQ_ERR_UNSUPPORTED,
                "pq_decode_select_multi");
  pq_select_item item{1, dq.t, sel.s, PQ_OK};
  PQ_EXPECT_ERR(pq_decode_select_device_batch(index, 0, &item, 1), PQ_ERR_UNSUPPORTED,
                "pq_decode_select_multi");
  EXPECT_EQ(item.status, PQ_ERR_UNSUPPORTED);
  PQ_EXPECT_ERR(pq_decode_select_multi_device(index, 1, 0, &dq.t, PQ_ROWS_PER_TOKEN, &sel.s),
                PQ_ERR_UNSUPPORTED, "pq_paged_keys");
  // The way out: the host call with the pool (here dense) as keys.
  pq_paged_keys pool{};
  pool.pool = *k.get();
  Sel want(kKvHeads, cap), got(kKvHeads, cap);
  ASSERT_EQ(pq_decode_select(host, 1, 0, d.q.get(), want.get()), PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_decode_select_multi(index, 1, 0, d.q.get(), PQ_ROWS_PER_TOKEN, &pool, got.get()),
            PQ_OK)
      << pq_last_error();
  EXPECT_EQ(got.positions, want.positions);
  // No K/V: the device fetch is refused.
  DeviceBuffer out(static_cast<size_t>(cap) * kKvHeads * kDim * 4);
  pq_tensor ot = *make_tensor(std::vector<float>(cap * kKvHeads * kDim), cap, kKvHeads, kDim,
                              PQ_DTYPE_F32).get();
  ot.data = out.get();
  ot.memory = PQ_MEMORY_DEVICE;
  PQ_EXPECT_ERR(pq_fetch_kv_device(index, 1, 0, &sel.s, &ot, &ot), PQ_ERR_UNSUPPORTED,
                "index-only");
}

// AUTO picks the CUDA backend for an index-only context as for the host
// tier (the fake has a device).
TEST(FakeCudaIndexOnly, AutoPicksTheDevice) {
  ASSERT_NE(Fake::get().table, nullptr);
  pq_config c = index_config(PQ_DTYPE_F32, PQ_KV_TIER_CALLER);
  c.backend = PQ_BACKEND_AUTO;
  c.cuda_plugin_path = PQ_FAKE_CUDA_PLUGIN_FILE;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  int32_t backend = -1;
  ASSERT_EQ(pq_get_backend(ctx, &backend), PQ_OK);
  EXPECT_EQ(backend, PQ_BACKEND_CUDA);
}

}  // namespace
