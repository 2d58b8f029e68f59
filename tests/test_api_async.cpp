// Asynchronous index builds: prefill returns before the build ends, select
// waits only for its own layer, builds can be waited for, cancelled by
// pq_sequence_remove and by pq_destroy; concurrent drivers give the same
// results as serial ones; statistics add up.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"

using namespace pqt;

namespace {

// A big f16 layer filled with a cheap deterministic generator (uniform-ish
// keys in [-2, 2), zero values): building it with 50 forced K-Means
// iterations takes well over half a second on two cores.
constexpr int64_t kBigTokens = 32768;
constexpr int32_t kBigKvHeads = 8;
constexpr int32_t kBigDim = 64;

struct BigLayer {
  HostTensor K, V;
};

BigLayer make_big_layer(uint64_t seed, int64_t tokens = kBigTokens) {
  BigLayer b;
  b.K = make_tensor(nullptr, tokens, kBigKvHeads, kBigDim, PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 0, 0, 0);
  b.V = make_tensor(nullptr, tokens, kBigKvHeads, kBigDim, PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 0, 0, 0);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  uint16_t* k = reinterpret_cast<uint16_t*>(b.K.bytes.data());
  size_t n = b.K.bytes.size() / 2;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    float f = static_cast<float>(static_cast<int32_t>(x >> 40) - (1 << 23)) / static_cast<float>(1 << 22);
    k[i] = float_to_half(f);
  }
  b.K.get();
  b.V.get();
  return b;
}

pq_config big_config(int32_t layers) {
  pq_config c = make_config(layers, kBigKvHeads, kBigKvHeads, kBigDim, PQ_DTYPE_F16);
  c.kmeans_iterations = 50;
  c.kmeans_tolerance = 0.0f;
  // 4096 training points per (kv head, subspace): with 16 groups and 50
  // iterations the build takes about a second on two cores, the encoding of
  // all 32K tokens a little more.
  c.kmeans_max_points_per_centroid = 64;
  c.worker_threads = 2;
  c.topk_tokens = 64;
  return c;
}

std::vector<float> small_keys(int64_t n, uint64_t seed) {
  return random_normal(static_cast<size_t>(n * kBigKvHeads * kBigDim), seed);
}

TEST(ApiAsync, PrefillReturnsBeforeBuildAndSelectWaitsOnlyForItsLayer) {
  pq_config c = big_config(2);
  // 8192 training points per group: the build takes well over a second on
  // two cores (measured about 1.3 s), so the checks right after the prefill
  // and after the select on the other layer see it pending.
  c.kmeans_max_points_per_centroid = 128;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));

  // Layer 1: small, built before the big one starts.
  const int64_t small = 300;
  std::vector<float> sk = small_keys(small, 1);
  HostTensor SK = make_tensor(sk, small, kBigKvHeads, kBigDim, PQ_DTYPE_F16);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 1, SK.get(), SK.get()));
  PQ_ASSERT_OK(pq_wait_builds(ctx));
  pq_layer_info i1 = layer_info(ctx, 1, 1);
  EXPECT_EQ(i1.index_ready, 1);
  EXPECT_EQ(i1.build_pending, 0);

  BigLayer big = make_big_layer(7);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, big.K.get(), big.V.get()));
  pq_status st;
  pq_layer_info i0 = layer_info(ctx, 1, 0, &st);
  PQ_ASSERT_OK(st);
  EXPECT_EQ(i0.build_pending, 1) << "pq_prefill_layer waited for the build";
  EXPECT_EQ(i0.index_ready, 0);
  EXPECT_EQ(i0.tokens, kBigTokens);
  EXPECT_EQ(i0.prefill_tokens, kBigTokens);

  // A select on the already-built layer does not wait for layer 0.
  std::vector<float> q = random_normal(kBigKvHeads * kBigDim, 2);
  HostTensor Q = make_tensor(q, 1, kBigKvHeads, kBigDim, PQ_DTYPE_F16);
  Sel s1(kBigKvHeads, selection_capacity(ctx, 1, 1));
  PQ_ASSERT_OK(pq_decode_select(ctx, 1, 1, Q.get(), s1.get()));
  i0 = layer_info(ctx, 1, 0);
  EXPECT_EQ(i0.build_pending, 1) << "select on layer 1 waited for layer 0's build";
  EXPECT_EQ(i0.index_ready, 0);

  // A select on the big layer waits for its build.
  int64_t cap = selection_capacity(ctx, 1, 0);
  EXPECT_EQ(cap, 4 + 64 + 128);
  Sel s0(kBigKvHeads, cap);
  PQ_ASSERT_OK(pq_decode_select(ctx, 1, 0, Q.get(), s0.get()));
  i0 = layer_info(ctx, 1, 0);
  EXPECT_EQ(i0.build_pending, 0);
  EXPECT_EQ(i0.index_ready, 1);
  EXPECT_EQ(i0.kmeans_iterations, 50);
  EXPECT_EQ(i0.kmeans_budget, 50);
  EXPECT_EQ(i0.coded_tokens, kBigTokens);
  EXPECT_GT(i0.build_seconds, 0.0);
  std::printf("[async] big layer build: %.3f s (%d iterations)\n", i0.build_seconds,
              i0.kmeans_iterations);
  for (int32_t h = 0; h < kBigKvHeads; ++h) EXPECT_EQ(s0.counts[static_cast<size_t>(h)], cap);

  pq_stats s = stats(ctx);
  EXPECT_EQ(s.builds_finished, 2u);
  EXPECT_EQ(s.kmeans_iterations, static_cast<uint64_t>(i0.kmeans_iterations + i1.kmeans_iterations));
  EXPECT_EQ(s.select_calls, 2u);
  EXPECT_GT(s.build_seconds, 0.0);
  EXPECT_GT(s.select_seconds, 0.0);
  EXPECT_GT(s.index_bytes, 0u);
}

