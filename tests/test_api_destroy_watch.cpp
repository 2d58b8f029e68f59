// pq_watch_destroy / pq_unwatch_destroy: how a handle kept by another
// library (the Redis tier's transfer, tests/redis/test_redis.cpp
// TransferOutlivesItsContext) learns that its context goes first
// (issue 39, R1).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"

using namespace pqt;

namespace {

pq_config watch_config() {
  pq_config c = make_config(2, 4, 2, 8, PQ_DTYPE_F32);
  c.selector = PQ_SELECTOR_EXACT;
  c.worker_threads = 1;
  return c;
}

struct Calls {
  std::vector<int> order;
};
struct Watcher {
  Calls* calls;
  int name;
};
void record(void* user) {
  auto* w = static_cast<Watcher*>(user);
  w->calls->order.push_back(w->name);
}

TEST(DestroyWatch, EachWatchRunsOnceNewestFirstBeforeTheContextIsFreed) {
  Calls calls;
  Watcher w1{&calls, 1}, w2{&calls, 2}, w3{&calls, 3};
  Ctx ctx(watch_config());
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  uint64_t id1 = 0, id2 = 0, id3 = 0;
  PQ_ASSERT_OK(pq_watch_destroy(ctx, record, &w1, &id1));
  PQ_ASSERT_OK(pq_watch_destroy(ctx, record, &w2, &id2));
  PQ_ASSERT_OK(pq_watch_destroy(ctx, record, &w3, &id3));
  EXPECT_NE(id1, id2);
  EXPECT_NE(id2, id3);
  PQ_ASSERT_OK(pq_unwatch_destroy(ctx, id2));
  EXPECT_TRUE(calls.order.empty()) << "nothing runs before pq_destroy";
  ctx.reset();
  EXPECT_EQ(calls.order, (std::vector<int>{3, 1}));
}

TEST(DestroyWatch, EndedAndUnknownWatchesAreNotFound) {
  Calls calls;
  Watcher w{&calls, 1};
  Ctx ctx(watch_config());
  uint64_t id = 0;
  PQ_ASSERT_OK(pq_watch_destroy(ctx, record, &w, &id));
  PQ_ASSERT_OK(pq_unwatch_destroy(ctx, id));
  PQ_EXPECT_ERR(pq_unwatch_destroy(ctx, id), PQ_ERR_NOT_FOUND, std::to_string(id).c_str());
  PQ_EXPECT_ERR(pq_unwatch_destroy(ctx, id + 1000), PQ_ERR_NOT_FOUND, "never made");
  ctx.reset();
  EXPECT_TRUE(calls.order.empty());
}

TEST(DestroyWatch, NullArgumentsAreNamed) {
  Ctx ctx(watch_config());
  uint64_t id = 0;
  Calls calls;
  Watcher w{&calls, 1};
  PQ_EXPECT_ERR(pq_watch_destroy(nullptr, record, &w, &id), PQ_ERR_INVALID_ARGUMENT,
                "pq_watch_destroy", "ctx");
  PQ_EXPECT_ERR(pq_watch_destroy(ctx, nullptr, &w, &id), PQ_ERR_INVALID_ARGUMENT, "fn");
  PQ_EXPECT_ERR(pq_watch_destroy(ctx, record, &w, nullptr), PQ_ERR_INVALID_ARGUMENT,
                "out_watch");
  PQ_EXPECT_ERR(pq_unwatch_destroy(nullptr, 1), PQ_ERR_INVALID_ARGUMENT, "pq_unwatch_destroy",
                "ctx");
  PQ_ASSERT_OK(pq_watch_destroy(ctx, record, nullptr, &id));  // user may be NULL
  PQ_ASSERT_OK(pq_unwatch_destroy(ctx, id));
}

// A watch may end another watch of the same context from inside pq_destroy
// (a handle freeing its companion handles): no deadlock, and the ended
// watch, already taken out, still runs once.
struct Chain {
  pq_context* ctx;
  uint64_t other;
  pq_status unwatch_status = PQ_OK;
  int runs = 0;
};
void end_other(void* user) {
  auto* c = static_cast<Chain*>(user);
  ++c->runs;
  if (c->other != 0) c->unwatch_status = pq_unwatch_destroy(c->ctx, c->other);
}

TEST(DestroyWatch, AWatchMayEndAnotherWithoutDeadlock) {
  Ctx ctx(watch_config());
  Chain first{ctx, 0}, second{ctx, 0};
  uint64_t id_first = 0, id_second = 0;
  PQ_ASSERT_OK(pq_watch_destroy(ctx, end_other, &first, &id_first));
  PQ_ASSERT_OK(pq_watch_destroy(ctx, end_other, &second, &id_second));
  second.other = id_first;  // runs first (newest), ends the other
  ctx.reset();
  EXPECT_EQ(second.runs, 1);
  EXPECT_EQ(first.runs, 1);
  EXPECT_EQ(second.unwatch_status, PQ_ERR_NOT_FOUND);
}

}  // namespace
