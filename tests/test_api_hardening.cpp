// Regression tests for the defects a hostile-caller review found (issue 11,
// D1-D7 and the smaller ones), and for the host memory limit covering what a
// caller can make the library allocate. Each test failed before its fix.
#include <gtest/gtest.h>

#include <malloc.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"

using namespace pqt;

namespace {

constexpr int64_t kChunk = 256;  // tokens per K/V chunk (pqcache.h, host_memory_limit)

pq_config small_config(int32_t selector = PQ_SELECTOR_EXACT) {
  pq_config c = make_config(1, 4, 2, 8, PQ_DTYPE_F32);
  c.selector = selector;
  c.sink_tokens = 2;
  c.local_tokens = 4;
  c.topk_tokens = 4;
  c.pq_bits = 2;
  c.kmeans_iterations = 3;
  c.worker_threads = 2;
  return c;
}

HostTensor kv(int64_t tokens, int32_t heads, int32_t dim, uint64_t seed) {
  return make_tensor(random_normal(static_cast<size_t>(tokens * heads * dim), seed), tokens,
                     heads, dim, PQ_DTYPE_F32);
}

uint64_t host_bytes(pq_context* ctx) { return stats(ctx).host_bytes; }

// ---------------------------------------------------------------------------
// D1: a refused over-limit call reserves nothing another thread can observe
// ---------------------------------------------------------------------------

TEST(Hardening, RefusedPrefillDoesNotMakeOtherThreadsFail) {
  // 8 kv heads x 128 dims of f32: a chunk of K/V is 2 MiB, so a slack of
  // 256 KiB for the fixed state cannot hold a chunk.
  pq_config c = make_config(1, 8, 8, 128, PQ_DTYPE_F32);
  c.selector = PQ_SELECTOR_EXACT;
  const uint64_t chunk_bytes = static_cast<uint64_t>(kChunk) * 8 * 128 * 4 * 2;
  c.host_memory_limit = 4 * chunk_bytes + (256u << 10);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  HostTensor two = kv(2 * kChunk, 8, 128, 1), ten = kv(10 * kChunk, 8, 128, 2),
             one = kv(kChunk, 8, 128, 3);
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, two.get(), two.get()));  // 2 of 4 chunks held
  PQ_ASSERT_OK(pq_sequence_add(ctx, 2));

  std::atomic<bool> stop{false};
  std::atomic<int> refused_messages_ok{0}, refused{0};
  std::thread hog([&] {
    while (!stop.load()) {
      pq_status st = pq_prefill_layer(ctx, 2, 0, ten.get(), ten.get());  // 10 chunks: never fits
      if (st != PQ_ERR_OUT_OF_MEMORY) continue;
      ++refused;
      // The message reports what is held, which is never more than the limit.
      std::smatch m;
      std::string msg = pq_last_error();
      if (std::regex_search(msg, m, std::regex("([0-9]+) held")) &&
          std::stoull(m[1].str()) <= c.host_memory_limit)
        ++refused_messages_ok;
    }
  });
  int failures = 0, rounds = 0;
  for (; rounds < 2000; ++rounds) {
    PQ_ASSERT_OK(pq_sequence_add(ctx, 3));
    if (pq_prefill_layer(ctx, 3, 0, one.get(), one.get()) != PQ_OK) ++failures;  // 3 of 4
    PQ_ASSERT_OK(pq_sequence_remove(ctx, 3));
  }
  stop.store(true);
  hog.join();
  EXPECT_EQ(failures, 0) << "of " << rounds << " valid 1-chunk prefills";
  EXPECT_GT(refused.load(), 0);
  EXPECT_EQ(refused_messages_ok.load(), refused.load());
}

// ---------------------------------------------------------------------------
// D2: pq_index_codes ranges
// ---------------------------------------------------------------------------

TEST(Hardening, IndexCodesRangeThatOverflowsIsInvalid) {
  pq_config c = small_config(PQ_SELECTOR_PQ);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  HostTensor t = kv(64, 2, 8, 4);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, t.get(), t.get()));
  std::vector<uint8_t> buf(64, 0xEE);
  PQ_EXPECT_ERR(pq_index_codes(ctx, 1, 0, 0, std::numeric_limits<int64_t>::max(), 2, buf.data()),
                PQ_ERR_INVALID_ARGUMENT, "first", "coded");
  PQ_EXPECT_ERR(pq_index_codes(ctx, 1, 0, 0, 2, std::numeric_limits<int64_t>::max(), buf.data()),
                PQ_ERR_INVALID_ARGUMENT, "count", "coded");
  for (uint8_t b : buf) EXPECT_EQ(b, 0xEE);
}

