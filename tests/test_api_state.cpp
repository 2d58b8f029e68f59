// Sequence state: pq_sequence_truncate, pq_sequence_fork, pq_sequence_save
// and pq_sequence_restore (docs/state-format.md), compared against
// sequences that were given the same tokens directly.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"
#include "state_format.h"

using namespace pqt;

namespace {

constexpr int32_t kLayers = 2, kQ = 4, kKv = 2, kDim = 16;

pq_config state_config(int32_t selector, int32_t dtype = PQ_DTYPE_F32) {
  pq_config c = make_config(kLayers, kQ, kKv, kDim, dtype);
  c.selector = selector;
  c.sink_tokens = 4;
  c.local_tokens = 16;
  c.topk_tokens = 24;
  c.pq_bits = 4;
  c.kmeans_iterations = 4;  // fixed: two builds over the same tokens agree
  c.worker_threads = 2;
  c.cache_tokens = 64;
  c.cache_block_tokens = 16;
  return c;
}

// Token rows of one "stream": stream s, positions [first, first + count),
// token-major [token][kv head][dim]. Two streams share no row.
std::vector<float> stream_rows(uint64_t stream, int64_t first, int64_t count) {
  std::vector<float> all = random_normal(static_cast<size_t>((first + count) * kKv * kDim),
                                         1000 + stream);
  return std::vector<float>(all.begin() + first * kKv * kDim, all.end());
}

std::vector<float> query_rows(uint64_t seed) {
  return random_normal(static_cast<size_t>(kQ * kDim), 77 + seed);
}

// What a decode step returns for one layer: the selection and the fetched
// K and V bytes.
struct Step {
  std::vector<int32_t> positions;
  std::vector<int32_t> counts;
  std::vector<unsigned char> keys, values;
  bool operator==(const Step& o) const {
    return positions == o.positions && counts == o.counts && keys == o.keys && values == o.values;
  }
};

class StateTest : public ::testing::Test {
 protected:
  void prefill(pq_context* ctx, uint64_t id, uint64_t stream, int64_t tokens) {
    ASSERT_EQ(pq_sequence_add(ctx, id), PQ_OK) << pq_last_error();
    std::vector<float> rows = stream_rows(stream, 0, tokens);
    HostTensor t = make_tensor(rows, tokens, kKv, kDim, PQ_DTYPE_F32);
    for (int32_t l = 0; l < kLayers; ++l)
      ASSERT_EQ(pq_prefill_layer(ctx, id, l, t.get(), t.get()), PQ_OK) << pq_last_error();
  }
  // Appends positions [first, first + count) of `stream`, one token a step.
  void decode(pq_context* ctx, uint64_t id, uint64_t stream, int64_t first, int64_t count) {
    std::vector<float> rows = stream_rows(stream, first, count);
    for (int64_t i = 0; i < count; ++i) {
      std::vector<float> one(rows.begin() + i * kKv * kDim, rows.begin() + (i + 1) * kKv * kDim);
      HostTensor t = make_tensor(one, 1, kKv, kDim, PQ_DTYPE_F32);
      for (int32_t l = 0; l < kLayers; ++l)
        ASSERT_EQ(pq_decode_append(ctx, id, l, t.get(), t.get()), PQ_OK) << pq_last_error();
    }
  }
  Step step(pq_context* ctx, uint64_t id, int32_t layer, uint64_t query_seed) {
    Step s;
    std::vector<float> q = query_rows(query_seed);
    HostTensor qt = make_tensor(q, 1, kQ, kDim, PQ_DTYPE_F32);
    const int64_t cap = selection_capacity(ctx, id, layer);
    EXPECT_GT(cap, 0);
    Sel sel(kKv, cap);
    EXPECT_EQ(pq_decode_select(ctx, id, layer, qt.get(), sel.get()), PQ_OK) << pq_last_error();
    s.positions = sel.positions;
    s.counts = sel.counts;
    HostTensor ko = make_tensor(nullptr, cap, kKv, kDim, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR);
    HostTensor vo = make_tensor(nullptr, cap, kKv, kDim, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR);
    EXPECT_EQ(pq_fetch_kv(ctx, id, layer, sel.get(), ko.get(), vo.get()), PQ_OK) << pq_last_error();
    s.keys = ko.bytes;
    s.values = vo.bytes;
    return s;
  }
  std::vector<Step> steps(pq_context* ctx, uint64_t id, uint64_t query_seed) {
    std::vector<Step> out;
    for (int32_t l = 0; l < kLayers; ++l) out.push_back(step(ctx, id, l, query_seed + l));
    return out;
  }
  int64_t length(pq_context* ctx, uint64_t id, int32_t layer = 0) {
    int64_t n = -1;
    EXPECT_EQ(pq_sequence_length(ctx, id, layer, &n), PQ_OK) << pq_last_error();
    return n;
  }
  std::vector<uint8_t> save(pq_context* ctx, uint64_t id) {
    uint64_t size = 0;
    EXPECT_EQ(pq_sequence_state_size(ctx, id, &size), PQ_OK) << pq_last_error();
    std::vector<uint8_t> bytes(static_cast<size_t>(size));
    uint64_t written = 0;
    EXPECT_EQ(pq_sequence_save_buffer(ctx, id, bytes.data(), size, &written), PQ_OK)
        << pq_last_error();
    EXPECT_EQ(written, size);
    return bytes;
  }
};

// ---------------------------------------------------------------------------
// Truncate
// ---------------------------------------------------------------------------

void feed_selector(pq_context* ctx, uint64_t id, int64_t tokens);

// PQ's codes and InfiniGen's partial keys of the truncated tokens go too.
TEST_F(StateTest, TruncatedDecodeTokensAreAsIfTheyNeverCame) {
  for (int32_t selector : {PQ_SELECTOR_PQ, PQ_SELECTOR_INFINIGEN}) {
    SCOPED_TRACE(selector);
    Ctx ctx(state_config(selector));
    ASSERT_TRUE(ctx.ok());
    // seq 1: 600 prompt tokens, 40 accepted and 30 rejected (stream 2) tokens.
    prefill(ctx, 1, 1, 600);
    feed_selector(ctx, 1, 600);
    decode(ctx, 1, 1, 600, 40);
    decode(ctx, 1, 2, 640, 30);
    (void)steps(ctx, 1, 5);  // selections and the cache saw the rejected tokens
    ASSERT_EQ(pq_sequence_truncate(ctx, 1, 640), PQ_OK) << pq_last_error();
    EXPECT_EQ(length(ctx, 1, 0), 640);
    EXPECT_EQ(length(ctx, 1, 1), 640);
    // seq 2 never saw them.
    prefill(ctx, 2, 1, 600);
    feed_selector(ctx, 2, 600);
    decode(ctx, 2, 1, 600, 40);
    decode(ctx, 1, 1, 640, 20);
    decode(ctx, 2, 1, 640, 20);
    for (uint64_t q = 0; q < 3; ++q) EXPECT_TRUE(steps(ctx, 1, q) == steps(ctx, 2, q)) << q;
    pq_layer_info a = layer_info(ctx, 1, 0), b = layer_info(ctx, 2, 0);
    EXPECT_EQ(a.coded_tokens, b.coded_tokens);
    EXPECT_EQ(a.prefill_tokens, 600);
  }
}

TEST_F(StateTest, TruncateInsideThePrefillRebuildsTheIndexOverWhatStays) {
  Ctx ctx(state_config(PQ_SELECTOR_PQ));
  ASSERT_TRUE(ctx.ok());
  prefill(ctx, 1, 1, 900);
  decode(ctx, 1, 1, 900, 10);
  ASSERT_EQ(pq_sequence_truncate(ctx, 1, 700), PQ_OK) << pq_last_error();
  prefill(ctx, 2, 1, 700);
  ASSERT_EQ(pq_wait_builds(ctx), PQ_OK) << pq_last_error();
  EXPECT_EQ(layer_info(ctx, 1, 1).prefill_tokens, 700);
  std::vector<float> c1(size_t{1} << 4 << 0), c2;
  for (int32_t l = 0; l < kLayers; ++l)
    for (int32_t h = 0; h < kKv; ++h) {
      std::vector<float> x(static_cast<size_t>(16 * kDim)), y(x.size());
      ASSERT_EQ(pq_index_centroids(ctx, 1, l, h, x.data(), static_cast<int64_t>(x.size())), PQ_OK)
          << pq_last_error();
      ASSERT_EQ(pq_index_centroids(ctx, 2, l, h, y.data(), static_cast<int64_t>(y.size())), PQ_OK);
      EXPECT_EQ(x, y) << "layer " << l << " head " << h;
    }
  decode(ctx, 1, 3, 700, 8);
  decode(ctx, 2, 3, 700, 8);
  EXPECT_TRUE(steps(ctx, 1, 9) == steps(ctx, 2, 9));
}

// A build cancelled by the truncate may still read the rows the truncate
// dropped; the appends after it must not write into those rows (found by
// TSan over the fuzz corpus: a data race between the build's reads and the
// append's writes in one chunk).
TEST_F(StateTest, AppendsAfterATruncateDoNotWriteUnderARunningBuild) {
  pq_config c = state_config(PQ_SELECTOR_PQ);
  c.kmeans_iterations = 25;
  c.pq_bits = 8;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  for (int round = 0; round < 6; ++round) {
    const uint64_t id = 10 + static_cast<uint64_t>(round);
    prefill(ctx, id, 1, 6000);  // its build runs on the pool
    // Into the build at different depths (a race window, not a timing).
    std::this_thread::sleep_for(std::chrono::milliseconds(15 * round));
    ASSERT_EQ(pq_sequence_truncate(ctx, id, 5000 + 37 * round), PQ_OK) << pq_last_error();
    decode(ctx, id, 2, 5000 + 37 * round, 40);  // rows the old build may be reading
    int64_t n = 0;
    ASSERT_EQ(pq_sequence_length(ctx, id, 1, &n), PQ_OK);
    EXPECT_EQ(n, 5040 + 37 * round);
  }
  ASSERT_EQ(pq_wait_builds(ctx), PQ_OK) << pq_last_error();
  prefill(ctx, 20, 1, 5000);
  decode(ctx, 20, 2, 5000, 40);
  ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
  EXPECT_TRUE(steps(ctx, 10, 1) == steps(ctx, 20, 1));
}

TEST_F(StateTest, TruncateToZeroEmptiesAndBadCountsAreNamed) {
  Ctx ctx(state_config(PQ_SELECTOR_PQ));
  ASSERT_TRUE(ctx.ok());
  prefill(ctx, 1, 1, 300);
  EXPECT_TRUE(IsError(pq_sequence_truncate(ctx, 1, -1), PQ_ERR_INVALID_ARGUMENT, {"tokens", "-1"}));
  EXPECT_TRUE(IsError(pq_sequence_truncate(ctx, 1, 301), PQ_ERR_INVALID_ARGUMENT, {"301", "300"}));
  EXPECT_TRUE(IsError(pq_sequence_truncate(ctx, 9, 0), PQ_ERR_NOT_FOUND, {"9"}));
  EXPECT_TRUE(IsError(pq_sequence_truncate(nullptr, 1, 0), PQ_ERR_INVALID_ARGUMENT, {"ctx"}));
  EXPECT_EQ(length(ctx, 1), 300);  // the refused calls changed nothing
  ASSERT_EQ(pq_sequence_truncate(ctx, 1, 300), PQ_OK);  // a no-op
  ASSERT_EQ(pq_sequence_truncate(ctx, 1, 0), PQ_OK) << pq_last_error();
  EXPECT_EQ(length(ctx, 1), 0);
  std::vector<float> one = stream_rows(1, 0, 1);
  HostTensor t = make_tensor(one, 1, kKv, kDim, PQ_DTYPE_F32);
  EXPECT_TRUE(IsError(pq_decode_append(ctx, 1, 0, t.get(), t.get()), PQ_ERR_BAD_STATE,
                      {"prefill"}));
  // Prefilled again, it matches a fresh sequence.
  std::vector<float> rows = stream_rows(1, 0, 300);
  HostTensor p = make_tensor(rows, 300, kKv, kDim, PQ_DTYPE_F32);
  for (int32_t l = 0; l < kLayers; ++l) ASSERT_EQ(pq_prefill_layer(ctx, 1, l, p.get(), p.get()), PQ_OK);
  prefill(ctx, 2, 1, 300);
  EXPECT_TRUE(steps(ctx, 1, 1) == steps(ctx, 2, 1));
}

// ---------------------------------------------------------------------------
// Fork
// ---------------------------------------------------------------------------

TEST_F(StateTest, ForkSelectsAsASequenceGivenTheSameTokens) {
  for (int32_t selector : {PQ_SELECTOR_PQ, PQ_SELECTOR_QUEST, PQ_SELECTOR_INFLLM, PQ_SELECTOR_EXACT,
                           PQ_SELECTOR_CLUSTERKV, PQ_SELECTOR_INFINIGEN}) {
    SCOPED_TRACE(selector);
    Ctx ctx(state_config(selector));
    ASSERT_TRUE(ctx.ok());
    // The same window queries for every sequence (InfiniGen's skew; the
    // others ignore them).
    auto prompt = [&](uint64_t id) {
      prefill(ctx, id, 1, 700);  // two full chunks and a partial one
      feed_selector(ctx, id, 700);
    };
    prompt(1);
    decode(ctx, 1, 1, 700, 12);
    (void)steps(ctx, 1, 0);
    ASSERT_EQ(pq_sequence_fork(ctx, 1, 2), PQ_OK) << pq_last_error();
    prompt(3);  // the reference: the same tokens, no fork
    decode(ctx, 3, 1, 700, 12);
    ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
    EXPECT_EQ(stats(ctx).builds_finished, selector == PQ_SELECTOR_PQ ? 4u : 0u)
        << "the fork ran no build";
    EXPECT_TRUE(steps(ctx, 2, 4) == steps(ctx, 3, 4));
    // The child and the parent go their own ways.
    decode(ctx, 2, 2, 712, 300);
    decode(ctx, 3, 2, 712, 300);
    decode(ctx, 1, 5, 712, 300);
    prompt(4);
    decode(ctx, 4, 1, 700, 12);
    decode(ctx, 4, 5, 712, 300);
    EXPECT_TRUE(steps(ctx, 2, 8) == steps(ctx, 3, 8));
    EXPECT_TRUE(steps(ctx, 1, 8) == steps(ctx, 4, 8));
  }
}

// A prefix of more than CodeColumn::kMinFrozenTokens coded tokens: the fork
// shares the parent's codes (frozen runs) instead of copying them. Both
// the tuple path (m x b = 2 x 4) and the per-token scan (4 x 8) read the
// runs; a truncate of the parent into the shared codes, and its new
// tokens, leave the child's selections as they were.
TEST_F(StateTest, ForkOfALongPrefixSelectsThroughSharedCodes) {
  for (int32_t m : {2, 4}) {
    SCOPED_TRACE(m);
    pq_config c = state_config(PQ_SELECTOR_PQ);
    c.pq_subspaces = m;
    c.pq_bits = m == 2 ? 4 : 8;
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok());
    auto given = [&](uint64_t id, int64_t decoded) {  // prompt 4200, then stream 1 decode tokens
      prefill(ctx, id, 1, 4200);
      decode(ctx, id, 1, 4200, decoded);
    };
    given(1, 300);  // 4,484 coded tokens: the fork freezes them
    ASSERT_EQ(pq_sequence_fork(ctx, 1, 2), PQ_OK) << pq_last_error();
    given(3, 300);
    ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
    EXPECT_TRUE(steps(ctx, 2, 4) == steps(ctx, 3, 4));
    decode(ctx, 2, 2, 4500, 100);
    decode(ctx, 3, 2, 4500, 100);
    const std::vector<Step> child = steps(ctx, 2, 8);
    EXPECT_TRUE(child == steps(ctx, 3, 8));

    // The parent cuts into the codes it shares, then writes new tokens.
    ASSERT_EQ(pq_sequence_truncate(ctx, 1, 4350), PQ_OK) << pq_last_error();
    decode(ctx, 1, 5, 4350, 60);
    given(4, 150);
    decode(ctx, 4, 5, 4350, 60);
    EXPECT_TRUE(steps(ctx, 1, 9) == steps(ctx, 4, 9));
    EXPECT_TRUE(steps(ctx, 2, 8) == child) << "the parent's truncate changed the child";
    EXPECT_EQ(stats(ctx).builds_finished, 3u * kLayers) << "no rebuild: the cut is after the prompt";
  }
}

