// libpqcache_redis: a sequence's saved state (pq_sequence_save) in blocks on
// a Redis server, through hiredis. docs/redis.md describes the key layout,
// the manifest and the error behaviour; include/pqcache_redis.h is the
// contract.
//
// Inside: every C entry point runs in pq::guarded (src/base/error.h; error.cpp is
// compiled into this library), which turns a pq::Error (or bad_alloc) into a
// pq_status and this library's thread-local message. A network error
// drops the hiredis context (its protocol state is unknown after a partial
// read or write); the next call on the connection reconnects first.
#include "pqcache_redis.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "internal.h"

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

namespace {

// A library call failed: its status passes through, its message is kept.
[[noreturn]] void library_failed(pq_status status, const char* call, const std::string& key) {
  const char* msg = pq_last_error();
  fail(status, call + std::string(" (key \"") + key + "\"): " + (msg ? msg : ""));
}

// hiredis writes with write(2): a peer that has gone raises SIGPIPE, which
// would kill the caller's process. The guard blocks SIGPIPE in this thread
// for the duration of a network conversation and consumes one that became
// pending meanwhile; the process's own disposition is never touched.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGPIPE);
    blocked_ = pthread_sigmask(SIG_BLOCK, &block, &old_) == 0;
  }
  ~SigpipeGuard() {
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

std::string block_key(const std::string& key, uint64_t n) {
  return key + ":blk:" + std::to_string(n);
}
std::string manifest_key(const std::string& key) { return key + ":manifest"; }

// ---------------------------------------------------------------------------
// The connection
// ---------------------------------------------------------------------------

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

void disconnect(pq_redis& r) noexcept {
  if (r.c != nullptr) redisFree(r.c);
  r.c = nullptr;
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

void check_status_reply(pq_redis& r, const redisReply* reply, const char* want,
                        const std::string& doing) {
  if (reply->type != REDIS_REPLY_STATUS ||
      std::string(reply->str, static_cast<size_t>(reply->len)) != want)
    fail(PQ_ERR_BACKEND, "redis at " + r.where() + ": " + doing + ": unexpected reply (type " +
                             std::to_string(reply->type) + "), expected " + want);
}

// One command, waiting for its reply; an error reply throws.
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

// Commands sent without waiting for each reply: at most `window` replies are
// outstanding, so neither side buffers more than a few blocks. Each command
// has a handler for its reply; a handler may throw a pq::Error, which is kept
// (the first one) while the remaining replies are read, so the connection
// stays in step. A network error throws at once and drops the connection.
class Pipeline {
 public:
  using Handler = std::function<void(redisReply*)>;
  Pipeline(pq_redis& r, size_t window) : r_(r), window_(window) {}

  void append(const std::vector<Arg>& args, Handler handler, std::string doing) {
    Argv argv(args);
    if (redisAppendCommandArgv(r_.c, argv.count(), argv.data.data(), argv.size.data()) != REDIS_OK)
      io_failed(r_, doing);
    pending_.push_back({std::move(handler), std::move(doing)});
    if (pending_.size() >= window_) read_one();
  }

  // Reads every outstanding reply, then throws the first handler failure.
  void finish() {
    while (!pending_.empty()) read_one();
    if (first_failure_) std::rethrow_exception(first_failure_);
  }
  // After a failure elsewhere: reads what is outstanding, ignoring it, so
  // that the connection is in step again (or dropped by a network error).
  void abandon() noexcept {
    try {
      while (!pending_.empty()) read_one();
    } catch (...) {
      pending_.clear();
    }
  }
  // A handler failure kept so far (the server refused a command), or null.
  std::exception_ptr first_failure() const { return first_failure_; }

 private:
  void read_one() {
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

  struct Pending {
    Handler handler;
    std::string doing;
  };
  pq_redis& r_;
  size_t window_;
  std::deque<Pending> pending_;
  std::exception_ptr first_failure_;
};

// Replies that a block was stored.
Pipeline::Handler expect_ok(pq_redis& r, std::string doing) {
  return [&r, doing](redisReply* reply) { check_status_reply(r, reply, "OK", doing); };
}

constexpr size_t kWindow = 8;

// ---------------------------------------------------------------------------
// Manifests and blocks
// ---------------------------------------------------------------------------

// The manifest under key, or false when there is none.
bool read_manifest(pq_redis& r, const std::string& key, Manifest* out) {
  const std::string mkey = manifest_key(key);
  Reply reply = command(r, {"GET", mkey}, "GET " + mkey);
  if (reply->type == REDIS_REPLY_NIL) return false;
  if (reply->type != REDIS_REPLY_STRING)
    fail(PQ_ERR_CORRUPT, mkey + " is not a string (reply type " + std::to_string(reply->type) + ")");
  *out = parse_manifest(reply->str, static_cast<size_t>(reply->len), mkey);
  return true;
}

// Deletes blocks [first, end). end == kUnknownEnd: blocks from first on
// until a batch finds none (a manifest that did not parse).
constexpr uint64_t kUnknownEnd = ~uint64_t{0};
void delete_blocks(pq_redis& r, const std::string& key, uint64_t first, uint64_t end) {
  constexpr uint64_t kBatch = 256;
  for (uint64_t at = first; at < end;) {
    const uint64_t stop = end == kUnknownEnd ? at + kBatch : std::min(end, at + kBatch);
    std::vector<std::string> keys;
    for (uint64_t n = at; n < stop; ++n) keys.push_back(block_key(key, n));
    std::vector<Arg> args{"DEL"};
    args.insert(args.end(), keys.begin(), keys.end());
    Reply reply = command(r, args, "DEL " + keys.front() + " ..");
    if (end == kUnknownEnd && reply->type == REDIS_REPLY_INTEGER && reply->integer == 0) return;
    at = stop;
  }
}

// The writer pq_sequence_save calls: cuts the stream into blocks and sends
// each as soon as it is whole. It must not throw into the library: a failure
// is kept and the save is stopped by returning non-zero.
class BlockWriter {
 public:
  BlockWriter(pq_redis& r, Pipeline& pipe, const std::string& key, uint64_t block_bytes,
              uint64_t expected_bytes)
      : r_(r), pipe_(pipe), key_(key), block_bytes_(block_bytes) {
    // The staging buffer holds at most one block, and no more than the state.
    staging_.reserve(static_cast<size_t>(std::min(block_bytes, expected_bytes)));
  }

  static int write(void* user, const void* data, size_t size) noexcept {
    auto* self = static_cast<BlockWriter*>(user);
    try {
      self->take(static_cast<const uint8_t*>(data), size);
      return 0;
    } catch (...) {
      self->error_ = std::current_exception();
      return 1;
    }
  }

  // Sends the last, partial block.
  void finish() {
    if (!staging_.empty()) emit(staging_.data(), staging_.size());
    staging_.clear();
  }
  std::exception_ptr error() const { return error_; }
  const std::vector<uint32_t>& crcs() const { return crcs_; }
  uint64_t total() const { return total_; }
  uint64_t blocks_sent() const { return crcs_.size(); }

 private:
  void take(const uint8_t* p, size_t size) {
    const size_t block = static_cast<size_t>(block_bytes_);
    while (size > 0) {
      if (staging_.empty() && size >= block) {  // a whole block straight from the stream
        emit(p, block);
        p += block;
        size -= block;
        continue;
      }
      const size_t n = std::min(size, block - staging_.size());
      staging_.insert(staging_.end(), p, p + n);
      p += n;
      size -= n;
      if (staging_.size() == block) {
        emit(staging_.data(), block);
        staging_.clear();
      }
    }
  }

  void emit(const uint8_t* p, size_t n) {
    // The server refused a block: stop the save (put reports the refusal).
    if (pipe_.first_failure()) std::rethrow_exception(pipe_.first_failure());
    const std::string k = block_key(key_, crcs_.size());
    crcs_.push_back(block_crc(p, n));
    total_ += n;
    pipe_.append({"SET", k, Arg(p, n)}, expect_ok(r_, "SET " + k), "SET " + k);
  }

  pq_redis& r_;
  Pipeline& pipe_;
  const std::string& key_;
  uint64_t block_bytes_;
  std::vector<uint8_t> staging_;
  std::vector<uint32_t> crcs_;
  uint64_t total_ = 0;
  std::exception_ptr error_;
};

// Best effort after a failed put: the blocks written (and those of an older
// state) go, so that the key holds nothing. Errors here are not reported:
// the put's own error is.
void delete_after_failure(pq_redis& r, const std::string& key, uint64_t end) noexcept {
  try {
    if (r.c != nullptr && end > 0) delete_blocks(r, key, 0, end);
  } catch (...) {
  }
}

void check_key(const char* key) {
  if (key == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "key is NULL");
  if (key[0] == '\0') fail(PQ_ERR_INVALID_ARGUMENT, "key is empty");
}

void check_conn(const pq_redis* conn) {
  if (conn == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "conn is NULL");
}

// ---------------------------------------------------------------------------
// The operations
// ---------------------------------------------------------------------------

void put(pq_redis& r, pq_context* ctx, uint64_t seq_id, const std::string& key,
         uint64_t block_bytes) {
  // The sequence must exist before the old state under key is touched.
  uint64_t expected = 0;
  pq_status st = pq_sequence_state_size(ctx, seq_id, &expected);
  if (st != PQ_OK) library_failed(st, "pq_sequence_state_size", key);

  std::lock_guard<std::mutex> lock(r.mu);
  SigpipeGuard sigpipe;
  ensure_connected(r);

  // The old state's block count (for the blocks a smaller state leaves over).
  uint64_t old_blocks = 0;
  try {
    Manifest old;
    if (read_manifest(r, key, &old)) old_blocks = old.block_count;
  } catch (const Error& f) {
    if (f.status() != PQ_ERR_CORRUPT && f.status() != PQ_ERR_INCOMPATIBLE) throw;
    old_blocks = kUnknownEnd;
  }
  // From here on a reader finds no state rather than a mix of two.
  const std::string mkey = manifest_key(key);
  command(r, {"DEL", mkey}, "DEL " + mkey);

  Pipeline pipe(r, kWindow);
  BlockWriter writer(r, pipe, key, block_bytes, expected);
  st = pq_sequence_save(ctx, seq_id, &BlockWriter::write, &writer);
  // A failure deletes the blocks sent and those of the older state.
  try {
    if (writer.error()) std::rethrow_exception(writer.error());
    if (st != PQ_OK) {
      const std::string msg = pq_last_error() ? pq_last_error() : "";
      pipe.finish();  // in step again, for the clean-up
      fail(st, "pq_sequence_save (key \"" + key + "\"): " + msg);
    }
    writer.finish();
    pipe.finish();

    Manifest m;
    m.state_bytes = writer.total();
    m.block_bytes = block_bytes;
    m.block_count = writer.blocks_sent();
    m.crcs = writer.crcs();
    Reply reply = command(r, {"SET", mkey, encode_manifest(m)}, "SET " + mkey);
    check_status_reply(r, reply.get(), "OK", "SET " + mkey);
  } catch (...) {
    pipe.abandon();
    delete_after_failure(r, key, std::max<uint64_t>(old_blocks, writer.blocks_sent()));
    throw;
  }
  if (old_blocks > writer.blocks_sent()) delete_blocks(r, key, writer.blocks_sent(), old_blocks);
}

// Fetches blocks [first, end) of m in one pipeline and hands each, checked
// against the manifest (present, a string, its size, its CRC-32C), to
// `take` in block order. A failure of `take` (a pq::Error) is reported after
// the outstanding replies are read, as any handler failure.
using BlockSink = std::function<void(uint64_t n, const uint8_t* data, size_t size)>;
void fetch_blocks(pq_redis& r, const std::string& key, const Manifest& m, uint64_t first,
                  uint64_t end, const BlockSink& take) {
  Pipeline pipe(r, kWindow);
  for (uint64_t n = first; n < end; ++n) {
    const std::string k = block_key(key, n);
    const uint64_t want = std::min(m.block_bytes, m.state_bytes - n * m.block_bytes);
    const uint32_t crc = m.crcs[n];
    pipe.append(
        {"GET", k},
        [k, n, want, crc, &take](redisReply* reply) {
          if (reply->type == REDIS_REPLY_NIL)
            fail(PQ_ERR_CORRUPT, "block " + k + " is missing (the manifest lists it)");
          if (reply->type != REDIS_REPLY_STRING)
            fail(PQ_ERR_CORRUPT, "block " + k + " is not a string");
          const uint64_t got = static_cast<uint64_t>(reply->len);
          if (got != want)
            fail(PQ_ERR_CORRUPT, "block " + k + " has " + std::to_string(got) +
                                     " bytes; the manifest says " + std::to_string(want));
          const uint32_t actual = block_crc(reply->str, static_cast<size_t>(got));
          if (actual != crc)
            fail(PQ_ERR_CORRUPT, "block " + k + ": CRC-32C " + hex32(actual) +
                                     " does not match the manifest's " + hex32(crc));
          take(n, reinterpret_cast<const uint8_t*>(reply->str), static_cast<size_t>(got));
        },
        "GET " + k);
  }
  pipe.finish();
}

// Reads and checks every block of m into one buffer of m.state_bytes.
std::unique_ptr<uint8_t[]> read_blocks(pq_redis& r, const std::string& key, const Manifest& m) {
  std::unique_ptr<uint8_t[]> state(new uint8_t[std::max<uint64_t>(m.state_bytes, 1)]);
  uint8_t* base = state.get();
  fetch_blocks(r, key, m, 0, m.block_count,
               [base, &m](uint64_t n, const uint8_t* data, size_t size) {
                 std::memcpy(base + n * m.block_bytes, data, size);
               });
  return state;
}

void require_absent(pq_context* ctx, uint64_t seq_id) {
  int64_t tokens = 0;
  if (pq_sequence_length(ctx, seq_id, 0, &tokens) == PQ_OK)
    fail(PQ_ERR_INVALID_ARGUMENT, "seq_id " + std::to_string(seq_id) + " already exists");
}

// The manifest under key; PQ_ERR_NOT_FOUND when there is none.
Manifest require_manifest(pq_redis& r, const std::string& key) {
  Manifest m;
  if (!read_manifest(r, key, &m))
    fail(PQ_ERR_NOT_FOUND, "no state under key \"" + key + "\" (" + manifest_key(key) +
                               " does not exist)");
  return m;
}

void get(pq_redis& r, pq_context* ctx, uint64_t seq_id, const std::string& key) {
  require_absent(ctx, seq_id);
  std::unique_ptr<uint8_t[]> state;
  Manifest m;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    SigpipeGuard sigpipe;
    ensure_connected(r);
    m = require_manifest(r, key);
    state = read_blocks(r, key, m);
  }
  const pq_status st = pq_sequence_restore(ctx, seq_id, state.get(), m.state_bytes);
  if (st != PQ_OK) library_failed(st, "pq_sequence_restore", key);
}

// ---------------------------------------------------------------------------
// The streaming get: the description first, then the K/V section by section
// ---------------------------------------------------------------------------

// The state's section header (docs/state-format.md): u32 type, i32 layer.
constexpr uint32_t kKeysValuesSection = 2;
constexpr uint32_t kEndSection = 0xFFFFFFFFu;

// Adds the sequence from the state's first blocks: one block, then as many
// as pq_sequence_restore_begin says it needs from the state's start, until
// it succeeds. Returns the bytes it read (the description); `prefix` keeps
// every byte fetched.
uint64_t begin_restore(pq_redis& r, pq_context* ctx, uint64_t seq_id, const std::string& key,
                       const Manifest& m, std::vector<uint8_t>& prefix) {
  uint64_t fetched = 0;  // blocks
  uint64_t want = std::min<uint64_t>(1, m.block_count);
  for (;;) {
    prefix.reserve(static_cast<size_t>(std::min(m.state_bytes, want * m.block_bytes)));
    fetch_blocks(r, key, m, fetched, want, [&prefix](uint64_t, const uint8_t* data, size_t size) {
      prefix.insert(prefix.end(), data, data + size);
    });
    fetched = want;
    uint64_t consumed = 0;
    const pq_status st =
        pq_sequence_restore_begin(ctx, seq_id, prefix.data(), prefix.size(), &consumed);
    if (st == PQ_OK) return consumed;
    if (st != PQ_ERR_BUFFER_TOO_SMALL) library_failed(st, "pq_sequence_restore_begin", key);
    if (consumed > m.state_bytes || consumed <= prefix.size())
      fail(PQ_ERR_CORRUPT, "key \"" + key + "\": the state's description needs " +
                               std::to_string(consumed) + " bytes; the state has " +
                               std::to_string(m.state_bytes));
    want = std::min(m.block_count, (consumed + m.block_bytes - 1) / m.block_bytes);
  }
}

}  // namespace

}  // namespace pqr

