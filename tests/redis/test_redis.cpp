// The Redis tier (include/pqcache_redis.h, docs/redis.md) against a real
// redis-server that each test starts on a loopback port of its own and
// kills in TearDown; a fake server plays a Redis that dies or hangs in the
// middle of a transfer. Without redis-server the tests report SKIPPED.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"
#include "pqcache_redis.h"
#include "redis_server.h"
#include "redis_test_util.h"

using namespace pqt;
using namespace pqrt;
using pqrt::FakeAction;
using pqrt::FakeRedis;
using pqrt::RawRedis;
using pqrt::RedisServer;

namespace {

// ---------------------------------------------------------------------------
// The fixture: a redis-server of the test's own, two contexts
// ---------------------------------------------------------------------------

class RedisTier : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = server_.start();
    if (!why.empty()) {
      if (why.find("not installed") != std::string::npos) GTEST_SKIP() << why;
      FAIL() << why;
    }
    REDIS_ASSERT_OK(pq_redis_connect("127.0.0.1", server_.port(), 5000, &conn_));
    pq_config c = model_config();
    a_ = Ctx(c);
    b_ = Ctx(c);
    ASSERT_TRUE(a_.ok() && b_.ok()) << pq_last_error();
    fill_sequence(a_, kSeqA, 11);
  }
  void TearDown() override {
    pq_redis_close(conn_);
    conn_ = nullptr;
    server_.stop();
  }

  std::string where() const { return "127.0.0.1:" + std::to_string(server_.port()); }

  // The original sequence still decodes in a_ (select and fetch work).
  void expect_a_usable() {
    for (int32_t l = 0; l < kLayers; ++l) {
      StepView v = select_and_fetch(a_, kSeqA, l, 777 + l);
      EXPECT_FALSE(v.counts.empty());
    }
  }

  // kSeqB in b_, restored from kSeqA, selects and fetches as kSeqA in a_,
  // with no K-Means run, before and after one more decode step on both with
  // the same token.
  void expect_b_decodes_as_a(uint64_t query_seed, uint64_t token_seed) {
    EXPECT_EQ(stats(b_).builds_finished, 0u) << "a restore must not run K-Means";
    expect_same_steps(a_, kSeqA, b_, kSeqB, query_seed);
    for (int32_t l = 0; l < kLayers; ++l) {
      HostTensor k = random_kv(1, token_seed + l), v = random_kv(1, token_seed + 100 + l);
      PQ_ASSERT_OK(pq_decode_append(a_, kSeqA, l, k.get(), v.get()));
      PQ_ASSERT_OK(pq_decode_append(b_, kSeqB, l, k.get(), v.get()));
    }
    expect_same_steps(a_, kSeqA, b_, kSeqB, query_seed + 909);
  }

  static constexpr uint64_t kSeqA = 1, kSeqB = 7;
  RedisServer server_;
  pq_redis* conn_ = nullptr;
  Ctx a_, b_;
};

// (1) A second context restores what the first saved: the same selections
// and fetched bytes, before and after one more decode step on both.
TEST_F(RedisTier, SecondContextRestoresWhatTheFirstSaved) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "session:1", 64 * 1024));
  uint64_t bytes = 0, block = 0, blocks = 0;
  REDIS_ASSERT_OK(pq_redis_info(conn_, "session:1", &bytes, &block, &blocks));
  EXPECT_EQ(bytes, state_size(a_, kSeqA));
  EXPECT_EQ(block, 64u * 1024);
  EXPECT_EQ(blocks, (bytes + block - 1) / block);
  EXPECT_GT(blocks, 1u) << "the state should span several blocks";

  // The second context has its own connection, as a second server would.
  pq_redis* conn2 = nullptr;
  REDIS_ASSERT_OK(pq_redis_connect("127.0.0.1", server_.port(), 5000, &conn2));
  REDIS_ASSERT_OK(pq_redis_get(conn2, b_, kSeqB, "session:1"));
  pq_redis_close(conn2);

  expect_b_decodes_as_a(4242, 9000);
}

// (2) A block whose bytes changed in Redis: PQ_ERR_CORRUPT naming the
// block, no sequence added, and both contexts still work.
TEST_F(RedisTier, CorruptBlockIsNamedAndLeavesBothContextsUsable) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "good", 4096));
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "bad", 4096));
  RawRedis raw(server_.port());
  ASSERT_TRUE(raw.ok());
  std::string old = raw.run({"GETRANGE", "bad:blk:1", "100", "103"});
  ASSERT_EQ(old.size(), 4u);
  std::string flipped = old;
  for (char& ch : flipped) ch = static_cast<char>(~ch);
  ASSERT_EQ(raw.run({"SETRANGE", "bad:blk:1", "100", flipped}), ":4096");

  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, kSeqB, "bad"), PQ_ERR_CORRUPT, "bad:blk:1", "CRC");
  EXPECT_FALSE(has_sequence(b_, kSeqB));
  expect_a_usable();
  // The connection and the second context go on: an intact key restores.
  REDIS_ASSERT_OK(pq_redis_get(conn_, b_, kSeqB, "good"));
  expect_same_steps(a_, kSeqA, b_, kSeqB, 31);
}