TEST_F(StateTest, ForkSharesFullChunksAndCountsThemOnce) {
  pq_config c = state_config(PQ_SELECTOR_PQ);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  prefill(ctx, 1, 1, 4096);  // 16 full chunks per layer
  ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
  const uint64_t one = stats(ctx).host_bytes;
  ASSERT_EQ(pq_sequence_fork(ctx, 1, 2), PQ_OK) << pq_last_error();
  const uint64_t two = stats(ctx).host_bytes;
  const uint64_t kv = 2ull * 4096 * kKv * kDim * sizeof(float) * kLayers;
  EXPECT_LT(two - one, kv / 4) << "one sequence holds " << one << " bytes, the fork added "
                               << two - one;
  prefill(ctx, 3, 1, 4096);
  EXPECT_GT(stats(ctx).host_bytes - two, kv) << "a fresh prefill holds the K/V again";
}

TEST_F(StateTest, WritingAfterTruncateCopiesASharedChunk) {
  Ctx ctx(state_config(PQ_SELECTOR_WINDOW));
  ASSERT_TRUE(ctx.ok());
  prefill(ctx, 1, 1, 512);  // two full chunks, both shared by the fork
  ASSERT_EQ(pq_sequence_fork(ctx, 1, 2), PQ_OK) << pq_last_error();
  const std::vector<Step> before = steps(ctx, 2, 3);
  ASSERT_EQ(pq_sequence_truncate(ctx, 1, 300), PQ_OK);
  decode(ctx, 1, 7, 300, 212);  // rewrites rows 300..511 of the parent
  EXPECT_TRUE(steps(ctx, 2, 3) == before) << "the child's rows changed under it";
  prefill(ctx, 3, 1, 300);
  decode(ctx, 3, 7, 300, 212);
  EXPECT_TRUE(steps(ctx, 1, 3) == steps(ctx, 3, 3));
}