// A get in steps (pqcache_redis.h): the blocks after those begin fetched,
// fed to pq_sequence_restore_kv one whole section at a time.
struct pq_redis_transfer {
  // Both become null when their owner goes first (pq_redis_close, or
  // pq_destroy through the watch below): every call but free is then
  // PQ_ERR_BAD_STATE, and nothing touches the freed memory.
  std::atomic<pq_redis*> conn{nullptr};
  std::atomic<pq_context*> ctx{nullptr};
  uint64_t destroy_watch = 0;       // pq_watch_destroy's, while ctx is set
  uint64_t seq_id = 0;
  std::string key;
  pqr::Manifest m;
  uint64_t next_block = 0;          // the next block to fetch
  std::vector<uint8_t> prefix;      // begin's blocks; bytes from prefix_at on are not fed yet
  size_t prefix_at = 0;
  std::vector<uint8_t> carry;       // the start of a section that spans blocks
  uint64_t carry_want = 0;          // the bytes the library asked for it
  uint64_t fed = 0;                 // state bytes the library has read
  uint64_t description_bytes = 0;
  std::atomic<uint64_t> fetched_bytes{0};
  std::atomic<int32_t> layers_ready{0};
  bool complete = false;            // the end section was read
  bool failed = false;              // the sequence was removed
  std::string failure;              // why

