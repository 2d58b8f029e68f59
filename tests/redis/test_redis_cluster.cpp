// The Redis tier on Redis Cluster (pq_redis_connect_cluster,
// docs/redis.md "Redis Cluster"): each test starts a cluster of three
// masters of its own on loopback (redis_cluster.h) and kills it in its
// destructor; fake nodes (redis_server.h) play a node that dies in the middle
// of a put, redirects forever or answers CLUSTERDOWN / TRYAGAIN. Without
// redis-server the tests report SKIPPED.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "pqcache.h"
#include "pqcache_redis.h"
#include "redis_cluster.h"
#include "redis_server.h"
#include "redis_test_util.h"

using namespace pqt;
using namespace pqrt;

namespace {

class RedisClusterTier : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = cluster_.start();
    if (!why.empty()) {
      if (why.find("not installed") != std::string::npos) GTEST_SKIP() << why;
      FAIL() << why;
    }
    REDIS_ASSERT_OK(pq_redis_connect_cluster("127.0.0.1", cluster_.port(0), 5000, &conn_));
    pq_config c = model_config();
    a_ = Ctx(c);
    b_ = Ctx(c);
    ASSERT_TRUE(a_.ok() && b_.ok()) << pq_last_error();
    fill_sequence(a_, kSeqA, 11);
    state_bytes_ = state_size(a_, kSeqA);
  }
  void TearDown() override {
    pq_redis_close(conn_);
    conn_ = nullptr;
  }

  // A key whose state lands on node `node`: its hash tag's slot is in the
  // node's range, as the cluster itself computes it (CLUSTER KEYSLOT).
  std::string key_on(int node, const std::string& prefix = "session:") {
    for (int n = 0; n < 1000; ++n) {
      const std::string key = prefix + std::to_string(n);
      if (RedisCluster::node_of_slot(cluster_.key_slot("{" + key + "}")) == node) return key;
    }
    ADD_FAILURE() << "no key found for node " << node;
    return "";
  }

  std::string where(int node) const { return "127.0.0.1:" + std::to_string(cluster_.port(node)); }

  // The number of keys on node i (DBSIZE).
  std::string dbsize(int i) { return cluster_.run(i, {"DBSIZE"}); }

  // kSeqA in a_ is unchanged: same state size, and it selects and fetches.
  void expect_a_intact() {
    EXPECT_EQ(state_size(a_, kSeqA), state_bytes_);
    for (int32_t l = 0; l < kLayers; ++l) EXPECT_FALSE(select_and_fetch(a_, kSeqA, l, 77 + l).counts.empty());
  }

  static constexpr uint64_t kSeqA = 1;
  static constexpr uint64_t kBlock = 4096;
  RedisCluster cluster_;
  pq_redis* conn_ = nullptr;
  Ctx a_, b_;
  uint64_t state_bytes_ = 0;
};