TEST_F(StateTest, ForkErrorsAreNamedAndAddNothing) {
  pq_config c = state_config(PQ_SELECTOR_PQ);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  prefill(ctx, 1, 1, 700);
  const uint64_t one = stats(ctx).host_bytes;
  prefill(ctx, 2, 1, 10);
  EXPECT_TRUE(IsError(pq_sequence_fork(ctx, 9, 3), PQ_ERR_NOT_FOUND, {"9"}));
  EXPECT_TRUE(IsError(pq_sequence_fork(ctx, 1, 2), PQ_ERR_INVALID_ARGUMENT, {"2", "exists"}));
  EXPECT_TRUE(IsError(pq_sequence_fork(ctx, 1, 1), PQ_ERR_INVALID_ARGUMENT, {"exists"}));
  int64_t n = 0;
  ASSERT_EQ(pq_sequence_count(ctx, &n), PQ_OK);
  EXPECT_EQ(n, 2);
  // Over the memory limit: nothing is added and nothing stays held.
  c.host_memory_limit = one + 4096;  // less than a partial chunk's copy
  Ctx small(c);
  ASSERT_TRUE(small.ok()) << pq_last_error();
  prefill(small, 1, 1, 700);
  const uint64_t held = stats(small).host_bytes;
  EXPECT_TRUE(IsError(pq_sequence_fork(small, 1, 2), PQ_ERR_OUT_OF_MEMORY, {"fork"}));
  EXPECT_EQ(stats(small).host_bytes, held);
  ASSERT_EQ(pq_sequence_count(small, &n), PQ_OK);
  EXPECT_EQ(n, 1);
}

// ---------------------------------------------------------------------------
// Save and restore
// ---------------------------------------------------------------------------

// Feeds the selector's inputs (prompt queries, observed attention) so its
// state is not empty.
void feed_selector(pq_context* ctx, uint64_t id, int64_t tokens) {
  std::vector<float> q = random_normal(static_cast<size_t>(8 * kQ * kDim), 5);
  HostTensor qt = make_tensor(q, 8, kQ, kDim, PQ_DTYPE_F32);
  for (int32_t l = 0; l < kLayers; ++l) {
    ASSERT_EQ(pq_prefill_queries(ctx, id, l, qt.get()), PQ_OK) << pq_last_error();
    Sel all(kKv, tokens);
    std::vector<float> probs(static_cast<size_t>(kKv * tokens));
    for (int32_t h = 0; h < kKv; ++h) {
      all.counts[static_cast<size_t>(h)] = static_cast<int32_t>(tokens);
      for (int64_t t = 0; t < tokens; ++t) {
        all.positions[static_cast<size_t>(h * tokens + t)] = static_cast<int32_t>(t);
        probs[static_cast<size_t>(h * tokens + t)] = static_cast<float>((t * 37 + h) % 101) / 101.f;
      }
    }
    ASSERT_EQ(pq_observe_attention(ctx, id, l, all.get(), probs.data()), PQ_OK) << pq_last_error();
  }
}