  pq_redis_transfer() = default;
  pq_redis_transfer(const pq_redis_transfer&) = delete;
  pq_redis_transfer& operator=(const pq_redis_transfer&) = delete;
  ~pq_redis_transfer() {
    if (pq_context* c = ctx.load()) pq_unwatch_destroy(c, destroy_watch);
    if (pq_redis* r = conn.load()) {
      std::lock_guard<std::mutex> lock(r->mu);
      r->transfers.erase(this);
    }
  }

  // Ties the transfer to its context and connection (before the sequence
  // exists: the only steps here that can fail).
  void attach(pq_redis* r, pq_context* c) {
    uint64_t watch = 0;
    const pq_status st = pq_watch_destroy(c, &pq_redis_transfer::context_destroyed, this, &watch);
    if (st != PQ_OK) pqr::library_failed(st, "pq_watch_destroy", key);
    ctx.store(c);
    destroy_watch = watch;
    std::lock_guard<std::mutex> lock(r->mu);
    r->transfers.insert(this);  // may throw bad_alloc: the destructor unwatches
    conn.store(r);
  }
  static void context_destroyed(void* self) {
    static_cast<pq_redis_transfer*>(self)->ctx.store(nullptr);
  }

  // PQ_ERR_BAD_STATE when the context or the connection went first.
  void require_owners() const {
    if (ctx.load() == nullptr)
      pqr::fail(PQ_ERR_BAD_STATE, "the context of the transfer of key \"" + key +
                                      "\" was destroyed (pq_destroy) while the transfer was "
                                      "open; free the transfer");
    if (conn.load() == nullptr)
      pqr::fail(PQ_ERR_BAD_STATE, "the connection of the transfer of key \"" + key +
                                      "\" was closed (pq_redis_close) while the transfer was "
                                      "open; free the transfer (seq_id " +
                                      std::to_string(seq_id) + " is then removed)");
  }

