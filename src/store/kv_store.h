// The host tier (kv_tier.h): the K/V of one (sequence, layer) in host
// memory. It grows in fixed chunks of kChunkTokens tokens, so appending
// never recopies what is stored and a build can read a snapshot while the
// caller appends more tokens.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/hooks.h"
#include "store/kv_tier.h"
#include "store/memory_budget.h"
#include "pqcache.h"
#include "base/thread_pool.h"

namespace pq {

class KvStore final : public KvTier {
 public:

  // One chunk: keys and values, each laid out [head][token in chunk][dim],
  // so one head's rows are contiguous (K-Means and scoring read by head).
  // It holds its share of the budget (its K/V and the state that grows with
  // its tokens elsewhere: codes, selector and cache state) while it lives.
  //
  // A chunk another store shares (pq_sequence_fork), or whose dropped rows a
  // snapshot may still read (truncate_under_readers), is marked `shared` for
  // good, and no store writes into it again: an append that would write
  // into a shared partial chunk copies it first.
  struct Chunk {
    Chunk(const HostAllocator& allocator, size_t bytes_per_tensor, Reservation charge);
    HostBlock keys;
    HostBlock values;
    Reservation charge;
    std::atomic<bool> shared{false};
  };

  // A read-only view of the first `tokens` tokens, valid while held.
  struct Snapshot {
    std::vector<std::shared_ptr<const Chunk>> chunks;
    int64_t tokens = 0;
    int32_t heads = 0;
    int32_t head_dim = 0;
    size_t element_size = 0;
    const uint8_t* key_row(int64_t token, int32_t head) const;
  };

  // chunk_charge: the budget bytes each chunk holds (>= its K/V); the
  // chunks' K and V blocks come from `allocator` (the caller's host_alloc).
  KvStore(int32_t heads, int32_t head_dim, int32_t dtype, MemoryBudget* budget,
          uint64_t chunk_charge, const HostAllocator& allocator = HostAllocator{});

  int64_t tokens() const override { return tokens_; }
  uint64_t bytes_held() const override { return chunks_.size() * chunk_bytes(); }
  uint64_t bytes_charged() const override {
    return chunks_.size() * chunk_charge_ + expected_charge_.bytes();
  }

  // Appends keys.tokens tokens from host tensors (already validated: same
  // token count, heads, head_dim, dtype), checking that every value is
  // finite in the same pass; a large append is spread over `pool` (may be
  // null). All or nothing: on an error (a NaN or Inf, the memory limit, an
  // allocation) nothing is appended and nothing is held.
  using KvTier::append;

  // append() in two steps: open() holds and allocates `count` more tokens
  // whose rows are not written yet (all or nothing; nothing may read them
  // until copy_in() wrote them); copy_in() writes rows from `first` on and
  // returns false if a value was not finite (the rows are then partly
  // written).
  void open(int64_t count) override;
  // Whether the next open() copies the partial last chunk (shared with a
  // fork or a reader), reading its rows.
  bool open_copies_last_chunk() const override {
    return tokens_ % kChunkTokens > 0 && !chunks_.empty() && chunks_.back()->shared.load();
  }
  bool copy_in(int64_t first, const pq_tensor& keys, const pq_tensor& values,
               ThreadPool* pool = nullptr) override;
  // For K/V that arrive after their tokens are known (a restore whose
  // description came first): this empty store counts `count` tokens and
  // charges the memory limit for them now (all or nothing), but allocates
  // their chunks only when copy_in() brings their rows, so a description
  // never makes the process allocate more than the bytes it was given.
  // Nothing may read the rows before copy_in() wrote them.
  void expect(int64_t count) override;

  const uint8_t* key_row(int64_t token, int32_t head) const { return row(true, token, head); }
  const uint8_t* value_row(int64_t token, int32_t head) const { return row(false, token, head); }
  size_t row_bytes() const override { return static_cast<size_t>(head_dim_) * element_size_; }
  int32_t head_dim() const override { return head_dim_; }
  int32_t dtype() const override { return dtype_; }
  // Where the chunks come from (a backend tells its own pool by it).
  const HostAllocator& allocator() const { return allocator_; }
  // The chunks' K and V blocks, [head][token in chunk][dim] each: chunk c
  // holds tokens [c * kChunkTokens, (c + 1) * kChunkTokens).
  size_t chunk_count() const override { return chunks_.size(); }
  // The bytes of one chunk's K (or V) block, as the allocator is asked.
  size_t block_bytes() const { return tensor_bytes_per_chunk(); }
  const uint8_t* chunk_keys(size_t c) const { return chunks_[c]->keys.get(); }
  const uint8_t* chunk_values(size_t c) const { return chunks_[c]->values.get(); }

