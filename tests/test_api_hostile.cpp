// Regression tests for the second hostile-caller study (issue 23): outputs
// that overlap the call's own inputs, a removed sequence still counted
// against the memory limit, a write callback that calls back into the
// sequence it saves, and configuration messages. The state-format defects
// of the same study (D3, D4) are in test_api_state.cpp. Each test failed
// (or crashed, or hung) before its fix; docs/reliability.md lists them.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"

using namespace pqt;

namespace {

constexpr int32_t kQ = 4, kKv = 2, kDim = 16;

pq_config hostile_config(int32_t selector = PQ_SELECTOR_EXACT) {
  pq_config c = make_config(1, kQ, kKv, kDim, PQ_DTYPE_F32);
  c.selector = selector;
  c.sink_tokens = 4;
  c.local_tokens = 4;
  c.topk_tokens = 4;
  c.pq_bits = 2;
  c.kmeans_iterations = 2;
  c.worker_threads = 2;
  return c;
}

// K/V whose every element lies in [1, 2): read as an int32 position, each
// is past 10^9, so a row written over a selection makes it point far
// outside any sequence (the shape that found D1).
HostTensor kv_rows(int64_t tokens, uint64_t seed) {
  return make_tensor(random_uniform(static_cast<size_t>(tokens * kKv * kDim), seed, 1.f, 2.f),
                     tokens, kKv, kDim, PQ_DTYPE_F32);
}

// Row (i, h) of a token-major [tokens][kKv][kDim] f32 buffer equals the
// stored row (position, h) of `stored`.
::testing::AssertionResult RowIs(const void* out, int64_t i, int32_t h, const HostTensor& stored,
                                 int32_t position) {
  const auto* row = static_cast<const unsigned char*>(out) + (i * kKv + h) * kDim * sizeof(float);
  if (std::memcmp(row, stored.row(position, h), kDim * sizeof(float)) == 0)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "row (" << i << ", " << h << ") is not the stored row of position " << position;
}

pq_tensor f32_tensor(void* data, int64_t tokens) {
  pq_tensor t;
  pq_tensor_init(&t, data, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, tokens, kKv, kDim);
  return t;
}

// ---------------------------------------------------------------------------
// D1: outputs over the call's own inputs
// ---------------------------------------------------------------------------

TEST(Hostile, FetchIntoItsOwnSelectionReadsTheSelectionOnce) {
  // The positions are the first elements of out_keys and the counts those
  // of out_values: the first rows written overwrite them. The library read
  // them before writing (it used to check them, then read them again while
  // gathering, and crashed on the overwritten values).
  Ctx ctx(hostile_config());
  ASSERT_TRUE(ctx.ok());
  HostTensor stored = kv_rows(64, 1);
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, stored.get(), stored.get()));
  std::vector<int32_t> keys(64 * kKv * kDim), values(64 * kKv * kDim);
  for (int32_t h = 0; h < kKv; ++h)
    for (int32_t i = 0; i < 64; ++i) keys[static_cast<size_t>(h * 64 + i)] = 63 - i;
  values[0] = values[1] = 64;
  const pq_selection sel{keys.data(), values.data(), 64};
  const pq_tensor out_keys = f32_tensor(keys.data(), 64), out_values = f32_tensor(values.data(), 64);
  PQ_ASSERT_OK(pq_fetch_kv(ctx, 1, 0, &sel, &out_keys, &out_values));
  for (int32_t h = 0; h < kKv; ++h)
    for (int32_t i = 0; i < 64; ++i) {
      EXPECT_TRUE(RowIs(keys.data(), i, h, stored, 63 - i));
      EXPECT_TRUE(RowIs(values.data(), i, h, stored, 63 - i));
    }
}