TEST_F(StateTest, RestoredSequenceSelectsAndFetchesAsTheSavedOne) {
  for (int32_t selector :
       {PQ_SELECTOR_PQ, PQ_SELECTOR_H2O, PQ_SELECTOR_SNAPKV, PQ_SELECTOR_SCOPE, PQ_SELECTOR_QUEST,
        PQ_SELECTOR_INFLLM, PQ_SELECTOR_RANDOM, PQ_SELECTOR_SPARQ, PQ_SELECTOR_PYRAMIDKV,
        PQ_SELECTOR_SCISSORHANDS, PQ_SELECTOR_KEYFORMER, PQ_SELECTOR_CLUSTERKV,
        PQ_SELECTOR_ADAKV, PQ_SELECTOR_ZIGZAGKV, PQ_SELECTOR_PYRAMIDINFER,
        PQ_SELECTOR_FASTGEN, PQ_SELECTOR_INFINIGEN}) {
    SCOPED_TRACE(selector);
    Ctx a(state_config(selector)), b(state_config(selector));
    ASSERT_TRUE(a.ok() && b.ok());
    prefill(a, 1, 1, 600);
    feed_selector(a, 1, 600);
    decode(a, 1, 1, 600, 20);
    (void)steps(a, 1, 0);
    const std::vector<uint8_t> bytes = save(a, 1);
    ASSERT_EQ(pq_sequence_restore(b, 7, bytes.data(), bytes.size()), PQ_OK) << pq_last_error();
    ASSERT_EQ(pq_sequence_restore(a, 8, bytes.data(), bytes.size()), PQ_OK) << pq_last_error();
    for (uint64_t q = 1; q < 4; ++q) {
      const std::vector<Step> original = steps(a, 1, q);
      EXPECT_TRUE(steps(b, 7, q) == original) << "query " << q;
      EXPECT_TRUE(steps(a, 8, q) == original) << "query " << q;
      decode(a, 1, 4, 620 + q, 1);
      decode(a, 8, 4, 620 + q, 1);
      decode(b, 7, 4, 620 + q, 1);
    }
    ASSERT_EQ(pq_wait_builds(b), PQ_OK);
    EXPECT_EQ(stats(b).builds_finished, 0u) << "the restore ran K-Means";
    EXPECT_EQ(layer_info(b, 7, 1).prefill_tokens, 600);
  }
}

TEST_F(StateTest, SaveWaitsForTheBuildAndSizesAgree) {
  Ctx ctx(state_config(PQ_SELECTOR_PQ));
  ASSERT_TRUE(ctx.ok());
  prefill(ctx, 1, 1, 3000);  // the build may still run: the save waits for it
  uint64_t size = 0;
  ASSERT_EQ(pq_sequence_state_size(ctx, 1, &size), PQ_OK) << pq_last_error();
  std::vector<uint8_t> small(16);
  uint64_t needed = 0;
  EXPECT_TRUE(IsError(pq_sequence_save_buffer(ctx, 1, small.data(), small.size(), &needed),
                      PQ_ERR_BUFFER_TOO_SMALL, {"16"}));
  EXPECT_EQ(needed, size);
  std::vector<uint8_t> streamed;
  auto append = [](void* user, const void* data, size_t n) {
    auto* v = static_cast<std::vector<uint8_t>*>(user);
    v->insert(v->end(), static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + n);
    return 0;
  };
  ASSERT_EQ(pq_sequence_save(ctx, 1, append, &streamed), PQ_OK) << pq_last_error();
  EXPECT_EQ(streamed, save(ctx, 1));
  EXPECT_EQ(streamed.size(), size);
  // K/V of both layers dominate; the index is small beside it.
  EXPECT_GT(size, 2ull * 3000 * kKv * kDim * sizeof(float) * kLayers);
  EXPECT_LT(size, 2ull * 3000 * kKv * kDim * sizeof(float) * kLayers * 11 / 10);
  auto refuse = [](void*, const void*, size_t) { return 1; };
  EXPECT_TRUE(IsError(pq_sequence_save(ctx, 1, refuse, nullptr), PQ_ERR_BACKEND, {"callback"}));
  EXPECT_TRUE(IsError(pq_sequence_save(ctx, 1, nullptr, nullptr), PQ_ERR_INVALID_ARGUMENT,
                      {"write"}));
  EXPECT_TRUE(IsError(pq_sequence_state_size(ctx, 5, &size), PQ_ERR_NOT_FOUND, {"5"}));
}

TEST_F(StateTest, FilesAreWrittenAtomically) {
  Ctx ctx(state_config(PQ_SELECTOR_PQ));
  ASSERT_TRUE(ctx.ok());
  prefill(ctx, 1, 1, 400);
  prefill(ctx, 2, 2, 500);
  char dir_template[] = "/tmp/pq_state_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template, path = dir + "/seq.pqstate";
  ASSERT_EQ(pq_sequence_save_file(ctx, 1, path.c_str()), PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_sequence_save_file(ctx, 2, path.c_str()), PQ_OK) << pq_last_error();  // replaces
  ASSERT_EQ(pq_sequence_restore_file(ctx, 3, path.c_str()), PQ_OK) << pq_last_error();
  EXPECT_EQ(length(ctx, 3), 500);
  EXPECT_TRUE(steps(ctx, 3, 1) == steps(ctx, 2, 1));
  // A failing save leaves the file as it was and no temporary file.
  EXPECT_TRUE(IsError(pq_sequence_save_file(ctx, 9, path.c_str()), PQ_ERR_NOT_FOUND, {"9"}));
  EXPECT_TRUE(IsError(pq_sequence_save_file(ctx, 1, (dir + "/no/such/dir/x").c_str()),
                      PQ_ERR_BACKEND, {"no/such/dir"}));
  EXPECT_EQ(pq_sequence_restore_file(ctx, 4, path.c_str()), PQ_OK) << pq_last_error();
  EXPECT_EQ(length(ctx, 4), 500);
  EXPECT_TRUE(IsError(pq_sequence_restore_file(ctx, 5, (dir + "/missing").c_str()),
                      PQ_ERR_NOT_FOUND, {"missing"}));
  EXPECT_TRUE(IsError(pq_sequence_save_file(ctx, 1, nullptr), PQ_ERR_INVALID_ARGUMENT, {"path"}));
  // A path that cannot be read as a file (a directory: it opens, but does
  // not map) is a backend error naming it.
  EXPECT_TRUE(IsError(pq_sequence_restore_file(ctx, 6, dir.c_str()), PQ_ERR_BACKEND,
                      {dir.c_str()}));
  std::string listing;
  std::unique_ptr<FILE, int (*)(FILE*)> ls(popen(("ls -a " + dir).c_str(), "r"), pclose);
  char buf[256];
  while (fgets(buf, sizeof buf, ls.get())) listing += buf;
  EXPECT_EQ(listing, ".\n..\nseq.pqstate\n") << "a temporary file was left behind";
  std::remove(path.c_str());
  rmdir(dir.c_str());
}

// ---------------------------------------------------------------------------
// Bad input (each case is listed in docs/state-format.md)
// ---------------------------------------------------------------------------

using pqt_state::reference_crc32c;
using pqt_state::reseal;
using pqt_state::reseal_header;
using pqt_state::SectionAt;
using pqt_state::walk;

// The section of `type` for `layer`.
SectionAt section(const std::vector<SectionAt>& all, uint32_t type, int32_t layer) {
  for (const SectionAt& s : all)
    if (s.type == type && s.layer == layer) return s;
  ADD_FAILURE() << "no section of type " << type << " for layer " << layer;
  return all.back();
}
constexpr uint32_t kMeta = 1, kKeysValues = 2, kIndex = 3, kSelectorState = 4;

// A copy of `b` with `value` written at byte `at` of section `s`'s frame
// (16 is the payload's first byte), resealed.
template <typename T>
std::vector<uint8_t> patched(const std::vector<uint8_t>& b, const SectionAt& s, size_t at,
                             T value) {
  std::vector<uint8_t> out = b;
  std::memcpy(&out[s.offset + at], &value, sizeof value);
  reseal(out, s);
  return out;
}

