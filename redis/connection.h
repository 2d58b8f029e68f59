// The connection of libpqcache_redis: the handle pq_redis, one command at a
// time and pipelined commands, through hiredis (connection.cpp). A network
// error drops the hiredis context (its protocol state is unknown after a
// partial read or write); the next call on the connection reconnects first.
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

struct pq_redis {
  std::string host;
  int port = 0;
  int timeout_ms = 0;
  std::mutex mu;                 // one conversation at a time
  redisContext* c = nullptr;     // nullptr: not connected (reconnect on use)
  // The open transfers of pq_redis_get_begin, told when pq_redis_close
  // frees the connection they use (under mu).
  std::set<pq_redis_transfer*> transfers;
  std::string where() const { return host + ":" + std::to_string(port); }
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

void disconnect(pq_redis& r) noexcept;

void check_status_reply(pq_redis& r, const redisReply* reply, const char* want,
                        const std::string& doing);

// One command, waiting for its reply; an error reply throws.
Reply command(pq_redis& r, const std::vector<Arg>& args, const std::string& doing);

void connect(pq_redis& r);

void ensure_connected(pq_redis& r);

// ---------------------------------------------------------------------------
// Pipelining
// ---------------------------------------------------------------------------

// Commands sent without waiting for each reply: at most `window` replies are
// outstanding, so neither side buffers more than a few blocks. Each command
// has a handler for its reply; a handler may throw a pq::Error, which is kept
// (the first one) while the remaining replies are read, so the connection
// stays in step. A network error throws at once and drops the connection.
class Pipeline {
 public:
  using Handler = std::function<void(redisReply*)>;
  Pipeline(pq_redis& r, size_t window) : r_(r), window_(window) {}

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
  };
  pq_redis& r_;
  size_t window_;
  std::deque<Pending> pending_;
  std::exception_ptr first_failure_;
};

}  // namespace pqr