TEST_F(RedisTier, MissingBlockIsCorrupt) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  RawRedis raw(server_.port());
  ASSERT_EQ(raw.run({"DEL", "k:blk:2"}), ":1");
  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, kSeqB, "k"), PQ_ERR_CORRUPT, "k:blk:2", "missing");
  EXPECT_FALSE(has_sequence(b_, kSeqB));
  expect_a_usable();
}

TEST_F(RedisTier, BlockOfTheWrongSizeIsCorrupt) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  RawRedis raw(server_.port());
  ASSERT_EQ(raw.run({"APPEND", "k:blk:0", "x"}), ":4097");
  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, kSeqB, "k"), PQ_ERR_CORRUPT, "k:blk:0", "4097");
  EXPECT_FALSE(has_sequence(b_, kSeqB));
}

TEST_F(RedisTier, BlockOfAnotherTypeIsCorrupt) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  RawRedis raw(server_.port());
  ASSERT_EQ(raw.run({"DEL", "k:blk:1"}), ":1");
  ASSERT_EQ(raw.run({"LPUSH", "k:blk:1", "x"}), ":1");
  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, kSeqB, "k"), PQ_ERR_CORRUPT, "k:blk:1", "WRONGTYPE");
  EXPECT_FALSE(has_sequence(b_, kSeqB));
  // The connection is still in step.
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k2", 4096));
  REDIS_ASSERT_OK(pq_redis_get(conn_, b_, kSeqB, "k2"));
}

TEST_F(RedisTier, BrokenManifestIsCorrupt) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  RawRedis raw(server_.port());
  std::string m = raw.run({"GET", "k:manifest"});
  ASSERT_GT(m.size(), 44u);
  m[20] = static_cast<char>(m[20] ^ 0x40);  // inside the state size
  ASSERT_EQ(raw.run({"SET", "k:manifest", m}), "+OK");
  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, kSeqB, "k"), PQ_ERR_CORRUPT, "k:manifest", "CRC");
  ASSERT_EQ(raw.run({"SET", "k:manifest", "hello"}), "+OK");
  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, kSeqB, "k"), PQ_ERR_CORRUPT, "k:manifest", "magic");
  EXPECT_FALSE(has_sequence(b_, kSeqB));
  // delete still removes what it can find.
  REDIS_ASSERT_OK(pq_redis_delete(conn_, "k"));
  EXPECT_EQ(raw.run({"DBSIZE"}), ":0");
}

TEST_F(RedisTier, ManifestOfAnotherVersionIsIncompatible) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  RawRedis raw(server_.port());
  ASSERT_EQ(raw.run({"SETRANGE", "k:manifest", "4", std::string("\x02\x00\x00\x00", 4)}).front(),
            ':');
  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, kSeqB, "k"), PQ_ERR_INCOMPATIBLE, "k:manifest",
                   "version 2");
  EXPECT_FALSE(has_sequence(b_, kSeqB));
}

// The library's own checks pass through: a context of another geometry.
TEST_F(RedisTier, LibraryErrorsPassThrough) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  Ctx other(model_config(kDim * 2));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(pq_redis_get(conn_, other, kSeqB, "k"), PQ_ERR_INCOMPATIBLE);
  const std::string lib = pq_last_error();
  const std::string ours = pq_redis_last_error();
  EXPECT_FALSE(lib.empty());
  EXPECT_NE(ours.find(lib), std::string::npos) << ours << " | " << lib;
  EXPECT_NE(ours.find("pq_sequence_restore"), std::string::npos) << ours;
  EXPECT_FALSE(has_sequence(other, kSeqB));
  // A sequence that does not exist: the library's NOT_FOUND, and the state
  // already under the key is left alone.
  EXPECT_EQ(pq_redis_put(conn_, a_, 999, "k", 4096), PQ_ERR_NOT_FOUND);
  REDIS_ASSERT_OK(pq_redis_get(conn_, b_, kSeqB, "k"));
}

// (3) The server dies between put and get: PQ_ERR_BACKEND with host:port,
// nothing added, contexts usable; once a server is back on the port the
// same connection works again (it reconnects on its next call).
TEST_F(RedisTier, ServerKilledBetweenPutAndGet) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  const int port = server_.port();
  server_.stop();
  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, kSeqB, "k"), PQ_ERR_BACKEND, where());
  EXPECT_FALSE(has_sequence(b_, kSeqB));
  // Still down: the reconnect is refused, named as such.
  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, kSeqB, "k"), PQ_ERR_BACKEND, where(), "refused");
  REDIS_EXPECT_ERR(pq_redis_put(conn_, a_, kSeqA, "k", 4096), PQ_ERR_BACKEND, where());
  expect_a_usable();

  const std::string why = server_.start(port);
  ASSERT_TRUE(why.empty()) << why;
  // The new server has no data (no persistence): NOT_FOUND, not BACKEND.
  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, kSeqB, "k"), PQ_ERR_NOT_FOUND, "k");
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  REDIS_ASSERT_OK(pq_redis_get(conn_, b_, kSeqB, "k"));
  expect_same_steps(a_, kSeqA, b_, kSeqB, 99);
}