TEST(Hardening, IndexCodesOfTheLocalWindowAreAsTheHeaderSays) {
  // The header and the library disagreed; now they say the same: the
  // prefill's build codes its local window too, appended tokens wait.
  pq_config c = small_config(PQ_SELECTOR_PQ);  // 2 sinks, 4 local tokens
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  HostTensor t = kv(64, 2, 8, 5);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, t.get(), t.get()));
  std::vector<uint8_t> buf(66 * 2, 0xEE);  // pq_subspaces (2) bytes per token
  PQ_EXPECT_OK(pq_index_codes(ctx, 1, 0, 0, 0, 64, buf.data()));  // the window [60, 64) too
  HostTensor one = kv(1, 2, 8, 6);
  PQ_ASSERT_OK(pq_decode_append(ctx, 1, 0, one.get(), one.get()));
  std::fill(buf.begin(), buf.end(), 0xEE);
  PQ_EXPECT_ERR(pq_index_codes(ctx, 1, 0, 0, 64, 1, buf.data()), PQ_ERR_INVALID_ARGUMENT,
                "coded", "local");
  PQ_EXPECT_ERR(pq_index_codes(ctx, 1, 0, 0, 0, 65, buf.data()), PQ_ERR_INVALID_ARGUMENT,
                "coded", "local");
  for (uint8_t b : buf) EXPECT_EQ(b, 0xEE);
}

// ---------------------------------------------------------------------------
// D3: pq_destroy while builds run
// ---------------------------------------------------------------------------

TEST(Hardening, DestroyWhileBuildsRunCancelsAndJoinsFirst) {
  // Builds that finish their K-Means and encode with the pool while the
  // context goes: short builds, many layers, destroyed at once. Under
  // ThreadSanitizer (test.sh --tsan) the old destroy, which reset the pool
  // pointer before joining, is a data race on that pointer every run.
  pq_config c = make_config(8, 4, 4, 32, PQ_DTYPE_F32);
  c.pq_bits = 4;
  c.kmeans_iterations = 1;
  c.worker_threads = 2;
  HostTensor t = kv(4096, 4, 32, 6);
  for (int round = 0; round < 40; ++round) {
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok());
    PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
    for (int32_t layer = 0; layer < 8; ++layer)
      PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, layer, t.get(), t.get()));
    ctx.reset();  // builds in flight
  }
}

// ---------------------------------------------------------------------------
// D4, D5: spans that overflow
// ---------------------------------------------------------------------------

TEST(Hardening, TensorInitWithOverflowingSizesIsInvalid) {
  pq_tensor t;
  std::memset(&t, 0x5A, sizeof t);
  pq_tensor before = t;
  float x = 0.f;
  PQ_EXPECT_ERR(pq_tensor_init(&t, &x, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR,
                               std::numeric_limits<int64_t>::max() / 2, 4, 128),
                PQ_ERR_INVALID_ARGUMENT, "tokens", "overflow");
  EXPECT_EQ(std::memcmp(&t, &before, sizeof t), 0);  // untouched
  PQ_EXPECT_ERR(pq_tensor_init(&t, &x, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR,
                               std::numeric_limits<int64_t>::max() / 2, 4, 128),
                PQ_ERR_INVALID_ARGUMENT, "tokens", "overflow");
}

TEST(Hardening, StridesWhoseSpanOverflowsAreInvalid) {
  pq_config c = small_config();
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  HostTensor good = kv(16, 2, 8, 7);
  HostTensor bad = kv(16, 2, 8, 7);
  bad.t.tokens = 2;
  bad.t.token_stride = std::numeric_limits<int64_t>::max() / 2;
  HostTensor good2 = kv(2, 2, 8, 7);
  PQ_EXPECT_ERR(pq_prefill_layer(ctx, 1, 0, bad.get(), good2.get()), PQ_ERR_INVALID_ARGUMENT,
                "keys", "overflow");
  bad.t.token_stride = 16;
  bad.t.head_stride = std::numeric_limits<int64_t>::max() / 3;
  PQ_EXPECT_ERR(pq_prefill_layer(ctx, 1, 0, bad.get(), good2.get()), PQ_ERR_INVALID_ARGUMENT,
                "keys", "overflow");
  int64_t n = -1;
  PQ_EXPECT_OK(pq_sequence_length(ctx, 1, 0, &n));
  EXPECT_EQ(n, 0);  // nothing stored

  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, good.get(), good.get()));
  Sel sel(2, 14);
  HostTensor q = make_tensor(random_normal(4 * 8, 8), 1, 4, 8, PQ_DTYPE_F32);
  PQ_ASSERT_OK(pq_decode_select(ctx, 1, 0, q.get(), sel.get()));
  std::vector<float> out(2 * 14 * 8);
  pq_tensor ok;
  PQ_ASSERT_OK(pq_tensor_init(&ok, out.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, 14, 2, 8));
  pq_tensor huge = ok;
  huge.token_stride = std::numeric_limits<int64_t>::max() / 4;
  PQ_EXPECT_ERR(pq_fetch_kv(ctx, 1, 0, sel.get(), &huge, &ok), PQ_ERR_INVALID_ARGUMENT,
                "out_keys", "overflow");
  PQ_EXPECT_ERR(pq_fetch_kv(ctx, 1, 0, sel.get(), &ok, &huge), PQ_ERR_INVALID_ARGUMENT,
                "out_values", "overflow");
  // A span that fits int64 elements but not in bytes.
  huge.token_stride = std::numeric_limits<int64_t>::max() / 64;
  PQ_EXPECT_ERR(pq_fetch_kv(ctx, 1, 0, sel.get(), &huge, &ok), PQ_ERR_INVALID_ARGUMENT,
                "out_keys", "overflow");
}

