// Whatever a caller observes, the library can restore what it saves: the
// selectors that keep observed attention (H2O, SCOPE, FastGen, Scissorhands,
// Keyformer) take any finite probability >= 0 (pq_observe_attention's only
// requirement), huge, denormal or zero, and every state saved along a random
// run of appends, selects and observations restores, saves back to the same
// bytes and selects as the original does. Public API only.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "api_test_util.h"

namespace {

using pqt::Ctx;
using pqt::Sel;

constexpr uint64_t kSeq = 1, kRestored = 2;
constexpr int32_t kQ = 4, kKv = 2, kDim = 8;
constexpr int64_t kPrompt = 40, kWindow = 4;

std::vector<uint8_t> save(pq_context* ctx, uint64_t id) {
  uint64_t size = 0;
  EXPECT_TRUE(pqt::IsOk(pq_sequence_state_size(ctx, id, &size)));
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  uint64_t written = 0;
  EXPECT_TRUE(pqt::IsOk(pq_sequence_save_buffer(ctx, id, bytes.data(), size, &written)));
  bytes.resize(static_cast<size_t>(written));
  return bytes;
}

// A probability as a caller might report it: ordinary, zero, denormal, or a
// finite number near the float's limit.
float any_probability(std::mt19937& rng) {
  const float special[] = {0.f, FLT_TRUE_MIN, 1e-40f, FLT_MIN, 1.f, 1e30f, 3e38f, FLT_MAX};
  std::uniform_int_distribution<int> pick(0, 11);
  const int i = pick(rng);
  if (i < 8) return special[i];
  return std::uniform_real_distribution<float>(0.f, 1.f)(rng);
}

pq_config observed_config(int32_t selector) {
  pq_config c = pqt::make_config(1, kQ, kKv, kDim, PQ_DTYPE_F32);
  c.selector = selector;
  c.sink_tokens = 2;
  c.local_tokens = 4;
  c.topk_tokens = 6;
  c.observation_window = kWindow;
  c.history_window = 8;
  c.worker_threads = 1;
  return c;
}

// Sequence kSeq with the prompt's K/V (the first kPrompt tokens of `keys`)
// and window queries.
void start(pq_context* ctx, const std::vector<float>& keys, uint64_t seed) {
  const std::vector<float> queries = pqt::random_normal(size_t{kWindow} * kQ * kDim, seed);
  pqt::HostTensor kt = pqt::make_tensor(keys.data(), kPrompt, kKv, kDim, PQ_DTYPE_F32);
  pqt::HostTensor qt = pqt::make_tensor(queries, kWindow, kQ, kDim, PQ_DTYPE_F32);
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  PQ_ASSERT_OK(pq_prefill_layer(ctx, kSeq, 0, kt.get(), kt.get()));
  PQ_ASSERT_OK(pq_prefill_queries(ctx, kSeq, 0, qt.get()));
}

pq_status select(pq_context* ctx, uint64_t id, const std::vector<float>& q, Sel* sel) {
  pqt::HostTensor qt = pqt::make_tensor(q, 1, kQ, kDim, PQ_DTYPE_F32);
  return pq_decode_select(ctx, id, 0, qt.get(), sel->get());
}

// One random run of `ops` operations on `selector`; every few operations the
// state is saved, restored as another sequence, compared and removed.
void run(int32_t selector, uint64_t seed, int ops) {
  const pq_config c = observed_config(selector);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const std::vector<float> keys = pqt::random_normal(size_t{kPrompt + 200} * kKv * kDim, seed);
  start(ctx, keys, seed + 1);
  if (::testing::Test::HasFatalFailure()) return;
  int64_t tokens = kPrompt, restores = 0;
  Sel last(kKv, 1);
  bool selected = false;
  for (int op = 0; op < ops; ++op) {
    SCOPED_TRACE("operation " + std::to_string(op));
    const int kind = std::uniform_int_distribution<int>(0, 3)(rng);
    const std::vector<float> q = pqt::random_normal(size_t{kQ} * kDim, seed * 1000 + op);
    if (kind == 0 && tokens < kPrompt + 200) {  // append and select
      pqt::HostTensor kv = pqt::make_tensor(keys.data() + tokens * kKv * kDim, 1, kKv, kDim, c.dtype);
      PQ_ASSERT_OK(pq_decode_append(ctx, kSeq, 0, kv.get(), kv.get()));
      ++tokens;
    }
    if (kind <= 1 || !selected) {  // select
      last = Sel(kKv, pqt::selection_capacity(ctx, kSeq, 0));
      PQ_ASSERT_OK(select(ctx, kSeq, q, &last));
      selected = true;
    }
    if (kind <= 2) {  // observe the last selection, one or two calls
      const int calls = std::uniform_int_distribution<int>(1, 2)(rng);
      for (int i = 0; i < calls; ++i) {
        std::vector<float> probs(static_cast<size_t>(kKv * std::max<int64_t>(last.capacity, 1)));
        for (float& p : probs) p = any_probability(rng);
        PQ_ASSERT_OK(pq_observe_attention(ctx, kSeq, 0, last.get(), probs.data()));
      }
      continue;
    }
    // Save, restore as another sequence, save that back, select on both.
    const std::vector<uint8_t> state = save(ctx, kSeq);
    ASSERT_FALSE(state.empty());
    const pq_status restored = pq_sequence_restore(ctx, kRestored, state.data(), state.size());
    ASSERT_TRUE(pqt::IsOk(restored)) << "a state the library saved does not restore";
    ++restores;
    EXPECT_EQ(save(ctx, kRestored), state) << "the restored state saves other bytes";
    Sel original(kKv, pqt::selection_capacity(ctx, kSeq, 0));
    Sel again(kKv, pqt::selection_capacity(ctx, kRestored, 0));
    PQ_ASSERT_OK(select(ctx, kSeq, q, &original));
    PQ_ASSERT_OK(select(ctx, kRestored, q, &again));
    for (int32_t h = 0; h < kKv; ++h)
      EXPECT_EQ(again.row(h), original.row(h)) << "kv head " << h;
    PQ_ASSERT_OK(pq_sequence_remove(ctx, kRestored));
    last = original;
  }
  EXPECT_GT(restores, 0) << "the run saved nothing: it checked nothing";
}

TEST(StateObserved, AnyFiniteProbabilitiesLeaveARestorableState) {
  for (int32_t selector : {PQ_SELECTOR_H2O, PQ_SELECTOR_SCOPE, PQ_SELECTOR_FASTGEN,
                           PQ_SELECTOR_SCISSORHANDS, PQ_SELECTOR_KEYFORMER}) {
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      SCOPED_TRACE("selector " + std::to_string(selector) + ", seed " + std::to_string(seed));
      run(selector, seed, 80);
      if (HasFatalFailure()) return;
    }
  }
}