// Put, info, get, streaming get and delete through the cluster, for one key
// on each of the three nodes: each state lives on its slot's node only,
// under the hash-tagged names.
TEST_F(RedisClusterTier, PutGetAndStreamingGetOnEveryNode) {
  for (int node = 0; node < RedisCluster::kMasters; ++node) {
    SCOPED_TRACE("node " + std::to_string(node));
    const std::string key = key_on(node);
    REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, key.c_str(), kBlock));
    uint64_t bytes = 0, block = 0, blocks = 0;
    REDIS_ASSERT_OK(pq_redis_info(conn_, key.c_str(), &bytes, &block, &blocks));
    EXPECT_EQ(bytes, state_bytes_);
    EXPECT_GT(blocks, 2u);
    // Every name of the state is on this node, in one slot: the manifest and
    // the blocks, nothing else.
    const int slot = cluster_.key_slot("{" + key + "}");
    EXPECT_EQ(cluster_.run(node, {"EXISTS", "{" + key + "}:manifest"}), ":1");
    EXPECT_EQ(cluster_.run(node, {"EXISTS", "{" + key + "}:blk:" + std::to_string(blocks - 1)}),
              ":1");
    EXPECT_EQ(cluster_.keys_in_slot(node, slot).size(), blocks + 1);
    for (int other = 0; other < RedisCluster::kMasters; ++other)
      if (other != node) EXPECT_EQ(dbsize(other), ":0") << "node " << other;

    const uint64_t whole = 100 + node, streamed = 200 + node;
    REDIS_ASSERT_OK(pq_redis_get(conn_, b_, whole, key.c_str()));
    expect_same_steps(a_, kSeqA, b_, whole, 500 + node);
    // The streaming get, one block a call after begin.
    pq_redis_transfer* t = nullptr;
    REDIS_ASSERT_OK(pq_redis_get_begin(conn_, b_, streamed, key.c_str(), &t));
    int32_t done = 0;
    while (done == 0) REDIS_ASSERT_OK(pq_redis_get_continue(t, 1, &done));
    pq_redis_transfer_free(t);
    expect_same_steps(a_, kSeqA, b_, streamed, 600 + node);

    REDIS_ASSERT_OK(pq_redis_delete(conn_, key.c_str()));
    EXPECT_EQ(dbsize(node), ":0");
    REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, 300 + node, key.c_str()), PQ_ERR_NOT_FOUND,
                     "{" + key + "}");
  }
}

// A slot moved to another node after the connection read the map: the old
// node answers MOVED, which is followed (and the map read again).
TEST_F(RedisClusterTier, MovedSlotIsFollowed) {
  const std::string key = key_on(0);
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, key.c_str(), kBlock));
  const int slot = cluster_.key_slot("{" + key + "}");
  ASSERT_EQ(cluster_.begin_migration(slot, 0, 1), "");
  ASSERT_EQ(cluster_.migrate_keys(0, 1, cluster_.keys_in_slot(0, slot)), "");
  ASSERT_EQ(cluster_.end_migration(slot, 1), "");
  ASSERT_EQ(dbsize(0), ":0");

  REDIS_ASSERT_OK(pq_redis_get(conn_, b_, 7, key.c_str()));  // the stale map says node 0
  expect_same_steps(a_, kSeqA, b_, 7, 41);
  ASSERT_TRUE(StreamedGet(conn_, b_, 8, key.c_str()));
  expect_same_steps(a_, kSeqA, b_, 8, 42);
  // Writes go to the slot's new node too.
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, key.c_str(), kBlock));
  EXPECT_EQ(dbsize(0), ":0");
  EXPECT_EQ(cluster_.run(1, {"EXISTS", "{" + key + "}:manifest"}), ":1");
  // A connection made before the move, used first for this key: a moved
  // slot is followed by a put too (its first command is redirected).
  pq_redis* early = nullptr;
  REDIS_ASSERT_OK(pq_redis_connect_cluster("127.0.0.1", cluster_.port(2), 5000, &early));
  const std::string key2 = key_on(0, "other:");
  const int slot2 = cluster_.key_slot("{" + key2 + "}");
  ASSERT_EQ(cluster_.begin_migration(slot2, 0, 2), "");
  ASSERT_EQ(cluster_.end_migration(slot2, 2), "");
  REDIS_ASSERT_OK(pq_redis_put(early, a_, kSeqA, key2.c_str(), kBlock));
  EXPECT_EQ(cluster_.run(2, {"EXISTS", "{" + key2 + "}:manifest"}), ":1");
  REDIS_ASSERT_OK(pq_redis_get(early, b_, 9, key2.c_str()));
  expect_same_steps(a_, kSeqA, b_, 9, 43);
  pq_redis_close(early);
}