TEST(Hostile, BatchFetchIntoAnotherItemsSelectionNeverCrashes) {
  // The study's reproduction: item 1's out_keys start where item 0's
  // positions are, and the items run concurrently. It crashed (SEGV in the
  // gather) within 3,000 calls on every run.
  Ctx ctx(hostile_config());
  ASSERT_TRUE(ctx.ok());
  HostTensor first = kv_rows(64, 2), second = kv_rows(64, 3);
  for (uint64_t id : {1, 2}) {
    PQ_ASSERT_OK(pq_sequence_add(ctx, id));
    HostTensor& t = id == 1 ? first : second;
    PQ_ASSERT_OK(pq_prefill_layer(ctx, id, 0, t.get(), t.get()));
  }
  std::vector<int32_t> all(kKv * 64), all_counts(kKv, 64), counts0(kKv, 8);
  for (int32_t h = 0; h < kKv; ++h)
    for (int32_t i = 0; i < 64; ++i) all[static_cast<size_t>(h * 64 + i)] = i;
  std::vector<float> keys0(8 * kKv * kDim), values0(keys0.size());
  std::vector<float> keys1(64 * kKv * kDim), values1(keys1.size());
  int32_t* positions0 = reinterpret_cast<int32_t*>(keys1.data());  // item 0's input, item 1's output
  pq_fetch_item items[2] = {};
  items[0] = {1, {positions0, counts0.data(), 8}, f32_tensor(keys0.data(), 8),
              f32_tensor(values0.data(), 8), PQ_OK};
  items[1] = {2, {all.data(), all_counts.data(), 64}, f32_tensor(keys1.data(), 64),
              f32_tensor(values1.data(), 64), PQ_OK};
  for (int round = 0; round < 3000; ++round) {
    for (int32_t h = 0; h < kKv; ++h)
      for (int32_t i = 0; i < 8; ++i) positions0[h * 8 + i] = 7 * i + h;
    PQ_ASSERT_OK(pq_fetch_kv_batch(ctx, 0, items, 2)) << "round " << round;
    for (int32_t h = 0; h < kKv; ++h)
      for (int32_t i = 0; i < 8; ++i)
        ASSERT_TRUE(RowIs(keys0.data(), i, h, first, 7 * i + h)) << "round " << round;
  }
  for (int32_t h = 0; h < kKv; ++h)
    for (int32_t i = 0; i < 64; ++i) EXPECT_TRUE(RowIs(values1.data(), i, h, second, i));
}

TEST(Hostile, BatchOutputsMayNotOverlapTheItemsArray) {
  // The call writes every item's status into the array after the items
  // ran: an output over the array would be overwritten (and, before, items
  // read their descriptors while other items wrote over them).
  Ctx ctx(hostile_config());
  ASSERT_TRUE(ctx.ok());
  HostTensor stored = kv_rows(64, 4);
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  PQ_ASSERT_OK(pq_sequence_add(ctx, 2));
  for (uint64_t id : {1, 2}) PQ_ASSERT_OK(pq_prefill_layer(ctx, id, 0, stored.get(), stored.get()));
  std::vector<int32_t> positions(kKv * 8, 5), counts(kKv, 8);
  std::vector<double> arena(64 * kKv * kDim);  // item 1's out_keys, the items at its start
  std::vector<float> keys0(8 * kKv * kDim), values0(keys0.size()), values1(arena.size() * 2);
  auto* items = reinterpret_cast<pq_fetch_item*>(arena.data());
  items[0] = {1, {positions.data(), counts.data(), 8}, f32_tensor(keys0.data(), 8),
              f32_tensor(values0.data(), 8), static_cast<pq_status>(1)};
  items[1] = {2, {positions.data(), counts.data(), 8}, f32_tensor(arena.data(), 64),
              f32_tensor(values1.data(), 64), static_cast<pq_status>(1)};
  PQ_EXPECT_ERR(pq_fetch_kv_batch(ctx, 0, items, 2), PQ_ERR_INVALID_ARGUMENT, "items[1].out_keys");
  EXPECT_NE(std::string(pq_last_error()).find("the items array"), std::string::npos)
      << pq_last_error();
  EXPECT_EQ(items[0].status, 1);  // a call-level error writes no status
  EXPECT_EQ(items[1].status, 1);
  for (float k : keys0) EXPECT_EQ(k, 0.f);

  std::vector<float> query = random_normal(kQ * kDim, 5);
  auto* select_items = reinterpret_cast<pq_select_item*>(arena.data());
  select_items[0] = {1, {}, {reinterpret_cast<int32_t*>(arena.data()), counts.data(), 16},
                     static_cast<pq_status>(1)};
  pq_tensor_init(&select_items[0].query, query.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 1, kQ,
                 kDim);
  PQ_EXPECT_ERR(pq_decode_select_batch(ctx, 0, select_items, 1), PQ_ERR_INVALID_ARGUMENT,
                "items[0].out.positions");
  EXPECT_EQ(select_items[0].status, 1);
}

// ---------------------------------------------------------------------------
// D5: a selection's counts inside its own positions
// ---------------------------------------------------------------------------

