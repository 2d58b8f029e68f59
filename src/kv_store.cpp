#include "kv_store.h"

#include <cstring>
#include <new>
#include <string>

#include "dtype.h"
#include "error.h"
#include "tensor.h"

namespace pq {

KvStore::Chunk::Chunk(size_t bytes_per_tensor, Reservation c) : charge(std::move(c)) {
  try {
    keys.reset(new uint8_t[bytes_per_tensor]);
    values.reset(new uint8_t[bytes_per_tensor]);
  } catch (const std::bad_alloc&) {
    fail(PQ_ERR_OUT_OF_MEMORY,
         "allocating " + std::to_string(2 * bytes_per_tensor) + " bytes of K/V failed");
  }
}

KvStore::KvStore(int32_t heads, int32_t head_dim, int32_t dtype, MemoryBudget* budget,
                 uint64_t chunk_charge)
    : heads_(heads),
      head_dim_(head_dim),
      dtype_(dtype),
      element_size_(dtype_size(dtype)),
      budget_(budget),
      chunk_charge_(chunk_charge) {}

const uint8_t* KvStore::row(bool key, int64_t token, int32_t head) const {
  const Chunk& c = *chunks_[static_cast<size_t>(token / kChunkTokens)];
  int64_t in_chunk = token % kChunkTokens;
  const uint8_t* base = key ? c.keys.get() : c.values.get();
  return base + (static_cast<size_t>(head) * kChunkTokens + in_chunk) * row_bytes();
}

void KvStore::append(const pq_tensor& keys, const pq_tensor& values) {
  int64_t count = keys.tokens;
  if (count <= 0) return;
  if (tokens_ + count > INT32_MAX)
    fail(PQ_ERR_INVALID_ARGUMENT, "a sequence holds at most 2147483647 tokens per layer; " +
                                      std::to_string(tokens_) + " stored, " +
                                      std::to_string(count) + " more given");
  size_t needed = static_cast<size_t>((tokens_ + count + kChunkTokens - 1) / kChunkTokens);
  const size_t opening = needed > chunks_.size() ? needed - chunks_.size() : 0;
  // The whole charge at once, then every new chunk, so that a failure
  // leaves the store (and the budget) as they were.
  Reservation charge;
  if (opening > 0)
    charge = budget_->reserve(
        opening * chunk_charge_,
        "storing " + std::to_string(count) + " more tokens (" + std::to_string(opening) +
            " new chunks)",
        "; K/V and the state that grows with them are counted in whole 256-token chunks of " +
            std::to_string(chunk_charge_) + " bytes per layer");
  std::vector<std::shared_ptr<Chunk>> fresh;
  fresh.reserve(opening);
  while (fresh.size() < opening)
    fresh.push_back(std::make_shared<Chunk>(tensor_bytes_per_chunk(), charge.split(chunk_charge_)));
  chunks_.reserve(needed);
  for (auto& c : fresh) chunks_.push_back(std::move(c));

  size_t rb = row_bytes();
  for (int64_t t = 0; t < count; ++t) {
    int64_t pos = tokens_ + t;
    Chunk& c = *chunks_[static_cast<size_t>(pos / kChunkTokens)];
    int64_t in_chunk = pos % kChunkTokens;
    for (int32_t h = 0; h < heads_; ++h) {
      size_t offset = (static_cast<size_t>(h) * kChunkTokens + in_chunk) * rb;
      std::memcpy(c.keys.get() + offset, tensor_row(keys, t, h, element_size_), rb);
      std::memcpy(c.values.get() + offset, tensor_row(values, t, h, element_size_), rb);
    }
  }
  tokens_ += count;
}

void KvStore::truncate(int64_t tokens) noexcept {
  if (tokens >= tokens_) return;
  chunks_.resize(static_cast<size_t>((tokens + kChunkTokens - 1) / kChunkTokens));
  tokens_ = tokens;
}

KvStore::Snapshot KvStore::snapshot() const {
  Snapshot s;
  s.chunks.assign(chunks_.begin(), chunks_.end());
  s.tokens = tokens_;
  s.heads = heads_;
  s.head_dim = head_dim_;
  s.element_size = element_size_;
  return s;
}

const uint8_t* KvStore::Snapshot::key_row(int64_t token, int32_t head) const {
  const Chunk& c = *chunks[static_cast<size_t>(token / kChunkTokens)];
  int64_t in_chunk = token % kChunkTokens;
  size_t rb = static_cast<size_t>(head_dim) * element_size;
  return c.keys.get() + (static_cast<size_t>(head) * kChunkTokens + in_chunk) * rb;
}

}  // namespace pq