  // A whole section (or more bytes) at p: the library reads one section.
  // Returns its size, or 0 when p holds only its start (carry_want is set).
  uint64_t feed_section(const uint8_t* p, uint64_t n) {
    if (complete)
      pqr::fail(PQ_ERR_CORRUPT, "key \"" + key + "\": " + std::to_string(n) +
                                    " bytes follow the end section");
    uint64_t used = 0;
    const pq_status st = pq_sequence_restore_kv(ctx.load(), seq_id, p, n, &used);
    if (st == PQ_ERR_BUFFER_TOO_SMALL) {
      if (used <= n || used > m.state_bytes - fed)
        pqr::fail(PQ_ERR_CORRUPT, "key \"" + key + "\": the section at byte " +
                                      std::to_string(fed) + " needs " + std::to_string(used) +
                                      " bytes; " + std::to_string(m.state_bytes - fed) +
                                      " are left in the state");
      carry_want = used;
      return 0;
    }
    if (st != PQ_OK) pqr::library_failed(st, "pq_sequence_restore_kv", key);
    uint32_t type = 0;
    int32_t layer = 0;
    std::memcpy(&type, p, 4);
    std::memcpy(&layer, p + 4, 4);
    if (type == pqr::kKeysValuesSection) layers_ready.store(layer + 1);
    if (type == pqr::kEndSection) complete = true;
    fed += used;
    return used;
  }

