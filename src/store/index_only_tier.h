// The index-only tier (PQ_KV_TIER_CALLER): a serving engine keeps K/V in
// its own pool, and a layer keeps only what its index needs: the keys of
// tokens not coded yet, in chunks of kChunkTokens like the other tiers, and
// no values at all. Once the layer has begun to select, the keys of whole
// chunks that are coded are let go (drop_coded_keys): from then on the
// index's codes stand for them, and nothing can be rebuilt over them.
//
// The memory limit counts, per chunk, the state that grows with its tokens
// elsewhere (codes, selector state: the host charge less its K/V) and, while
// the chunk's keys are held, the keys (half the host tier's K/V charge).
// A build's snapshot holds the chunks it reads until it ends, after the
// tier let go of them: working memory of the build, as its K-Means sample.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/hooks.h"
#include "store/kv_tier.h"
#include "store/memory_budget.h"

namespace pq {

class IndexOnlyTier final : public KvTier {
 public:
  struct Geometry {
    int32_t heads, head_dim, dtype;
  };
  // chunk_charge: what a chunk is charged in the host tier (K/V and
  // state); chunk_kv: the K/V part of it (memory_cost.h).
  IndexOnlyTier(const Geometry& g, MemoryBudget* budget, uint64_t chunk_charge, uint64_t chunk_kv);

  int64_t tokens() const override { return tokens_; }
  size_t row_bytes() const override { return row_bytes_; }
  int32_t head_dim() const override { return g_.head_dim; }
  int32_t dtype() const override { return g_.dtype; }
  uint64_t bytes_held() const override { return held_ * block_bytes(); }
  uint64_t bytes_charged() const override {
    return chunks_.size() * state_part() + static_cast<uint64_t>(held_) * key_part();
  }
  int64_t shared_chunks() const override;
  size_t chunk_count() const override { return chunks_.size(); }

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
  // Values and column reads: no selector an index-only context serves asks.
  void key_columns_as_float(int32_t head, int64_t first, int64_t count, const int32_t* cols,
                            int32_t ncols, float* out) const override;
  void gather(int32_t head, const int32_t* positions, int64_t count, uint8_t* keys,
              size_t key_stride, uint8_t* values, size_t value_stride) const override;
  SelectedRows select_rows(int32_t head, const int32_t* positions, int64_t count,
                           RowStaging& staging) const override;
  void for_each_run(bool keys, int32_t head, int64_t first, int64_t end,
                    const std::function<void(const uint8_t*, int64_t)>& fn) const override;

  bool keeps_values() const override { return false; }
  void drop_coded_keys(int64_t coded) override;
  bool dropped_keys() const override { return dropping_; }

  // One chunk's keys, [head][token in chunk][dim].
  struct Keys {
    explicit Keys(size_t bytes) : block(HostAllocator{}, bytes) {}
    HostBlock block;
  };

 private:
  // Shared by a fork's tier (full chunks), with their charges.
  struct Chunk {
    std::shared_ptr<const Keys> keys;  // null once let go
    Reservation state_charge;          // always
    Reservation keys_charge;           // while the keys are held
    // Another tier, or a build's snapshot taken before a truncate, may read
    // it: never written again (an append copies it) nor let go.
    std::atomic<bool> shared{false};
  };

  size_t block_bytes() const { return static_cast<size_t>(kChunkTokens) * g_.heads * row_bytes_; }
  uint64_t state_part() const { return chunk_charge_ - chunk_kv_; }
  uint64_t key_part() const { return chunk_kv_ / 2; }
  // The key row of token `row` of `head`; PQ_ERR_INTERNAL for a key let go.
  const uint8_t* key_row(int32_t head, int64_t row) const;
  void recount();

  Geometry g_;
  size_t element_size_, row_bytes_;
  MemoryBudget* budget_;
  uint64_t chunk_charge_, chunk_kv_;
  int64_t tokens_ = 0;
  std::vector<std::shared_ptr<Chunk>> chunks_;
  int64_t held_ = 0;       // chunks whose keys are held
  int64_t kept_from_ = 0;  // keys of tokens below it may be gone
  bool dropping_ = false;  // from the first drop_coded_keys on
};

}  // namespace pq
