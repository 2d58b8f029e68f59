// The connection of libpqcache_redis (connection.h): connecting, one command
// at a time, pipelined commands and the SIGPIPE guard, through hiredis. A
// network error drops the hiredis context (its protocol state is unknown
// after a partial read or write); the next call on the connection
// reconnects first.
#include "connection.h"

#include <pthread.h>

#include <cerrno>
#include <new>

#include "internal.h"

namespace pqr {

SigpipeGuard::SigpipeGuard() {
  sigset_t pending;
  sigemptyset(&pending);
  sigpending(&pending);
  was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, SIGPIPE);
  blocked_ = pthread_sigmask(SIG_BLOCK, &block, &old_) == 0;
}

SigpipeGuard::~SigpipeGuard() {
  if (!blocked_) return;
  if (!was_pending_) {
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE) == 1) {
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, SIGPIPE);
      timespec zero{0, 0};
      while (sigtimedwait(&one, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

namespace {

// hiredis's argc/argv/argvlen of a command.
struct Argv {
  std::vector<const char*> data;
  std::vector<size_t> size;
  explicit Argv(const std::vector<Arg>& args) {
    data.reserve(args.size());
    size.reserve(args.size());
    for (const Arg& a : args) {
      data.push_back(a.data);
      size.push_back(a.size);
    }
  }
  int count() const { return static_cast<int>(data.size()); }
};

// hiredis's text for the context's error, with what it means where it says
// little (a read or write that ran into the socket timeout reports EAGAIN).
std::string io_text(const pq_redis& r) {
  if (r.c == nullptr) return "not connected";
  std::string text = r.c->errstr;
  if (r.c->err == REDIS_ERR_IO &&
      (text == std::strerror(EAGAIN) || text == std::strerror(EWOULDBLOCK)))
    text += " (timed out after " + std::to_string(r.timeout_ms) + " ms)";
  return text;
}

// A network failure: the hiredis context is dropped (its protocol state is
// unknown), so the next call reconnects.
[[noreturn]] void io_failed(pq_redis& r, const std::string& doing) {
  std::string text = io_text(r);
  disconnect(r);
  fail(PQ_ERR_BACKEND, "redis at " + r.where() + ": " + doing + ": " + text);
}

// An error reply: PQ_ERR_BACKEND with the server's text (OOM, READONLY,
// NOAUTH, ...). WRONGTYPE means one of this key's names holds something
// other than a string, which no put wrote: PQ_ERR_CORRUPT.
[[noreturn]] void server_refused(pq_redis& r, const std::string& doing, const redisReply* reply) {
  const std::string text(reply->str, static_cast<size_t>(reply->len));
  fail(text.rfind("WRONGTYPE", 0) == 0 ? PQ_ERR_CORRUPT : PQ_ERR_BACKEND,
       "redis at " + r.where() + ": " + doing + ": the server answered \"" + text + "\"");
}

}  // namespace

// ---------------------------------------------------------------------------
// The connection
// ---------------------------------------------------------------------------

void disconnect(pq_redis& r) noexcept {
  if (r.c != nullptr) redisFree(r.c);
  r.c = nullptr;
}

void check_status_reply(pq_redis& r, const redisReply* reply, const char* want,
                        const std::string& doing) {
  if (reply->type != REDIS_REPLY_STATUS ||
      std::string(reply->str, static_cast<size_t>(reply->len)) != want)
    fail(PQ_ERR_BACKEND, "redis at " + r.where() + ": " + doing + ": unexpected reply (type " +
                             std::to_string(reply->type) + "), expected " + want);
}

Reply command(pq_redis& r, const std::vector<Arg>& args, const std::string& doing) {
  Argv argv(args);
  void* raw = redisCommandArgv(r.c, argv.count(), argv.data.data(), argv.size.data());
  if (raw == nullptr) io_failed(r, doing);
  Reply reply(static_cast<redisReply*>(raw));
  if (reply->type == REDIS_REPLY_ERROR) server_refused(r, doing, reply.get());
  return reply;
}

void connect(pq_redis& r) {
  redisContext* c = nullptr;
  if (r.timeout_ms > 0) {
    timeval tv{r.timeout_ms / 1000, (r.timeout_ms % 1000) * 1000};
    c = redisConnectWithTimeout(r.host.c_str(), r.port, tv);
  } else {
    c = redisConnect(r.host.c_str(), r.port);
  }
  if (c == nullptr) throw std::bad_alloc();
  r.c = c;
  if (c->err != 0) io_failed(r, "cannot connect");
  if (r.timeout_ms > 0) {
    timeval tv{r.timeout_ms / 1000, (r.timeout_ms % 1000) * 1000};
    if (redisSetTimeout(c, tv) != REDIS_OK) io_failed(r, "cannot set the socket timeout");
  }
  try {
    Reply pong = command(r, {"PING"}, "PING after connecting");
    check_status_reply(r, pong.get(), "PONG", "PING after connecting");
  } catch (...) {
    disconnect(r);  // a server that refuses PING (NOAUTH) is no connection
    throw;
  }
}

void ensure_connected(pq_redis& r) {
  if (r.c == nullptr) connect(r);
}

// ---------------------------------------------------------------------------
// Pipelining
// ---------------------------------------------------------------------------

void Pipeline::append(const std::vector<Arg>& args, Handler handler, std::string doing) {
  Argv argv(args);
  if (redisAppendCommandArgv(r_.c, argv.count(), argv.data.data(), argv.size.data()) != REDIS_OK)
    io_failed(r_, doing);
  pending_.push_back({std::move(handler), std::move(doing)});
  if (pending_.size() >= window_) read_one();
}

void Pipeline::finish() {
  while (!pending_.empty()) read_one();
  if (first_failure_) std::rethrow_exception(first_failure_);
}

void Pipeline::abandon() noexcept {
  try {
    while (!pending_.empty()) read_one();
  } catch (...) {
    pending_.clear();
  }
}

void Pipeline::read_one() {
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  if (r_.c == nullptr) io_failed(r_, p.doing);  // dropped by an earlier failure
  void* raw = nullptr;
  if (redisGetReply(r_.c, &raw) != REDIS_OK || raw == nullptr) io_failed(r_, p.doing);
  Reply reply(static_cast<redisReply*>(raw));
  if (first_failure_) return;  // only keep the protocol in step
  try {
    if (reply->type == REDIS_REPLY_ERROR) server_refused(r_, p.doing, reply.get());
    p.handler(reply.get());
  } catch (...) {  // a pq::Error, or bad_alloc in a handler
    first_failure_ = std::current_exception();
  }
}

}  // namespace pqr