// ---------------------------------------------------------------------------
// D6: misaligned data is read as it is (no alignment required)
// ---------------------------------------------------------------------------

TEST(Hardening, MisalignedF32DataWorksLikeAligned) {
  pq_config c = small_config(PQ_SELECTOR_PQ);
  const int64_t n = 96;
  std::vector<float> keys = random_normal(static_cast<size_t>(n * 2 * 8), 9);
  std::vector<float> query = random_normal(4 * 8, 10);
  std::vector<std::vector<int32_t>> rows[2];
  std::vector<float> fetched[2];
  for (int misaligned = 0; misaligned < 2; ++misaligned) {
    // The same values, at a 1-byte offset for the second round.
    std::vector<unsigned char> kbuf(keys.size() * 4 + 1), qbuf(query.size() * 4 + 1);
    unsigned char* k = kbuf.data() + misaligned;
    unsigned char* q = qbuf.data() + misaligned;
    std::memcpy(k, keys.data(), keys.size() * 4);
    std::memcpy(q, query.data(), query.size() * 4);
    pq_tensor kt, qt;
    PQ_ASSERT_OK(pq_tensor_init(&kt, k, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, n, 2, 8));
    PQ_ASSERT_OK(pq_tensor_init(&qt, q, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 1, 4, 8));
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok());
    PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
    PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, &kt, &kt));
    Sel sel(2, selection_capacity(ctx, 1, 0));
    PQ_ASSERT_OK(pq_decode_select(ctx, 1, 0, &qt, sel.get()));
    std::vector<unsigned char> out(2 * static_cast<size_t>(sel.capacity) * 8 * 4 + 1),
        vout(out.size());
    pq_tensor ot, vt;
    PQ_ASSERT_OK(pq_tensor_init(&ot, out.data() + misaligned, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR,
                                sel.capacity, 2, 8));
    PQ_ASSERT_OK(pq_tensor_init(&vt, vout.data() + misaligned, PQ_DTYPE_F32,
                                PQ_LAYOUT_HEAD_MAJOR, sel.capacity, 2, 8));
    PQ_ASSERT_OK(pq_fetch_kv(ctx, 1, 0, sel.get(), &ot, &vt));
    rows[misaligned] = {sel.row(0), sel.row(1)};
    fetched[misaligned].resize(2 * static_cast<size_t>(sel.capacity) * 8);
    std::memcpy(fetched[misaligned].data(), out.data() + misaligned, fetched[misaligned].size() * 4);
  }
  EXPECT_EQ(rows[0][0], rows[1][0]);
  EXPECT_EQ(rows[0][1], rows[1][1]);
  EXPECT_EQ(fetched[0], fetched[1]);
}

// ---------------------------------------------------------------------------
// D7: overlapping output rows are refused; inputs may repeat rows
// ---------------------------------------------------------------------------

TEST(Hardening, FetchIntoOverlappingRowsIsInvalid) {
  pq_config c = small_config();
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  HostTensor t = kv(32, 2, 8, 11);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, t.get(), t.get()));
  Sel sel(2, 10);
  HostTensor q = make_tensor(random_normal(4 * 8, 12), 1, 4, 8, PQ_DTYPE_F32);
  PQ_ASSERT_OK(pq_decode_select(ctx, 1, 0, q.get(), sel.get()));
  std::vector<float> out(2 * 10 * 8, 7.f), other(2 * 10 * 8, 7.f);
  pq_tensor ok;
  PQ_ASSERT_OK(pq_tensor_init(&ok, other.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, 10, 2, 8));
  struct Layout {
    int64_t token_stride, head_stride;
  };
  for (Layout l : {Layout{0, 80}, Layout{8, 0}, Layout{8, 1}, Layout{4, 80}, Layout{12, 8},
                   Layout{1, 8}}) {
    pq_tensor bad;
    PQ_ASSERT_OK(pq_tensor_init(&bad, out.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, 10, 2, 8));
    bad.token_stride = l.token_stride;
    bad.head_stride = l.head_stride;
    PQ_EXPECT_ERR(pq_fetch_kv(ctx, 1, 0, sel.get(), &bad, &ok), PQ_ERR_INVALID_ARGUMENT,
                  "out_keys", "overlap")
        << "token_stride " << l.token_stride << ", head_stride " << l.head_stride;
  }
  for (float v : out) EXPECT_EQ(v, 7.f);  // nothing written
  // Interleaved layouts that do not overlap are fine: [token][head][dim].
  pq_tensor interleaved;
  PQ_ASSERT_OK(pq_tensor_init(&interleaved, out.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 10,
                              2, 8));
  PQ_EXPECT_OK(pq_fetch_kv(ctx, 1, 0, sel.get(), &interleaved, &ok));
  // K and V into one buffer: refused unless their rows interleave without
  // touching ([token][K or V][head][dim] here); the same buffer twice is not.
  PQ_EXPECT_ERR(pq_fetch_kv(ctx, 1, 0, sel.get(), &ok, &ok), PQ_ERR_INVALID_ARGUMENT, "overlap");
  std::vector<float> both(10 * 2 * 2 * 8);
  pq_tensor k_half, v_half;
  PQ_ASSERT_OK(pq_tensor_init(&k_half, both.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 10, 2, 8));
  k_half.token_stride = 2 * 2 * 8;
  v_half = k_half;
  v_half.data = both.data() + 2 * 8;
  PQ_EXPECT_OK(pq_fetch_kv(ctx, 1, 0, sel.get(), &k_half, &v_half));
  v_half.data = both.data() + 8;  // V's head 0 on K's head 1
  PQ_EXPECT_ERR(pq_fetch_kv(ctx, 1, 0, sel.get(), &k_half, &v_half), PQ_ERR_INVALID_ARGUMENT,
                "overlap");
}

