// What the Redis tier's tests share (test_redis.cpp: one server;
// test_redis_cluster.cpp: a cluster of three): status checks with
// pq_redis_last_error(), a small model with a filled sequence, and the
// comparisons of two contexts' selections and fetched rows.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"
#include "pqcache_redis.h"

namespace pqrt {

using namespace pqt;

// ---------------------------------------------------------------------------
// Status checks with pq_redis_last_error()
// ---------------------------------------------------------------------------

inline ::testing::AssertionResult RedisOk(pq_status got) {
  if (got == PQ_OK) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "status " << status_name(got)
                                       << "; pq_redis_last_error() = \"" << pq_redis_last_error()
                                       << "\"";
}

// The call returned `want` and pq_redis_last_error() names every one of
// `names` (case-insensitive).
inline ::testing::AssertionResult RedisError(pq_status got, pq_status want,
                                             std::initializer_list<std::string> names) {
  const std::string msg = pq_redis_last_error();
  if (got != want)
    return ::testing::AssertionFailure() << "status " << status_name(got) << ", expected "
                                         << status_name(want) << "; pq_redis_last_error() = \""
                                         << msg << "\"";
  for (const std::string& n : names)
    if (!contains_ci(msg, n))
      return ::testing::AssertionFailure() << "pq_redis_last_error() = \"" << msg
                                           << "\" does not name \"" << n << "\"";
  std::printf("    %s: %s\n", pq_status_string(got), msg.c_str());  // what a user reads
  return ::testing::AssertionSuccess();
}

#define REDIS_ASSERT_OK(call) ASSERT_TRUE(::pqrt::RedisOk(call)) << #call
#define REDIS_EXPECT_ERR(call, want, ...) \
  EXPECT_TRUE(::pqrt::RedisError((call), (want), {__VA_ARGS__})) << #call

// ---------------------------------------------------------------------------
// A small model: a few layers, a few hundred tokens, PQ, some decode steps
// ---------------------------------------------------------------------------

constexpr int32_t kLayers = 3, kQHeads = 4, kKvHeads = 2, kDim = 32;
constexpr int64_t kPrompt = 300;
constexpr int kDecodeSteps = 5;

inline pq_config model_config(int32_t head_dim = kDim, int32_t layers = kLayers) {
  pq_config c = make_config(layers, kQHeads, kKvHeads, head_dim, PQ_DTYPE_F16);
  c.selector = PQ_SELECTOR_PQ;
  c.pq_subspaces = 2;
  c.pq_bits = 4;
  c.kmeans_iterations = 6;
  c.sink_tokens = 4;
  c.local_tokens = 32;
  c.topk_tokens = 40;
  c.worker_threads = 2;
  return c;
}

inline HostTensor random_kv(int64_t tokens, uint64_t seed) {
  auto data = random_normal(static_cast<size_t>(tokens) * kKvHeads * kDim, seed);
  return make_tensor(data, tokens, kKvHeads, kDim, PQ_DTYPE_F16);
}

inline HostTensor random_query(uint64_t seed) {
  auto data = random_normal(static_cast<size_t>(kQHeads) * kDim, seed);
  return make_tensor(data, 1, kQHeads, kDim, PQ_DTYPE_F16);
}

// Prefills every layer of seq with kPrompt tokens, then kDecodeSteps decode
// steps (append one token, select) on every layer.
inline void fill_sequence(pq_context* ctx, uint64_t seq, uint64_t seed) {
  PQ_ASSERT_OK(pq_sequence_add(ctx, seq));
  for (int32_t l = 0; l < kLayers; ++l) {
    HostTensor k = random_kv(kPrompt, seed * 100 + l), v = random_kv(kPrompt, seed * 100 + 50 + l);
    PQ_ASSERT_OK(pq_prefill_layer(ctx, seq, l, k.get(), v.get()));
  }
  for (int step = 0; step < kDecodeSteps; ++step)
    for (int32_t l = 0; l < kLayers; ++l) {
      HostTensor k = random_kv(1, seed * 1000 + step * 10 + l);
      HostTensor v = random_kv(1, seed * 2000 + step * 10 + l);
      PQ_ASSERT_OK(pq_decode_append(ctx, seq, l, k.get(), v.get()));
      HostTensor q = random_query(seed * 3000 + step * 10 + l);
      int64_t cap = selection_capacity(ctx, seq, l);
      ASSERT_GT(cap, 0);
      Sel sel(kKvHeads, cap);
      PQ_ASSERT_OK(pq_decode_select(ctx, seq, l, q.get(), sel.get()));
    }
}

// What one decode step sees at a layer: the selection and the fetched bytes.
struct StepView {
  std::vector<int32_t> positions, counts;
  std::vector<unsigned char> keys, values;
};

// The selection alone (no fetch): what a sequence whose K/V are still on the
// way can do.
inline StepView select_only(pq_context* ctx, uint64_t seq, int32_t layer, uint64_t query_seed) {
  StepView out;
  HostTensor q = random_query(query_seed);
  int64_t cap = selection_capacity(ctx, seq, layer);
  EXPECT_GT(cap, 0);
  if (cap <= 0) return out;
  Sel sel(kKvHeads, cap);
  EXPECT_TRUE(IsOk(pq_decode_select(ctx, seq, layer, q.get(), sel.get())));
  out.positions = sel.positions;
  out.counts = sel.counts;
  return out;
}

inline StepView select_and_fetch(pq_context* ctx, uint64_t seq, int32_t layer, uint64_t query_seed) {
  StepView out = select_only(ctx, seq, layer, query_seed);
  if (out.counts.empty()) return out;
  const int64_t cap = static_cast<int64_t>(out.positions.size()) / kKvHeads;
  Sel sel(kKvHeads, cap);
  sel.positions = out.positions;
  sel.counts = out.counts;
  HostTensor k = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR);
  HostTensor v = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR);
  EXPECT_TRUE(IsOk(pq_fetch_kv(ctx, seq, layer, sel.get(), k.get(), v.get())));
  out.keys = k.bytes;
  out.values = v.bytes;
  return out;
}

