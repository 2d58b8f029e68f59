// The disk tier (PQ_KV_TIER_DISK): one (sequence, layer)'s K/V in chunks
// of kChunkTokens tokens, like the host store, but a full chunk that holds
// no sink and has left the local window is written to the context's
// ChunkFile and its memory freed. The sink chunk, the chunks of the window
// and the partial last chunk stay in memory; every other row is read back
// from the file when a fetch, an attention, a selector or a build asks for
// it (the operating system's page cache sits between).
//
// Rules it shares with the host store: all or nothing (an append that
// fails, a full disk among its causes, leaves the tier as it was: a chunk
// whose write failed stays in memory), forks share full chunks (in memory
// or on disk) and copy the partial last one, a chunk a fork or a reader may
// hold is never written again (the next append copies it, reading it back
// from the file if it is there). A chunk shared with a fork stays where it
// is: in memory it is never moved to the file.
//
// The memory limit counts, per chunk, the state that grows with its tokens
// elsewhere (codes, selector and cache state: the host charge less its K/V)
// and, while the chunk is in memory for good (sinks, window), its K/V. A
// chunk an append fills and writes out at once is working memory of the
// call: a 1M-token prefill holds one such chunk at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/hooks.h"
#include "store/chunk_file.h"
#include "store/kv_tier.h"
#include "store/memory_budget.h"

namespace pq {

class DiskKvTier final : public KvTier {
 public:
  struct Geometry {
    int32_t heads, head_dim, dtype;
    int64_t sink_tokens, local_tokens;  // what stays in memory (config)
  };
  // chunk_charge: what a chunk is charged in the host tier (K/V and
  // state); chunk_kv: the K/V part of it (memory_cost.h).
  DiskKvTier(const Geometry& g, MemoryBudget* budget, uint64_t chunk_charge, uint64_t chunk_kv,
             std::shared_ptr<ChunkFile> file, const HostAllocator& allocator = HostAllocator{});

  int64_t tokens() const override { return tokens_; }
  size_t row_bytes() const override { return row_bytes_; }
  int32_t head_dim() const override { return g_.head_dim; }
  int32_t dtype() const override { return g_.dtype; }
  uint64_t bytes_held() const override;
  uint64_t bytes_charged() const override;
  int64_t shared_chunks() const override;
  size_t chunk_count() const override { return chunks_.size(); }
  // Chunks whose rows are in memory.
  int64_t chunks_in_memory() const { return in_memory_; }

  void open(int64_t count) override;
  bool open_copies_last_chunk() const override;
  bool copy_in(int64_t first, const pq_tensor& keys, const pq_tensor& values,
               ThreadPool* pool) override;
  void expect(int64_t count) override;
  void truncate(int64_t tokens) noexcept override;
  void truncate_under_readers(int64_t tokens) noexcept override;
  int64_t fork_from(const KvTier& parent) override;

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

  // One chunk's K and V blocks in memory.
  struct Rows {
    Rows(const HostAllocator& allocator, size_t block_bytes)
        : keys(allocator, block_bytes), values(allocator, block_bytes) {}
    HostBlock keys, values;
  };
  // Where one chunk's rows are: in memory, in the file, or both null for a
  // restore's chunk whose rows have not come yet.
  struct Source {
    std::shared_ptr<const Rows> rows;
    std::shared_ptr<const DiskSlot> slot;
  };

 private:
  struct Chunk {
    std::shared_ptr<Rows> rows;
    std::shared_ptr<const DiskSlot> slot;
    Reservation state_charge;  // always: what grows with its tokens elsewhere
    Reservation rows_charge;   // while in memory for good
    std::atomic<bool> shared{false};
  };

  size_t block_bytes() const { return static_cast<size_t>(kChunkTokens) * g_.heads * row_bytes_; }
  uint64_t state_part() const { return chunk_charge_ - chunk_kv_; }
  // Whether chunk c stays in memory in a tier of `tokens` tokens.
  bool stays(int64_t c, int64_t tokens) const;
  void check_room(int64_t count) const;
  // A chunk of its own holding the first `rows` rows of `from`.
  std::shared_ptr<Chunk> copy_chunk(const Chunk& from, int64_t rows, Reservation charge) const;
  // Writes chunk c to the file and frees its rows; on a failure (thrown)
  // the chunk keeps its rows.
  void write_out(size_t c);
  // Writes out every full chunk that no longer stays (not shared).
  void write_out_leavers();
  Source source(size_t c) const { return {chunks_[c]->rows, chunks_[c]->slot}; }
  // Adds (sign 1) or takes away (-1) what chunk c counts in in_memory_ and
  // kept_; every change of the chunk list or of a chunk's rows or charge
  // goes through it, so that the sizes an append publishes cost no walk.
  void tally(const Chunk& c, int64_t sign) {
    in_memory_ += sign * (c.rows != nullptr ? 1 : 0);
    kept_ += sign * (c.rows_charge.bytes() > 0 ? 1 : 0);
  }
  void recount();
  // c -> (rows in memory, slot in the file) of chunk c, for the reads.
  auto chunk_at() const;
  // fn(rows, index of the first, count) for each run of rows [first, end)
  // of one head within a chunk, read from memory or the file.
  void for_each_range_run(bool keys, int32_t head, int64_t first, int64_t end,
                          const std::function<void(const uint8_t*, int64_t, int64_t)>& fn) const;

  Geometry g_;
  size_t element_size_, row_bytes_;
  MemoryBudget* budget_;
  uint64_t chunk_charge_, chunk_kv_;
  std::shared_ptr<ChunkFile> file_;
  HostAllocator allocator_;
  int64_t tokens_ = 0;
  std::vector<std::shared_ptr<Chunk>> chunks_;
  size_t leavers_from_ = 0;  // chunks below it were written out or stay
  int64_t in_memory_ = 0;    // chunks whose rows are in memory
  int64_t kept_ = 0;         // chunks charged for their rows (kept in memory)
};

}  // namespace pq
