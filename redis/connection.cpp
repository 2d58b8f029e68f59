// The connection of libpqcache_redis (connection.h): connecting, one command
// at a time, pipelined commands and the SIGPIPE guard, through hiredis. A
// network error drops the node's hiredis context (its protocol state is unknown
// after a partial read or write); the next call on the connection
// reconnects first.
#include "connection.h"

#include <pthread.h>

#include <cerrno>
#include <new>

#include "cluster.h"
#include "internal.h"

pq_redis::pq_redis() = default;

pq_redis::~pq_redis() {
  pqr::disconnect(server);
  if (cluster)
    for (auto& n : cluster->nodes) pqr::disconnect(*n);
}

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
std::string io_text(const pq_redis& r, const Node& n) {
  if (n.c == nullptr) return "not connected";
  std::string text = n.c->errstr;
  if (n.c->err == REDIS_ERR_IO &&
      (text == std::strerror(EAGAIN) || text == std::strerror(EWOULDBLOCK)))
    text += " (timed out after " + std::to_string(r.timeout_ms) + " ms)";
  return text;
}

// A network failure: the node's hiredis context is dropped (its protocol
// state is unknown), so the next call reconnects; in cluster mode the slot
// map is read again first (the node may have gone for good).
[[noreturn]] void io_failed(pq_redis& r, Node& n, const std::string& doing) {
  std::string text = io_text(r, n);
  disconnect(n);
  if (r.cluster) r.cluster->stale = true;
  fail(PQ_ERR_BACKEND, "redis at " + n.where() + ": " + doing + ": " + text);
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

[[noreturn]] void server_refused(const Node& n, const std::string& doing, const redisReply* reply) {
  const std::string text(reply->str, static_cast<size_t>(reply->len));
  std::string meaning;
  if (starts_with(text, "CLUSTERDOWN"))
    meaning = " (the cluster does not serve this key's slot now: a node is down or slots are "
              "unassigned; retry once it is whole)";
  else if (starts_with(text, "TRYAGAIN"))
    meaning = " (the key's slot is being migrated between nodes; retry)";
  else if (starts_with(text, "MOVED") || starts_with(text, "ASK"))
    meaning = " (a Redis Cluster node: connect with pq_redis_connect_cluster)";
  fail(starts_with(text, "WRONGTYPE") ? PQ_ERR_CORRUPT : PQ_ERR_BACKEND,
       "redis at " + n.where() + ": " + doing + ": the server answered \"" + text + "\"" + meaning);
}

// ---------------------------------------------------------------------------
// The connection
// ---------------------------------------------------------------------------

void disconnect(Node& n) noexcept {
  if (n.c != nullptr) redisFree(n.c);
  n.c = nullptr;
}

void check_status_reply(pq_redis& r, const redisReply* reply, const char* want,
                        const std::string& doing) {
  if (reply->type != REDIS_REPLY_STATUS ||
      std::string(reply->str, static_cast<size_t>(reply->len)) != want)
    fail(PQ_ERR_BACKEND, "redis at " + r.where() + ": " + doing + ": unexpected reply (type " +
                             std::to_string(reply->type) + "), expected " + want);
}

Reply send_to(pq_redis& r, Node& n, const std::vector<Arg>& args, const std::string& doing,
              bool asking) {
  ensure_connected(r, n);
  Argv argv(args);
  if (!asking) {
    void* raw = redisCommandArgv(n.c, argv.count(), argv.data.data(), argv.size.data());
    if (raw == nullptr) io_failed(r, n, doing);
    return Reply(static_cast<redisReply*>(raw));
  }
  // ASKING lets the next command (only) in while the slot is being imported.
  const char* asking_argv[] = {"ASKING"};
  void* raw = nullptr;
  if (redisAppendCommandArgv(n.c, 1, asking_argv, nullptr) != REDIS_OK ||
      redisAppendCommandArgv(n.c, argv.count(), argv.data.data(), argv.size.data()) != REDIS_OK ||
      redisGetReply(n.c, &raw) != REDIS_OK || raw == nullptr)
    io_failed(r, n, "ASKING, then " + doing);
  Reply ok(static_cast<redisReply*>(raw));
  raw = nullptr;
  if (redisGetReply(n.c, &raw) != REDIS_OK || raw == nullptr) io_failed(r, n, doing);
  Reply reply(static_cast<redisReply*>(raw));
  if (ok->type == REDIS_REPLY_ERROR) server_refused(n, "ASKING", ok.get());
  return reply;
}

Reply command(pq_redis& r, const std::vector<Arg>& args, const std::string& doing) {
  Node& n = *r.node;
  Reply reply = send_to(r, n, args, doing);
  if (reply->type == REDIS_REPLY_ERROR && r.cluster)
    reply = follow_redirects(r, n, std::move(reply), args, doing, nullptr);
  if (reply->type == REDIS_REPLY_ERROR) server_refused(*r.node, doing, reply.get());
  return reply;
}

void connect(pq_redis& r, Node& n) {
  redisContext* c = nullptr;
  if (r.timeout_ms > 0) {
    timeval tv{r.timeout_ms / 1000, (r.timeout_ms % 1000) * 1000};
    c = redisConnectWithTimeout(n.host.c_str(), n.port, tv);
  } else {
    c = redisConnect(n.host.c_str(), n.port);
  }
  if (c == nullptr) throw std::bad_alloc();
  n.c = c;
  if (c->err != 0) io_failed(r, n, "cannot connect");
  if (r.timeout_ms > 0) {
    timeval tv{r.timeout_ms / 1000, (r.timeout_ms % 1000) * 1000};
    if (redisSetTimeout(c, tv) != REDIS_OK) io_failed(r, n, "cannot set the socket timeout");
  }
  try {
    Reply pong = send_to(r, n, {"PING"}, "PING after connecting");
    if (pong->type == REDIS_REPLY_ERROR) server_refused(n, "PING after connecting", pong.get());
    check_status_reply(r, pong.get(), "PONG", "PING after connecting");
  } catch (...) {
    disconnect(n);  // a server that refuses PING (NOAUTH) is no connection
    throw;
  }
}

void ensure_connected(pq_redis& r, Node& n) {
  if (n.c == nullptr) connect(r, n);
}

// ---------------------------------------------------------------------------
// Pipelining
// ---------------------------------------------------------------------------

void Pipeline::append(const std::vector<Arg>& args, Handler handler, std::string doing) {
  ensure_connected(r_, node_);
  Argv argv(args);
  if (redisAppendCommandArgv(node_.c, argv.count(), argv.data.data(), argv.size.data()) !=
      REDIS_OK)
    io_failed(r_, node_, doing);
  Pending p{std::move(handler), std::move(doing), {}};
  if (r_.cluster)
    for (const Arg& a : args) p.args.emplace_back(a.data, a.size);
  pending_.push_back(std::move(p));
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
  if (node_.c == nullptr) io_failed(r_, node_, p.doing);  // dropped by an earlier failure
  void* raw = nullptr;
  if (redisGetReply(node_.c, &raw) != REDIS_OK || raw == nullptr) io_failed(r_, node_, p.doing);
  Reply reply(static_cast<redisReply*>(raw));
  if (first_failure_) return;  // only keep the protocol in step
  try {
    if (reply->type == REDIS_REPLY_ERROR && r_.cluster) {
      const std::vector<Arg> args(p.args.begin(), p.args.end());
      // Nothing may be sent on node_ while its replies are outstanding.
      reply = follow_redirects(r_, node_, std::move(reply), args, p.doing,
                               pending_.empty() ? nullptr : &node_);
    }
    if (reply->type == REDIS_REPLY_ERROR) server_refused(node_, p.doing, reply.get());
    p.handler(reply.get());
  } catch (const Error& e) {
    // A redirect sent back to node_ itself that failed there dropped node_:
    // its outstanding replies are lost, so this throws now. Any other failure
    // (a redirect's target gone, a refusal) waits while the replies are read.
    if (e.status() == PQ_ERR_BACKEND && node_.c == nullptr) throw;
    first_failure_ = std::current_exception();
  } catch (...) {  // bad_alloc in a handler
    first_failure_ = std::current_exception();
  }
}

}  // namespace pqr