class StateBadInput : public StateTest {
 protected:
  void SetUp() override {
    ctx_ = Ctx(state_config(PQ_SELECTOR_PQ));
    ASSERT_TRUE(ctx_.ok());
    prefill(ctx_, 1, 1, 300);
    decode(ctx_, 1, 1, 300, 5);
    bytes_ = save(ctx_, 1);
    before_ = stats(ctx_).host_bytes;
  }
  // The restore fails with `status` and a message holding `words`, and
  // leaves nothing behind.
  ::testing::AssertionResult Refused(const std::vector<uint8_t>& b, pq_status status,
                                     std::initializer_list<const char*> words) {
    ::testing::AssertionResult r =
        IsError(pq_sequence_restore(ctx_, 2, b.data(), b.size()), status, words);
    if (!r) return r;
    int64_t n = 0;
    pq_sequence_count(ctx_, &n);
    if (n != 1) return ::testing::AssertionFailure() << "a sequence was added";
    if (stats(ctx_).host_bytes != before_)
      return ::testing::AssertionFailure() << "memory stayed held";
    return ::testing::AssertionSuccess();
  }
  Ctx ctx_;
  std::vector<uint8_t> bytes_;
  uint64_t before_ = 0;
};

TEST_F(StateBadInput, TheLibraryWritesTheDocumentedFraming) {
  EXPECT_EQ(std::memcmp(bytes_.data(), "PQCSTATE", 8), 0);
  EXPECT_EQ(reference_crc32c(bytes_.data(), 52), [&] {
    uint32_t c;
    std::memcpy(&c, &bytes_[52], 4);
    return c;
  }());
  std::vector<SectionAt> s = walk(bytes_);
  // Every layer's description (layer section, index; PQ keeps no selector
  // state) before any K/V, then the K/V of each layer, then the end.
  ASSERT_EQ(s.size(), 2u * 3 + 1);
  const uint32_t types[] = {kMeta, kIndex, kMeta, kIndex, kKeysValues, kKeysValues, 0xFFFFFFFFu};
  const int32_t layers[] = {0, 0, 1, 1, 0, 1, -1};
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(s[i].type, types[i]) << i;
    EXPECT_EQ(s[i].layer, layers[i]) << i;
  }
  for (const SectionAt& x : s) {
    uint32_t crc;
    std::memcpy(&crc, &bytes_[x.offset + 16 + x.payload], 4);
    EXPECT_EQ(crc, reference_crc32c(&bytes_[x.offset], 16 + x.payload)) << "type " << x.type;
  }
  EXPECT_EQ(s.back().type, 0xFFFFFFFFu);
  EXPECT_EQ(s.back().offset + 16 + 8 + 4, bytes_.size());
  EXPECT_EQ(section(s, kKeysValues, 0).payload, 2ull * 305 * kKv * kDim * sizeof(float));
}

TEST_F(StateBadInput, EmptyNullAndForeignBytes) {
  EXPECT_TRUE(Refused({}, PQ_ERR_CORRUPT, {"magic"}));
  std::vector<uint8_t> text(200, 'x');
  EXPECT_TRUE(Refused(text, PQ_ERR_CORRUPT, {"magic"}));
  EXPECT_TRUE(IsError(pq_sequence_restore(ctx_, 2, nullptr, 10), PQ_ERR_INVALID_ARGUMENT, {"data"}));
  EXPECT_TRUE(IsError(pq_sequence_restore(ctx_, 1, bytes_.data(), bytes_.size()),
                      PQ_ERR_INVALID_ARGUMENT, {"exists"}));
}

TEST_F(StateBadInput, TruncatedAnywhere) {
  std::vector<size_t> cuts = {8, 40, 55, 56, 60, 71};
  for (const SectionAt& s : walk(bytes_)) {
    cuts.push_back(s.offset);
    cuts.push_back(s.offset + 16 + s.payload / 2);
    cuts.push_back(s.offset + 16 + s.payload + 2);
  }
  cuts.push_back(bytes_.size() - 1);
  for (size_t cut : cuts) {
    std::vector<uint8_t> b(bytes_.begin(), bytes_.begin() + static_cast<std::ptrdiff_t>(cut));
    EXPECT_TRUE(Refused(b, PQ_ERR_CORRUPT, {}).operator bool()) << "cut at " << cut;
  }
  EXPECT_TRUE(Refused(std::vector<uint8_t>(bytes_.begin(), bytes_.begin() + 100), PQ_ERR_CORRUPT,
                      {"truncated"}));
}

TEST_F(StateBadInput, AFlippedByteInAnySectionFailsItsChecksum) {
  for (const SectionAt& s : walk(bytes_)) {
    for (size_t at : {s.offset + 3, s.offset + 16 + s.payload / 2}) {
      std::vector<uint8_t> b = bytes_;
      b[at] ^= 0x10;
      EXPECT_TRUE(Refused(b, PQ_ERR_CORRUPT, {}).operator bool()) << "byte " << at;
    }
  }
  std::vector<uint8_t> b = bytes_;
  b[30] ^= 1;  // a geometry field, under the header checksum
  EXPECT_TRUE(Refused(b, PQ_ERR_CORRUPT, {"header", "checksum"}));
  b = bytes_;
  b[section(walk(bytes_), kKeysValues, 0).offset + 16 + 100] ^= 4;
  EXPECT_TRUE(Refused(b, PQ_ERR_CORRUPT, {"checksum", "keys and values", "layer 0"}));
}

TEST_F(StateBadInput, OtherVersionsAndGeometriesAreIncompatible) {
  std::vector<uint8_t> b = bytes_;
  const uint32_t version = 2;
  std::memcpy(&b[8], &version, 4);
  reseal_header(b);
  EXPECT_TRUE(Refused(b, PQ_ERR_INCOMPATIBLE, {"version 2", "reads version 1"}));
  struct Change {
    int32_t pq_config::*field;
    int32_t value;
    const char* name;
  };
  for (Change ch : {Change{&pq_config::num_layers, 3, "num_layers"},
                    Change{&pq_config::num_kv_heads, 1, "num_kv_heads"},
                    Change{&pq_config::head_dim, 32, "head_dim"},
                    Change{&pq_config::pq_bits, 5, "pq_bits"},
                    Change{&pq_config::selector, PQ_SELECTOR_H2O, "selector"}}) {
    pq_config c = state_config(PQ_SELECTOR_PQ);
    c.*ch.field = ch.value;
    if (ch.field == &pq_config::num_kv_heads) c.num_q_heads = 4;
    Ctx other(c);
    ASSERT_TRUE(other.ok()) << pq_last_error();
    EXPECT_TRUE(IsError(pq_sequence_restore(other, 1, bytes_.data(), bytes_.size()),
                        PQ_ERR_INCOMPATIBLE, {ch.name}));
  }
  Ctx half(state_config(PQ_SELECTOR_PQ, PQ_DTYPE_F16));
  EXPECT_TRUE(IsError(pq_sequence_restore(half, 1, bytes_.data(), bytes_.size()),
                      PQ_ERR_INCOMPATIBLE, {"dtype"}));
  // dtypes by name, not number.
  EXPECT_STREQ(pq_last_error(),
               "pq_sequence_restore: the saved state has dtype f32; this context has f16; "
               "nothing was restored");
}