// The reproduction: two observations of 3e38 of one token.
TEST(StateObserved, TwoHugeObservationsOfOneTokenStillRestore) {
  for (int32_t selector : {PQ_SELECTOR_H2O, PQ_SELECTOR_SCOPE, PQ_SELECTOR_FASTGEN}) {
    SCOPED_TRACE("selector " + std::to_string(selector));
    Ctx ctx(observed_config(selector));
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    start(ctx, pqt::random_normal(size_t{kPrompt} * kKv * kDim, 9), 10);
    if (HasFatalFailure()) return;
    Sel sel(kKv, pqt::selection_capacity(ctx, kSeq, 0));
    PQ_ASSERT_OK(select(ctx, kSeq, std::vector<float>(kQ * kDim, 1.f), &sel));
    const std::vector<float> huge(static_cast<size_t>(kKv * sel.capacity), 3e38f);
    PQ_ASSERT_OK(pq_observe_attention(ctx, kSeq, 0, sel.get(), huge.data()));
    PQ_ASSERT_OK(pq_observe_attention(ctx, kSeq, 0, sel.get(), huge.data()));
    const std::vector<uint8_t> state = save(ctx, kSeq);
    EXPECT_TRUE(pqt::IsOk(pq_sequence_restore(ctx, kRestored, state.data(), state.size())));
  }
}