TEST(Hardening, InputsMayRepeatARowWithZeroStrides) {
  // A broadcast input (token_stride 0: every token the same row) is read as
  // described: documented as allowed for inputs.
  pq_config c = small_config();
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  std::vector<float> row = random_normal(8, 13);
  pq_tensor t;
  PQ_ASSERT_OK(pq_tensor_init(&t, row.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 20, 2, 8));
  t.token_stride = 0;
  t.head_stride = 0;
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, &t, &t));
  Sel sel(2, 20);
  for (int32_t h = 0; h < 2; ++h) {
    for (int32_t i = 0; i < 20; ++i) sel.positions[static_cast<size_t>(h * 20 + i)] = i;
    sel.counts[static_cast<size_t>(h)] = 20;
  }
  std::vector<float> out(2 * 20 * 8);
  pq_tensor ot;
  PQ_ASSERT_OK(pq_tensor_init(&ot, out.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, 20, 2, 8));
  std::vector<float> vout(out.size());
  pq_tensor vt;
  PQ_ASSERT_OK(pq_tensor_init(&vt, vout.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, 20, 2, 8));
  PQ_ASSERT_OK(pq_fetch_kv(ctx, 1, 0, sel.get(), &ot, &vt));
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], row[i % 8]);
}

// ---------------------------------------------------------------------------
// The smaller ones
// ---------------------------------------------------------------------------

TEST(Hardening, FetchAndObserveBeforePrefillAreBadState) {
  pq_config c = small_config(PQ_SELECTOR_H2O);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  Sel sel(2, 1);
  sel.positions.assign(sel.positions.size(), 0);
  sel.counts = {1, 1};
  std::vector<float> out(2 * 8), vout(2 * 8);
  pq_tensor ot, vt;
  PQ_ASSERT_OK(pq_tensor_init(&ot, out.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, 1, 2, 8));
  PQ_ASSERT_OK(pq_tensor_init(&vt, vout.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, 1, 2, 8));
  PQ_EXPECT_ERR(pq_fetch_kv(ctx, 1, 0, sel.get(), &ot, &vt), PQ_ERR_BAD_STATE, "prefill");
  float probs[2] = {0.5f, 0.5f};
  PQ_EXPECT_ERR(pq_observe_attention(ctx, 1, 0, sel.get(), probs), PQ_ERR_BAD_STATE, "prefill");
}

TEST(Hardening, DuplicatedPositionsCountOnceAsCacheHits) {
  pq_config c = small_config();
  c.cache_tokens = 64;
  c.cache_block_tokens = 8;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  HostTensor t = kv(64, 2, 8, 14);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, t.get(), t.get()));
  std::vector<float> out(2 * 4 * 8), vout(2 * 4 * 8);
  pq_tensor ot, vt;
  PQ_ASSERT_OK(pq_tensor_init(&ot, out.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, 4, 2, 8));
  PQ_ASSERT_OK(pq_tensor_init(&vt, vout.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, 4, 2, 8));
  Sel sel(2, 4);
  for (int32_t h = 0; h < 2; ++h) {
    for (int32_t i = 0; i < 4; ++i) sel.positions[static_cast<size_t>(h * 4 + i)] = 16;
    sel.counts[static_cast<size_t>(h)] = 4;
  }
  PQ_ASSERT_OK(pq_fetch_kv(ctx, 1, 0, sel.get(), &ot, &vt));  // admits block 2
  pq_stats before = stats(ctx);
  PQ_ASSERT_OK(pq_fetch_kv(ctx, 1, 0, sel.get(), &ot, &vt));
  pq_stats after = stats(ctx);
  EXPECT_EQ(after.cache_hits - before.cache_hits, 2u);  // one token per kv head
  EXPECT_EQ(after.cache_misses - before.cache_misses, 0u);
}

// ---------------------------------------------------------------------------
// The host memory limit covers what a caller can make the library allocate
// ---------------------------------------------------------------------------

TEST(HostMemoryLimit, ConfigurationsWhoseFixedStateExceedsTheLimitAreRefused) {
  pq_config c = small_config();
  c.host_memory_limit = 1u << 20;
  c.num_layers = 1 << 20;  // a million layers' state for one sequence
  pq_context* ctx = nullptr;
  PQ_EXPECT_ERR(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, "host_memory_limit");
  EXPECT_EQ(ctx, nullptr);
  c = small_config();
  c.host_memory_limit = 1u << 20;
  c.cache_tokens = int64_t{1} << 26;  // 64M slots of block-cache bookkeeping per layer
  c.cache_block_tokens = 1;
  PQ_EXPECT_ERR(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, "host_memory_limit",
                "cache_tokens");
  EXPECT_EQ(ctx, nullptr);
}

