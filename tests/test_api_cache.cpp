// The block cache through the public API (config fields, hit counters) and
// pq_sequence_set_stream on the CPU backend.
#include <gtest/gtest.h>

#include <vector>

#include "api_test_util.h"

namespace {

using namespace pqt;

constexpr int32_t kKvHeads = 2, kQHeads = 4, kDim = 16;

pq_config cache_config(int64_t cache_tokens, int32_t policy = PQ_CACHE_LRU) {
  pq_config c = make_config(1, kQHeads, kKvHeads, kDim);
  c.selector = PQ_SELECTOR_EXACT;  // scores by the keys: repeatable selections
  c.sink_tokens = 4;
  c.local_tokens = 16;
  c.topk_tokens = 32;
  c.cache_tokens = cache_tokens;
  c.cache_block_tokens = 16;
  c.cache_policy = policy;
  c.worker_threads = 1;
  return c;
}

// The middle tokens one fetch counts: topk_tokens per kv head (sinks and
// the local window are not counted).
constexpr int64_t kMiddlePerFetch = 32 * kKvHeads;

// One select + fetch with `query`; returns the fetched K then V bytes.
std::vector<unsigned char> select_and_fetch(pq_context* ctx, const std::vector<float>& query) {
  const int64_t cap = selection_capacity(ctx, 1, 0);
  Sel sel(kKvHeads, cap);
  HostTensor q = make_tensor(query, 1, kQHeads, kDim, PQ_DTYPE_F32);
  EXPECT_TRUE(IsOk(pq_decode_select(ctx, 1, 0, q.get(), sel.get())));
  std::vector<float> zeros(static_cast<size_t>(cap * kKvHeads * kDim));
  HostTensor k = make_tensor(zeros, cap, kKvHeads, kDim, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR);
  HostTensor v = make_tensor(zeros, cap, kKvHeads, kDim, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR);
  EXPECT_TRUE(IsOk(pq_fetch_kv(ctx, 1, 0, sel.get(), k.get(), v.get())));
  std::vector<unsigned char> bytes = k.bytes;
  bytes.insert(bytes.end(), v.bytes.begin(), v.bytes.end());
  return bytes;
}

Ctx prefilled(const pq_config& c, int64_t tokens) {
  Ctx ctx(c);
  EXPECT_TRUE(ctx.ok()) << pq_last_error();
  EXPECT_TRUE(IsOk(pq_sequence_add(ctx, 1)));
  std::vector<float> keys = random_normal(static_cast<size_t>(tokens * kKvHeads * kDim), 11);
  HostTensor k = make_tensor(keys, tokens, kKvHeads, kDim, PQ_DTYPE_F32);
  HostTensor v = make_tensor(keys, tokens, kKvHeads, kDim, PQ_DTYPE_F32);
  EXPECT_TRUE(IsOk(pq_prefill_layer(ctx, 1, 0, k.get(), v.get())));
  return ctx;
}

TEST(ApiCache, DefaultsAreOffWithPaperBlocksAndLru) {
  pq_config c;
  pq_config_default(&c);
  EXPECT_EQ(c.cache_tokens, 0);
  EXPECT_EQ(c.cache_block_tokens, 128);
  EXPECT_EQ(c.cache_policy, PQ_CACHE_LRU);
  EXPECT_EQ(c.cache_update_blocks, 0);
}

TEST(ApiCache, BadSettingsNameTheField) {
  pq_context* ctx = nullptr;
  pq_config c = cache_config(256);
  c.cache_policy = 7;
  EXPECT_TRUE(IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"cache_policy", "7"}));
  c = cache_config(256);
  c.cache_block_tokens = 0;
  EXPECT_TRUE(IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"cache_block_tokens"}));
  c = cache_config(-1);
  EXPECT_TRUE(IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"cache_tokens"}));
  c = cache_config(256);
  c.cache_update_blocks = -2;
  EXPECT_TRUE(IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"cache_update_blocks"}));
  EXPECT_EQ(ctx, nullptr);
}