  // The bytes of the state that follow those fed so far.
  void feed(const uint8_t* p, uint64_t n) {
    while (n > 0) {
      if (carry.empty()) {
        const uint64_t used = feed_section(p, n);
        if (used == 0) {  // the section goes on in the next block
          carry.reserve(static_cast<size_t>(carry_want));
          carry.assign(p, p + n);
          return;
        }
        p += used;
        n -= used;
        continue;
      }
      const uint64_t take = std::min<uint64_t>(n, carry_want - carry.size());
      carry.insert(carry.end(), p, p + take);
      p += take;
      n -= take;
      if (carry.size() < carry_want) continue;
      // Whole: read it, or learn its real size (only its header was asked for).
      if (feed_section(carry.data(), carry.size()) != 0)
        carry.clear();
      else
        carry.reserve(static_cast<size_t>(carry_want));  // one section, no doubling
    }
  }

  bool done() const { return complete && next_block == m.block_count; }

  // Fetches blocks [next_block, end) and feeds them.
  void advance(uint64_t end) {
    if (prefix_at < prefix.size()) {  // begin's bytes after the description
      feed(prefix.data() + prefix_at, prefix.size() - prefix_at);
      prefix_at = prefix.size();
    }
    std::vector<uint8_t>().swap(prefix);
    prefix_at = 0;
    if (next_block < end) {
      pq_redis& r = *conn.load();
      std::lock_guard<std::mutex> lock(r.mu);
      pqr::SigpipeGuard sigpipe;
      pqr::ensure_connected(r);
      pqr::fetch_blocks(r, key, m, next_block, end,
                        [this](uint64_t n, const uint8_t* data, size_t size) {
                          fetched_bytes.fetch_add(size);
                          feed(data, size);
                          next_block = n + 1;
                        });
    }
    if (next_block == m.block_count && !complete)
      pqr::fail(PQ_ERR_CORRUPT, "key \"" + key + "\": the state ends " +
                                    (carry.empty() ? std::string("before its end section")
                                                   : "inside the section at byte " +
                                                         std::to_string(fed)));
    if (complete) std::vector<uint8_t>().swap(carry);
  }