// A sequence of 48 tokens (capacity 12: 4 sinks, 4 chosen, 4 local) and a
// query for it.
class HostileSelect : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ctx_.ok());
    PQ_ASSERT_OK(pq_sequence_add(ctx_, 1));
    PQ_ASSERT_OK(pq_prefill_layer(ctx_, 1, 0, stored_.get(), stored_.get()));
    ASSERT_EQ(selection_capacity(ctx_, 1, 0), kCap);
  }
  static constexpr int64_t kCap = 12;
  Ctx ctx_{hostile_config()};
  HostTensor stored_ = make_tensor(random_normal(48 * kKv * kDim, 6), 48, kKv, kDim, PQ_DTYPE_F32);
  HostTensor query_ = make_tensor(random_normal(kQ * kDim, 7), 1, kQ, kDim, PQ_DTYPE_F32);
};

TEST_F(HostileSelect, CountsInsidePositionsAreInvalid) {
  // The study's case: out.counts = out.positions + 5 gave PQ_OK with row 0
  // [0 1 2 3 20 20 20 46] (the counts overwrote positions as they were
  // written), duplicates that pq_fetch_kv then accepted.
  std::vector<int32_t> buffer(static_cast<size_t>(kKv * kCap), -7);
  pq_selection out{buffer.data(), buffer.data() + 5, kCap};
  PQ_EXPECT_ERR(pq_decode_select(ctx_, 1, 0, query_.get(), &out), PQ_ERR_INVALID_ARGUMENT,
                "out->counts");
  EXPECT_NE(std::string(pq_last_error()).find("out->positions"), std::string::npos);
  for (int32_t v : buffer) EXPECT_EQ(v, -7);  // nothing written

  // The same item in a batch fails on its own.
  pq_select_item item{1, *query_.get(), out, PQ_OK};
  PQ_EXPECT_ERR(pq_decode_select_batch(ctx_, 0, &item, 1), PQ_ERR_INVALID_ARGUMENT,
                "out->counts");
  EXPECT_EQ(item.status, PQ_ERR_INVALID_ARGUMENT);

  // Counts right after the positions do not overlap them.
  buffer.resize(static_cast<size_t>(kKv * kCap + kKv));
  out = {buffer.data(), buffer.data() + kKv * kCap, kCap};
  PQ_ASSERT_OK(pq_decode_select(ctx_, 1, 0, query_.get(), &out));
  for (int32_t h = 0; h < kKv; ++h) {
    EXPECT_EQ(out.counts[h], kCap);
    for (int64_t i = 1; i < kCap; ++i) EXPECT_LT(buffer[h * kCap + i - 1], buffer[h * kCap + i]);
  }
}

TEST_F(HostileSelect, PositionsOverTheirDescriptorGiveTheSelection) {
  // out.positions starts at the pq_selection itself: the first row written
  // replaces the descriptor's pointer and capacity, which the library read
  // again for the next row (a write through a pointer made of positions).
  Sel expected(kKv, kCap);
  PQ_ASSERT_OK(pq_decode_select(ctx_, 1, 0, query_.get(), expected.get()));
  std::vector<int64_t> arena(kKv * kCap);  // 8-byte aligned for the descriptor
  auto* positions = reinterpret_cast<int32_t*>(arena.data());
  std::vector<int32_t> counts(kKv, -1);
  auto* out = reinterpret_cast<pq_selection*>(arena.data());
  *out = {positions, counts.data(), kCap};
  PQ_ASSERT_OK(pq_decode_select(ctx_, 1, 0, query_.get(), out));
  EXPECT_TRUE(std::equal(positions, positions + kKv * kCap, expected.positions.begin()));
  EXPECT_EQ(counts, expected.counts);
}

// ---------------------------------------------------------------------------
// D2: a removed sequence leaves the memory limit when it is removed
// ---------------------------------------------------------------------------