TEST_F(StateBadInput, WellSealedButInconsistentContent) {
  const std::vector<SectionAt> all = walk(bytes_);
  const SectionAt meta = section(all, kMeta, 0), kv = section(all, kKeysValues, 0),
                  index = section(all, kIndex, 0);
  // A code out of range for pq_bits 4, with a valid checksum.
  {
    std::vector<uint8_t> b = bytes_;
    b[index.offset + 16 + index.payload - 1] = 0xEE;
    reseal(b, index);
    EXPECT_TRUE(Refused(b, PQ_ERR_CORRUPT, {"code", "238"}));
  }
  // A NaN key.
  {
    const float nan = std::nanf("");
    EXPECT_TRUE(Refused(patched(bytes_, kv, 16 + 64, nan), PQ_ERR_CORRUPT,
                        {"keys and values", "layer 0"}));
  }
  // More prefill than tokens in the layer section.
  {
    const int64_t prefill = 10000;
    EXPECT_TRUE(Refused(patched(bytes_, meta, 16 + 8, prefill), PQ_ERR_CORRUPT, {"prefill"}));
  }
  // Sections out of order: layer 0's section claims layer 1.
  {
    const int32_t layer = 1;
    EXPECT_TRUE(Refused(patched(bytes_, meta, 4, layer), PQ_ERR_CORRUPT, {"layer 1", "layer 0"}));
  }
  // Layer 1's K/V where layer 0's are expected.
  {
    const int32_t layer = 1;
    EXPECT_TRUE(Refused(patched(bytes_, kv, 4, layer), PQ_ERR_CORRUPT,
                        {"keys and values of layer 0"}));
  }
  // Flags that announce no index while an index section follows.
  {
    std::vector<uint8_t> b = bytes_;
    b[meta.offset + 16 + 16] = 0;
    reseal(b, meta);
    EXPECT_TRUE(Refused(b, PQ_ERR_CORRUPT, {"flags"}));
  }
  // An index that codes more tokens than the layer holds.
  {
    const int64_t coded = 306;
    EXPECT_TRUE(Refused(patched(bytes_, index, 16, coded), PQ_ERR_CORRUPT, {"306", "index"}));
  }
  // A non-finite centroid.
  {
    const float inf = INFINITY;
    EXPECT_TRUE(Refused(patched(bytes_, index, 16 + 32 + 8, inf), PQ_ERR_CORRUPT, {"centroid"}));
  }
  // A section of a type version 1 does not have, sealed.
  {
    std::vector<uint8_t> b = bytes_;
    const uint32_t unknown = 7;
    std::memcpy(&b[kv.offset], &unknown, 4);
    reseal(b, kv);
    EXPECT_TRUE(Refused(b, PQ_ERR_CORRUPT, {"unknown type 7"}));
  }
  // Bytes after the end section.
  {
    std::vector<uint8_t> b = bytes_;
    b.push_back(0);
    EXPECT_TRUE(Refused(b, PQ_ERR_CORRUPT, {"follow the end"}));
  }
}

// Issue 23, D4: sections whose checksums hold but whose build facts are
// impossible restored with PQ_OK, and pq_layer_info_get reported them.
TEST_F(StateBadInput, WellSealedButImpossibleNumbers) {
  const std::vector<SectionAt> all = walk(bytes_);
  const SectionAt meta = section(all, kMeta, 0), index = section(all, kIndex, 0);
  // The layer section: tokens, prefill tokens, flags, then the last build's
  // iterations (byte 16 + 17), budget (16 + 21) and seconds (16 + 25).
  EXPECT_TRUE(Refused(patched(bytes_, meta, 16 + 17, int32_t{-5}), PQ_ERR_CORRUPT,
                      {"iterations is -5"}));
  EXPECT_TRUE(Refused(patched(bytes_, meta, 16 + 21, std::numeric_limits<int32_t>::min()),
                      PQ_ERR_CORRUPT, {"budget is -2147483648"}));
  EXPECT_TRUE(Refused(patched(bytes_, meta, 16 + 25, std::nan("")), PQ_ERR_CORRUPT,
                      {"build seconds is nan"}));
  // More iterations than the budget the build was given (4).
  EXPECT_TRUE(Refused(patched(bytes_, meta, 16 + 17, int32_t{5}), PQ_ERR_CORRUPT,
                      {"iterations is 5", "budget 4"}));
  // The index section: coded tokens, iterations (16 + 8), budget (16 + 12),
  // training points (16 + 16) and seconds (16 + 24).
  EXPECT_TRUE(Refused(patched(bytes_, index, 16 + 16, int64_t{-7}), PQ_ERR_CORRUPT,
                      {"training points is -7"}));
  EXPECT_TRUE(Refused(patched(bytes_, index, 16 + 16, int64_t{306}), PQ_ERR_CORRUPT,
                      {"training points is 306"}));
  EXPECT_TRUE(Refused(patched(bytes_, index, 16 + 24, -1e300), PQ_ERR_CORRUPT,
                      {"build seconds is -1e+300"}));
  EXPECT_TRUE(Refused(patched(bytes_, index, 16 + 24, HUGE_VAL), PQ_ERR_CORRUPT,
                      {"build seconds is inf"}));
  EXPECT_TRUE(Refused(patched(bytes_, index, 16 + 8, int32_t{100001}), PQ_ERR_CORRUPT,
                      {"iterations is 100001"}));
  // Bytes 48-51 hold key_rotary (reserved as 0 before 0.7): a value no
  // layout has is corrupt; another layout than the context's is refused as
  // incompatible (the codes group the dimensions by it).
  {
    std::vector<uint8_t> b = bytes_;
    b[49] = 1;
    reseal_header(b);
    EXPECT_TRUE(Refused(b, PQ_ERR_CORRUPT, {"key_rotary", "256"}));
    b[49] = 0;
    b[48] = PQ_ROTARY_HALF;
    reseal_header(b);
    EXPECT_TRUE(Refused(b, PQ_ERR_INCOMPATIBLE, {"key_rotary 1", "this context has 0"}));
  }
  // The end section belongs to no layer: its layer field is -1.
  EXPECT_TRUE(Refused(patched(bytes_, all.back(), 4, int32_t{0}), PQ_ERR_CORRUPT,
                      {"end section", "layer 0"}));
  // The intact state restores, and reports the saved build's facts.
  ASSERT_EQ(pq_sequence_restore(ctx_, 2, bytes_.data(), bytes_.size()), PQ_OK) << pq_last_error();
  const pq_layer_info a = layer_info(ctx_, 1, 0), b = layer_info(ctx_, 2, 0);
  EXPECT_EQ(b.kmeans_iterations, a.kmeans_iterations);
  EXPECT_EQ(b.kmeans_budget, 4);
  EXPECT_EQ(b.build_seconds, a.build_seconds);
}

// Issue 23, D3: no bytes at all (NULL, 0) reached a memcmp of a null
// pointer (UBSan aborts there); it asks for the header like any short start.
TEST_F(StateBadInput, RestoreBeginOfNoBytesAsksForTheHeader) {
  uint64_t used = 0;
  EXPECT_TRUE(IsError(pq_sequence_restore_begin(ctx_, 5, nullptr, 0, &used),
                      PQ_ERR_BUFFER_TOO_SMALL, {"56"}));
  EXPECT_EQ(used, 56u);
  const uint8_t none = 0;
  used = 0;
  EXPECT_TRUE(IsError(pq_sequence_restore_begin(ctx_, 5, &none, 0, &used),
                      PQ_ERR_BUFFER_TOO_SMALL, {"56"}));
  EXPECT_EQ(used, 56u);
  EXPECT_TRUE(IsError(pq_sequence_restore(ctx_, 5, nullptr, 0), PQ_ERR_CORRUPT, {"0 bytes"}));
  int64_t n = 0;
  ASSERT_EQ(pq_sequence_count(ctx_, &n), PQ_OK);
  EXPECT_EQ(n, 1);
}