// A server that closes the connection in the middle of a block reply.
TEST_F(RedisTier, ServerDiesInTheMiddleOfAGet) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  RawRedis raw(server_.port());
  const std::string manifest = raw.run({"GET", "k:manifest"});
  const std::string block0 = raw.run({"GET", "k:blk:0"});
  ASSERT_EQ(block0.size(), 4096u);
  FakeRedis fake([&](const std::vector<std::string>& args) {
    FakeAction a;
    if (args[0] == "PING") a.reply = "+PONG\r\n";
    else if (args[0] == "GET" && args[1] == "k:manifest") a.reply = FakeRedis::bulk(manifest);
    else if (args[0] == "GET" && args[1] == "k:blk:0") a.reply = FakeRedis::bulk(block0);
    else {  // block 1: half of it, then the server is gone
      a.reply = "$4096\r\n" + block0.substr(0, 2000);
      a.close = true;
    }
    return a;
  });
  ASSERT_GT(fake.port(), 0);
  pq_redis* conn = nullptr;
  REDIS_ASSERT_OK(pq_redis_connect("127.0.0.1", fake.port(), 5000, &conn));
  const std::string fake_where = "127.0.0.1:" + std::to_string(fake.port());
  REDIS_EXPECT_ERR(pq_redis_get(conn, b_, kSeqB, "k"), PQ_ERR_BACKEND, fake_where, "k:blk:1");
  EXPECT_FALSE(has_sequence(b_, kSeqB));
  pq_redis_close(conn);
  expect_a_usable();
  REDIS_ASSERT_OK(pq_redis_get(conn_, b_, kSeqB, "k"));
}

// A server that goes away while blocks are being written: PQ_ERR_BACKEND,
// and the process survives the broken pipe (no SIGPIPE reaches it).
TEST_F(RedisTier, ServerDiesInTheMiddleOfAPut) {
  FakeRedis fake([&](const std::vector<std::string>& args) {
    FakeAction a;
    if (args[0] == "PING") a.reply = "+PONG\r\n";
    else if (args[0] == "GET") a.reply = "$-1\r\n";
    else if (args[0] == "DEL") a.reply = ":0\r\n";
    else a.close = true;  // the first SET of a block
    return a;
  });
  ASSERT_GT(fake.port(), 0);
  sigset_t before;
  pthread_sigmask(SIG_SETMASK, nullptr, &before);
  pq_redis* conn = nullptr;
  REDIS_ASSERT_OK(pq_redis_connect("127.0.0.1", fake.port(), 5000, &conn));
  const std::string fake_where = "127.0.0.1:" + std::to_string(fake.port());
  REDIS_EXPECT_ERR(pq_redis_put(conn, a_, kSeqA, "k", 1000), PQ_ERR_BACKEND, fake_where);
  pq_redis_close(conn);
  sigset_t after, pending;
  pthread_sigmask(SIG_SETMASK, nullptr, &after);
  EXPECT_EQ(sigismember(&before, SIGPIPE), sigismember(&after, SIGPIPE))
      << "the signal mask was not restored";
  sigpending(&pending);
  EXPECT_EQ(sigismember(&pending, SIGPIPE), 0) << "a SIGPIPE was left pending";
  expect_a_usable();
}

// A server that stops answering: PQ_ERR_BACKEND saying it timed out.
TEST_F(RedisTier, ServerThatHangsTimesOut) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  FakeRedis fake([&](const std::vector<std::string>& args) {
    FakeAction a;
    if (args[0] == "PING") a.reply = "+PONG\r\n";
    else a.hang = true;
    return a;
  });
  pq_redis* conn = nullptr;
  REDIS_ASSERT_OK(pq_redis_connect("127.0.0.1", fake.port(), 300, &conn));
  auto t0 = std::chrono::steady_clock::now();
  REDIS_EXPECT_ERR(pq_redis_get(conn, b_, kSeqB, "k"), PQ_ERR_BACKEND, "timed out", "300 ms");
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(waited, std::chrono::seconds(5));
  EXPECT_FALSE(has_sequence(b_, kSeqB));
  pq_redis_close(conn);
}

TEST_F(RedisTier, ConnectionRefusedIsBackend) {
  pqrt::ReservedPort reserved;  // bound, not listening: connects are refused
  const int port = reserved.port();
  ASSERT_GT(port, 0);
  pq_redis* conn = nullptr;
  REDIS_EXPECT_ERR(pq_redis_connect("127.0.0.1", port, 1000, &conn), PQ_ERR_BACKEND,
                   "127.0.0.1:" + std::to_string(port), "refused");
  EXPECT_EQ(conn, nullptr);
}

// A Redis error reply (here its memory limit) is PQ_ERR_BACKEND with the
// server's text; the connection stays in step and the key holds nothing.
TEST_F(RedisTier, ServerOutOfMemoryIsBackendAndTheConnectionGoesOn) {
  RawRedis raw(server_.port());
  ASSERT_EQ(raw.run({"CONFIG", "SET", "maxmemory-policy", "noeviction"}), "+OK");
  ASSERT_EQ(raw.run({"CONFIG", "SET", "maxmemory", "1"}), "+OK");
  REDIS_EXPECT_ERR(pq_redis_put(conn_, a_, kSeqA, "k", 4096), PQ_ERR_BACKEND, "OOM", where());
  ASSERT_EQ(raw.run({"CONFIG", "SET", "maxmemory", "0"}), "+OK");
  EXPECT_EQ(raw.run({"EXISTS", "k:manifest"}), ":0");
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  REDIS_ASSERT_OK(pq_redis_get(conn_, b_, kSeqB, "k"));
  expect_same_steps(a_, kSeqA, b_, kSeqB, 7);
}