  // After an error: the sequence goes (its K/V would never arrive), unless
  // its context went first and took it along.
  void abandon(const std::string& why) noexcept {
    if (failed) return;
    failed = true;
    failure = why;
    if (pq_context* c = ctx.load()) pq_sequence_remove(c, seq_id);
    std::vector<uint8_t>().swap(carry);
    std::vector<uint8_t>().swap(prefix);
  }
};

namespace pqr {
namespace {

// A step of a transfer; an error abandons it (the sequence is removed).
void transfer_step(pq_redis_transfer& t, uint64_t max_blocks) {
  t.require_owners();
  if (t.failed)
    fail(PQ_ERR_BAD_STATE, "the transfer of key \"" + t.key + "\" failed earlier (" + t.failure +
                               "); seq_id " + std::to_string(t.seq_id) +
                               " was removed; free the transfer");
  if (t.done()) return;
  const uint64_t left = t.m.block_count - t.next_block;
  const uint64_t end = t.next_block + (max_blocks == 0 ? left : std::min(left, max_blocks));
  try {
    t.advance(end);
  } catch (const Error& e) {
    t.abandon(e.what());
    throw;
  } catch (...) {
    t.abandon("out of memory");
    throw;
  }
}

}  // namespace

}  // namespace pqr

using pqr::fail;