TEST_F(StateTest, SelectorStatesAreCheckedAndMustBelongToTheSelector) {
  Ctx h2o(state_config(PQ_SELECTOR_H2O));
  ASSERT_TRUE(h2o.ok());
  prefill(h2o, 1, 1, 300);
  feed_selector(h2o, 1, 300);
  std::vector<uint8_t> bytes = save(h2o, 1);
  const SectionAt state = section(walk(bytes), kSelectorState, 0);  // H2O keeps one
  // A negative accumulated score, sealed.
  std::vector<uint8_t> b = bytes;
  const float negative = -1.f;
  std::memcpy(&b[state.offset + 16 + 4 + 8 + 4 * 7], &negative, 4);
  reseal(b, state);
  EXPECT_TRUE(IsError(pq_sequence_restore(h2o, 2, b.data(), b.size()), PQ_ERR_CORRUPT,
                      {"accumulated attention", "token 7"}));
  // A state cut short, sealed: its length field no longer matches.
  b = bytes;
  const uint64_t longer = 301;
  std::memcpy(&b[state.offset + 16 + 4], &longer, 8);
  reseal(b, state);
  EXPECT_TRUE(IsError(pq_sequence_restore(h2o, 2, b.data(), b.size()), PQ_ERR_CORRUPT,
                      {"301"}));
  // An H2O state in a file whose header claims the window selector: a
  // section that selector does not keep.
  b = bytes;
  const int32_t window = PQ_SELECTOR_WINDOW;
  std::memcpy(&b[44], &window, 4);
  reseal_header(b);
  Ctx win(state_config(PQ_SELECTOR_WINDOW));
  EXPECT_TRUE(IsError(pq_sequence_restore(win, 2, b.data(), b.size()), PQ_ERR_CORRUPT,
                      {"selector state", "does not keep"}));
  int64_t n = -1;
  ASSERT_EQ(pq_sequence_count(h2o, &n), PQ_OK);
  EXPECT_EQ(n, 1);
}

// ---------------------------------------------------------------------------
// A restore in pieces: the index first, the K/V after
// ---------------------------------------------------------------------------

// Exact re-ranking reads the keys: before they arrive it is refused,
// naming the field, not read from a store that is not there.
TEST_F(StateTest, ReRankingWaitsForTheKeysOfARestoreInPieces) {
  pq_config c = state_config(PQ_SELECTOR_PQ);
  c.pq_rerank = 0.5f;
  Ctx a(c), b(c);
  ASSERT_TRUE(a.ok() && b.ok());
  prefill(a, 1, 1, 900);
  const std::vector<uint8_t> bytes = save(a, 1);
  uint64_t consumed = 0;
  ASSERT_EQ(pq_sequence_restore_begin(b, 5, bytes.data(), bytes.size(), &consumed), PQ_OK)
      << pq_last_error();
  std::vector<float> q = query_rows(3);
  HostTensor qt = make_tensor(q, 1, kQ, kDim, PQ_DTYPE_F32);
  const int64_t cap = selection_capacity(b, 5, 0);
  Sel x(kKv, cap), y(kKv, cap);
  EXPECT_TRUE(IsError(pq_decode_select(b, 5, 0, qt.get(), x.get()), PQ_ERR_BAD_STATE,
                      {"pq_rerank", "restore"}));
  for (uint64_t at = consumed, used = 0; at < bytes.size(); at += used)
    ASSERT_EQ(pq_sequence_restore_kv(b, 5, bytes.data() + at, bytes.size() - at, &used), PQ_OK)
        << pq_last_error();
  ASSERT_EQ(pq_decode_select(b, 5, 0, qt.get(), x.get()), PQ_OK) << pq_last_error();
  ASSERT_EQ(pq_decode_select(a, 1, 0, qt.get(), y.get()), PQ_OK) << pq_last_error();
  EXPECT_EQ(x.positions, y.positions);
}

TEST_F(StateTest, SelectionStartsBeforeTheKeysAndValuesArrive) {
  Ctx a(state_config(PQ_SELECTOR_PQ)), b(state_config(PQ_SELECTOR_PQ));
  ASSERT_TRUE(a.ok() && b.ok());
  prefill(a, 1, 1, 900);
  decode(a, 1, 1, 900, 30);  // tokens that left the window since the build
  const std::vector<uint8_t> bytes = save(a, 1);
  const std::vector<SectionAt> all = walk(bytes);
  const size_t first_kv = section(all, kKeysValues, 0).offset;

  // The beginning arrives in pieces: each short call names what it needs.
  uint64_t got = 0, consumed = 0;
  int calls = 0;
  pq_status st;
  while ((st = pq_sequence_restore_begin(b, 5, bytes.data(), got, &consumed)) ==
         PQ_ERR_BUFFER_TOO_SMALL) {
    ASSERT_GT(consumed, got) << pq_last_error();
    got = consumed;
    ASSERT_LE(got, bytes.size());
    ++calls;
  }
  ASSERT_EQ(st, PQ_OK) << pq_last_error();
  EXPECT_EQ(consumed, first_kv);
  EXPECT_GE(calls, 4);
  EXPECT_LT(first_kv, bytes.size() / 20) << "the description is a small part of the state";

  // Selection works now and equals the saved sequence's; the K/V do not.
  std::vector<float> q = query_rows(3);
  HostTensor qt = make_tensor(q, 1, kQ, kDim, PQ_DTYPE_F32);
  for (int32_t l = 0; l < kLayers; ++l) {
    const int64_t cap = selection_capacity(b, 5, l);
    Sel x(kKv, cap), y(kKv, cap);
    ASSERT_EQ(pq_decode_select(b, 5, l, qt.get(), x.get()), PQ_OK) << pq_last_error();
    ASSERT_EQ(pq_decode_select(a, 1, l, qt.get(), y.get()), PQ_OK);
    EXPECT_EQ(x.positions, y.positions) << "layer " << l;
    HostTensor ko = make_tensor(nullptr, cap, kKv, kDim, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR);
    HostTensor vo = make_tensor(nullptr, cap, kKv, kDim, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR);
    EXPECT_TRUE(IsError(pq_fetch_kv(b, 5, l, x.get(), ko.get(), vo.get()), PQ_ERR_BAD_STATE,
                        {"restore", "layer"}));
  }
  std::vector<float> one = stream_rows(1, 930, 1);
  HostTensor t = make_tensor(one, 1, kKv, kDim, PQ_DTYPE_F32);
  EXPECT_TRUE(IsError(pq_decode_append(b, 5, 0, t.get(), t.get()), PQ_ERR_BAD_STATE,
                      {"pq_decode_append"}));
  EXPECT_TRUE(IsError(pq_sequence_truncate(b, 5, 10), PQ_ERR_BAD_STATE, {"truncate"}));
  EXPECT_TRUE(IsError(pq_sequence_fork(b, 5, 6), PQ_ERR_BAD_STATE, {"fork"}));
  uint64_t size = 0;
  EXPECT_TRUE(IsError(pq_sequence_state_size(b, 5, &size), PQ_ERR_BAD_STATE, {"save"}));

  // The K/V, one section a call: short, damaged (changes nothing), right.
  uint64_t at = consumed;
  while (at < bytes.size()) {
    uint64_t used = 0;
    ASSERT_TRUE(IsError(pq_sequence_restore_kv(b, 5, bytes.data() + at, 10, &used),
                        PQ_ERR_BUFFER_TOO_SMALL, {"needs"}));
    EXPECT_EQ(used, 16u);
    std::vector<uint8_t> damaged(bytes.begin() + static_cast<std::ptrdiff_t>(at), bytes.end());
    damaged[damaged.size() / 2 < 20 ? 18 : 20] ^= 1;
    EXPECT_TRUE(IsError(pq_sequence_restore_kv(b, 5, damaged.data(), damaged.size(), &used),
                        PQ_ERR_CORRUPT, {"checksum"}));
    ASSERT_EQ(pq_sequence_restore_kv(b, 5, bytes.data() + at, bytes.size() - at, &used), PQ_OK)
        << pq_last_error();
    at += used;
  }
  uint64_t used = 0;
  EXPECT_TRUE(IsError(pq_sequence_restore_kv(b, 5, bytes.data(), bytes.size(), &used),
                      PQ_ERR_BAD_STATE, {"complete"}));
  for (uint64_t q2 = 0; q2 < 3; ++q2) EXPECT_TRUE(steps(b, 5, q2) == steps(a, 1, q2)) << q2;
  decode(a, 1, 2, 930, 5);
  decode(b, 5, 2, 930, 5);
  EXPECT_TRUE(steps(b, 5, 7) == steps(a, 1, 7));
  ASSERT_EQ(pq_wait_builds(b), PQ_OK);
  EXPECT_EQ(stats(b).builds_finished, 0u);
}