// A slot half migrated: the manifest and some blocks on the target, the
// rest on the source. The source answers ASK for what it no longer has;
// each such command goes to the target preceded by ASKING. Get, the
// streaming get and a put all work in the middle of the migration, and a
// get after it (MOVED).
TEST_F(RedisClusterTier, AskDuringASlotMigrationIsFollowed) {
  const std::string key = key_on(0);
  const std::string name = "{" + key + "}";
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, key.c_str(), kBlock));
  uint64_t blocks = 0;
  REDIS_ASSERT_OK(pq_redis_info(conn_, key.c_str(), nullptr, nullptr, &blocks));
  const int slot = cluster_.key_slot(name);
  ASSERT_EQ(cluster_.begin_migration(slot, 0, 1), "");
  std::vector<std::string> moved = {name + ":manifest"};
  for (uint64_t n = 0; n < blocks; n += 2) moved.push_back(name + ":blk:" + std::to_string(n));
  ASSERT_EQ(cluster_.migrate_keys(0, 1, moved), "");
  // The source sends a client to the target for what it has not any more.
  ASSERT_EQ(cluster_.run(0, {"EXISTS", name + ":manifest"}).rfind("-ASK ", 0), 0u);
  ASSERT_EQ(cluster_.run(0, {"EXISTS", name + ":blk:1"}), ":1");

  REDIS_ASSERT_OK(pq_redis_get(conn_, b_, 7, key.c_str()));
  expect_same_steps(a_, kSeqA, b_, 7, 51);
  ASSERT_TRUE(StreamedGet(conn_, b_, 8, key.c_str()));
  expect_same_steps(a_, kSeqA, b_, 8, 52);
  // A put meanwhile: blocks still on the source are written there, the
  // others and the manifest on the target; a get reads it back.
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, key.c_str(), kBlock));
  EXPECT_EQ(cluster_.run_asking(1, {"EXISTS", name + ":manifest"}), ":1");
  EXPECT_EQ(cluster_.run(0, {"EXISTS", name + ":blk:1"}), ":1");
  REDIS_ASSERT_OK(pq_redis_get(conn_, b_, 9, key.c_str()));
  expect_same_steps(a_, kSeqA, b_, 9, 53);

  // The migration ends: everything on the target, the source answers MOVED.
  ASSERT_EQ(cluster_.migrate_keys(0, 1, cluster_.keys_in_slot(0, slot)), "");
  ASSERT_EQ(cluster_.end_migration(slot, 1), "");
  ASSERT_EQ(dbsize(0), ":0");
  REDIS_ASSERT_OK(pq_redis_get(conn_, b_, 10, key.c_str()));
  expect_same_steps(a_, kSeqA, b_, 10, 54);
  REDIS_ASSERT_OK(pq_redis_delete(conn_, key.c_str()));
  EXPECT_EQ(dbsize(1), ":0");
}

// The node that serves the key is killed between get_begin and the rest of
// the transfer: PQ_ERR_BACKEND naming the node, the half-restored sequence
// removed, the source untouched. While it is down, get and put fail the
// same way and add nothing; once it is back (empty: no persistence), put and
// the streaming get work again on the same connection.
TEST_F(RedisClusterTier, NodeKilledDuringAStreamingGet) {
  const int node = 1;
  const std::string key = key_on(node);
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, key.c_str(), kBlock));
  pq_redis_transfer* t = nullptr;
  REDIS_ASSERT_OK(pq_redis_get_begin(conn_, b_, 7, key.c_str(), &t));
  EXPECT_TRUE(has_sequence(b_, 7));
  cluster_.kill(node);
  REDIS_EXPECT_ERR(pq_redis_get_finish(t), PQ_ERR_BACKEND, where(node));
  EXPECT_FALSE(has_sequence(b_, 7)) << "a half-restored sequence was left behind";
  REDIS_EXPECT_ERR(pq_redis_get_continue(t, 1, nullptr), PQ_ERR_BAD_STATE, "failed earlier");
  pq_redis_transfer_free(t);
  expect_a_intact();

  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, 7, key.c_str()), PQ_ERR_BACKEND, where(node));
  EXPECT_FALSE(has_sequence(b_, 7));
  REDIS_EXPECT_ERR(pq_redis_get_begin(conn_, b_, 7, key.c_str(), &t), PQ_ERR_BACKEND,
                   where(node));
  EXPECT_FALSE(has_sequence(b_, 7));
  REDIS_EXPECT_ERR(pq_redis_put(conn_, a_, kSeqA, key.c_str(), kBlock), PQ_ERR_BACKEND,
                   where(node));
  expect_a_intact();

  const std::string why = cluster_.restart(node);
  ASSERT_TRUE(why.empty()) << why;
  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, 7, key.c_str()), PQ_ERR_NOT_FOUND, key);
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, key.c_str(), kBlock));
  ASSERT_TRUE(StreamedGet(conn_, b_, 7, key.c_str()));
  expect_same_steps(a_, kSeqA, b_, 7, 61);
}

