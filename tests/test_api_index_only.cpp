// The index-only tier (PQ_KV_TIER_CALLER) through the public API: an engine
// keeps K/V in its own (paged) pool and the library the index. It selects
// what a context that stores K/V selects (dense keys, a block table, a slot
// map), builds a chunked prompt by its doubling rule, lets keys go once
// coded, re-ranks from the caller's pool, refuses what needs K/V, and forks
// and truncates. Also: several query tokens in one select, and tensor
// parallel ranks (config.kv_head_offset) that select what one context does.
#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "api_test_util.h"

namespace {

using pqt::Ctx;
using pqt::Sel;

constexpr uint64_t kSeq = 3;
constexpr int32_t kQ = 4, kKv = 2, kDim = 32;

pq_config config(int32_t tier, int32_t q = kQ, int32_t kv = kKv) {
  pq_config c = pqt::make_config(1, q, kv, kDim);
  c.kv_tier = tier;
  c.topk_tokens = 40;
  c.local_tokens = 64;
  c.kmeans_iterations = 8;
  c.worker_threads = 2;
  return c;
}

// Keys with structure (a few directions per head plus noise), [token][kv][dim].
std::vector<float> keys_for(int64_t tokens, int32_t kv, uint64_t seed) {
  std::vector<float> k = pqt::random_normal(static_cast<size_t>(tokens) * kv * kDim, seed, 0.3f);
  std::vector<float> dirs = pqt::random_normal(static_cast<size_t>(8) * kDim, seed + 1);
  for (int64_t t = 0; t < tokens; ++t)
    for (int32_t h = 0; h < kv; ++h)
      for (int32_t d = 0; d < kDim; ++d)
        k[(t * kv + h) * kDim + d] += dirs[((t * 7 + h) % 8) * kDim + d];
  return k;
}

std::vector<float> query_for(int64_t tokens, int32_t q, uint64_t seed) {
  return pqt::random_normal(static_cast<size_t>(tokens) * q * kDim, seed);
}

// The selection of every kv head as rows.
std::vector<std::vector<int32_t>> select(pq_context* ctx, const std::vector<float>& query,
                                         int32_t q = kQ, int32_t kv = kKv) {
  Sel sel(kv, pqt::selection_capacity(ctx, kSeq, 0));
  pqt::HostTensor qt = pqt::make_tensor(query, 1, q, kDim, PQ_DTYPE_F32);
  EXPECT_TRUE(pqt::IsOk(pq_decode_select(ctx, kSeq, 0, qt.get(), sel.get())));
  std::vector<std::vector<int32_t>> rows;
  for (int32_t h = 0; h < kv; ++h) rows.push_back(sel.row(h));
  return rows;
}

// A context with its sequence, made or failed.
Ctx make(const pq_config& c) {
  Ctx ctx(c);
  EXPECT_TRUE(pqt::IsOk(ctx.status()));
  if (ctx.ok()) EXPECT_TRUE(pqt::IsOk(pq_sequence_add(ctx, kSeq)));
  return ctx;
}

pq_status prefill(pq_context* ctx, const std::vector<float>& keys, int64_t first, int64_t count,
                  bool values, bool is_prefill = true) {
  pqt::HostTensor k = pqt::make_tensor(keys.data() + first * kKv * kDim, count, kKv, kDim,
                                       PQ_DTYPE_F32);
  pqt::HostTensor v = pqt::make_tensor(keys.data() + first * kKv * kDim, count, kKv, kDim,
                                       PQ_DTYPE_F32);
  const pq_tensor* vt = values ? v.get() : nullptr;
  return is_prefill ? pq_prefill_layer(ctx, kSeq, 0, k.get(), vt)
                    : pq_decode_append(ctx, kSeq, 0, k.get(), vt);
}

// The engine's pool: `tokens` positions scattered over blocks in a random
// order, the pool token-major [slot][kv][dim] with spare blocks around.
struct Pool {
  int32_t block_size = 16;
  std::vector<int32_t> block_table;
  std::vector<int64_t> slots;
  pqt::HostTensor tensor;
  Pool(const std::vector<float>& keys, int64_t tokens, uint64_t seed) {
    const int64_t blocks = (tokens + block_size - 1) / block_size;
    const int64_t pool_blocks = blocks * 2 + 3;
    std::vector<int32_t> order(static_cast<size_t>(pool_blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
    block_table.assign(order.begin(), order.begin() + blocks);
    std::vector<float> pool(static_cast<size_t>(pool_blocks * block_size) * kKv * kDim, 99.f);
    for (int64_t p = 0; p < tokens; ++p) {
      const int64_t slot = block_table[p / block_size] * int64_t{block_size} + p % block_size;
      slots.push_back(slot);
      std::copy_n(keys.begin() + p * kKv * kDim, kKv * kDim, pool.begin() + slot * kKv * kDim);
    }
    tensor = pqt::make_tensor(pool, pool_blocks * block_size, kKv, kDim, PQ_DTYPE_F32);
  }
  pq_paged_keys by_blocks(int64_t tokens) {
    pq_paged_keys k{};
    k.pool = *tensor.get();
    k.block_table = block_table.data();
    k.block_size = block_size;
    k.map_length = static_cast<int64_t>(block_table.size());
    k.tokens = tokens;
    return k;
  }
  pq_paged_keys by_slots(int64_t tokens) {
    pq_paged_keys k{};
    k.pool = *tensor.get();
    k.slots = slots.data();
    k.map_length = static_cast<int64_t>(slots.size());
    k.tokens = tokens;
    return k;
  }
};

constexpr int64_t kPrompt = 1500, kDecode = 300;

TEST(IndexOnly, DenseAndPagedKeysSelectWhatTheHostTierSelects) {
  const std::vector<float> keys = keys_for(kPrompt + kDecode, kKv, 11);
  Ctx host = make(config(PQ_KV_TIER_HOST));
  Ctx dense = make(config(PQ_KV_TIER_CALLER));
  Ctx blocks = make(config(PQ_KV_TIER_CALLER));
  Ctx slots = make(config(PQ_KV_TIER_CALLER));
  Pool pool(keys, kPrompt + kDecode, 5);
  PQ_ASSERT_OK(prefill(host, keys, 0, kPrompt, true));
  PQ_ASSERT_OK(prefill(dense, keys, 0, kPrompt, false));
  pq_paged_keys b = pool.by_blocks(kPrompt), s = pool.by_slots(kPrompt);
  PQ_ASSERT_OK(pq_prefill_layer_paged(blocks, kSeq, 0, &b));
  PQ_ASSERT_OK(pq_prefill_layer_paged(slots, kSeq, 0, &s));
  int64_t selected = 0;
  for (int64_t step = 0; step < kDecode; ++step) {
    const std::vector<float> q = query_for(1, kQ, 100 + step);
    const auto want = select(host, q);
    EXPECT_EQ(select(dense, q), want) << "step " << step;
    EXPECT_EQ(select(blocks, q), want) << "step " << step;
    EXPECT_EQ(select(slots, q), want) << "step " << step;
    for (const auto& row : want) selected += static_cast<int64_t>(row.size());
    const int64_t t = kPrompt + step;
    PQ_ASSERT_OK(prefill(host, keys, t, 1, true, false));
    PQ_ASSERT_OK(prefill(dense, keys, t, 1, false, false));
    b = pool.by_blocks(1);
    s = pool.by_slots(1);
    PQ_ASSERT_OK(pq_decode_append_paged(blocks, kSeq, 0, &b));
    PQ_ASSERT_OK(pq_decode_append_paged(slots, kSeq, 0, &s));
  }
  EXPECT_GT(selected, 0);
}

TEST(IndexOnly, KeysGoOnceCodedAndOnlyTheIndexIsCounted) {
  const int64_t n = 6000;
  const std::vector<float> keys = keys_for(n, kKv, 12);
  Ctx host = make(config(PQ_KV_TIER_HOST));
  Ctx index = make(config(PQ_KV_TIER_CALLER));
  PQ_ASSERT_OK(prefill(host, keys, 0, n, true));
  PQ_ASSERT_OK(prefill(index, keys, 0, n, false));
  PQ_ASSERT_OK(pq_wait_builds(index));
  const uint64_t before = pqt::stats(index).host_bytes;
  const std::vector<float> q = query_for(1, kQ, 3);
  EXPECT_EQ(select(index, q), select(host, q));
  const uint64_t after = pqt::stats(index).host_bytes;
  const uint64_t full = pqt::stats(host).host_bytes;
  // Before the first select the prompt's keys are held (half the host
  // tier's K/V); after it only the codes, state and at most the chunks of
  // the local window and the partial last chunk.
  const uint64_t key_chunk = 256ull * kKv * kDim * sizeof(float);
  const uint64_t chunks = (n + 255) / 256;
  EXPECT_GE(before, chunks * key_chunk);
  EXPECT_LE(after, before - (chunks - 2) * key_chunk);
  EXPECT_LT(after * 4, full) << "index-only " << after << " bytes, host tier " << full;
}

TEST(IndexOnly, TheMemoryLimitCountsTheIndexAndTheKeysHeld) {
  // Measured without a limit: what each tier holds for the prompt.
  const int64_t n = 4000;
  const std::vector<float> keys = keys_for(n + 4000, kKv, 21);
  uint64_t index_prompt = 0, host_prompt = 0;
  {
    Ctx index = make(config(PQ_KV_TIER_CALLER));
    Ctx host = make(config(PQ_KV_TIER_HOST));
    PQ_ASSERT_OK(prefill(index, keys, 0, n, false));
    PQ_ASSERT_OK(prefill(host, keys, 0, n, true));
    index_prompt = pqt::stats(index).host_bytes;
    host_prompt = pqt::stats(host).host_bytes;
  }
  ASSERT_LT(index_prompt * 3, host_prompt * 2) << "keys only: about half the K/V";
  // A limit between the two: the host tier is refused, the index-only tier
  // takes the prompt, and once it selects (keys let go) 4000 more tokens fit
  // under the same limit.
  pq_config c = config(PQ_KV_TIER_HOST);
  c.host_memory_limit = (index_prompt + host_prompt) / 2;
  Ctx host = make(c);
  PQ_EXPECT_ERR(prefill(host, keys, 0, n, true), PQ_ERR_OUT_OF_MEMORY, "limit");
  c.kv_tier = PQ_KV_TIER_CALLER;
  Ctx index = make(c);
  PQ_ASSERT_OK(prefill(index, keys, 0, n, false));
  select(index, query_for(1, kQ, 4));
  PQ_ASSERT_OK(prefill(index, keys, n, 4000, false, false));
  select(index, query_for(1, kQ, 5));
  EXPECT_LE(pqt::stats(index).host_bytes, c.host_memory_limit);
  EXPECT_GT(pqt::stats(index).host_bytes, 0u);
}

TEST(IndexOnly, AChunkedPromptBuildsWhenItsTokensDouble) {
  // Chunks of 300, 300, 600 and 200 tokens: builds over 300, 600 and 1200
  // tokens (each at least twice the last), none at 1400. What it selects
  // is a host-tier context's with 1200 tokens prefilled and 200 appended.
  const std::vector<float> keys = keys_for(1400, kKv, 13);
  Ctx index = make(config(PQ_KV_TIER_CALLER));
  Ctx host = make(config(PQ_KV_TIER_HOST));
  int64_t first = 0;
  for (int64_t chunk : {300, 300, 600, 200}) {
    PQ_ASSERT_OK(prefill(index, keys, first, chunk, false));
    first += chunk;
  }
  PQ_ASSERT_OK(prefill(host, keys, 0, 1200, true));
  PQ_ASSERT_OK(prefill(host, keys, 1200, 200, true, /*is_prefill=*/false));
  for (int i = 0; i < 5; ++i) {
    const std::vector<float> q = query_for(1, kQ, 40 + i);
    EXPECT_EQ(select(index, q), select(host, q)) << "query " << i;
  }
  // Once it selects, later chunks are coded with the index as it is: no
  // rebuild, even past twice the tokens (a host tier would build over 2800).
  const std::vector<float> more = keys_for(1400, kKv, 14);
  Ctx host_coded = make(config(PQ_KV_TIER_HOST));
  PQ_ASSERT_OK(prefill(host_coded, keys, 0, 1200, true));
  PQ_ASSERT_OK(prefill(host_coded, keys, 1200, 200, true, false));
  PQ_ASSERT_OK(prefill(host_coded, more, 0, 1400, true, false));
  PQ_ASSERT_OK(prefill(index, more, 0, 1400, false));
  const std::vector<float> q = query_for(1, kQ, 77);
  EXPECT_EQ(select(index, q), select(host_coded, q));
}

TEST(IndexOnly, ReRankReadsExactKeysFromThePool) {
  const int64_t n = 2000;
  const std::vector<float> keys = keys_for(n, kKv, 15);
  pq_config c = config(PQ_KV_TIER_CALLER);
  c.pq_rerank = 1.0f;
  Ctx index = make(c);
  c.kv_tier = PQ_KV_TIER_HOST;
  Ctx host = make(c);
  Pool pool(keys, n, 9);
  pq_paged_keys b = pool.by_blocks(n);
  PQ_ASSERT_OK(pq_prefill_layer_paged(index, kSeq, 0, &b));
  PQ_ASSERT_OK(prefill(host, keys, 0, n, true));
  const std::vector<float> q = query_for(1, kQ, 8);
  pqt::HostTensor qt = pqt::make_tensor(q, 1, kQ, kDim, PQ_DTYPE_F32);
  Sel sel(kKv, pqt::selection_capacity(index, kSeq, 0));
  PQ_EXPECT_ERR(pq_decode_select(index, kSeq, 0, qt.get(), sel.get()), PQ_ERR_BAD_STATE,
                "pq_rerank");
  Sel got(kKv, sel.capacity);
  PQ_ASSERT_OK(pq_decode_select_multi(index, kSeq, 0, qt.get(), PQ_ROWS_PER_TOKEN, &b, got.get()));
  const auto want = select(host, q);
  for (int32_t h = 0; h < kKv; ++h) EXPECT_EQ(got.row(h), want[static_cast<size_t>(h)]);
  // A map that leaves a position out is named.
  pq_paged_keys short_map = b;
  short_map.map_length = 3;
  PQ_EXPECT_ERR(
      pq_decode_select_multi(index, kSeq, 0, qt.get(), PQ_ROWS_PER_TOKEN, &short_map, got.get()),
      PQ_ERR_INVALID_ARGUMENT, "block_table");
}

TEST(IndexOnly, WhatNeedsKvIsRefusedByName) {
  const std::vector<float> keys = keys_for(600, kKv, 16);
  Ctx index = make(config(PQ_KV_TIER_CALLER));
  PQ_ASSERT_OK(prefill(index, keys, 0, 600, false));
  const auto rows = select(index, query_for(1, kQ, 1));
  Sel sel(kKv, pqt::selection_capacity(index, kSeq, 0));
  for (int32_t h = 0; h < kKv; ++h) {
    sel.counts[h] = static_cast<int32_t>(rows[h].size());
    std::copy(rows[h].begin(), rows[h].end(), sel.positions.begin() + h * sel.capacity);
  }
  std::vector<float> out_rows(static_cast<size_t>(sel.capacity) * kKv * kDim);
  pqt::HostTensor ok = pqt::make_tensor(out_rows, sel.capacity, kKv, kDim, PQ_DTYPE_F32);
  pqt::HostTensor ov = pqt::make_tensor(out_rows, sel.capacity, kKv, kDim, PQ_DTYPE_F32);
  PQ_EXPECT_ERR(pq_fetch_kv(index, kSeq, 0, sel.get(), ok.get(), ov.get()), PQ_ERR_UNSUPPORTED,
                "index-only");
  const std::vector<float> q = query_for(1, kQ, 2);
  pqt::HostTensor qt = pqt::make_tensor(q, 1, kQ, kDim, PQ_DTYPE_F32);
  std::vector<float> out(kQ * kDim);
  PQ_EXPECT_ERR(pq_decode_attend(index, kSeq, 0, qt.get(), sel.get(), 0.f, out.data(), nullptr),
                PQ_ERR_UNSUPPORTED, "index-only");
  uint64_t size = 0;
  PQ_EXPECT_ERR(pq_sequence_state_size(index, kSeq, &size), PQ_ERR_UNSUPPORTED, "index-only");

  // Settings an index-only context cannot serve, at pq_create.
  pq_config c = config(PQ_KV_TIER_CALLER);
  c.selector = PQ_SELECTOR_EXACT;
  pq_context* none = nullptr;
  PQ_EXPECT_ERR(pq_create(&c, &none), PQ_ERR_INVALID_ARGUMENT, "selector");
  c = config(PQ_KV_TIER_CALLER);
  c.pq_rebuild_share = 0.1f;
  PQ_EXPECT_ERR(pq_create(&c, &none), PQ_ERR_INVALID_ARGUMENT, "pq_rebuild_share");
  c = config(PQ_KV_TIER_CALLER);
  c.cache_tokens = 256;
  PQ_EXPECT_ERR(pq_create(&c, &none), PQ_ERR_INVALID_ARGUMENT, "cache_tokens");
  EXPECT_EQ(none, nullptr);

  // Paged keys in a context that stores K/V, and bad maps.
  Ctx host = make(config(PQ_KV_TIER_HOST));
  Pool pool(keys, 600, 3);
  pq_paged_keys b = pool.by_blocks(100);
  PQ_EXPECT_ERR(pq_prefill_layer_paged(host, kSeq, 0, &b), PQ_ERR_UNSUPPORTED, "values");
  Ctx fresh = make(config(PQ_KV_TIER_CALLER));
  pq_paged_keys both = b;
  both.slots = pool.slots.data();
  PQ_EXPECT_ERR(pq_prefill_layer_paged(fresh, kSeq, 0, &both), PQ_ERR_INVALID_ARGUMENT,
                "block_table");
  pq_paged_keys bad_block = b;
  std::vector<int32_t> table = pool.block_table;
  table[2] = 1 << 20;
  bad_block.block_table = table.data();
  PQ_EXPECT_ERR(pq_prefill_layer_paged(fresh, kSeq, 0, &bad_block), PQ_ERR_INVALID_ARGUMENT,
                "block_table[2]");
  pq_paged_keys bad_slot = pool.by_slots(100);
  std::vector<int64_t> slots = pool.slots;
  slots[7] = -1;
  bad_slot.slots = slots.data();
  PQ_EXPECT_ERR(pq_prefill_layer_paged(fresh, kSeq, 0, &bad_slot), PQ_ERR_INVALID_ARGUMENT,
                "slots[7]");
  pq_paged_keys too_many = pool.by_slots(601);
  PQ_EXPECT_ERR(pq_prefill_layer_paged(fresh, kSeq, 0, &too_many), PQ_ERR_INVALID_ARGUMENT,
                "not mapped");
  EXPECT_EQ(pqt::layer_info(fresh, kSeq, 0).tokens, 0) << "a refused call stores nothing";
  PQ_EXPECT_ERR(pq_prefill_layer_paged(fresh, kSeq, 0, nullptr), PQ_ERR_INVALID_ARGUMENT, "keys");
}

TEST(IndexOnly, TruncateAndForkKeepSelectingAsTheHostTier) {
  const std::vector<float> keys = keys_for(2400, kKv, 17);
  Ctx index = make(config(PQ_KV_TIER_CALLER));
  Ctx host = make(config(PQ_KV_TIER_HOST));
  PQ_ASSERT_OK(prefill(index, keys, 0, 1400, false));
  PQ_ASSERT_OK(prefill(host, keys, 0, 1400, true));
  PQ_ASSERT_OK(prefill(index, keys, 1400, 400, false, false));
  PQ_ASSERT_OK(prefill(host, keys, 1400, 400, true, false));
  const std::vector<float> q = query_for(1, kQ, 5);
  ASSERT_EQ(select(index, q), select(host, q));
  // Speculative decoding's truncate of decode tokens: both keep the index
  // and code the tokens that come after.
  PQ_ASSERT_OK(pq_sequence_truncate(index, kSeq, 1500));
  PQ_ASSERT_OK(pq_sequence_truncate(host, kSeq, 1500));
  PQ_ASSERT_OK(prefill(index, keys, 1600, 500, false, false));
  PQ_ASSERT_OK(prefill(host, keys, 1600, 500, true, false));
  EXPECT_EQ(select(index, q), select(host, q));
  PQ_ASSERT_OK(pq_sequence_fork(index, kSeq, kSeq + 1));
  PQ_ASSERT_OK(pq_sequence_fork(host, kSeq, kSeq + 1));
  for (pq_context* ctx : {index.get(), host.get()}) {
    pqt::HostTensor k = pqt::make_tensor(keys.data() + 2100 * kKv * kDim, 300, kKv, kDim,
                                         PQ_DTYPE_F32);
    PQ_ASSERT_OK(pq_decode_append(ctx, kSeq + 1, 0, k.get(), k.get()));
  }
  for (uint64_t id : {kSeq, kSeq + 1}) {
    Sel a(kKv, pqt::selection_capacity(index, id, 0)), b(kKv, a.capacity);
    pqt::HostTensor qt = pqt::make_tensor(q, 1, kQ, kDim, PQ_DTYPE_F32);
    PQ_ASSERT_OK(pq_decode_select(index, id, 0, qt.get(), a.get()));
    PQ_ASSERT_OK(pq_decode_select(host, id, 0, qt.get(), b.get()));
    EXPECT_EQ(a.positions, b.positions) << "seq " << id;
  }
  // Below the prompt, where a host tier rebuilds over the tokens that stay,
  // an index-only layer that let its keys go keeps its index (pqcache.h).
  PQ_ASSERT_OK(pq_sequence_truncate(index, kSeq, 1000));
  EXPECT_EQ(pqt::layer_info(index, kSeq, 0).tokens, 1000);
  const auto rows = select(index, q);
  for (const auto& row : rows) {
    ASSERT_EQ(row.size(), static_cast<size_t>(pqt::selection_capacity(index, kSeq, 0)));
    for (int32_t p : row) EXPECT_LT(p, 1000);
  }
}

// ---------------------------------------------------------------------------
// Several query tokens in one select
// ---------------------------------------------------------------------------

TEST(SelectMulti, RowsPerTokenPerHeadAndPerRequest) {
  const int64_t n = 1800, q = 3;
  const std::vector<float> keys = keys_for(n, kKv, 18);
  for (int32_t tier : {PQ_KV_TIER_HOST, PQ_KV_TIER_CALLER}) {
    Ctx ctx = make(config(tier));
    PQ_ASSERT_OK(prefill(ctx, keys, 0, n, tier == PQ_KV_TIER_HOST));
    const std::vector<float> queries = query_for(q, kQ, 21);
    std::vector<std::vector<std::vector<int32_t>>> single;  // [token][head]
    for (int64_t t = 0; t < q; ++t)
      single.push_back(select(ctx, std::vector<float>(queries.begin() + t * kQ * kDim,
                                                      queries.begin() + (t + 1) * kQ * kDim)));
    pqt::HostTensor qt = pqt::make_tensor(queries, q, kQ, kDim, PQ_DTYPE_F32);
    for (int32_t form : {PQ_ROWS_PER_TOKEN, PQ_ROWS_PER_HEAD, PQ_ROWS_PER_REQUEST}) {
      int64_t rows = 0, cap = 0;
      PQ_ASSERT_OK(pq_selection_capacity_multi(ctx, kSeq, 0, q, form, &rows, &cap));
      std::vector<std::vector<int32_t>> want;
      if (form == PQ_ROWS_PER_TOKEN) {
        for (const auto& token : single) want.insert(want.end(), token.begin(), token.end());
      } else {
        std::set<int32_t> all;
        for (int32_t h = 0; h < kKv; ++h) {
          std::set<int32_t> head;
          for (const auto& token : single) head.insert(token[h].begin(), token[h].end());
          all.insert(head.begin(), head.end());
          if (form == PQ_ROWS_PER_HEAD) want.emplace_back(head.begin(), head.end());
        }
        if (form == PQ_ROWS_PER_REQUEST) want.emplace_back(all.begin(), all.end());
      }
      ASSERT_EQ(rows, static_cast<int64_t>(want.size())) << "form " << form;
      // Too small: the capacity needed in every count, nothing else written.
      Sel small(static_cast<int32_t>(rows), cap - 1);
      PQ_EXPECT_ERR(pq_decode_select_multi(ctx, kSeq, 0, qt.get(), form, nullptr, small.get()),
                    PQ_ERR_BUFFER_TOO_SMALL, "capacity");
      for (int32_t c : small.counts) EXPECT_EQ(c, cap);
      Sel got(static_cast<int32_t>(rows), cap);
      PQ_ASSERT_OK(pq_decode_select_multi(ctx, kSeq, 0, qt.get(), form, nullptr, got.get()));
      for (int64_t r = 0; r < rows; ++r) {
        EXPECT_EQ(got.row(static_cast<int32_t>(r)), want[static_cast<size_t>(r)])
            << "tier " << tier << " form " << form << " row " << r;
        for (int64_t i = got.counts[r]; i < cap; ++i)
          ASSERT_EQ(got.positions[r * cap + i], -1) << "padding of row " << r;
        EXPECT_LE(got.counts[r], cap);
      }
    }
    pq_selection none{};
    PQ_EXPECT_ERR(pq_decode_select_multi(ctx, kSeq, 0, qt.get(), 3, nullptr, &none),
                  PQ_ERR_INVALID_ARGUMENT, "rows");
    int64_t cap = 0;
    PQ_EXPECT_ERR(pq_selection_capacity_multi(ctx, kSeq, 0, 0, PQ_ROWS_PER_TOKEN, nullptr, &cap),
                  PQ_ERR_INVALID_ARGUMENT, "query_tokens");
  }
}

// ---------------------------------------------------------------------------
// Tensor parallel: ranks with a slice of the kv heads each
// ---------------------------------------------------------------------------

TEST(TensorParallel, TwoRanksWithHalfTheKvHeadsSelectWhatOneContextSelects) {
  constexpr int32_t kv = 4, q_heads = 8, half = kv / 2;
  const int64_t n = 1700;
  const std::vector<float> keys = keys_for(n, kv, 19);
  for (int32_t selector : {PQ_SELECTOR_PQ, PQ_SELECTOR_RANDOM}) {
    pq_config whole_config = config(PQ_KV_TIER_HOST, q_heads, kv);
    whole_config.selector = selector;
    Ctx whole = make(whole_config);
    pqt::HostTensor k = pqt::make_tensor(keys, n, kv, kDim, PQ_DTYPE_F32);
    PQ_ASSERT_OK(pq_prefill_layer(whole, kSeq, 0, k.get(), k.get()));
    std::vector<Ctx> ranks;
    for (int32_t r = 0; r < 2; ++r) {
      pq_config rc = config(PQ_KV_TIER_HOST, q_heads / 2, half);
      rc.selector = selector;
      rc.kv_head_offset = r * half;
      ranks.push_back(make(rc));
      std::vector<float> slice;
      for (int64_t t = 0; t < n; ++t)
        slice.insert(slice.end(), keys.begin() + (t * kv + r * half) * kDim,
                     keys.begin() + (t * kv + (r + 1) * half) * kDim);
      pqt::HostTensor sk = pqt::make_tensor(slice, n, half, kDim, PQ_DTYPE_F32);
      PQ_ASSERT_OK(pq_prefill_layer(ranks.back(), kSeq, 0, sk.get(), sk.get()));
    }
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> query = query_for(1, q_heads, 60 + step);
      const auto want = select(whole, query, q_heads, kv);
      for (int32_t r = 0; r < 2; ++r) {
        const std::vector<float> part(query.begin() + r * (q_heads / 2) * kDim,
                                      query.begin() + (r + 1) * (q_heads / 2) * kDim);
        const auto got = select(ranks[static_cast<size_t>(r)], part, q_heads / 2, half);
        for (int32_t h = 0; h < half; ++h)
          EXPECT_EQ(got[static_cast<size_t>(h)], want[static_cast<size_t>(r * half + h)])
              << "selector " << selector << " rank " << r << " head " << h << " step " << step;
      }
    }
  }
  pq_config bad = config(PQ_KV_TIER_HOST);
  bad.kv_head_offset = 65535;
  pq_context* none = nullptr;
  PQ_EXPECT_ERR(pq_create(&bad, &none), PQ_ERR_INVALID_ARGUMENT, "kv_head_offset");
}

}  // namespace