// (4) A key that was never put.
TEST_F(RedisTier, MissingKeyIsNotFound) {
  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, kSeqB, "nothing"), PQ_ERR_NOT_FOUND, "nothing");
  EXPECT_FALSE(has_sequence(b_, kSeqB));
  uint64_t bytes = 123;
  REDIS_EXPECT_ERR(pq_redis_info(conn_, "nothing", &bytes, nullptr, nullptr), PQ_ERR_NOT_FOUND,
                   "nothing");
  EXPECT_EQ(bytes, 123u);
  REDIS_EXPECT_ERR(pq_redis_delete(conn_, "nothing"), PQ_ERR_NOT_FOUND, "nothing");
  // A deleted key is gone too.
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  REDIS_ASSERT_OK(pq_redis_delete(conn_, "k"));
  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, kSeqB, "k"), PQ_ERR_NOT_FOUND, "k");
  RawRedis raw(server_.port());
  EXPECT_EQ(raw.run({"DBSIZE"}), ":0");
}

// (5) Block sizes that do not divide the state, one block, and 0.
TEST_F(RedisTier, BlockSizes) {
  const uint64_t size = state_size(a_, kSeqA);
  ASSERT_GT(size, 5000u);
  // A block size that cuts layer 1's K/V section header in two (8 bytes in
  // block 0, which holds the description and layer 0's K/V): the streaming
  // get's carry buffer first learns only the header's size.
  uint64_t description = 0;
  {
    REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
    pq_redis_transfer* t = nullptr;
    REDIS_ASSERT_OK(pq_redis_get_begin(conn_, b_, 99, "k", &t));
    REDIS_ASSERT_OK(pq_redis_transfer_progress(t, nullptr, &description, nullptr, nullptr));
    pq_redis_transfer_free(t);
  }
  int64_t tokens0 = 0;
  PQ_ASSERT_OK(pq_sequence_length(a_, kSeqA, 0, &tokens0));
  const uint64_t kv0_section = 16 + 2 * static_cast<uint64_t>(tokens0) * kKvHeads * kDim * 2 + 4;
  const uint64_t header_split = description + kv0_section + 8;
  uint64_t seq = 100;
  for (uint64_t block : {uint64_t{1000}, uint64_t{4097}, uint64_t{65539}, header_split, size - 1,
                         size, size + 1, uint64_t{1} << 24}) {
    SCOPED_TRACE("block_bytes " + std::to_string(block));
    REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", block));
    uint64_t bytes = 0, bb = 0, count = 0;
    REDIS_ASSERT_OK(pq_redis_info(conn_, "k", &bytes, &bb, &count));
    EXPECT_EQ(bytes, size);
    EXPECT_EQ(bb, block);
    EXPECT_EQ(count, (size + block - 1) / block);
    REDIS_ASSERT_OK(pq_redis_get(conn_, b_, seq, "k"));
    expect_same_steps(a_, kSeqA, b_, seq, 1234);
    PQ_ASSERT_OK(pq_sequence_remove(b_, seq));
    // Streamed, three blocks a call: sections cut anywhere by the blocks.
    pq_redis_transfer* t = nullptr;
    REDIS_ASSERT_OK(pq_redis_get_begin(conn_, b_, seq, "k", &t));
    for (int32_t done = 0; !done;) REDIS_ASSERT_OK(pq_redis_get_continue(t, 3, &done));
    EXPECT_EQ(layers_ready(t), kLayers);
    pq_redis_transfer_free(t);
    expect_same_steps(a_, kSeqA, b_, seq, 1234);
    PQ_ASSERT_OK(pq_sequence_remove(b_, seq));
    ++seq;
  }
  REDIS_EXPECT_ERR(pq_redis_put(conn_, a_, kSeqA, "k0", 0), PQ_ERR_INVALID_ARGUMENT,
                   "block_bytes");
  REDIS_EXPECT_ERR(pq_redis_put(conn_, a_, kSeqA, "k0", PQ_REDIS_MAX_BLOCK_BYTES + 1),
                   PQ_ERR_INVALID_ARGUMENT, "block_bytes");
  RawRedis raw(server_.port());
  EXPECT_EQ(raw.run({"EXISTS", "k0:manifest"}), ":0");
}

// A put over a larger earlier state leaves no stale block behind.
TEST_F(RedisTier, OverwriteDeletesLeftoverBlocks) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 1000));
  uint64_t many = 0;
  REDIS_ASSERT_OK(pq_redis_info(conn_, "k", nullptr, nullptr, &many));
  ASSERT_GT(many, 3u);
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", uint64_t{1} << 24));
  RawRedis raw(server_.port());
  EXPECT_EQ(raw.run({"DBSIZE"}), ":2");  // the manifest and one block
  EXPECT_EQ(raw.run({"EXISTS", "k:blk:1"}), ":0");
  REDIS_ASSERT_OK(pq_redis_get(conn_, b_, kSeqB, "k"));
}