TEST(ApiCache, WithoutCacheNothingIsCounted) {
  Ctx ctx = prefilled(cache_config(0), 512);
  select_and_fetch(ctx, random_normal(kQHeads * kDim, 3));
  pq_stats s = stats(ctx);
  EXPECT_EQ(s.cache_hits, 0u);
  EXPECT_EQ(s.cache_misses, 0u);
}

TEST(ApiCache, RepeatedQueriesHitAndEveryMiddleTokenIsCountedOnce) {
  for (int32_t policy : {PQ_CACHE_LRU, PQ_CACHE_LFU}) {
    // 512 tokens = 32 blocks of 16; the cache holds 8 blocks.
    Ctx ctx = prefilled(cache_config(128, policy), 512);
    std::vector<float> query = random_normal(kQHeads * kDim, 3);
    const int64_t per_fetch = kMiddlePerFetch;
    select_and_fetch(ctx, query);
    pq_stats first = stats(ctx);
    EXPECT_EQ(first.cache_hits, 0u) << "nothing is cached before the first fetch";
    EXPECT_EQ(first.cache_misses, static_cast<uint64_t>(per_fetch));

    select_and_fetch(ctx, query);  // the same tokens: the blocks admitted now hit
    pq_stats second = stats(ctx);
    const uint64_t hits = second.cache_hits;
    EXPECT_GT(hits, 0u);
    EXPECT_EQ(second.cache_hits + second.cache_misses, static_cast<uint64_t>(2 * per_fetch));

    pq_stats seq;
    std::memset(&seq, 0, sizeof seq);
    seq.struct_size = sizeof seq;
    ASSERT_TRUE(IsOk(pq_sequence_stats_get(ctx, 1, &seq)));
    EXPECT_EQ(seq.cache_hits, second.cache_hits);
    EXPECT_EQ(seq.cache_misses, second.cache_misses);
  }
}

TEST(ApiCache, ACacheAsLargeAsTheContextHitsEverythingOnTheSecondFetch) {
  Ctx ctx = prefilled(cache_config(1024), 512);
  std::vector<float> query = random_normal(kQHeads * kDim, 5);
  const int64_t per_fetch = kMiddlePerFetch;
  select_and_fetch(ctx, query);
  select_and_fetch(ctx, query);
  pq_stats s = stats(ctx);
  EXPECT_EQ(s.cache_hits, static_cast<uint64_t>(per_fetch));
  EXPECT_EQ(s.cache_misses, static_cast<uint64_t>(per_fetch));
}

TEST(ApiCache, FetchedBytesDoNotDependOnTheCache) {
  std::vector<std::vector<unsigned char>> outputs;
  for (int64_t cache : {int64_t{0}, int64_t{64}, int64_t{1024}}) {
    Ctx ctx = prefilled(cache_config(cache), 300);
    std::vector<float> query = random_normal(kQHeads * kDim, 9);
    select_and_fetch(ctx, query);  // fills the cache
    outputs.push_back(select_and_fetch(ctx, query));
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  EXPECT_EQ(outputs[0], outputs[2]);
}

TEST(ApiStream, CpuBackendAcceptsOnlyTheNullStream) {
  Ctx ctx(cache_config(0));
  ASSERT_TRUE(ctx.ok());
  ASSERT_TRUE(IsOk(pq_sequence_add(ctx, 1)));
  EXPECT_TRUE(IsOk(pq_sequence_set_stream(ctx, 1, nullptr)));
  int dummy = 0;
  EXPECT_TRUE(IsError(pq_sequence_set_stream(ctx, 1, &dummy), PQ_ERR_UNSUPPORTED,
                      {"cuda_stream", "cpu"}));
  EXPECT_TRUE(IsError(pq_sequence_set_stream(ctx, 2, nullptr), PQ_ERR_NOT_FOUND, {"2"}));
  EXPECT_TRUE(IsError(pq_sequence_set_stream(nullptr, 1, nullptr), PQ_ERR_INVALID_ARGUMENT,
                      {"ctx"}));
}

}  // namespace