TEST(ApiAsync, WaitBuildsFinishesEveryLayer) {
  pq_config c = big_config(3);
  c.kmeans_iterations = 10;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  BigLayer big = make_big_layer(3, 2048);
  for (uint64_t seq : {1u, 2u}) {
    PQ_ASSERT_OK(pq_sequence_add(ctx, seq));
    for (int32_t l = 0; l < 3; ++l) PQ_ASSERT_OK(pq_prefill_layer(ctx, seq, l, big.K.get(), big.V.get()));
  }
  PQ_ASSERT_OK(pq_wait_builds(ctx));
  for (uint64_t seq : {1u, 2u})
    for (int32_t l = 0; l < 3; ++l) {
      pq_layer_info info = layer_info(ctx, seq, l);
      EXPECT_EQ(info.build_pending, 0) << seq << "/" << l;
      EXPECT_EQ(info.index_ready, 1) << seq << "/" << l;
      EXPECT_EQ(info.kmeans_iterations, 10) << seq << "/" << l;
      EXPECT_EQ(info.coded_tokens, 2048) << seq << "/" << l;
    }
  pq_stats s = stats(ctx);
  EXPECT_EQ(s.builds_finished, 6u);
  EXPECT_EQ(s.kmeans_iterations, 60u);
  // Same data, same seed, same layer: same index in both sequences.
  std::vector<float> c1(2 * 64 * 32), c2(2 * 64 * 32);
  PQ_ASSERT_OK(pq_index_centroids(ctx, 1, 2, 5, c1.data(), static_cast<int64_t>(c1.size())));
  PQ_ASSERT_OK(pq_index_centroids(ctx, 2, 2, 5, c2.data(), static_cast<int64_t>(c2.size())));
  EXPECT_EQ(0, std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)));
}

TEST(ApiAsync, DestroyWithBuildsInFlight) {
  pq_config c = big_config(4);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  BigLayer big = make_big_layer(5, 16384);
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  PQ_ASSERT_OK(pq_sequence_add(ctx, 2));
  for (int32_t l = 0; l < 4; ++l) PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, l, big.K.get(), big.V.get()));
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 2, 0, big.K.get(), big.V.get()));
  int pending = 0;
  for (int32_t l = 0; l < 4; ++l) pending += layer_info(ctx, 1, l).build_pending;
  EXPECT_GE(pending, 2) << "builds should still be queued or running";
  ctx.reset();  // pq_destroy: cancels and waits, must return cleanly
  // A new context works normally afterwards.
  Ctx again(c);
  ASSERT_TRUE(again.ok());
  PQ_EXPECT_OK(pq_sequence_add(again, 1));
}