// A build_done hook that holds the pool's one worker in the first build's
// hook until the test opens it: every build queued meanwhile stays queued.
struct Gate {
  std::mutex mutex;
  std::condition_variable cv;
  bool entered = false, open = false;
  static void hold(void* user, uint64_t, int32_t, pq_status) {
    auto* g = static_cast<Gate*>(user);
    std::unique_lock<std::mutex> lock(g->mutex);
    if (g->entered) return;
    g->entered = true;
    g->cv.notify_all();
    g->cv.wait(lock, [g] { return g->open; });
  }
  void wait_entered() {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [this] { return entered; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    open = true;
    cv.notify_all();
  }
};

TEST(Hostile, ARemovedSequenceLeavesTheLimitThoughItsBuildIsQueued) {
  // The study's case: {add, prefill 256 tokens, remove, pq_wait_builds}
  // with the worker busy left every removed sequence's chunk counted
  // (75,776 bytes a cycle) until its cancelled build reached a worker, and
  // refused cycles that fit the limit.
  pq_config c = hostile_config(PQ_SELECTOR_PQ);
  c.worker_threads = 1;
  uint64_t fixed = 0, chunk = 0;
  HostTensor t = kv_rows(256, 10);
  {
    Ctx probe(c);
    ASSERT_TRUE(probe.ok());
    PQ_ASSERT_OK(pq_sequence_add(probe, 1));
    fixed = stats(probe).host_bytes;
    PQ_ASSERT_OK(pq_prefill_layer(probe, 1, 0, t.get(), t.get()));
    chunk = stats(probe).host_bytes - fixed;
  }
  c.host_memory_limit = 3 * fixed + 4 * chunk;
  Gate gate;  // outlives the context, whose pq_destroy waits for the hook
  pq_hooks hooks;
  pq_hooks_default(&hooks);
  hooks.build_done = &Gate::hold;
  hooks.build_done_user = &gate;
  Ctx ctx(c, hooks);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  struct Opener {  // destroyed before ctx, also when an assertion returns
    Gate& g;
    ~Opener() { g.release(); }
  } opener{gate};
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, t.get(), t.get()));
  gate.wait_entered();  // the worker is held from here on
  PQ_ASSERT_OK(pq_wait_builds(ctx));
  const uint64_t held = stats(ctx).host_bytes;
  EXPECT_EQ(held, fixed + chunk);
  for (uint64_t id = 10; id < 16; ++id) {
    PQ_ASSERT_OK(pq_sequence_add(ctx, id));
    PQ_ASSERT_OK(pq_prefill_layer(ctx, id, 0, t.get(), t.get())) << "cycle " << id - 10;
    EXPECT_EQ(stats(ctx).host_bytes, held + fixed + chunk);
    PQ_ASSERT_OK(pq_sequence_remove(ctx, id));
    EXPECT_EQ(stats(ctx).host_bytes, held) << "cycle " << id - 10 << ": after the remove";
    PQ_ASSERT_OK(pq_wait_builds(ctx));
    EXPECT_EQ(stats(ctx).host_bytes, held) << "cycle " << id - 10 << ": after pq_wait_builds";
  }
}

// ---------------------------------------------------------------------------
// D6: a write callback that calls into the sequence it saves
// ---------------------------------------------------------------------------

// Runs fn on a thread and fails the whole program if it has not returned
// within `limit`: a deadlocked thread can be neither joined nor stopped,
// and a hang must fail the test rather than the CI run's clock.
template <typename Fn>
void returns_within(std::chrono::seconds limit, const char* what, Fn fn) {
  std::promise<void> done;
  std::future<void> returned = done.get_future();
  std::thread worker([&] {
    fn();
    done.set_value();
  });
  if (returned.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "FAILED: %s did not return within %lld s (a deadlock)\n", what,
                 static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::_Exit(1);
  }
  worker.join();
}

struct Reentry {
  Reentry(pq_context* c, uint64_t i, int which) : ctx(c), id(i), call(which) {}
  pq_context* ctx;
  uint64_t id;
  int call;
  int writes = 0;
  bool made = false;
  pq_status status = PQ_OK;
  std::string message;
};

// Makes one call on the sequence being saved, from inside the save, at
// its second write: the first section's, which comes under the layer's lock
// (the header before it does not).
int reenter(void* user, const void*, size_t) {
  auto* r = static_cast<Reentry*>(user);
  if (++r->writes != 2) return 0;
  r->made = true;
  HostTensor one = kv_rows(1, 11);
  uint64_t bytes = 0;
  switch (r->call) {
    case 0: r->status = pq_sequence_remove(r->ctx, r->id); break;
    case 1: r->status = pq_sequence_state_size(r->ctx, r->id, &bytes); break;
    case 2: r->status = pq_sequence_truncate(r->ctx, r->id, 3); break;
    case 3: r->status = pq_decode_append(r->ctx, r->id, 0, one.get(), one.get()); break;
    case 4: r->status = pq_sequence_fork(r->ctx, r->id, 99); break;
    case 5: r->status = pq_wait_builds(r->ctx); break;
    default: r->status = pq_prefill_layer(r->ctx, r->id, 0, one.get(), one.get()); break;
  }
  r->message = pq_last_error();
  return 0;
}