namespace pq {
const char* last_error();  // src/base/error.cpp, compiled into this library
}  // namespace pq

extern "C" {

PQ_REDIS_API pq_status pq_redis_connect(const char* host, int32_t port, int32_t timeout_ms,
                                        pq_redis** out) {
  return pq::guarded(__func__, [&] {
    if (host == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "host is NULL");
    if (host[0] == '\0') fail(PQ_ERR_INVALID_ARGUMENT, "host is empty");
    if (out == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "out is NULL");
    if (port < 1 || port > 65535)
      fail(PQ_ERR_INVALID_ARGUMENT, "port " + std::to_string(port) + " is not in 1..65535");
    if (timeout_ms < 0)
      fail(PQ_ERR_INVALID_ARGUMENT,
           "timeout_ms " + std::to_string(timeout_ms) + " is negative (0: no limit)");
    auto conn = std::make_unique<pq_redis>();
    conn->host = host;
    conn->port = port;
    conn->timeout_ms = timeout_ms;
    pqr::SigpipeGuard sigpipe;
    pqr::connect(*conn);
    *out = conn.release();
  });
}

PQ_REDIS_API void pq_redis_close(pq_redis* conn) {
  if (conn == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(conn->mu);
    for (pq_redis_transfer* t : conn->transfers) t->conn.store(nullptr);
  }
  pqr::disconnect(*conn);
  delete conn;
}

PQ_REDIS_API pq_status pq_redis_put(pq_redis* conn, pq_context* ctx, uint64_t seq_id,
                                    const char* key, uint64_t block_bytes) {
  return pq::guarded(__func__, [&] {
    pqr::check_conn(conn);
    if (ctx == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "ctx is NULL");
    pqr::check_key(key);
    if (block_bytes == 0 || block_bytes > PQ_REDIS_MAX_BLOCK_BYTES)
      fail(PQ_ERR_INVALID_ARGUMENT, "block_bytes " + std::to_string(block_bytes) +
                                        " is not in 1.." +
                                        std::to_string(PQ_REDIS_MAX_BLOCK_BYTES));
    pqr::put(*conn, ctx, seq_id, key, block_bytes);
  });
}

PQ_REDIS_API pq_status pq_redis_get(pq_redis* conn, pq_context* ctx, uint64_t seq_id,
                                    const char* key) {
  return pq::guarded(__func__, [&] {
    pqr::check_conn(conn);
    if (ctx == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "ctx is NULL");
    pqr::check_key(key);
    pqr::get(*conn, ctx, seq_id, key);
  });
}

PQ_REDIS_API pq_status pq_redis_get_begin(pq_redis* conn, pq_context* ctx, uint64_t seq_id,
                                          const char* key, pq_redis_transfer** out) {
  return pq::guarded(__func__, [&] {
    pqr::check_conn(conn);
    if (ctx == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "ctx is NULL");
    pqr::check_key(key);
    if (out == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "out is NULL");
    pqr::require_absent(ctx, seq_id);
    auto t = std::make_unique<pq_redis_transfer>();  // before the sequence exists
    t->seq_id = seq_id;
    t->key = key;
    t->attach(conn, ctx);
    {
      std::lock_guard<std::mutex> lock(conn->mu);
      pqr::SigpipeGuard sigpipe;
      pqr::ensure_connected(*conn);
      t->m = pqr::require_manifest(*conn, t->key);
      t->description_bytes = pqr::begin_restore(*conn, ctx, seq_id, t->key, t->m, t->prefix);
    }
    // Nothing below can fail: the sequence exists from here on.
    t->fetched_bytes.store(t->prefix.size());
    t->next_block = (t->prefix.size() + t->m.block_bytes - 1) / t->m.block_bytes;
    t->prefix_at = static_cast<size_t>(t->description_bytes);
    t->fed = t->description_bytes;
    *out = t.release();
  });
}

PQ_REDIS_API pq_status pq_redis_get_continue(pq_redis_transfer* transfer, uint64_t max_blocks,
                                             int32_t* out_done) {
  return pq::guarded(__func__, [&] {
    if (transfer == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "transfer is NULL");
    pqr::transfer_step(*transfer, max_blocks);
    if (out_done) *out_done = transfer->done() ? 1 : 0;
  });
}

PQ_REDIS_API pq_status pq_redis_get_finish(pq_redis_transfer* transfer) {
  return pq::guarded(__func__, [&] {
    if (transfer == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "transfer is NULL");
    pqr::transfer_step(*transfer, 0);
  });
}

PQ_REDIS_API pq_status pq_redis_transfer_progress(const pq_redis_transfer* transfer,
                                                  uint64_t* out_fetched_bytes,
                                                  uint64_t* out_description_bytes,
                                                  uint64_t* out_state_bytes,
                                                  int32_t* out_layers_ready) {
  return pq::guarded(__func__, [&] {
    if (transfer == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "transfer is NULL");
    transfer->require_owners();
    if (out_fetched_bytes) *out_fetched_bytes = transfer->fetched_bytes.load();
    if (out_description_bytes) *out_description_bytes = transfer->description_bytes;
    if (out_state_bytes) *out_state_bytes = transfer->m.state_bytes;
    if (out_layers_ready) *out_layers_ready = transfer->layers_ready.load();
  });
}

PQ_REDIS_API void pq_redis_transfer_free(pq_redis_transfer* transfer) {
  if (transfer == nullptr) return;
  if (!transfer->done()) transfer->abandon("freed before it was done");
  delete transfer;
}

PQ_REDIS_API pq_status pq_redis_info(pq_redis* conn, const char* key, uint64_t* out_state_bytes,
                                     uint64_t* out_block_bytes, uint64_t* out_block_count) {
  return pq::guarded(__func__, [&] {
    pqr::check_conn(conn);
    pqr::check_key(key);
    pqr::Manifest m;
    {
      std::lock_guard<std::mutex> lock(conn->mu);
      pqr::SigpipeGuard sigpipe;
      pqr::ensure_connected(*conn);
      if (!pqr::read_manifest(*conn, key, &m))
        fail(PQ_ERR_NOT_FOUND, std::string("no state under key \"") + key + "\"");
    }
    if (out_state_bytes) *out_state_bytes = m.state_bytes;
    if (out_block_bytes) *out_block_bytes = m.block_bytes;
    if (out_block_count) *out_block_count = m.block_count;
  });
}

PQ_REDIS_API pq_status pq_redis_delete(pq_redis* conn, const char* key) {
  return pq::guarded(__func__, [&] {
    pqr::check_conn(conn);
    pqr::check_key(key);
    std::lock_guard<std::mutex> lock(conn->mu);
    pqr::SigpipeGuard sigpipe;
    pqr::ensure_connected(*conn);
    uint64_t end = 0;
    try {
      pqr::Manifest m;
      if (!pqr::read_manifest(*conn, key, &m))
        fail(PQ_ERR_NOT_FOUND, std::string("no state under key \"") + key + "\"");
      end = m.block_count;
    } catch (const pqr::Error& f) {
      if (f.status() != PQ_ERR_CORRUPT && f.status() != PQ_ERR_INCOMPATIBLE) throw;
      end = pqr::kUnknownEnd;
    }
    const std::string mkey = pqr::manifest_key(key);
    pqr::command(*conn, {"DEL", mkey}, "DEL " + mkey);
    pqr::delete_blocks(*conn, key, 0, end);
  });
}

PQ_REDIS_API const char* pq_redis_last_error(void) { return pq::last_error(); }

}  // extern "C"