  Snapshot snapshot() const;

  // Every row's address (row_table.h); valid until the store changes.
  using RowTable = pq::RowTable;
  RowTable row_table() const { return table_; }


  // Makes this empty store hold `parent`'s tokens: its full chunks shared
  // (marked shared in both stores, charged once), the partial last chunk
  // copied into a chunk of its own (charged here). All or nothing. Returns
  // the number of chunks shared.
  int64_t fork_from(const KvStore& parent);
  int64_t fork_from(const KvTier& parent) override;
  // Chunks this store holds that another store may hold too.
  int64_t shared_chunks() const override;

  // Drops the tokens from `tokens` on (and the chunks they alone used):
  // undoes an append whose call failed afterwards. Never throws.
  void truncate(int64_t tokens) noexcept override;
  // truncate() for pq_sequence_truncate: the rows it drops may still be read
  // by a snapshot (an index build in flight, cancelled or not), so a partial
  // last chunk is marked shared and the next append writes into a copy.
  void truncate_under_readers(int64_t tokens) noexcept override;

  // KvTier's reads, straight from the chunks (kv_store_reads.cpp).
  std::shared_ptr<const KeySnapshot> snapshot(int64_t tokens) const override;
  void keys_as_float(int32_t head, int64_t first, int64_t count, float* out) const override;
  void keys_as_float(int32_t head, const int32_t* positions, int64_t count,
                     float* out) const override;
  void keys_as_float(int32_t head, const int64_t* rows, int64_t count, float* out) const override;
  void key_columns_as_float(int32_t head, int64_t first, int64_t count, const int32_t* cols,
                            int32_t ncols, float* out) const override;
  void gather(int32_t head, const int32_t* positions, int64_t count, uint8_t* keys,
              size_t key_stride, uint8_t* values, size_t value_stride) const override;
  SelectedRows select_rows(int32_t head, const int32_t* positions, int64_t count,
                           RowStaging& staging) const override;
  void for_each_run(bool keys, int32_t head, int64_t first, int64_t end,
                    const std::function<void(const uint8_t*, int64_t)>& fn) const override;
  const KvStore* host_store() const override { return this; }
  // Throws reject_non_finite's error for the first chunk run of [first, end)
  // that holds a NaN or Inf (rows the device wrote); *run_first is set to
  // where that run starts.
  void reject_non_finite_rows(int64_t first, int64_t end, int64_t* run_first) const;
  using KvTier::host_store;

 private:
  size_t chunk_bytes() const { return 2 * tensor_bytes_per_chunk(); }
  size_t tensor_bytes_per_chunk() const {
    return static_cast<size_t>(kChunkTokens) * heads_ * row_bytes();
  }
  const uint8_t* row(bool key, int64_t token, int32_t head) const;
  // A private chunk holding the first `rows` token rows of `from`.
  std::shared_ptr<Chunk> copy_chunk(const Chunk& from, int64_t rows, Reservation charge) const;

  int32_t heads_;
  int32_t head_dim_;
  int32_t dtype_;
  size_t element_size_;
  MemoryBudget* budget_;
  uint64_t chunk_charge_;
  HostAllocator allocator_;
  // Allocates the chunks that rows before `end` need and expect() charged.
  void materialize(int64_t end);
  void check_room(int64_t count) const;

  // table_ after the chunk list changed, in room reserve_table() made.
  void reserve_table(size_t chunks);
  void sync_table() noexcept;

  int64_t tokens_ = 0;
  std::vector<std::shared_ptr<Chunk>> chunks_;
  RowTable table_;
  Reservation expected_charge_;  // expect()'s charge for chunks not allocated yet
};

// The host rows of a tier whose rows are in host memory: the CUDA
// backend reads and writes them in place (mapped pinned memory), so
// pq_create pairs it with the host tier only; another tier here is a bug of
// the core (PQ_ERR_INTERNAL).
const KvStore& host_rows(const KvTier& tier);
KvStore& host_rows(KvTier& tier);

}  // namespace pq
