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