int count_bytes(void* user, const void*, size_t size) {
  *static_cast<uint64_t*>(user) += size;
  return 0;
}

TEST(Hostile, WriteCallbackCallsOnTheSavedSequenceAreBadState) {
  // Each of these never returned: the save holds the layer's lock while it
  // calls the write function, and the call waited for that lock.
  const char* names[] = {"pq_sequence_remove", "pq_sequence_state_size", "pq_sequence_truncate",
                         "pq_decode_append", "pq_sequence_fork", "pq_wait_builds",
                         "pq_prefill_layer"};
  Ctx ctx(hostile_config(PQ_SELECTOR_PQ));
  ASSERT_TRUE(ctx.ok());
  HostTensor t = kv_rows(40, 12);
  for (uint64_t id : {1, 2}) {
    PQ_ASSERT_OK(pq_sequence_add(ctx, id));
    PQ_ASSERT_OK(pq_prefill_layer(ctx, id, 0, t.get(), t.get()));
  }
  for (int call = 0; call < 7; ++call) {
    SCOPED_TRACE(names[call]);
    Reentry r{ctx, 1, call};
    pq_status saved = PQ_ERR_INTERNAL;
    returns_within(std::chrono::seconds(120), names[call],
                   [&] { saved = pq_sequence_save(ctx, 1, &reenter, &r); });
    PQ_EXPECT_OK(saved);
    EXPECT_TRUE(r.made);
    EXPECT_EQ(r.status, PQ_ERR_BAD_STATE) << r.message;
    EXPECT_NE(r.message.find("pq_write_fn"), std::string::npos) << r.message;
    EXPECT_EQ(selection_capacity(ctx, 1, 0), 12);  // still there, unchanged
  }
  // Calls on other sequences work from inside the save.
  Reentry other{ctx, 2, 3};
  returns_within(std::chrono::seconds(120), "an append to another sequence",
                 [&] { PQ_EXPECT_OK(pq_sequence_save(ctx, 1, &reenter, &other)); });
  PQ_EXPECT_OK(other.status);
  int64_t n = 0;
  PQ_EXPECT_OK(pq_sequence_length(ctx, 2, 0, &n));
  EXPECT_EQ(n, 41);
  // And after the save, the sequence takes every call again.
  uint64_t bytes = 0;
  PQ_EXPECT_OK(pq_sequence_save(ctx, 1, &count_bytes, &bytes));
  PQ_EXPECT_OK(pq_sequence_truncate(ctx, 1, 30));
}

// ---------------------------------------------------------------------------
// D7: configuration messages
// ---------------------------------------------------------------------------

TEST(Hostile, ConfigMessagesNameTheCallAndTheExactBound) {
  pq_context* out = nullptr;
  pq_config c = hostile_config();
  c.compute_gamma = 1e308;
  PQ_EXPECT_ERR(pq_create(&c, &out), PQ_ERR_INVALID_ARGUMENT, "compute_gamma");
  std::string message = pq_last_error();
  EXPECT_EQ(message,
            "pq_create: config.compute_gamma is 1e+308; expected a finite value in [0, 1e+300]");
  PQ_EXPECT_ERR(pq_create_with_hooks(&c, nullptr, &out), PQ_ERR_INVALID_ARGUMENT,
                "compute_gamma");
  EXPECT_EQ(std::string(pq_last_error()).rfind("pq_create_with_hooks: ", 0), 0u);
  c = hostile_config();
  c.pyramid_ratio = 1.5f;
  PQ_EXPECT_ERR(pq_create(&c, &out), PQ_ERR_INVALID_ARGUMENT, "pyramid_ratio");
  EXPECT_EQ(std::string(pq_last_error()),
            "pq_create: config.pyramid_ratio is 1.5; expected a value in (0, 1]");
  c = hostile_config();
  c.kmeans_tolerance = -0.1f;  // a float field prints as the float it is
  PQ_EXPECT_ERR(pq_create(&c, &out), PQ_ERR_INVALID_ARGUMENT, "kmeans_tolerance");
  EXPECT_EQ(std::string(pq_last_error()),
            "pq_create: config.kmeans_tolerance is -0.1; expected a finite value in [0, 1e+300]");
  EXPECT_EQ(out, nullptr);
}

}  // namespace