TEST_F(StateTest, BadKeysAndValuesEndARestoreInPieces) {
  Ctx a(state_config(PQ_SELECTOR_H2O)), b(state_config(PQ_SELECTOR_H2O));
  ASSERT_TRUE(a.ok() && b.ok());
  prefill(a, 1, 1, 300);
  std::vector<uint8_t> bytes = save(a, 1);
  const std::vector<SectionAt> all = walk(bytes);
  const SectionAt kv0 = section(all, kKeysValues, 0), kv1 = section(all, kKeysValues, 1);
  uint64_t used = 0;
  ASSERT_EQ(pq_sequence_restore_begin(b, 2, bytes.data(), bytes.size(), &used), PQ_OK)
      << pq_last_error();
  EXPECT_EQ(used, kv0.offset);
  // H2O selects from its scores, but the core selects nothing without K/V
  // for any selector but PQ.
  std::vector<float> q = query_rows(1);
  HostTensor qt = make_tensor(q, 1, kQ, kDim, PQ_DTYPE_F32);
  Sel sel(kKv, selection_capacity(b, 2, 0));
  EXPECT_TRUE(IsError(pq_decode_select(b, 2, 0, qt.get(), sel.get()), PQ_ERR_BAD_STATE,
                      {"other than PQ"}));
  // Layer 1's K/V first: out of order, changes nothing.
  EXPECT_TRUE(IsError(pq_sequence_restore_kv(b, 2, bytes.data() + kv1.offset, kv1.payload + 20,
                                             &used),
                      PQ_ERR_CORRUPT, {"layer 0"}));
  // A NaN, sealed: the restore ends; the sequence must be removed.
  const float nan = std::nanf("");
  std::memcpy(&bytes[kv0.offset + 16 + 8], &nan, 4);
  reseal(bytes, kv0);
  EXPECT_TRUE(IsError(pq_sequence_restore_kv(b, 2, bytes.data() + kv0.offset, kv0.payload + 20,
                                             &used),
                      PQ_ERR_CORRUPT, {"layer 0"}));
  EXPECT_TRUE(IsError(pq_sequence_restore_kv(b, 2, bytes.data() + kv1.offset, kv1.payload + 20,
                                             &used),
                      PQ_ERR_BAD_STATE, {"remove"}));
  EXPECT_TRUE(IsError(pq_sequence_restore_kv(b, 9, bytes.data(), 20, &used), PQ_ERR_NOT_FOUND,
                      {"9"}));
  ASSERT_EQ(pq_sequence_add(b, 3), PQ_OK);
  EXPECT_TRUE(IsError(pq_sequence_restore_kv(b, 3, bytes.data(), 20, &used), PQ_ERR_BAD_STATE,
                      {"pq_sequence_restore_begin"}));
  EXPECT_TRUE(IsError(pq_sequence_restore_begin(b, 2, bytes.data(), bytes.size(), &used),
                      PQ_ERR_INVALID_ARGUMENT, {"exists"}));
  EXPECT_TRUE(IsError(pq_sequence_restore_begin(b, 4, bytes.data(), bytes.size(), nullptr),
                      PQ_ERR_INVALID_ARGUMENT, {"out_consumed"}));
  ASSERT_EQ(pq_sequence_remove(b, 2), PQ_OK);
}

TEST_F(StateTest, SelectionsRunWhileTheKeysAndValuesArrive) {
  Ctx a(state_config(PQ_SELECTOR_PQ)), b(state_config(PQ_SELECTOR_PQ));
  ASSERT_TRUE(a.ok() && b.ok());
  prefill(a, 1, 1, 2000);
  const std::vector<uint8_t> bytes = save(a, 1);
  uint64_t at = 0;
  ASSERT_EQ(pq_sequence_restore_begin(b, 1, bytes.data(), bytes.size(), &at), PQ_OK);
  std::atomic<bool> done{false};
  std::atomic<int> errors{0}, selections{0};
  std::thread selector([&] {
    std::vector<float> q = query_rows(2);
    HostTensor qt = make_tensor(q, 1, kQ, kDim, PQ_DTYPE_F32);
    while (!done.load()) {
      for (int32_t l = 0; l < kLayers; ++l) {
        Sel sel(kKv, selection_capacity(b, 1, l));
        if (pq_decode_select(b, 1, l, qt.get(), sel.get()) != PQ_OK) ++errors;
        ++selections;
      }
    }
  });
  int seen = 0;
  while (at < bytes.size()) {
    // At least one more selection between two sections: they interleave.
    while (selections.load() <= seen) std::this_thread::yield();
    seen = selections.load();
    uint64_t used = 0;
    ASSERT_EQ(pq_sequence_restore_kv(b, 1, bytes.data() + at, bytes.size() - at, &used), PQ_OK)
        << pq_last_error();
    at += used;
  }
  done.store(true);
  selector.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_TRUE(steps(b, 1, 4) == steps(a, 1, 4));
}

TEST_F(StateBadInput, OverTheMemoryLimitNothingIsAdded) {
  pq_config c = state_config(PQ_SELECTOR_PQ);
  c.host_memory_limit = before_ / 2;  // room for the fixed state, not the K/V
  Ctx small(c);
  ASSERT_TRUE(small.ok()) << pq_last_error();
  EXPECT_TRUE(IsError(pq_sequence_restore(small, 1, bytes_.data(), bytes_.size()),
                      PQ_ERR_OUT_OF_MEMORY, {}));
  EXPECT_EQ(stats(small).host_bytes, 0u);
  int64_t n = -1;
  ASSERT_EQ(pq_sequence_count(small, &n), PQ_OK);
  EXPECT_EQ(n, 0);
}

}  // namespace
