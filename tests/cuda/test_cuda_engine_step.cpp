// What a serving engine selects on a real GPU through the public API (issue
// 42): an index-only context (PQ_KV_TIER_CALLER; keys from device memory,
// no values) selects on the device, single and batched, what a host-tier
// context selects with the host-positions call; and several query tokens
// in one select on the device (pq_decode_select_multi_device) write, for
// every row form, the rows pq_decode_select_multi writes, on host-tier and
// index-only contexts. MAX combine: bit-identical on the device and the
// host. Without a GPU every test reports SKIPPED with the reason (the same
// logic runs on every build through the host fake of the plug-in:
// tests/cuda_fake/test_cuda_fake_index_only.cpp and _multi.cpp).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <pqcache.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "api_gpu_util.h"

namespace {

// MAX combine and rotate-half, on the tier given.
pq_context* tier_context(int32_t tier) {
  return make_context(PQ_GQA_MAX, PQ_ROTARY_HALF, 0.f, tier);
}

pq_tensor tensor(const void* data, int64_t tokens, int32_t heads, int32_t memory) {
  pq_tensor t;
  pq_tensor_init(&t, const_cast<void*>(data), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, tokens, heads,
                 kDim);
  t.memory = memory;
  return t;
}

// `tokens` keys (seeded by id) appended to seq `id`: K/V from host memory on
// a host-tier context, the keys from device memory with no values on an
// index-only one.
void add_tokens(pq_context* ctx, bool index_only, uint64_t id, int64_t first, int64_t tokens) {
  const std::vector<uint16_t> k =
      random_f16(static_cast<size_t>(tokens) * kKvHeads * kDim, static_cast<uint32_t>(id * 7919 + first));
  const bool prefill = first == 0;
  if (prefill) ASSERT_EQ(pq_sequence_add(ctx, id), PQ_OK);
  pq_status s;
  if (index_only) {
    Dev<uint16_t> dk(k.size(), k.data());
    const pq_tensor kt = tensor(dk.p, tokens, kKvHeads, PQ_MEMORY_DEVICE);
    s = prefill ? pq_prefill_layer(ctx, id, 0, &kt, nullptr) : pq_decode_append(ctx, id, 0, &kt, nullptr);
    ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);  // the device keys are read before dk goes
  } else {
    const pq_tensor kt = tensor(k.data(), tokens, kKvHeads, PQ_MEMORY_HOST);
    s = prefill ? pq_prefill_layer(ctx, id, 0, &kt, &kt) : pq_decode_append(ctx, id, 0, &kt, &kt);
  }
  ASSERT_EQ(s, PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
}

TEST(CudaIndexOnly, TheDeviceSelectsWhatTheHostTierSelects) {
  REQUIRE_GPU();
  pq_context* host = tier_context(PQ_KV_TIER_HOST);
  pq_context* index = tier_context(PQ_KV_TIER_CALLER);
  ASSERT_TRUE(host != nullptr && index != nullptr);
  const int n = 4;
  for (int i = 0; i < n; ++i)
    for (pq_context* ctx : {host, index}) add_tokens(ctx, ctx == index, 10 + i, 0, 3000 + 2500 * i);
  for (int step = 0; step < 6; ++step) {
    std::vector<std::vector<int32_t>> want(n), want_counts(n);
    std::vector<std::unique_ptr<Dev<int32_t>>> pos, cnt;
    std::vector<pq_select_item> items(n);
    const std::vector<uint16_t> q = random_f16(static_cast<size_t>(kQHeads) * kDim, 50 + step);
    Dev<uint16_t> dq(q.size(), q.data());
    for (int i = 0; i < n; ++i) {
      for (pq_context* ctx : {host, index}) {
        pq_layer_info info{};
        info.struct_size = sizeof info;
        ASSERT_EQ(pq_layer_info_get(ctx, 10 + i, 0, &info), PQ_OK) << pq_last_error();
        add_tokens(ctx, ctx == index, 10 + i, info.tokens, 1);
      }
      int64_t cap = 0;
      ASSERT_EQ(pq_selection_capacity(host, 10 + i, 0, &cap), PQ_OK);
      want[i].assign(kKvHeads * cap, -1), want_counts[i].assign(kKvHeads, -1);
      pq_selection w{want[i].data(), want_counts[i].data(), cap};
      const pq_tensor hq = tensor(q.data(), 1, kQHeads, PQ_MEMORY_HOST);
      ASSERT_EQ(pq_decode_select(host, 10 + i, 0, &hq, &w), PQ_OK) << pq_last_error();
      pos.push_back(std::make_unique<Dev<int32_t>>(kKvHeads * cap));
      cnt.push_back(std::make_unique<Dev<int32_t>>(kKvHeads));
      items[i] = pq_select_item{static_cast<uint64_t>(10 + i),
                                tensor(dq.p, 1, kQHeads, PQ_MEMORY_DEVICE),
                                pq_selection{pos[i]->p, cnt[i]->p, cap}, PQ_OK};
    }
    if (step % 2 == 0) {
      for (int i = 0; i < n; ++i)
        ASSERT_EQ(pq_decode_select_device(index, items[i].seq_id, 0, &items[i].query, &items[i].out),
                  PQ_OK)
            << pq_last_error();
    } else {
      ASSERT_EQ(pq_decode_select_device_batch(index, 0, items.data(), n), PQ_OK) << pq_last_error();
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(cnt[i]->get(), want_counts[i]) << "step " << step << " seq " << i;
      EXPECT_EQ(pos[i]->get(), want[i]) << "step " << step << " seq " << i;
    }
  }
  pq_destroy(index);
  pq_destroy(host);
}

TEST(CudaSelectMulti, EveryRowFormIsTheHostCallsRows) {
  REQUIRE_GPU();
  for (int32_t tier : {PQ_KV_TIER_HOST, PQ_KV_TIER_CALLER}) {
    pq_context* ctx = tier_context(tier);
    ASSERT_NE(ctx, nullptr);
    add_tokens(ctx, tier == PQ_KV_TIER_CALLER, 1, 0, 12000);
    for (int64_t q : {1, 4, 16}) {
      const std::vector<uint16_t> queries =
          random_f16(static_cast<size_t>(q) * kQHeads * kDim, static_cast<uint32_t>(q));
      Dev<uint16_t> dq(queries.size(), queries.data());
      const pq_tensor hq = tensor(queries.data(), q, kQHeads, PQ_MEMORY_HOST);
      const pq_tensor devq = tensor(dq.p, q, kQHeads, PQ_MEMORY_DEVICE);
      for (int32_t form : {PQ_ROWS_PER_TOKEN, PQ_ROWS_PER_HEAD, PQ_ROWS_PER_REQUEST}) {
        SCOPED_TRACE("tier " + std::to_string(tier) + " q " + std::to_string(q) + " form " +
                     std::to_string(form));
        int64_t rows = 0, cap = 0;
        ASSERT_EQ(pq_selection_capacity_multi(ctx, 1, 0, q, form, &rows, &cap), PQ_OK);
        std::vector<int32_t> want(static_cast<size_t>(rows * cap), 7), want_counts(rows, 7);
        pq_selection w{want.data(), want_counts.data(), cap};
        ASSERT_EQ(pq_decode_select_multi(ctx, 1, 0, &hq, form, nullptr, &w), PQ_OK)
            << pq_last_error();
        Dev<int32_t> pos(want.size()), cnt(want_counts.size());
        pq_selection got{pos.p, cnt.p, cap};
        ASSERT_EQ(pq_decode_select_multi_device(ctx, 1, 0, &devq, form, &got), PQ_OK)
            << pq_last_error();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(cnt.get(), want_counts);
        EXPECT_EQ(pos.get(), want) << "rows, then -1 to the capacity";
      }
    }
    pq_destroy(ctx);
  }
}

}  // namespace