// The whole get and a put when the node dies: the get of a key on a node
// killed after the put adds nothing, and keys on the other nodes still work
// from the same connection.
TEST_F(RedisClusterTier, NodeKilledBetweenPutAndGet) {
  const std::string gone = key_on(2), alive = key_on(0);
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, gone.c_str(), kBlock));
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, alive.c_str(), kBlock));
  cluster_.kill(2);
  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, 7, gone.c_str()), PQ_ERR_BACKEND, where(2));
  EXPECT_FALSE(has_sequence(b_, 7));
  // Node 0 serves its slots until the others mark node 2 failed (5 s, the
  // node timeout): a get right away works.
  REDIS_ASSERT_OK(pq_redis_get(conn_, b_, 8, alive.c_str()));
  expect_same_steps(a_, kSeqA, b_, 8, 71);
  expect_a_intact();
}

// ---------------------------------------------------------------------------
// Fake nodes: deterministic failures
// ---------------------------------------------------------------------------

// A CLUSTER SLOTS reply that gives every slot to the fake node at port.
std::string all_slots_to(int port) {
  return "*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n" + FakeRedis::bulk("127.0.0.1") + ":" +
         std::to_string(port) + "\r\n" + FakeRedis::bulk("fakeid");
}

// A node that goes away while the blocks are being written: PQ_ERR_BACKEND
// naming it, and the source sequence is untouched.
TEST_F(RedisClusterTier, NodeGoneInTheMiddleOfAPut) {
  std::atomic<int> fake_port{0};  // the fake's thread reads it
  FakeRedis fake([&](const std::vector<std::string>& args) {
    FakeAction a;
    if (args[0] == "PING") a.reply = "+PONG\r\n";
    else if (args[0] == "CLUSTER") a.reply = all_slots_to(fake_port.load());
    else if (args[0] == "GET") a.reply = "$-1\r\n";
    else if (args[0] == "DEL") a.reply = ":0\r\n";
    else a.close = true;  // the first SET of a block
    return a;
  });
  fake_port = fake.port();
  ASSERT_GT(fake_port, 0);
  pq_redis* conn = nullptr;
  REDIS_ASSERT_OK(pq_redis_connect_cluster("127.0.0.1", fake_port, 5000, &conn));
  REDIS_EXPECT_ERR(pq_redis_put(conn, a_, kSeqA, "k", 1000), PQ_ERR_BACKEND,
                   "127.0.0.1:" + std::to_string(fake_port.load()), "{k}:blk:0");
  pq_redis_close(conn);
  expect_a_intact();
}

