// The streaming get (transfer.cpp): the description first, then the K/V
// section by section, in the steps of pq_redis_get_begin, _continue and
// _finish (pqcache_redis.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "internal.h"
#include "pqcache_redis.h"

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
  ~pq_redis_transfer();

  // Ties the transfer to its context and connection (before the sequence
  // exists: the only steps here that can fail).
  void attach(pq_redis* r, pq_context* c);
  static void context_destroyed(void* self);

  // PQ_ERR_BAD_STATE when the context or the connection went first.
  void require_owners() const;

  // A whole section (or more bytes) at p: the library reads one section.
  // Returns its size, or 0 when p holds only its start (carry_want is set).
  uint64_t feed_section(const uint8_t* p, uint64_t n);

  // The bytes of the state that follow those fed so far.
  void feed(const uint8_t* p, uint64_t n);

  bool done() const { return complete && next_block == m.block_count; }

  // Fetches blocks [next_block, end) and feeds them.
  void advance(uint64_t end);

  // After an error: the sequence goes (its K/V would never arrive), unless
  // its context went first and took it along.
  void abandon(const std::string& why) noexcept;
};

namespace pqr {

// Adds the sequence from the state's first blocks: one block, then as many
// as pq_sequence_restore_begin says it needs from the state's start, until
// it succeeds. Returns the bytes it read (the description); `prefix` keeps
// every byte fetched.
uint64_t begin_restore(pq_redis& r, pq_context* ctx, uint64_t seq_id, const std::string& key,
                       const Manifest& m, std::vector<uint8_t>& prefix);

// A step of a transfer; an error abandons it (the sequence is removed).
void transfer_step(pq_redis_transfer& t, uint64_t max_blocks);

}  // namespace pqr
