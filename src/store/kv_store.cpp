#include "store/kv_store.h"

#include <cstring>
#include <new>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "base/tensor.h"

namespace pq {

KvStore::Chunk::Chunk(const HostAllocator& allocator, size_t bytes_per_tensor, Reservation c)
    : keys(allocator, bytes_per_tensor), values(allocator, bytes_per_tensor), charge(std::move(c)) {}

KvStore::KvStore(int32_t heads, int32_t head_dim, int32_t dtype, MemoryBudget* budget,
                 uint64_t chunk_charge, const HostAllocator& allocator)
    : heads_(heads),
      head_dim_(head_dim),
      dtype_(dtype),
      element_size_(dtype_size(dtype)),
      budget_(budget),
      chunk_charge_(chunk_charge),
      allocator_(allocator) {
  table_.row_bytes = row_bytes();
  table_.head_bytes = static_cast<size_t>(kChunkTokens) * row_bytes();
  table_.head_dim = head_dim_;
  table_.dtype = dtype_;
}

const uint8_t* KvStore::row(bool key, int64_t token, int32_t head) const {
  const Chunk& c = *chunks_[static_cast<size_t>(token / kChunkTokens)];
  int64_t in_chunk = token % kChunkTokens;
  const uint8_t* base = key ? c.keys.get() : c.values.get();
  return base + (static_cast<size_t>(head) * kChunkTokens + in_chunk) * row_bytes();
}

void KvStore::reserve_table(size_t chunks) {
  table_.keys.reserve(chunks);
  table_.values.reserve(chunks);
}

void KvStore::sync_table() noexcept {
  // Never allocates: every caller reserved room for the chunks first.
  table_.keys.resize(chunks_.size());
  table_.values.resize(chunks_.size());
  for (size_t c = 0; c < chunks_.size(); ++c) {
    table_.keys[c] = chunks_[c]->keys.get();
    table_.values[c] = chunks_[c]->values.get();
  }
}

void KvStore::check_room(int64_t count) const {
  if (tokens_ + count > INT32_MAX)
    fail(PQ_ERR_INVALID_ARGUMENT, "a sequence holds at most 2147483647 tokens per layer; " +
                                      std::to_string(tokens_) + " stored, " +
                                      std::to_string(count) + " more given");
}

void KvStore::expect(int64_t count) {
  if (count <= 0) return;
  if (tokens_ != 0 || !chunks_.empty() || expected_charge_.bytes() != 0)
    fail(PQ_ERR_INTERNAL, "K/V can be expected only in an empty store");
  check_room(count);
  const uint64_t chunks = static_cast<uint64_t>((count + kChunkTokens - 1) / kChunkTokens);
  expected_charge_ = budget_->reserve(
      chunks * chunk_charge_,
      "restoring " + std::to_string(count) + " tokens (" + std::to_string(chunks) + " chunks)",
      "; K/V and the state that grows with them are counted in whole 256-token chunks of " +
          std::to_string(chunk_charge_) + " bytes per layer");
  tokens_ = count;
}

void KvStore::materialize(int64_t end) {
  const size_t needed = static_cast<size_t>((end + kChunkTokens - 1) / kChunkTokens);
  if (chunks_.size() >= needed) return;
  chunks_.reserve(needed);
  reserve_table(needed);  // first, so that keeping it in step cannot fail
  while (chunks_.size() < needed) {  // a failure keeps the chunks made so far, and their charge
    auto chunk = std::make_shared<Chunk>(allocator_, tensor_bytes_per_chunk(), Reservation{});
    chunk->charge = expected_charge_.split(chunk_charge_);
    table_.keys.push_back(chunk->keys.get());
    table_.values.push_back(chunk->values.get());
    chunks_.push_back(std::move(chunk));
  }
}

void KvStore::open(int64_t count) {
  if (count <= 0) return;
  if (expected_charge_.bytes() != 0)
    fail(PQ_ERR_INTERNAL, "the store still awaits the K/V of a restore");
  check_room(count);
  size_t needed = static_cast<size_t>((tokens_ + count + kChunkTokens - 1) / kChunkTokens);
  const size_t opening = needed > chunks_.size() ? needed - chunks_.size() : 0;
  // The partial last chunk, if another store shares it, is written into a
  // copy (copy-on-write).
  const int64_t partial_rows = tokens_ % kChunkTokens;
  const bool copy_last = partial_rows > 0 && chunks_.back()->shared.load();
  const size_t charged = opening + (copy_last ? 1 : 0);
  // The whole charge at once, then every new chunk, so that a failure
  // leaves the store (and the budget) as they were.
  Reservation charge;
  if (charged > 0)
    charge = budget_->reserve(
        charged * chunk_charge_,
        "storing " + std::to_string(count) + " more tokens (" + std::to_string(charged) +
            " new chunks" + (copy_last ? ", one a copy of a chunk shared with a fork" : "") + ")",
        "; K/V and the state that grows with them are counted in whole 256-token chunks of " +
            std::to_string(chunk_charge_) + " bytes per layer");
  std::shared_ptr<Chunk> last_copy;
  if (copy_last) last_copy = copy_chunk(*chunks_.back(), partial_rows, charge.split(chunk_charge_));
  std::vector<std::shared_ptr<Chunk>> fresh;
  fresh.reserve(opening);
  while (fresh.size() < opening)
    fresh.push_back(std::make_shared<Chunk>(allocator_, tensor_bytes_per_chunk(), charge.split(chunk_charge_)));
  chunks_.reserve(needed);
  reserve_table(needed);
  if (last_copy) chunks_.back() = std::move(last_copy);
  for (auto& c : fresh) chunks_.push_back(std::move(c));
  if (charged > 0) sync_table();
  tokens_ += count;
}

bool KvStore::copy_in(int64_t first, const pq_tensor& keys, const pq_tensor& values,
                      ThreadPool* pool) {
  const int64_t count = keys.tokens;
  materialize(first + count);
  // Copy and finiteness check in one pass over the source, token ranges in
  // parallel for a large copy (chunk-aligned, so no two workers share a
  // destination row block).
  const int64_t elements = head_dim_;
  auto copy_range = [&](int64_t t0, int64_t t1) {
    bool finite = true;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t pos = first + t;
      Chunk& c = *chunks_[static_cast<size_t>(pos / kChunkTokens)];
      const int64_t in_chunk = pos % kChunkTokens;
      for (int32_t h = 0; h < heads_; ++h) {
        const size_t offset = (static_cast<size_t>(h) * kChunkTokens + in_chunk) * row_bytes();
        finite &= copy_if_finite(c.keys.get() + offset, tensor_row(keys, t, h, element_size_),
                                 elements, dtype_);
        finite &= copy_if_finite(c.values.get() + offset, tensor_row(values, t, h, element_size_),
                                 elements, dtype_);
      }
    }
    return finite;
  };
  const uint64_t bytes = 2 * static_cast<uint64_t>(count) * heads_ * row_bytes();
  if (pool != nullptr && pool->size() > 1 && bytes >= (uint64_t{4} << 20)) {
    // Ranges end on chunk boundaries of the store.
    std::vector<int64_t> bounds{0};
    for (int64_t t = kChunkTokens - first % kChunkTokens; t < count; t += kChunkTokens * 4)
      bounds.push_back(t);
    bounds.push_back(count);
    std::vector<uint8_t> ok(bounds.size() - 1, 1);
    pool->parallel_for(static_cast<int64_t>(ok.size()), [&](int64_t i) {
      ok[static_cast<size_t>(i)] = copy_range(bounds[static_cast<size_t>(i)],
                                              bounds[static_cast<size_t>(i) + 1]);
    });
    bool finite = true;
    for (uint8_t o : ok) finite &= o != 0;
    return finite;
  }
  return copy_range(0, count);
}