// A node that redirects to itself forever: the redirects are bounded, and
// the error names the reply; CLUSTERDOWN and TRYAGAIN are named errors.
TEST_F(RedisClusterTier, RedirectLoopClusterDownAndTryAgainAreNamed) {
  // Shared with the fake's thread (a socket is no synchronisation to
  // ThreadSanitizer): the port atomic, the answer under a mutex.
  std::atomic<int> fake_port{0};
  std::mutex mu;
  std::string answer;
  auto answer_with = [&](const std::string& reply) {
    std::lock_guard<std::mutex> lock(mu);
    answer = reply;
  };
  FakeRedis fake([&](const std::vector<std::string>& args) {
    FakeAction a;
    if (args[0] == "PING") a.reply = "+PONG\r\n";
    else if (args[0] == "ASKING") a.reply = "+OK\r\n";
    else if (args[0] == "CLUSTER") a.reply = all_slots_to(fake_port.load());
    else {
      std::lock_guard<std::mutex> lock(mu);
      a.reply = answer;
    }
    return a;
  });
  fake_port = fake.port();
  ASSERT_GT(fake_port, 0);
  pq_redis* conn = nullptr;
  REDIS_ASSERT_OK(pq_redis_connect_cluster("127.0.0.1", fake_port, 5000, &conn));
  const std::string fake_where = "127.0.0.1:" + std::to_string(fake_port.load());
  answer_with("-MOVED 1234 " + fake_where + "\r\n");
  REDIS_EXPECT_ERR(pq_redis_get(conn, b_, 7, "k"), PQ_ERR_BACKEND, "MOVED 1234", "after 5 redirects");
  int gets = 0;
  for (const std::string& c : fake.commands()) gets += c == "GET";
  EXPECT_EQ(gets, 6) << "the first GET and 5 redirects";
  answer_with("-ASK 1234 " + fake_where + "\r\n");
  REDIS_EXPECT_ERR(pq_redis_info(conn, "k", nullptr, nullptr, nullptr), PQ_ERR_BACKEND, "ASK 1234",
                   "after 5 redirects");
  answer_with("-CLUSTERDOWN The cluster is down\r\n");
  REDIS_EXPECT_ERR(pq_redis_get(conn, b_, 7, "k"), PQ_ERR_BACKEND, "CLUSTERDOWN", fake_where);
  answer_with("-TRYAGAIN Multiple keys request during rehashing of slot\r\n");
  REDIS_EXPECT_ERR(pq_redis_delete(conn, "k"), PQ_ERR_BACKEND, "TRYAGAIN", "migrated");
  EXPECT_FALSE(has_sequence(b_, 7));
  pq_redis_close(conn);
}

TEST_F(RedisClusterTier, ConnectErrorsAreNamed) {
  RedisServer plain;  // no cluster support
  const std::string why = plain.start();
  ASSERT_TRUE(why.empty()) << why;
  pq_redis* conn = nullptr;
  REDIS_EXPECT_ERR(pq_redis_connect_cluster("127.0.0.1", plain.port(), 5000, &conn),
                   PQ_ERR_BACKEND, "cluster support disabled", "pq_redis_connect");
  pqrt::ReservedPort reserved;  // bound, not listening: connects are refused
  REDIS_EXPECT_ERR(pq_redis_connect_cluster("127.0.0.1", reserved.port(), 1000, &conn),
                   PQ_ERR_BACKEND, "127.0.0.1:" + std::to_string(reserved.port()), "refused");
  REDIS_EXPECT_ERR(pq_redis_connect_cluster(nullptr, 6379, 0, &conn), PQ_ERR_INVALID_ARGUMENT,
                   "host");
  REDIS_EXPECT_ERR(pq_redis_connect_cluster("127.0.0.1", 0, 0, &conn), PQ_ERR_INVALID_ARGUMENT,
                   "port");
  REDIS_EXPECT_ERR(pq_redis_connect_cluster("127.0.0.1", 6379, -1, &conn),
                   PQ_ERR_INVALID_ARGUMENT, "timeout_ms");
  REDIS_EXPECT_ERR(pq_redis_connect_cluster("127.0.0.1", 6379, 0, nullptr),
                   PQ_ERR_INVALID_ARGUMENT, "out");
  EXPECT_EQ(conn, nullptr);
  // A single-server connection to a cluster node keeps the plain layout, and
  // is redirected by the node for a key of another node (MOVED, not followed
  // in single-server mode): a named error.
  pq_redis* single = nullptr;
  REDIS_ASSERT_OK(pq_redis_connect("127.0.0.1", cluster_.port(0), 5000, &single));
  const std::string elsewhere = key_on(1);
  REDIS_EXPECT_ERR(pq_redis_info(single, ("{" + elsewhere + "}").c_str(), nullptr, nullptr,
                                 nullptr),
                   PQ_ERR_BACKEND, "MOVED", "pq_redis_connect_cluster");
  pq_redis_close(single);
}

}  // namespace