// The manifest is written after every block (MONITOR sees the commands in
// the order the server ran them), and the old one is deleted before.
TEST_F(RedisTier, ManifestIsWrittenLast) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 8192));  // an old state to replace
  RawRedis mon(server_.port());
  ASSERT_EQ(mon.run({"MONITOR"}), "+OK");
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 8192));
  uint64_t blocks = 0;
  REDIS_ASSERT_OK(pq_redis_info(conn_, "k", nullptr, nullptr, &blocks));
  // Lines look like: 1700000000.123456 [0 127.0.0.1:40000] "SET" "k:blk:0" "...".
  std::vector<std::string> order;
  for (;;) {
    void* raw = nullptr;
    ASSERT_EQ(redisGetReply(mon.get(), &raw), REDIS_OK);
    auto* r = static_cast<redisReply*>(raw);
    std::string line(r->str, r->len);
    freeReplyObject(r);
    size_t q1 = line.find('"'), q2 = line.find('"', q1 + 1);
    size_t q3 = line.find('"', q2 + 1), q4 = line.find('"', q3 + 1);
    if (q1 == std::string::npos || q4 == std::string::npos) continue;
    std::string cmd = line.substr(q1 + 1, q2 - q1 - 1), key = line.substr(q3 + 1, q4 - q3 - 1);
    order.push_back(cmd + " " + key);
    if (cmd == "GET" && key == "k:manifest" && order.size() > 3) break;  // pq_redis_info
  }
  auto index_of = [&](const std::string& s) {
    for (size_t i = 0; i < order.size(); ++i)
      if (order[i] == s) return static_cast<long>(i);
    return -1L;
  };
  const long del = index_of("DEL k:manifest"), set = index_of("SET k:manifest");
  ASSERT_GE(del, 0);
  ASSERT_GE(set, 0);
  for (uint64_t n = 0; n < blocks; ++n) {
    const long at = index_of("SET k:blk:" + std::to_string(n));
    EXPECT_GT(at, del) << "block " << n;
    EXPECT_LT(at, set) << "block " << n;
  }
}

// ---------------------------------------------------------------------------
// The streaming get: pq_redis_get_begin, _continue, _finish
// ---------------------------------------------------------------------------

// (a) After begin the second context selects as the first does while every
// fetch reports that the K/V have not arrived; layers arrive in order; a
// thread selects all through finish; afterwards the fetched bytes are equal.
TEST_F(RedisTier, StreamingGetSelectsBeforeTheKvArrive) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "s", 4096));
  pq_redis* conn2 = nullptr;  // the second server's own connection
  REDIS_ASSERT_OK(pq_redis_connect("127.0.0.1", server_.port(), 5000, &conn2));
  pq_redis_transfer* t = nullptr;
  REDIS_ASSERT_OK(pq_redis_get_begin(conn2, b_, kSeqB, "s", &t));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(layers_ready(t), 0);
  EXPECT_LT(fetched_bytes(t), state_size(a_, kSeqA));

  for (int32_t l = 0; l < kLayers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    StepView x = select_only(a_, kSeqA, l, 600 + l), y = select_only(b_, kSeqB, l, 600 + l);
    EXPECT_EQ(x.counts, y.counts);
    EXPECT_EQ(x.positions, y.positions);
    EXPECT_TRUE(IsError(try_fetch(b_, kSeqB, l), PQ_ERR_BAD_STATE,
                        {("layer " + std::to_string(l)).c_str()}));
  }
  // One block at a time until layer 0 is in: it fetches, the last does not.
  int32_t done = -1;
  while (layers_ready(t) < 1) {
    REDIS_ASSERT_OK(pq_redis_get_continue(t, 1, &done));
    ASSERT_EQ(done, 0);
  }
  ASSERT_LT(layers_ready(t), kLayers);
  PQ_EXPECT_OK(try_fetch(b_, kSeqB, 0));
  EXPECT_EQ(try_fetch(b_, kSeqB, kLayers - 1), PQ_ERR_BAD_STATE);

  // Selections on another thread while the rest arrives.
  std::atomic<bool> stop{false};
  std::atomic<int> selects{0}, failures{0};
  std::thread selector([&] {
    HostTensor q = random_query(8);
    const int64_t cap = selection_capacity(b_, kSeqB, kLayers - 1);
    Sel sel(kKvHeads, cap);
    while (!stop.load()) {
      for (int32_t l = 0; l < kLayers; ++l)
        if (pq_decode_select(b_, kSeqB, l, q.get(), sel.get()) != PQ_OK) failures++;
      selects++;
    }
  });
  // At least one selection between two blocks, so that they interleave
  // whatever the scheduler does; finish then completes the transfer.
  pq_status finished = PQ_OK;
  int seen = 0;
  for (done = 0; done == 0 && finished == PQ_OK;) {
    while (selects.load() <= seen) std::this_thread::yield();
    seen = selects.load();
    finished = pq_redis_get_continue(t, 1, &done);
  }
  if (finished == PQ_OK) finished = pq_redis_get_finish(t);
  stop = true;
  selector.join();
  REDIS_ASSERT_OK(finished);
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(selects.load(), 0);
  EXPECT_EQ(layers_ready(t), kLayers);
  EXPECT_EQ(fetched_bytes(t), state_size(a_, kSeqA));
  REDIS_ASSERT_OK(pq_redis_get_continue(t, 5, &done));  // done: nothing more
  EXPECT_EQ(done, 1);
  pq_redis_transfer_free(t);  // after finish the sequence stays
  pq_redis_close(conn2);

  expect_b_decodes_as_a(4343, 9200);
}