TEST(HostMemoryLimit, SequencesAreRefusedOnceTheirFixedStateDoesNotFit) {
  pq_config c = small_config();
  c.num_layers = 64;
  Ctx probe(c);
  ASSERT_TRUE(probe.ok());
  PQ_ASSERT_OK(pq_sequence_add(probe, 1));
  const uint64_t one = host_bytes(probe);
  ASSERT_GT(one, 0u);
  c.host_memory_limit = 3 * one + one / 2;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  for (uint64_t s = 1; s <= 3; ++s) PQ_ASSERT_OK(pq_sequence_add(ctx, s));
  PQ_EXPECT_ERR(pq_sequence_add(ctx, 4), PQ_ERR_OUT_OF_MEMORY, "host memory limit");
  int64_t count = 0;
  PQ_ASSERT_OK(pq_sequence_count(ctx, &count));
  EXPECT_EQ(count, 3);
  EXPECT_EQ(host_bytes(ctx), 3 * one);
  PQ_ASSERT_OK(pq_sequence_remove(ctx, 2));
  EXPECT_EQ(host_bytes(ctx), 2 * one);
  PQ_EXPECT_OK(pq_sequence_add(ctx, 4));
}

TEST(HostMemoryLimit, OneTokenPrefillTakesOneChunkAsTheHeaderSays) {
  pq_config c = small_config();
  Ctx probe(c);
  ASSERT_TRUE(probe.ok());
  PQ_ASSERT_OK(pq_sequence_add(probe, 1));
  const uint64_t fixed = host_bytes(probe);
  HostTensor one = kv(1, 2, 8, 15);
  PQ_ASSERT_OK(pq_prefill_layer(probe, 1, 0, one.get(), one.get()));
  const uint64_t chunk = host_bytes(probe) - fixed;
  EXPECT_GE(chunk, static_cast<uint64_t>(kChunk) * 2 * 8 * 4 * 2);  // at least the chunk's K/V
  HostTensor more = kv(kChunk - 1, 2, 8, 16);
  PQ_ASSERT_OK(pq_decode_append(probe, 1, 0, more.get(), more.get()));
  EXPECT_EQ(host_bytes(probe) - fixed, chunk);  // the same chunk, filled

  c.host_memory_limit = fixed + chunk;  // exactly one chunk: fits
  Ctx exact(c);
  ASSERT_TRUE(exact.ok());
  PQ_ASSERT_OK(pq_sequence_add(exact, 1));
  PQ_EXPECT_OK(pq_prefill_layer(exact, 1, 0, one.get(), one.get()));
  c.host_memory_limit = fixed + chunk - 1;  // a byte short of the chunk: refused, said why
  Ctx tight(c);
  ASSERT_TRUE(tight.ok());
  PQ_ASSERT_OK(pq_sequence_add(tight, 1));
  PQ_EXPECT_ERR(pq_prefill_layer(tight, 1, 0, one.get(), one.get()), PQ_ERR_OUT_OF_MEMORY,
                "256-token");
}

// Issue 39 R2: FastGen's token classes may describe positions before their
// K/V; with an 8 MiB limit and 100 tokens stored, classes of 200M positions
// were accepted (one copy per layer, 406 MB resident, host_bytes unchanged)
// and a fork copied them again. They are charged as held now: a call that
// would pass the limit is refused and changes nothing, a fork and a restore
// charge their copy, a truncate and a remove give it back.
pq_config fastgen_config(int32_t layers, uint64_t limit) {
  pq_config c = make_config(layers, 4, 2, 8, PQ_DTYPE_F32);
  c.selector = PQ_SELECTOR_FASTGEN;
  c.sink_tokens = 2;
  c.local_tokens = 4;
  c.topk_tokens = 4;
  c.worker_threads = 1;
  c.host_memory_limit = limit;
  return c;
}

// A FastGen context under `limit` whose sequence 1 holds 100 tokens in
// every layer.
Ctx fastgen_with_prompt(int32_t layers, uint64_t limit, uint64_t seed) {
  Ctx ctx(fastgen_config(layers, limit));
  EXPECT_TRUE(ctx.ok()) << pq_last_error();
  EXPECT_EQ(pq_sequence_add(ctx, 1), PQ_OK);
  HostTensor t = kv(100, 2, 8, seed);
  for (int32_t l = 0; l < layers; ++l)
    EXPECT_EQ(pq_prefill_layer(ctx, 1, l, t.get(), t.get()), PQ_OK) << pq_last_error();
  return ctx;
}

