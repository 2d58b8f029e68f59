// The connection of libpqcache_redis: the handle pq_redis, one command at a
// time and pipelined commands, through hiredis (connection.cpp). A network
// error drops the node's hiredis context (its protocol state is unknown after
// a partial read or write); the next call on the connection reconnects first.
// In cluster mode (cluster.h) the handle holds one context per node and each
// operation is routed to the node that serves its key's slot.
#pragma once

#include <hiredis/hiredis.h>
#include <signal.h>

#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "pqcache_redis.h"

namespace pqr {

// One Redis server: the server of pq_redis_connect, or a node of a cluster.
struct Node {
  std::string host;
  int port = 0;
  redisContext* c = nullptr;  // nullptr: not connected (reconnect on use)
  std::string where() const { return host + ":" + std::to_string(port); }
};

struct Cluster;  // cluster.h

}  // namespace pqr

struct pq_redis {
  int timeout_ms = 0;
  std::mutex mu;                 // one conversation at a time
  pqr::Node server;              // pq_redis_connect's server (unused in cluster mode)
  pqr::Node* node = &server;     // where the current operation's commands go
  std::unique_ptr<pqr::Cluster> cluster;  // cluster mode (pq_redis_connect_cluster), else null
  // The open transfers of pq_redis_get_begin, told when pq_redis_close
  // frees the connection they use (under mu).
  std::set<pq_redis_transfer*> transfers;
  std::string where() const { return node->where(); }
  pq_redis();
  ~pq_redis();
  pq_redis(const pq_redis&) = delete;
  pq_redis& operator=(const pq_redis&) = delete;
};

namespace pqr {

// hiredis writes with write(2): a peer that has gone raises SIGPIPE, which
// would kill the caller's process. The guard blocks SIGPIPE in this thread
// for the duration of a network conversation and consumes one that became
// pending meanwhile; the process's own disposition is never touched.
class SigpipeGuard {
 public:
  SigpipeGuard();
  ~SigpipeGuard();
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t old_{};
  bool blocked_ = false;
  bool was_pending_ = false;
};

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// One argument of a command: bytes, not a C string (blocks hold NULs).
struct Arg {
  const char* data;
  size_t size;
  Arg(const std::string& s) : data(s.data()), size(s.size()) {}  // NOLINT: implicit on purpose
  Arg(const char* s) : data(s), size(std::strlen(s)) {}          // NOLINT
  Arg(const void* d, size_t n) : data(static_cast<const char*>(d)), size(n) {}
};

// ---------------------------------------------------------------------------
// The connection
// ---------------------------------------------------------------------------

void disconnect(Node& n) noexcept;

void check_status_reply(pq_redis& r, const redisReply* reply, const char* want,
                        const std::string& doing);

// One command on r.node, waiting for its reply; in cluster mode MOVED and
// ASK are followed (cluster.h). An error reply throws.
Reply command(pq_redis& r, const std::vector<Arg>& args, const std::string& doing);

// One command on node n (connected first), its reply as it came, error
// replies included: no redirect is followed. `asking`: preceded by ASKING
// (an ASK redirect). A network error throws.
Reply send_to(pq_redis& r, Node& n, const std::vector<Arg>& args, const std::string& doing,
              bool asking = false);

// An error reply as a pq::Error: PQ_ERR_BACKEND with the server's text
// (WRONGTYPE: PQ_ERR_CORRUPT), saying what a cluster's refusals mean.
[[noreturn]] void server_refused(const Node& n, const std::string& doing, const redisReply* reply);

// Connects n and checks that it answers PING.
void connect(pq_redis& r, Node& n);

void ensure_connected(pq_redis& r, Node& n);

// ---------------------------------------------------------------------------
// Pipelining
// ---------------------------------------------------------------------------

// Commands sent without waiting for each reply: at most `window` replies are
// outstanding, so neither side buffers more than a few blocks. Each command
// has a handler for its reply; a handler may throw a pq::Error, which is kept
// (the first one) while the remaining replies are read, so the connection
// stays in step. A network error throws at once and drops the connection.
// Every command goes to the node r.node was when the pipeline was made; in
// cluster mode each command's arguments are kept until its reply, so that a
// MOVED or ASK reply sends that one command again where it says.
class Pipeline {
 public:
  using Handler = std::function<void(redisReply*)>;
  Pipeline(pq_redis& r, size_t window) : r_(r), node_(*r.node), window_(window) {}

  void append(const std::vector<Arg>& args, Handler handler, std::string doing);

  // Reads every outstanding reply, then throws the first handler failure.
  void finish();
  // After a failure elsewhere: reads what is outstanding, ignoring it, so
  // that the connection is in step again (or dropped by a network error).
  void abandon() noexcept;
  // A handler failure kept so far (the server refused a command), or null.
  std::exception_ptr first_failure() const { return first_failure_; }

 private:
  void read_one();

  struct Pending {
    Handler handler;
    std::string doing;
    std::vector<std::string> args;  // cluster mode only: to follow a redirect
  };
  pq_redis& r_;
  Node& node_;
  size_t window_;
  std::deque<Pending> pending_;
  std::exception_ptr first_failure_;
};

}  // namespace pqr