TEST(ApiAsync, RemoveSequenceWithBuildInFlight) {
  pq_config c = big_config(1);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  BigLayer big = make_big_layer(9);
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  PQ_ASSERT_OK(pq_sequence_add(ctx, 2));
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, big.K.get(), big.V.get()));
  EXPECT_EQ(layer_info(ctx, 1, 0).build_pending, 1);
  PQ_ASSERT_OK(pq_sequence_remove(ctx, 1));
  int64_t count = -1, len = -1;
  PQ_ASSERT_OK(pq_sequence_count(ctx, &count));
  EXPECT_EQ(count, 1);
  PQ_EXPECT_ERR(pq_sequence_length(ctx, 1, 0, &len), PQ_ERR_NOT_FOUND, "seq", "1");
  pq_stats s = stats(ctx);
  EXPECT_EQ(s.tokens, 0) << "removed sequence's tokens still counted";
  EXPECT_EQ(s.kv_bytes, 0u);

  // The other sequence and a re-added id work.
  const int64_t small = 400;
  std::vector<float> sk = small_keys(small, 3);
  HostTensor SK = make_tensor(sk, small, kBigKvHeads, kBigDim, PQ_DTYPE_F16);
  std::vector<float> q = random_normal(kBigKvHeads * kBigDim, 4);
  HostTensor Q = make_tensor(q, 1, kBigKvHeads, kBigDim, PQ_DTYPE_F16);
  for (uint64_t seq : {2u, 1u}) {
    if (seq == 1) {
      PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
    }
    PQ_ASSERT_OK(pq_prefill_layer(ctx, seq, 0, SK.get(), SK.get()));
    Sel sel(kBigKvHeads, selection_capacity(ctx, seq, 0));
    PQ_ASSERT_OK(pq_decode_select(ctx, seq, 0, Q.get(), sel.get()));
    pq_layer_info info = layer_info(ctx, seq, 0);
    EXPECT_EQ(info.tokens, small);
    EXPECT_EQ(info.index_ready, 1);
  }
  PQ_ASSERT_OK(pq_wait_builds(ctx));
  s = stats(ctx);
  EXPECT_GE(s.builds_cancelled, 1u) << "the removed sequence's build was not cancelled";
  EXPECT_EQ(s.builds_finished, 2u);
  EXPECT_EQ(s.tokens, 2 * small);
}

TEST(ApiAsync, RepeatedPrefillSupersedesRunningBuild) {
  pq_config c = big_config(1);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  BigLayer big = make_big_layer(11, 16384);
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, big.K.get(), big.V.get()));
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, big.K.get(), big.V.get()));
  PQ_ASSERT_OK(pq_wait_builds(ctx));
  pq_layer_info info = layer_info(ctx, 1, 0);
  EXPECT_EQ(info.tokens, 2 * 16384);
  EXPECT_EQ(info.coded_tokens, 2 * 16384);
  EXPECT_EQ(info.index_ready, 1);
  EXPECT_EQ(info.build_pending, 0);
  EXPECT_EQ(info.kmeans_iterations, 50);
  pq_stats s = stats(ctx);
  EXPECT_GE(s.builds_cancelled, 1u) << "the first build should have been superseded";
  EXPECT_EQ(s.builds_finished, 1u);
}

// ---------------------------------------------------------------------------
// Concurrent drivers
// ---------------------------------------------------------------------------

constexpr int32_t kLayers = 2, kQH = 4, kKvH = 2, kHd = 32;

pq_config driver_config() {
  pq_config c = make_config(kLayers, kQH, kKvH, kHd, PQ_DTYPE_F16);
  c.pq_bits = 5;
  c.sink_tokens = 4;
  c.local_tokens = 16;
  c.topk_tokens = 20;
  c.kmeans_iterations = 6;
  c.worker_threads = 2;
  return c;
}

struct Trace {
  std::vector<std::vector<int32_t>> selections;  // per step/layer: all rows
  std::vector<std::vector<unsigned char>> fetched;
  std::vector<std::vector<uint8_t>> codes;
};