TEST(HostMemoryLimit, TokenClassesAheadOfTheirKvAreCharged) {
  constexpr int32_t kLayers = 4;
  Ctx ctx = fastgen_with_prompt(kLayers, 8u << 20, 41);
  const uint64_t before = host_bytes(ctx);
  const uint64_t state_before = [&] {
    uint64_t n = 0;
    EXPECT_EQ(pq_sequence_state_size(ctx, 1, &n), PQ_OK);
    return n;
  }();

  // 4 MiB of classes in each of 4 layers: 16 MiB, past the 8 MiB limit.
  const int64_t huge = int64_t{4} << 20;
  std::vector<uint8_t> classes(static_cast<size_t>(huge), PQ_TOKEN_PUNCTUATION);
  PQ_EXPECT_ERR(pq_sequence_token_classes(ctx, 1, 100, huge, classes.data()),
                PQ_ERR_OUT_OF_MEMORY, "pq_sequence_token_classes", "host memory limit",
                "4 layers");
  EXPECT_EQ(host_bytes(ctx), before) << "a refused call holds nothing";
  uint64_t state_now = 0;
  PQ_ASSERT_OK(pq_sequence_state_size(ctx, 1, &state_now));
  EXPECT_EQ(state_now, state_before) << "a refused call changes no layer";

  // 256 Ki positions ahead fit (1 MiB in all) and are counted as held.
  const int64_t ahead = int64_t{256} << 10;
  PQ_ASSERT_OK(pq_sequence_token_classes(ctx, 1, 100, ahead, classes.data()));
  const uint64_t with_classes = host_bytes(ctx);
  EXPECT_GE(with_classes - before, static_cast<uint64_t>(kLayers) * static_cast<uint64_t>(ahead))
      << "one byte per described position in every layer";
  EXPECT_LE(with_classes - before, 2u * kLayers * static_cast<uint64_t>(100 + ahead));
  pq_stats seq_stats;
  seq_stats.struct_size = sizeof seq_stats;
  PQ_ASSERT_OK(pq_sequence_stats_get(ctx, 1, &seq_stats));
  EXPECT_GE(seq_stats.host_bytes, static_cast<uint64_t>(kLayers) * static_cast<uint64_t>(ahead))
      << "the sequence's own share shows them too";

  // A fork copies them: charged again; refused when the copy does not fit.
  PQ_ASSERT_OK(pq_sequence_fork(ctx, 1, 2));
  EXPECT_GE(host_bytes(ctx) - with_classes,
            static_cast<uint64_t>(kLayers) * static_cast<uint64_t>(ahead));
  PQ_ASSERT_OK(pq_sequence_remove(ctx, 2));
  EXPECT_EQ(host_bytes(ctx), with_classes);

  // A truncate gives back what described the tokens that go.
  PQ_ASSERT_OK(pq_sequence_truncate(ctx, 1, 50));
  EXPECT_LT(host_bytes(ctx), before + kLayers * 1024u)
      << "the classes past the 50 tokens left are released";
  PQ_ASSERT_OK(pq_sequence_remove(ctx, 1));
  EXPECT_EQ(host_bytes(ctx), 0u);
}

TEST(HostMemoryLimit, ForkAndRestoreOfTokenClassesAreRefusedPastTheLimit) {
  constexpr int32_t kLayers = 2;
  Ctx ctx = fastgen_with_prompt(kLayers, 6u << 20, 42);
  // 1.5 MiB per layer: 3 MiB held, a second copy would pass 6 MiB.
  const int64_t ahead = int64_t{3} << 19;
  std::vector<uint8_t> classes(static_cast<size_t>(ahead), PQ_TOKEN_SPECIAL);
  PQ_ASSERT_OK(pq_sequence_token_classes(ctx, 1, 100, ahead, classes.data()));
  const uint64_t held = host_bytes(ctx);
  PQ_EXPECT_ERR(pq_sequence_fork(ctx, 1, 2), PQ_ERR_OUT_OF_MEMORY, "token classes");
  EXPECT_EQ(host_bytes(ctx), held);
  int64_t count = 0;
  PQ_ASSERT_OK(pq_sequence_count(ctx, &count));
  EXPECT_EQ(count, 1);

  std::vector<uint8_t> state;
  uint64_t size = 0;
  PQ_ASSERT_OK(pq_sequence_state_size(ctx, 1, &size));
  state.resize(size);
  uint64_t written = 0;
  PQ_ASSERT_OK(pq_sequence_save_buffer(ctx, 1, state.data(), state.size(), &written));
  PQ_EXPECT_ERR(pq_sequence_restore(ctx, 3, state.data(), written), PQ_ERR_OUT_OF_MEMORY,
                "token classes");
  EXPECT_EQ(host_bytes(ctx), held);
  // Into a context with room it restores, and is charged there.
  Ctx roomy(fastgen_config(kLayers, 0));
  PQ_ASSERT_OK(pq_sequence_restore(roomy, 3, state.data(), written));
  EXPECT_GE(host_bytes(roomy), static_cast<uint64_t>(kLayers) * static_cast<uint64_t>(ahead));
}

TEST(HostMemoryLimit, TokenClassRangesPastTheLargestSequenceAreInvalid) {
  Ctx ctx(fastgen_config(1, 0));
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  uint8_t one = PQ_TOKEN_PLAIN;
  PQ_EXPECT_ERR(pq_sequence_token_classes(ctx, 1, 0, int64_t{1} << 31, &one),
                PQ_ERR_INVALID_ARGUMENT, "first + count", "2147483647");
  PQ_EXPECT_ERR(pq_sequence_token_classes(ctx, 1, 0, INT64_MAX, &one), PQ_ERR_INVALID_ARGUMENT,
                "first + count");
}