// Issue 39 (audit D4): prompt scores were NaN when q . k overflowed the
// float (keys and queries near FLT_MAX, both accepted): exp(inf - inf) in
// the window rows' softmax. The selection went on, the save succeeded, the
// restore refused it as PQ_ERR_CORRUPT for SnapKV, PyramidKV, AdaKV,
// ZigZagKV, SCOPE, FastGen and PyramidInfer.
TEST(StateObserved, PromptScoresOfOverflowingLogitsRestore) {
  for (int32_t selector : {PQ_SELECTOR_SNAPKV, PQ_SELECTOR_PYRAMIDKV, PQ_SELECTOR_ADAKV,
                           PQ_SELECTOR_ZIGZAGKV, PQ_SELECTOR_SCOPE, PQ_SELECTOR_FASTGEN,
                           PQ_SELECTOR_PYRAMIDINFER, PQ_SELECTOR_KEYFORMER}) {
    for (float big : {1e20f, 3e38f}) {
      SCOPED_TRACE("selector " + std::to_string(selector) + ", " + std::to_string(big));
      Ctx ctx(observed_config(selector));
      ASSERT_TRUE(ctx.ok()) << pq_last_error();
      std::vector<float> keys = pqt::random_normal(size_t{kPrompt} * kKv * kDim, 21);
      std::vector<float> queries = pqt::random_normal(size_t{kWindow} * kQ * kDim, 22);
      // Token 9's keys and every window query point the same huge way, and
      // token 12's the opposite: +inf and -inf in the same row, and
      // products that overflow inside one dot.
      for (int32_t h = 0; h < kKv; ++h) {
        keys[(size_t{9} * kKv + h) * kDim] = big;
        keys[(size_t{9} * kKv + h) * kDim + 1] = -big;
        keys[(size_t{12} * kKv + h) * kDim] = -big;
      }
      for (size_t r = 0; r < size_t{kWindow} * kQ; ++r) {
        queries[r * kDim] = big;
        queries[r * kDim + 1] = big;
      }
      pqt::HostTensor kt = pqt::make_tensor(keys.data(), kPrompt, kKv, kDim, PQ_DTYPE_F32);
      pqt::HostTensor qt = pqt::make_tensor(queries, kWindow, kQ, kDim, PQ_DTYPE_F32);
      PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
      PQ_ASSERT_OK(pq_prefill_layer(ctx, kSeq, 0, kt.get(), kt.get()));
      PQ_ASSERT_OK(pq_prefill_queries(ctx, kSeq, 0, qt.get()));
      const std::vector<float> q = pqt::random_normal(size_t{kQ} * kDim, 23);
      Sel original(kKv, pqt::selection_capacity(ctx, kSeq, 0));
      PQ_ASSERT_OK(select(ctx, kSeq, q, &original));
      const std::vector<uint8_t> state = save(ctx, kSeq);
      ASSERT_TRUE(pqt::IsOk(pq_sequence_restore(ctx, kRestored, state.data(), state.size())))
          << "a state the library saved does not restore";
      Sel again(kKv, pqt::selection_capacity(ctx, kRestored, 0));
      Sel twice(kKv, pqt::selection_capacity(ctx, kSeq, 0));
      PQ_ASSERT_OK(select(ctx, kSeq, q, &twice));
      PQ_ASSERT_OK(select(ctx, kRestored, q, &again));
      for (int32_t h = 0; h < kKv; ++h) EXPECT_EQ(again.row(h), twice.row(h)) << "kv head " << h;
    }
  }
}

}  // namespace
