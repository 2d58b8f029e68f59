// A state's manifest and blocks on the server (docs/redis.md describes the
// key layout), and the operations over them: the put, which cuts
// pq_sequence_save's stream into blocks and writes the manifest last, and
// the whole get, which fetches and checks every block before the restore.
#include "store.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "cluster.h"

namespace pqr {

namespace {

std::string block_key(const std::string& key, uint64_t n) {
  return key + ":blk:" + std::to_string(n);
}

// Replies that a block was stored.
Pipeline::Handler expect_ok(pq_redis& r, std::string doing) {
  return [&r, doing](redisReply* reply) { check_status_reply(r, reply, "OK", doing); };
}

constexpr size_t kWindow = 8;

}  // namespace

std::string manifest_key(const std::string& key) { return key + ":manifest"; }

// ---------------------------------------------------------------------------
// Manifests and blocks
// ---------------------------------------------------------------------------

bool read_manifest(pq_redis& r, const std::string& key, Manifest* out) {
  const std::string mkey = manifest_key(key);
  Reply reply = command(r, {"GET", mkey}, "GET " + mkey);
  if (reply->type == REDIS_REPLY_NIL) return false;
  if (reply->type != REDIS_REPLY_STRING)
    fail(PQ_ERR_CORRUPT, mkey + " is not a string (reply type " + std::to_string(reply->type) + ")");
  *out = parse_manifest(reply->str, static_cast<size_t>(reply->len), mkey);
  return true;
}

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

namespace {

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
    if (r.node->c != nullptr && end > 0) delete_blocks(r, key, 0, end);
  } catch (...) {
  }
}

}  // namespace

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
  route(r, manifest_key(key));

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

namespace {

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

}  // namespace

void require_absent(pq_context* ctx, uint64_t seq_id) {
  int64_t tokens = 0;
  if (pq_sequence_length(ctx, seq_id, 0, &tokens) == PQ_OK)
    fail(PQ_ERR_INVALID_ARGUMENT, "seq_id " + std::to_string(seq_id) + " already exists");
}

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
    route(r, manifest_key(key));
    m = require_manifest(r, key);
    state = read_blocks(r, key, m);
  }
  const pq_status st = pq_sequence_restore(ctx, seq_id, state.get(), m.state_bytes);
  if (st != PQ_OK) library_failed(st, "pq_sequence_restore", key);
}

}  // namespace pqr