// (b) The server dies between begin and finish: PQ_ERR_BACKEND, the
// half-restored sequence is removed, both contexts go on; a transfer freed
// before it is done removes its sequence too.
TEST_F(RedisTier, ServerKilledDuringAStreamingGet) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  pq_redis_transfer* t = nullptr;
  REDIS_ASSERT_OK(pq_redis_get_begin(conn_, b_, kSeqB, "k", &t));
  EXPECT_TRUE(has_sequence(b_, kSeqB));
  const int port = server_.port();
  server_.stop();
  REDIS_EXPECT_ERR(pq_redis_get_finish(t), PQ_ERR_BACKEND, where());
  EXPECT_FALSE(has_sequence(b_, kSeqB));
  REDIS_EXPECT_ERR(pq_redis_get_continue(t, 1, nullptr), PQ_ERR_BAD_STATE, "failed earlier",
                   where());
  pq_redis_transfer_free(t);
  expect_a_usable();

  const std::string why = server_.start(port);
  ASSERT_TRUE(why.empty()) << why;
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  // Abandoned: freed before it was done.
  REDIS_ASSERT_OK(pq_redis_get_begin(conn_, b_, kSeqB, "k", &t));
  pq_redis_transfer_free(t);
  EXPECT_FALSE(has_sequence(b_, kSeqB));
  // The same id again, to the end.
  ASSERT_TRUE(StreamedGet(conn_, b_, kSeqB, "k"));
  expect_same_steps(a_, kSeqA, b_, kSeqB, 98);
}

// (c) A damaged K/V block: begin works (the description is intact), finish
// is PQ_ERR_CORRUPT naming the block, the sequence is removed. A damaged
// block inside the description fails begin, with nothing added.
TEST_F(RedisTier, CorruptBlockDuringAStreamingGet) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "good", 4096));
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "bad", 4096));
  uint64_t blocks = 0;
  REDIS_ASSERT_OK(pq_redis_info(conn_, "bad", nullptr, nullptr, &blocks));
  const uint64_t kv_block = blocks - 2;  // a whole block near the end: K/V
  const std::string bad_block = "bad:blk:" + std::to_string(kv_block);
  RawRedis raw(server_.port());
  ASSERT_TRUE(raw.ok());
  ASSERT_EQ(raw.run({"SETRANGE", bad_block, "100", "\xff\xff\xff\xff"}), ":4096");

  pq_redis_transfer* t = nullptr;
  REDIS_ASSERT_OK(pq_redis_get_begin(conn_, b_, kSeqB, "bad", &t));
  ASSERT_LT(fetched_bytes(t), kv_block * 4096) << "begin should not have reached the block";
  (void)select_only(b_, kSeqB, 0, 3);
  REDIS_EXPECT_ERR(pq_redis_get_finish(t), PQ_ERR_CORRUPT, bad_block, "CRC");
  EXPECT_FALSE(has_sequence(b_, kSeqB));
  pq_redis_transfer_free(t);
  expect_a_usable();

  // Block 1 lies inside the description (the index of layer 0).
  uint64_t description = 0;
  REDIS_ASSERT_OK(pq_redis_get_begin(conn_, b_, kSeqB, "good", &t));
  REDIS_ASSERT_OK(pq_redis_transfer_progress(t, nullptr, &description, nullptr, nullptr));
  pq_redis_transfer_free(t);
  ASSERT_GT(description, 2u * 4096);
  ASSERT_EQ(raw.run({"SETRANGE", "bad:blk:1", "100", "\xff\xff\xff\xff"}), ":4096");
  t = nullptr;
  REDIS_EXPECT_ERR(pq_redis_get_begin(conn_, b_, kSeqB, "bad", &t), PQ_ERR_CORRUPT, "bad:blk:1",
                   "CRC");
  EXPECT_EQ(t, nullptr);
  EXPECT_FALSE(has_sequence(b_, kSeqB));

  // The connection and the second context go on.
  ASSERT_TRUE(StreamedGet(conn_, b_, kSeqB, "good"));
  expect_same_steps(a_, kSeqA, b_, kSeqB, 32);
}

