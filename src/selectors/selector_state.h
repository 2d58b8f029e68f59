// What a selector keeps per (sequence, layer) between calls, and the host
// bytes it may take (for the memory limit, layer/memory_cost.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/error.h"
#include "pqcache.h"
#include "store/kv_tier.h"

namespace pq {

class ByteReader;
class ByteWriter;

// What a selector keeps per (sequence, layer) between calls: block
// summaries, accumulated attention, prompt scores, a random stream. It
// follows the sequence through the state calls of pq_sequence_truncate,
// pq_sequence_fork, pq_sequence_save and pq_sequence_restore.
class SelectorState {
 public:
  virtual ~SelectorState() = default;
  // A copy for a forked sequence.
  virtual std::unique_ptr<SelectorState> clone() const = 0;
  // Forgets what it holds of the tokens at or after `tokens`.
  virtual void truncate(int64_t tokens) = 0;
  // What cannot be recomputed from the stored K/V (derived summaries are
  // rebuilt instead); load() reads it into a fresh state, checking it
  // against the layer's `tokens` and the configuration (PQ_ERR_CORRUPT).
  virtual void save(ByteWriter& out) const = 0;
  virtual void load(ByteReader& in, int64_t tokens, const pq_config& c) = 0;

  // Host bytes held for what the caller described ahead of, or apart from,
  // the stored tokens, which the per-chunk StateCost cannot bound (FastGen's
  // token classes may describe a prompt before its K/V): the layer charges
  // them to the memory limit as they are, after every change.
  virtual uint64_t caller_bytes() const { return 0; }
  // An upper bound of caller_bytes() after observe_token_classes of
  // positions up to `end`, reserved before the call so that a refusal
  // changes nothing.
  virtual uint64_t caller_bytes_after_classes(int64_t end) const { return caller_bytes(); }
};

// clone() for a state that is copyable as it is.
template <typename State>
struct CopyableState : SelectorState {
  std::unique_ptr<SelectorState> clone() const override {
    return std::make_unique<State>(static_cast<const State&>(*this));
  }
};

// A selector's own state, typed: the layer made it with the selector's
// make_state, so a missing or foreign state is a bug, and it says so
// instead of a downcast that silently does nothing or misreads memory.
template <typename State>
State& state_of(SelectorState* state, const char* selector) {
  auto* typed = dynamic_cast<State*>(state);
  if (typed == nullptr)
    fail(PQ_ERR_INTERNAL, std::string("selector ") + selector + ": its state is " +
                              (state ? "of another type" : "missing"));
  return *typed;
}

// Host bytes a selector's state and index may take for one (sequence,
// layer), for the host memory limit (memory_cost.h): an upper bound, with
// room for a vector's geometric growth where the state grows by resizing.
struct StateCost {
  uint64_t per_layer = 0;   // held from pq_sequence_add
  uint64_t per_chunk = 0;   // per KvTier::kChunkTokens tokens stored
};

// State that grows by resize() may hold twice what it uses; a truncate
// cuts it with cut_to (base/cut_to.h), which keeps it so.
constexpr uint64_t kGrowthRoom = 2;

// Per-token state of `bytes_per_token` for every kv head, per chunk.
inline uint64_t per_token_cost(const pq_config& c, uint64_t bytes_per_token) {
  return kGrowthRoom * static_cast<uint64_t>(KvTier::kChunkTokens) * c.num_kv_heads *
         bytes_per_token;
}

// Blocks of block_tokens a chunk of tokens can open: kChunkTokens /
// block_tokens, rounded up, plus one for a block that straddles chunks.
inline uint64_t blocks_per_chunk(int32_t block_tokens) {
  return (KvTier::kChunkTokens + block_tokens - 1) / block_tokens + 1;
}

// Per-block state of `bytes_per_block` for every kv head, per chunk.
inline uint64_t per_block_cost(const pq_config& c, int32_t block_tokens,
                               uint64_t bytes_per_block) {
  return kGrowthRoom * blocks_per_chunk(block_tokens) * c.num_kv_heads * bytes_per_block;
}

}  // namespace pq