// Prefill every layer, then decode steps: append, select, fetch. `layers`
// restricts the driver to some layers (for per-layer threads).
void drive(pq_context* ctx, uint64_t seq, Trace* out, std::vector<int32_t> layers = {0, 1}) {
  const int64_t n = 700;
  for (int32_t l : layers) {
    std::vector<float> k = random_normal(static_cast<size_t>(n * kKvH * kHd), seq * 100 + l);
    std::vector<float> v = random_normal(static_cast<size_t>(n * kKvH * kHd), seq * 100 + l + 50);
    HostTensor K = make_tensor(k, n, kKvH, kHd, PQ_DTYPE_F16);
    HostTensor V = make_tensor(v, n, kKvH, kHd, PQ_DTYPE_F16);
    ASSERT_TRUE(IsOk(pq_prefill_layer(ctx, seq, l, K.get(), V.get())));
  }
  for (int step = 0; step < 25; ++step) {
    for (int32_t l : layers) {
      std::vector<float> k = random_normal(static_cast<size_t>(kKvH * kHd), seq * 10000 + step * 10 + l);
      HostTensor K = make_tensor(k, 1, kKvH, kHd, PQ_DTYPE_F16);
      ASSERT_TRUE(IsOk(pq_decode_append(ctx, seq, l, K.get(), K.get())));
      std::vector<float> q = random_normal(static_cast<size_t>(kQH * kHd), seq * 20000 + step * 10 + l);
      HostTensor Q = make_tensor(q, 1, kQH, kHd, PQ_DTYPE_F16);
      int64_t cap = 0;
      ASSERT_TRUE(IsOk(pq_selection_capacity(ctx, seq, l, &cap)));
      Sel sel(kKvH, cap);
      ASSERT_TRUE(IsOk(pq_decode_select(ctx, seq, l, Q.get(), sel.get())));
      std::vector<int32_t> rows(sel.positions);
      rows.insert(rows.end(), sel.counts.begin(), sel.counts.end());
      out->selections.push_back(rows);
      HostTensor OK = make_tensor(nullptr, cap, kKvH, kHd, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR);
      HostTensor OV = make_tensor(nullptr, cap, kKvH, kHd, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR);
      ASSERT_TRUE(IsOk(pq_fetch_kv(ctx, seq, l, sel.get(), OK.get(), OV.get())));
      out->fetched.push_back(OK.bytes);
      out->fetched.push_back(OV.bytes);
    }
  }
  for (int32_t l : layers) {
    std::vector<uint8_t> cd(static_cast<size_t>(700 * 2));
    ASSERT_TRUE(IsOk(pq_index_codes(ctx, seq, l, 1, 0, 700, cd.data())));
    out->codes.push_back(cd);
  }
}

void expect_same(const Trace& a, const Trace& b, const std::string& what) {
  EXPECT_EQ(a.selections.size(), b.selections.size()) << what;
  EXPECT_TRUE(a.selections == b.selections) << what << ": selections differ";
  EXPECT_TRUE(a.fetched == b.fetched) << what << ": fetched bytes differ";
  EXPECT_TRUE(a.codes == b.codes) << what << ": codes differ";
}

TEST(ApiAsync, TwoSequencesOnTwoThreadsMatchSerial) {
  pq_config c = driver_config();
  Trace serial[2], concurrent[2];
  {
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    for (uint64_t seq : {1u, 2u}) {
      PQ_ASSERT_OK(pq_sequence_add(ctx, seq));
      drive(ctx, seq, &serial[seq - 1]);
    }
  }
  {
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
    PQ_ASSERT_OK(pq_sequence_add(ctx, 2));
    std::thread t1([&] { drive(ctx, 1, &concurrent[0]); });
    std::thread t2([&] { drive(ctx, 2, &concurrent[1]); });
    t1.join();
    t2.join();
    pq_stats s = stats(ctx);
    EXPECT_EQ(s.select_calls, 2u * 25 * kLayers);
    EXPECT_EQ(s.fetch_calls, 2u * 25 * kLayers);
    EXPECT_EQ(s.tokens, 2 * kLayers * (700 + 25));
  }
  ASSERT_FALSE(serial[0].selections.empty());
  expect_same(serial[0], concurrent[0], "sequence 1");
  expect_same(serial[1], concurrent[1], "sequence 2");
}

TEST(ApiAsync, OneSequenceTwoLayersOnTwoThreadsMatchSerial) {
  pq_config c = driver_config();
  Trace serial[2], concurrent[2];
  {
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok());
    PQ_ASSERT_OK(pq_sequence_add(ctx, 3));
    drive(ctx, 3, &serial[0], {0});
    drive(ctx, 3, &serial[1], {1});
  }
  {
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok());
    PQ_ASSERT_OK(pq_sequence_add(ctx, 3));
    std::thread t0([&] { drive(ctx, 3, &concurrent[0], {0}); });
    std::thread t1([&] { drive(ctx, 3, &concurrent[1], {1}); });
    t0.join();
    t1.join();
  }
  expect_same(serial[0], concurrent[0], "layer 0");
  expect_same(serial[1], concurrent[1], "layer 1");
}

// ---------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------