// What the limit counts is at least what the library allocates: glibc's
// heap grows by no more than the reported host_bytes for each kind of state.
size_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;  // small blocks of every arena, and mmapped ones
}

void expect_counted(pq_context* ctx, size_t heap_before, uint64_t counted_before,
                    const char* what) {
  const size_t now = heap_in_use();
  const size_t grown = now > heap_before ? now - heap_before : 0;
  const uint64_t counted = host_bytes(ctx) - counted_before;
  EXPECT_GE(counted, grown) << what << ": the heap grew by " << grown << " bytes, "
                            << counted << " counted";
}

TEST(HostMemoryLimit, CountsAtLeastWhatTheLibraryAllocates) {
  if (kSanitizerHeap) GTEST_SKIP() << "a sanitizer's allocator replaces glibc's heap figures";
  // glibc's figures do not see the host tier's 2 MiB slabs (mapped on their
  // own; test_api_host_slabs.cpp checks their charge to the byte): the K/V
  // comes from the heap here, so the upper bound below sees it.
  setenv("PQ_HOST_HUGE_PAGES", "0", 1);
  struct Deferred {
    ~Deferred() { unsetenv("PQ_HOST_HUGE_PAGES"); }
  } restore_env;
  struct Case {
    const char* what;
    int32_t selector;
    int64_t cache_tokens;
  };
  for (Case k : {Case{"PQ codes and centroids", PQ_SELECTOR_PQ, 0},
                 Case{"H2O's accumulators", PQ_SELECTOR_H2O, 0},
                 Case{"Scissorhands' hit histories", PQ_SELECTOR_SCISSORHANDS, 0},
                 Case{"Keyformer's scores", PQ_SELECTOR_KEYFORMER, 0},
                 Case{"ClusterKV's clusters", PQ_SELECTOR_CLUSTERKV, 0},
                 Case{"Quest's block summaries", PQ_SELECTOR_QUEST, 0},
                 Case{"the block cache's bookkeeping", PQ_SELECTOR_EXACT, 4096}}) {
    pq_config c = make_config(16, 8, 4, 64, PQ_DTYPE_F32);
    c.selector = k.selector;
    c.cache_tokens = k.cache_tokens;
    c.cache_block_tokens = 16;
    c.block_tokens = 16;
    c.worker_threads = 1;
    c.kmeans_iterations = 2;
    c.cluster_count = 16;  // ClusterKV: a short clustering
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok());
    // The fixed state is counted when the sequence is added and allocated
    // as it is needed (the index at the build), so what was added is
    // compared from before pq_sequence_add: the limit's promise.
    HostTensor t = kv(3000, 4, 64, 17);
    HostTensor q = make_tensor(random_normal(8 * 64, 18), 1, 8, 64, PQ_DTYPE_F32);
    const size_t heap = heap_in_use();
    const uint64_t counted = host_bytes(ctx);
    PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
    expect_counted(ctx, heap, counted, k.what);
    for (int32_t layer = 0; layer < 16; ++layer) {
      PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, layer, t.get(), t.get()));
      Sel sel(4, selection_capacity(ctx, 1, layer));
      PQ_ASSERT_OK(pq_decode_select(ctx, 1, layer, q.get(), sel.get()));
      std::vector<float> probs(sel.positions.size(), 0.01f);
      PQ_ASSERT_OK(pq_observe_attention(ctx, 1, layer, sel.get(), probs.data()));
      std::vector<float> out(4 * static_cast<size_t>(sel.capacity) * 64), vout(out.size());
      pq_tensor ot, vt;
      PQ_ASSERT_OK(pq_tensor_init(&ot, out.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR,
                                  sel.capacity, 4, 64));
      PQ_ASSERT_OK(pq_tensor_init(&vt, vout.data(), PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR,
                                  sel.capacity, 4, 64));
      PQ_ASSERT_OK(pq_fetch_kv(ctx, 1, layer, sel.get(), &ot, &vt));
    }
    PQ_ASSERT_OK(pq_wait_builds(ctx));
    expect_counted(ctx, heap, counted, k.what);
    // An upper bound, but not a wild one: within 2x of what is allocated.
    EXPECT_LE(host_bytes(ctx), 2 * (heap_in_use() - heap) + (4u << 20)) << k.what;
  }
}

}  // namespace