// (d) What begin fetches is the description plus less than one block, a
// small part of the state. The bound comes from the format
// (docs/state-format.md), not from a measurement: for L layers of T tokens,
// H kv heads, head_dim D, m subspaces of 2^b centroids, f16,
//   description <= 56 + L x (16+33+4  +  16+32 + H*m*2^b*(D/m)*4 + H*T*m + 4)
//   state       >= L x 2 x T x H x D x 2          (the K/V payloads alone)
// and begin asks for blocks until the description and the next section's
// 16-byte header are in: fetched <= description + 16 + block - 1.
TEST_F(RedisTier, StreamingGetFetchesLittleBeforeTheFirstSelection) {
  constexpr int32_t L = 2;
  constexpr int64_t T = 600;
  constexpr uint64_t kBlock = 4096;
  pq_config c = model_config(kDim, L);
  Ctx src(c), dst(c);
  ASSERT_TRUE(src.ok() && dst.ok());
  PQ_ASSERT_OK(pq_sequence_add(src, 1));
  for (int32_t l = 0; l < L; ++l) {
    HostTensor k = random_kv(T, 70 + l), v = random_kv(T, 80 + l);
    PQ_ASSERT_OK(pq_prefill_layer(src, 1, l, k.get(), v.get()));
  }
  PQ_ASSERT_OK(pq_wait_builds(src));
  REDIS_ASSERT_OK(pq_redis_put(conn_, src, 1, "small", kBlock));

  const uint64_t H = kKvHeads, D = kDim, m = static_cast<uint64_t>(c.pq_subspaces);
  const uint64_t centroids = uint64_t{1} << c.pq_bits;
  const uint64_t description_bound =
      56 + L * (16 + 33 + 4 + 16 + 32 + H * m * centroids * (D / m) * 4 + H * T * m + 4);
  const uint64_t state_lower = L * 2 * T * H * D * 2;
  const uint64_t fetched_bound = description_bound + 16 + kBlock - 1;
  ASSERT_LT(static_cast<double>(fetched_bound), 0.10 * static_cast<double>(state_lower))
      << "the geometry should make the bound small";

  pq_redis_transfer* t = nullptr;
  REDIS_ASSERT_OK(pq_redis_get_begin(conn_, dst, 1, "small", &t));
  uint64_t fetched = 0, description = 0, state = 0;
  REDIS_ASSERT_OK(pq_redis_transfer_progress(t, &fetched, &description, &state, nullptr));
  std::printf("    state %llu bytes; description %llu (bound %llu); begin fetched %llu = %.1f%%\n",
              static_cast<unsigned long long>(state), static_cast<unsigned long long>(description),
              static_cast<unsigned long long>(description_bound),
              static_cast<unsigned long long>(fetched), 100.0 * fetched / state);
  EXPECT_EQ(state, state_size(src, 1));
  EXPECT_GE(state, state_lower);
  EXPECT_LE(description, description_bound);
  EXPECT_GE(fetched, description);
  EXPECT_EQ(fetched % kBlock, 0u);
  EXPECT_LE(fetched, description + 16 + kBlock - 1);
  EXPECT_LT(static_cast<double>(fetched), 0.10 * static_cast<double>(state));
  // It selects now.
  HostTensor q = random_query(5);
  const int64_t cap = selection_capacity(dst, 1, 0);
  Sel sel(kKvHeads, cap);
  PQ_EXPECT_OK(pq_decode_select(dst, 1, 0, q.get(), sel.get()));
  REDIS_ASSERT_OK(pq_redis_get_finish(t));
  pq_redis_transfer_free(t);
}

TEST_F(RedisTier, InvalidArguments) {
  pq_redis* conn = nullptr;
  REDIS_EXPECT_ERR(pq_redis_connect(nullptr, 6379, 0, &conn), PQ_ERR_INVALID_ARGUMENT, "host");
  REDIS_EXPECT_ERR(pq_redis_connect("", 6379, 0, &conn), PQ_ERR_INVALID_ARGUMENT, "host");
  REDIS_EXPECT_ERR(pq_redis_connect("127.0.0.1", 0, 0, &conn), PQ_ERR_INVALID_ARGUMENT, "port");
  REDIS_EXPECT_ERR(pq_redis_connect("127.0.0.1", 70000, 0, &conn), PQ_ERR_INVALID_ARGUMENT,
                   "port");
  REDIS_EXPECT_ERR(pq_redis_connect("127.0.0.1", 6379, -1, &conn), PQ_ERR_INVALID_ARGUMENT,
                   "timeout_ms");
  REDIS_EXPECT_ERR(pq_redis_connect("127.0.0.1", 6379, 0, nullptr), PQ_ERR_INVALID_ARGUMENT, "out");
  EXPECT_EQ(conn, nullptr);
  REDIS_EXPECT_ERR(pq_redis_put(nullptr, a_, kSeqA, "k", 10), PQ_ERR_INVALID_ARGUMENT, "conn");
  REDIS_EXPECT_ERR(pq_redis_put(conn_, nullptr, kSeqA, "k", 10), PQ_ERR_INVALID_ARGUMENT, "ctx");
  REDIS_EXPECT_ERR(pq_redis_put(conn_, a_, kSeqA, nullptr, 10), PQ_ERR_INVALID_ARGUMENT, "key");
  REDIS_EXPECT_ERR(pq_redis_put(conn_, a_, kSeqA, "", 10), PQ_ERR_INVALID_ARGUMENT, "key");
  REDIS_EXPECT_ERR(pq_redis_get(conn_, b_, kSeqB, nullptr), PQ_ERR_INVALID_ARGUMENT, "key");
  REDIS_EXPECT_ERR(pq_redis_get(nullptr, b_, kSeqB, "k"), PQ_ERR_INVALID_ARGUMENT, "conn");
  REDIS_EXPECT_ERR(pq_redis_get(conn_, nullptr, kSeqB, "k"), PQ_ERR_INVALID_ARGUMENT, "ctx");
  REDIS_EXPECT_ERR(pq_redis_info(conn_, "", nullptr, nullptr, nullptr), PQ_ERR_INVALID_ARGUMENT,
                   "key");
  REDIS_EXPECT_ERR(pq_redis_delete(conn_, nullptr), PQ_ERR_INVALID_ARGUMENT, "key");
  // Restoring over a sequence that exists is refused before any transfer.
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  REDIS_EXPECT_ERR(pq_redis_get(conn_, a_, kSeqA, "k"), PQ_ERR_INVALID_ARGUMENT, "exists");
  pq_redis_transfer* t = nullptr;
  REDIS_EXPECT_ERR(pq_redis_get_begin(conn_, a_, kSeqA, "k", &t), PQ_ERR_INVALID_ARGUMENT,
                   "exists");
  REDIS_EXPECT_ERR(pq_redis_get_begin(conn_, b_, kSeqB, "k", nullptr), PQ_ERR_INVALID_ARGUMENT,
                   "out");
  REDIS_EXPECT_ERR(pq_redis_get_begin(conn_, b_, kSeqB, "", &t), PQ_ERR_INVALID_ARGUMENT, "key");
  REDIS_EXPECT_ERR(pq_redis_get_begin(conn_, b_, kSeqB, "nothing", &t), PQ_ERR_NOT_FOUND,
                   "nothing");
  EXPECT_EQ(t, nullptr);
  EXPECT_FALSE(has_sequence(b_, kSeqB));
  REDIS_EXPECT_ERR(pq_redis_get_continue(nullptr, 1, nullptr), PQ_ERR_INVALID_ARGUMENT,
                   "transfer");
  REDIS_EXPECT_ERR(pq_redis_get_finish(nullptr), PQ_ERR_INVALID_ARGUMENT, "transfer");
  REDIS_EXPECT_ERR(pq_redis_transfer_progress(nullptr, nullptr, nullptr, nullptr, nullptr),
                   PQ_ERR_INVALID_ARGUMENT, "transfer");
  pq_redis_transfer_free(nullptr);  // a no-op
  expect_a_usable();
  pq_redis_close(nullptr);  // a no-op
}