TEST(ApiAsync, StatsAddUp) {
  pq_config c = driver_config();
  c.kmeans_tolerance = 0.0f;
  c.kmeans_iterations = 7;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  const size_t row = static_cast<size_t>(kKvH) * kHd * 2 /* f16 */ * 2 /* K and V */;
  // (sequence, layer) -> tokens
  struct Part {
    uint64_t seq;
    int32_t layer;
    int64_t tokens;
  } parts[] = {{1, 0, 300}, {1, 1, 700}, {2, 0, 1000}, {2, 1, 256}};
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  PQ_ASSERT_OK(pq_sequence_add(ctx, 2));
  for (const Part& p : parts) {
    std::vector<float> k = random_normal(static_cast<size_t>(p.tokens * kKvH * kHd), p.seq * 7 + p.layer);
    HostTensor K = make_tensor(k, p.tokens, kKvH, kHd, PQ_DTYPE_F16);
    PQ_ASSERT_OK(pq_prefill_layer(ctx, p.seq, p.layer, K.get(), K.get()));
  }
  // Five appends to (2, 1): 256 -> 261 crosses a chunk boundary.
  for (int i = 0; i < 5; ++i) {
    std::vector<float> k = random_normal(static_cast<size_t>(kKvH * kHd), 900 + i);
    HostTensor K = make_tensor(k, 1, kKvH, kHd, PQ_DTYPE_F16);
    PQ_ASSERT_OK(pq_decode_append(ctx, 2, 1, K.get(), K.get()));
  }
  parts[3].tokens += 5;
  PQ_ASSERT_OK(pq_wait_builds(ctx));

  std::vector<float> q = random_normal(kQH * kHd, 5);
  HostTensor Q = make_tensor(q, 1, kQH, kHd, PQ_DTYPE_F16);
  int selects = 0;
  for (const Part& p : parts)
    for (int r = 0; r < 3; ++r) {
      Sel sel(kKvH, selection_capacity(ctx, p.seq, p.layer));
      PQ_ASSERT_OK(pq_decode_select(ctx, p.seq, p.layer, Q.get(), sel.get()));
      ++selects;
    }

  uint64_t exact = 0, rounded = 0;
  int64_t tokens = 0;
  for (const Part& p : parts) {
    tokens += p.tokens;
    exact += static_cast<uint64_t>(p.tokens) * row;
    rounded += static_cast<uint64_t>((p.tokens + 255) / 256 * 256) * row;
  }
  pq_stats s = stats(ctx);
  EXPECT_EQ(s.struct_size, sizeof(pq_stats));
  EXPECT_EQ(s.sequences, 2);
  EXPECT_EQ(s.tokens, tokens);
  EXPECT_GE(s.kv_bytes, exact);
  EXPECT_LE(s.kv_bytes, rounded);
  EXPECT_GT(s.index_bytes, 0u);
  EXPECT_EQ(s.builds_finished, 4u);
  EXPECT_EQ(s.kmeans_iterations, 4u * 7);
  EXPECT_EQ(s.select_calls, static_cast<uint64_t>(selects));
  EXPECT_GT(s.select_seconds, 0.0);
  EXPECT_GT(s.build_seconds, 0.0);
  EXPECT_GT(s.bytes_scored, 0u);
  EXPECT_EQ(s.fetch_calls, 0u);
  EXPECT_EQ(s.bytes_fetched, 0u);

  // Per sequence: they add up to the context's.
  pq_stats s1, s2;
  std::memset(&s1, 0, sizeof s1);
  std::memset(&s2, 0, sizeof s2);
  s1.struct_size = s2.struct_size = sizeof(pq_stats);
  PQ_ASSERT_OK(pq_sequence_stats_get(ctx, 1, &s1));
  PQ_ASSERT_OK(pq_sequence_stats_get(ctx, 2, &s2));
  EXPECT_EQ(s1.tokens, 1000);
  EXPECT_EQ(s2.tokens, 1261);
  EXPECT_EQ(s1.tokens + s2.tokens, s.tokens);
  EXPECT_EQ(s1.kv_bytes + s2.kv_bytes, s.kv_bytes);
  EXPECT_EQ(s1.select_calls + s2.select_calls, s.select_calls);
  EXPECT_EQ(s1.builds_finished + s2.builds_finished, s.builds_finished);

  // Removing a sequence drops its tokens and bytes but keeps its counters.
  PQ_ASSERT_OK(pq_sequence_remove(ctx, 1));
  pq_stats after = stats(ctx);
  EXPECT_EQ(after.sequences, 1);
  EXPECT_EQ(after.tokens, s2.tokens);
  EXPECT_EQ(after.kv_bytes, s2.kv_bytes);
  EXPECT_EQ(after.select_calls, s.select_calls);
  EXPECT_EQ(after.builds_finished, s.builds_finished);
}

}  // namespace