void KvStore::truncate(int64_t tokens) noexcept {
  if (tokens >= tokens_) return;
  chunks_.resize(static_cast<size_t>((tokens + kChunkTokens - 1) / kChunkTokens));
  table_.keys.resize(chunks_.size());  // shrinking: no allocation
  table_.values.resize(chunks_.size());
  tokens_ = tokens;
}

std::shared_ptr<KvStore::Chunk> KvStore::copy_chunk(const Chunk& from, int64_t rows,
                                                    Reservation charge) const {
  auto copy = std::make_shared<Chunk>(allocator_, tensor_bytes_per_chunk(), std::move(charge));
  const size_t head_bytes = static_cast<size_t>(kChunkTokens) * row_bytes();
  const size_t used = static_cast<size_t>(rows) * row_bytes();
  for (int32_t h = 0; h < heads_; ++h) {
    std::memcpy(copy->keys.get() + h * head_bytes, from.keys.get() + h * head_bytes, used);
    std::memcpy(copy->values.get() + h * head_bytes, from.values.get() + h * head_bytes, used);
  }
  return copy;
}

int64_t KvStore::fork_from(const KvStore& parent) {
  const size_t full = static_cast<size_t>(parent.tokens_ / kChunkTokens);
  const int64_t partial_rows = parent.tokens_ % kChunkTokens;
  std::shared_ptr<Chunk> last;
  if (partial_rows > 0)
    last = copy_chunk(*parent.chunks_[full], partial_rows,
                      budget_->reserve(chunk_charge_, "forking (a copy of the partial last chunk)",
                                       "; each layer of a fork copies its partial last chunk of "
                                       "256 tokens and shares the full ones"));
  std::vector<std::shared_ptr<Chunk>> chunks(parent.chunks_.begin(),
                                             parent.chunks_.begin() + full);
  if (last) chunks.push_back(std::move(last));
  reserve_table(chunks.size());
  for (size_t i = 0; i < full; ++i) chunks[i]->shared.store(true);
  chunks_ = std::move(chunks);
  sync_table();
  tokens_ = parent.tokens_;
  return static_cast<int64_t>(full);
}

int64_t KvStore::fork_from(const KvTier& parent) {
  const KvStore* host = parent.host_store();
  if (host == nullptr) fail(PQ_ERR_INTERNAL, "a host store forks only from a host store");
  return fork_from(*host);
}

int64_t KvStore::shared_chunks() const {
  int64_t n = 0;
  for (const auto& c : chunks_) n += c->shared.load() ? 1 : 0;
  return n;
}

void KvStore::truncate_under_readers(int64_t tokens) noexcept {
  truncate(tokens);
  if (tokens_ % kChunkTokens != 0) chunks_.back()->shared.store(true);
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
