// The residency seam: where one (sequence, layer)'s K/V rows live, behind
// one interface. The layer, the index build and the selectors see only
// this; what holds the rows (host memory: KvStore; a file on local disk:
// DiskKvTier; later an engine's paged pool) is the tier's business. Only
// src/store/ and a backend's device fetch code touch raw row pointers
// (through host_store(), for tiers whose rows are in host memory).
//
// Every tier keeps tokens in chunks of kChunkTokens, each chunk's keys and
// values laid out [head][token in chunk][dim], so that chunk-granular
// charges (memory_cost.h), forks that share whole chunks and the codes'
// capacity agree across tiers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "pqcache.h"
#include "store/row_table.h"

namespace pq {

class KvStore;
class ThreadPool;

// A read-only view of a tier's first tokens (an index build's input),
// valid while held, whatever the tier does meanwhile (append, truncate).
class KeySnapshot {
 public:
  virtual ~KeySnapshot() = default;
  // Keys of rows[i] of kv head `head` as float, head_dim each. Throws
  // (PQ_ERR_IO) when a tier cannot read them.
  virtual void keys_as_float(int32_t head, const int64_t* rows, int64_t count,
                             float* out) const = 0;
  virtual int64_t tokens() const = 0;
};

// Where a selection's rows are read from by the attention kernels: a row
// table and the positions to look up in it. For a tier whose rows are in
// host memory, its own table and the caller's positions; otherwise rows
// read into `staging` and positions 0..count-1.
struct RowStaging {
  std::vector<uint8_t> keys, values;
  std::vector<int32_t> positions;
  RowTable table;
};
struct SelectedRows {
  const RowTable* table;
  const int32_t* positions;
};

class KvTier {
 public:
  static constexpr int64_t kChunkTokens = RowTable::kChunkTokens;
  static constexpr int kChunkShift = RowTable::kChunkShift;

  virtual ~KvTier() = default;

  virtual int64_t tokens() const = 0;
  virtual size_t row_bytes() const = 0;
  virtual int32_t head_dim() const = 0;
  virtual int32_t dtype() const = 0;
  // Host memory the tier's rows hold now, and what it holds against the
  // memory limit (its rows in memory and the state charged per chunk).
  virtual uint64_t bytes_held() const = 0;
  virtual uint64_t bytes_charged() const = 0;
  // Chunks this tier holds that another tier may hold too (a fork's).
  virtual int64_t shared_chunks() const = 0;
  virtual size_t chunk_count() const = 0;

  // --- Writing (the caller holds the layer; see KvStore for each one) ---
  // keys.tokens more tokens from host tensors (already validated), every
  // value checked finite: open() then copy_in(), all or nothing (on an error
  // nothing is appended and nothing is held). kv_tier.cpp.
  void append(const pq_tensor& keys, const pq_tensor& values, ThreadPool* pool = nullptr);
  virtual void open(int64_t count) = 0;
  virtual bool open_copies_last_chunk() const = 0;
  virtual bool copy_in(int64_t first, const pq_tensor& keys, const pq_tensor& values,
                       ThreadPool* pool) = 0;
  virtual void expect(int64_t count) = 0;
  virtual void truncate(int64_t tokens) noexcept = 0;
  virtual void truncate_under_readers(int64_t tokens) noexcept = 0;
  // Makes this empty tier hold `parent`'s tokens (a tier of the same kind),
  // sharing what it can. All or nothing. Returns the chunks shared.
  virtual int64_t fork_from(const KvTier& parent) = 0;

  // --- Reading rows by selection ---
  // The first `tokens` tokens, for a build that runs while the caller
  // appends (tokens <= this->tokens()).
  virtual std::shared_ptr<const KeySnapshot> snapshot(int64_t tokens) const = 0;
  // Keys of kv head `head` as float, head_dim each: tokens first + i, or
  // positions[i] (int32 or int64), or only dimensions cols[0..ncols) of
  // tokens first + i (SparQ). Throw PQ_ERR_IO when a tier cannot read.
  virtual void keys_as_float(int32_t head, int64_t first, int64_t count, float* out) const = 0;
  virtual void keys_as_float(int32_t head, const int32_t* positions, int64_t count,
                             float* out) const = 0;
  virtual void keys_as_float(int32_t head, const int64_t* rows, int64_t count,
                             float* out) const = 0;
  virtual void key_columns_as_float(int32_t head, int64_t first, int64_t count,
                                    const int32_t* cols, int32_t ncols, float* out) const = 0;
  // K and V rows of positions[0..count) of kv head `head`, row i to
  // keys + i * key_stride and values + i * value_stride.
  virtual void gather(int32_t head, const int32_t* positions, int64_t count, uint8_t* keys,
                      size_t key_stride, uint8_t* values, size_t value_stride) const = 0;
  // The rows the attention kernels read for positions[0..count) of `head`.
  // Safe to call from several threads at once, each with its own staging.
  virtual SelectedRows select_rows(int32_t head, const int32_t* positions, int64_t count,
                                   RowStaging& staging) const = 0;
  // Rows [first, end) of kv head `head` (keys, or values) in token order,
  // as runs: fn(rows, count) for each (a state file's payload).
  virtual void for_each_run(bool keys, int32_t head, int64_t first, int64_t end,
                            const std::function<void(const uint8_t*, int64_t)>& fn) const = 0;

  // --- Index only (PQ_KV_TIER_CALLER) ---
  // Whether the tier keeps values (an index-only tier keeps keys only, and
  // those only until they are coded).
  virtual bool keeps_values() const { return true; }
  // Lets go of the keys of whole chunks below `coded` (their codes stand
  // for them from now on); tiers that keep every row ignore it.
  virtual void drop_coded_keys(int64_t /*coded*/) {}
  // Whether some key was let go: nothing can be rebuilt over every key.
  virtual bool dropped_keys() const { return false; }

  // fp8 scales of this layer, [2][heads] (K then V, owned by the context),
  // or null: every scale 1. The reads as float above apply the key scales;
  // gather() and select_rows() hand out the stored bytes.
  void set_scales(const float* scales, int32_t heads) {
    key_scales_ = scales;
    value_scales_ = scales != nullptr ? scales + heads : nullptr;
  }
  float key_scale(int32_t head) const { return key_scales_ ? key_scales_[head] : 1.f; }
  float value_scale(int32_t head) const { return value_scales_ ? value_scales_[head] : 1.f; }
  const float* key_scales() const { return key_scales_; }

  // The host store when this tier's rows are all in host memory (the
  // backends' device code reads and writes rows through it), else null.
  virtual const KvStore* host_store() const { return nullptr; }
  KvStore* host_store() {
    return const_cast<KvStore*>(static_cast<const KvTier*>(this)->host_store());
  }

 private:
  const float* key_scales_ = nullptr;
  const float* value_scales_ = nullptr;
};

}  // namespace pq