// Every layer of (a, seq_a) and (b, seq_b) selects the same positions and
// fetches the same bytes for the same queries.
inline void expect_same_steps(pq_context* a, uint64_t seq_a, pq_context* b, uint64_t seq_b,
                       uint64_t query_seed) {
  for (int32_t l = 0; l < kLayers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    int64_t len_a = -1, len_b = -2;
    EXPECT_TRUE(IsOk(pq_sequence_length(a, seq_a, l, &len_a)));
    EXPECT_TRUE(IsOk(pq_sequence_length(b, seq_b, l, &len_b)));
    EXPECT_EQ(len_a, len_b);
    StepView x = select_and_fetch(a, seq_a, l, query_seed + l);
    StepView y = select_and_fetch(b, seq_b, l, query_seed + l);
    EXPECT_EQ(x.counts, y.counts);
    EXPECT_EQ(x.positions, y.positions);
    EXPECT_TRUE(x.keys == y.keys) << "fetched keys differ";
    EXPECT_TRUE(x.values == y.values) << "fetched values differ";
  }
}

// pq_fetch_kv of a selection's first rows at a layer: its status.
inline pq_status try_fetch(pq_context* ctx, uint64_t seq, int32_t layer) {
  int64_t cap = selection_capacity(ctx, seq, layer);
  if (cap <= 0) return PQ_ERR_INTERNAL;
  Sel sel(kKvHeads, cap);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    sel.counts[h] = 1;
    sel.positions[static_cast<size_t>(h * cap)] = 0;
  }
  HostTensor k = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR);
  HostTensor v = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR);
  return pq_fetch_kv(ctx, seq, layer, sel.get(), k.get(), v.get());
}

inline int32_t layers_ready(const pq_redis_transfer* t) {
  int32_t n = -1;
  EXPECT_EQ(pq_redis_transfer_progress(t, nullptr, nullptr, nullptr, &n), PQ_OK);
  return n;
}

inline uint64_t fetched_bytes(const pq_redis_transfer* t) {
  uint64_t n = 0;
  EXPECT_EQ(pq_redis_transfer_progress(t, &n, nullptr, nullptr, nullptr), PQ_OK);
  return n;
}

// pq_redis_get_begin, then pq_redis_get_finish, then free: the streaming
// get as one call.
inline ::testing::AssertionResult StreamedGet(pq_redis* conn, pq_context* ctx, uint64_t seq,
                                       const char* key) {
  pq_redis_transfer* t = nullptr;
  ::testing::AssertionResult begun = RedisOk(pq_redis_get_begin(conn, ctx, seq, key, &t));
  if (!begun) return begun << " (pq_redis_get_begin)";
  ::testing::AssertionResult finished = RedisOk(pq_redis_get_finish(t));
  pq_redis_transfer_free(t);
  if (!finished) return finished << " (pq_redis_get_finish)";
  return ::testing::AssertionSuccess();
}

inline bool has_sequence(pq_context* ctx, uint64_t seq) {
  int64_t n = 0;
  return pq_sequence_length(ctx, seq, 0, &n) == PQ_OK;
}

inline uint64_t state_size(pq_context* ctx, uint64_t seq) {
  uint64_t n = 0;
  EXPECT_TRUE(IsOk(pq_sequence_state_size(ctx, seq, &n)));
  return n;
}

}  // namespace pqrt