namespace {

// Issue 39 (audit D3): a speculation's rows were kept until the process
// ended (never charged, never freed); they are now held, and charged, only
// until the layer's next select or truncate.
TEST(HostMemoryLimit, ASpeculationIsChargedUntilTheLayersNextSelect) {
  pq_config c = make_config(1, 4, 2, 8, PQ_DTYPE_F32);
  c.selector = PQ_SELECTOR_EXACT;
  c.topk_fraction = 1.f;  // k is the whole middle: a hint of kv_heads x middle positions
  c.worker_threads = 1;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  HostTensor t = kv(20000, 2, 8, 61);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, t.get(), t.get()));
  HostTensor q = make_tensor(random_normal(4 * 8, 62), 1, 4, 8, PQ_DTYPE_F32);
  const uint64_t before = host_bytes(ctx);
  Sel sel(2, selection_capacity(ctx, 1, 0));
  PQ_ASSERT_OK(pq_decode_speculate(ctx, 1, 0, q.get(), sel.get()));
  const uint64_t middle = 20000 - static_cast<uint64_t>(c.sink_tokens) - c.local_tokens;
  EXPECT_GE(host_bytes(ctx) - before, 2 * middle * sizeof(int32_t)) << "the hint is charged";
  PQ_ASSERT_OK(pq_decode_select(ctx, 1, 0, q.get(), sel.get()));
  EXPECT_EQ(host_bytes(ctx), before) << "the select that used it let it go";
  PQ_ASSERT_OK(pq_decode_speculate(ctx, 1, 0, q.get(), sel.get()));
  PQ_ASSERT_OK(pq_decode_speculate(ctx, 1, 0, q.get(), sel.get()));
  EXPECT_LT(host_bytes(ctx) - before, 2 * 2 * middle * sizeof(int32_t)) << "one hint at a time";
  PQ_ASSERT_OK(pq_sequence_truncate(ctx, 1, 10000));
  PQ_ASSERT_OK(pq_sequence_remove(ctx, 1));
  EXPECT_EQ(host_bytes(ctx), 0u);
  // Refused past the limit, with nothing held.
  c.host_memory_limit = before + 2 * middle;  // room for a quarter of the hint
  Ctx tight(c);
  ASSERT_TRUE(tight.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(tight, 1));
  PQ_ASSERT_OK(pq_prefill_layer(tight, 1, 0, t.get(), t.get()));
  const uint64_t held = host_bytes(tight);
  PQ_EXPECT_ERR(pq_decode_speculate(tight, 1, 0, q.get(), sel.get()), PQ_ERR_OUT_OF_MEMORY,
                "speculation");
  EXPECT_EQ(host_bytes(tight), held);
  PQ_EXPECT_OK(pq_decode_select(tight, 1, 0, q.get(), sel.get()));
}

// Issue 39 (audit D2): a truncate released its chunks' charge while the
// selector states kept their capacity (6 Scissorhands sequences of 8192
// tokens truncated to 0 held 384 MB, host_bytes near 0). What the heap
// holds after the cut is at most what is counted, for every selector that
// keeps per-token state.
TEST(HostMemoryLimit, ATruncateKeepsNoMoreThanItIsCountedFor) {
  if (kSanitizerHeap) GTEST_SKIP() << "a sanitizer's allocator replaces glibc's heap figures";
  for (int32_t selector :
       {PQ_SELECTOR_PQ, PQ_SELECTOR_H2O, PQ_SELECTOR_SCOPE, PQ_SELECTOR_SNAPKV,
        PQ_SELECTOR_QUEST, PQ_SELECTOR_INFLLM, PQ_SELECTOR_SCISSORHANDS, PQ_SELECTOR_KEYFORMER,
        PQ_SELECTOR_CLUSTERKV, PQ_SELECTOR_FASTGEN, PQ_SELECTOR_INFINIGEN}) {
    SCOPED_TRACE("selector " + std::to_string(selector));
    pq_config c = make_config(1, 8, 8, 64, PQ_DTYPE_F32);
    c.selector = selector;
    c.history_window = 1024;  // Scissorhands: 128 bytes of history per token and head
    c.block_tokens = 16;
    c.cluster_count = 16;
    c.kmeans_iterations = 2;
    c.worker_threads = 1;
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    // The test's own buffers come before the baseline or go before the end.
    HostTensor t = kv(16384, 8, 64, 63);
    HostTensor w = make_tensor(random_normal(32 * 8 * 64, 64), 32, 8, 64, PQ_DTYPE_F32);
    HostTensor q = make_tensor(random_normal(8 * 64, 65), 1, 8, 64, PQ_DTYPE_F32);
    const size_t heap = heap_in_use();
    const uint64_t counted = host_bytes(ctx);
    PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
    PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, t.get(), t.get()));
    PQ_ASSERT_OK(pq_prefill_queries(ctx, 1, 0, w.get()));
    {
      Sel sel(8, selection_capacity(ctx, 1, 0));
      PQ_ASSERT_OK(pq_decode_select(ctx, 1, 0, q.get(), sel.get()));
      std::vector<float> probs(sel.positions.size(), 0.01f);
      PQ_ASSERT_OK(pq_observe_attention(ctx, 1, 0, sel.get(), probs.data()));
    }
    PQ_ASSERT_OK(pq_wait_builds(ctx));
    PQ_ASSERT_OK(pq_sequence_truncate(ctx, 1, 300));
    PQ_ASSERT_OK(pq_wait_builds(ctx));
    const size_t kept = heap_in_use() - heap;
    const uint64_t kept_counted = host_bytes(ctx) - counted;
    // What the context keeps with no sequence at all (working memory of a
    // select kept for the next one, not counted) is not the sequence's.
    PQ_ASSERT_OK(pq_sequence_remove(ctx, 1));
    PQ_ASSERT_OK(pq_wait_builds(ctx));
    const size_t idle = heap_in_use() > heap ? heap_in_use() - heap : 0;
    EXPECT_LE(kept, kept_counted + idle)
        << "after the truncate the heap holds " << kept << " bytes more, " << kept_counted
        << " counted, " << idle << " kept by the context without the sequence";
  }
}

}  // namespace
