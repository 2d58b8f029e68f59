// The streaming get (transfer.h): pq_redis_get_begin adds the sequence from
// the state's first blocks (the description), then each step fetches the
// blocks after them and feeds pq_sequence_restore_kv one whole section at a
// time, so that a selection can start before the K/V have arrived.
#include "transfer.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "cluster.h"
#include "connection.h"
#include "store.h"

// ---------------------------------------------------------------------------
// The streaming get: the description first, then the K/V section by section
// ---------------------------------------------------------------------------

namespace pqr {

namespace {

// The state's section header (docs/state-format.md): u32 type, i32 layer.
constexpr uint32_t kKeysValuesSection = 2;
constexpr uint32_t kEndSection = 0xFFFFFFFFu;

}  // namespace

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

}  // namespace pqr

pq_redis_transfer::~pq_redis_transfer() {
  if (pq_context* c = ctx.load()) pq_unwatch_destroy(c, destroy_watch);
  if (pq_redis* r = conn.load()) {
    std::lock_guard<std::mutex> lock(r->mu);
    r->transfers.erase(this);
  }
}

void pq_redis_transfer::attach(pq_redis* r, pq_context* c) {
  uint64_t watch = 0;
  const pq_status st = pq_watch_destroy(c, &pq_redis_transfer::context_destroyed, this, &watch);
  if (st != PQ_OK) pqr::library_failed(st, "pq_watch_destroy", key);
  ctx.store(c);
  destroy_watch = watch;
  std::lock_guard<std::mutex> lock(r->mu);
  r->transfers.insert(this);  // may throw bad_alloc: the destructor unwatches
  conn.store(r);
}

void pq_redis_transfer::context_destroyed(void* self) {
  static_cast<pq_redis_transfer*>(self)->ctx.store(nullptr);
}

void pq_redis_transfer::require_owners() const {
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

uint64_t pq_redis_transfer::feed_section(const uint8_t* p, uint64_t n) {
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

void pq_redis_transfer::feed(const uint8_t* p, uint64_t n) {
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

void pq_redis_transfer::advance(uint64_t end) {
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
    pqr::route(r, pqr::manifest_key(key));
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

void pq_redis_transfer::abandon(const std::string& why) noexcept {
  if (failed) return;
  failed = true;
  failure = why;
  if (pq_context* c = ctx.load()) pq_sequence_remove(c, seq_id);
  std::vector<uint8_t>().swap(carry);
  std::vector<uint8_t>().swap(prefix);
}

namespace pqr {

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

}  // namespace pqr