// Issue 39 R1: a transfer whose context is destroyed first. Every call but
// free is PQ_ERR_BAD_STATE naming pq_destroy, and free touches nothing of
// the freed context (AddressSanitizer: heap-use-after-free in
// Context::sequence_remove from the transfer's abandon before the fix).
TEST_F(RedisTier, TransferOutlivesItsContext) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  for (int freed_after = 0; freed_after < 3; ++freed_after) {
    SCOPED_TRACE("case " + std::to_string(freed_after));
    Ctx c(model_config());
    ASSERT_TRUE(c.ok()) << pq_last_error();
    pq_redis_transfer* t = nullptr;
    REDIS_ASSERT_OK(pq_redis_get_begin(conn_, c, kSeqB, "k", &t));
    if (freed_after == 1) REDIS_ASSERT_OK(pq_redis_get_continue(t, 1, nullptr));
    if (freed_after == 2) REDIS_ASSERT_OK(pq_redis_get_finish(t));  // done, then destroyed
    c.reset();
    int32_t done = -1;
    REDIS_EXPECT_ERR(pq_redis_get_continue(t, 1, &done), PQ_ERR_BAD_STATE, "pq_destroy", "\"k\"");
    EXPECT_EQ(done, -1) << "nothing is written on failure";
    REDIS_EXPECT_ERR(pq_redis_get_finish(t), PQ_ERR_BAD_STATE, "pq_destroy");
    REDIS_EXPECT_ERR(pq_redis_transfer_progress(t, nullptr, nullptr, nullptr, nullptr),
                     PQ_ERR_BAD_STATE, "pq_destroy");
    pq_redis_transfer_free(t);
  }
  // A transfer freed before its context ends its watch: destroying the
  // context later calls nothing.
  {
    Ctx c(model_config());
    pq_redis_transfer* t = nullptr;
    REDIS_ASSERT_OK(pq_redis_get_begin(conn_, c, kSeqB, "k", &t));
    pq_redis_transfer_free(t);
    EXPECT_FALSE(has_sequence(c, kSeqB));
  }
  expect_a_usable();
}

// A transfer whose connection is closed first: BAD_STATE naming
// pq_redis_close; free then removes the unfinished sequence, and the
// context goes on.
TEST_F(RedisTier, TransferOutlivesItsConnection) {
  REDIS_ASSERT_OK(pq_redis_put(conn_, a_, kSeqA, "k", 4096));
  pq_redis* conn2 = nullptr;
  REDIS_ASSERT_OK(pq_redis_connect("127.0.0.1", server_.port(), 5000, &conn2));
  pq_redis_transfer* t = nullptr;
  REDIS_ASSERT_OK(pq_redis_get_begin(conn2, b_, kSeqB, "k", &t));
  pq_redis_close(conn2);
  REDIS_EXPECT_ERR(pq_redis_get_continue(t, 1, nullptr), PQ_ERR_BAD_STATE, "pq_redis_close");
  REDIS_EXPECT_ERR(pq_redis_get_finish(t), PQ_ERR_BAD_STATE, "pq_redis_close");
  EXPECT_TRUE(has_sequence(b_, kSeqB));
  pq_redis_transfer_free(t);
  EXPECT_FALSE(has_sequence(b_, kSeqB));
  ASSERT_TRUE(StreamedGet(conn_, b_, kSeqB, "k"));
  expect_same_steps(a_, kSeqA, b_, kSeqB, 31);
}

// One connection shared by threads: calls are serialised.
TEST_F(RedisTier, ConnectionSharedByThreads) {
  std::vector<std::thread> threads;
  std::vector<pq_status> put_st(4, PQ_ERR_INTERNAL), get_st(4, PQ_ERR_INTERNAL);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      const std::string key = "t" + std::to_string(t);
      put_st[t] = pq_redis_put(conn_, a_, kSeqA, key.c_str(), 3000 + t);
      if (put_st[t] == PQ_OK) get_st[t] = pq_redis_get(conn_, b_, 200 + t, key.c_str());
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(put_st[t], PQ_OK) << t;
    EXPECT_EQ(get_st[t], PQ_OK) << t;
    if (get_st[t] == PQ_OK) expect_same_steps(a_, kSeqA, b_, 200 + t, 55);
  }
}

}  // namespace
