// The index-only tier (index_only_tier.h): keys until coded, no values.
#include "store/index_only_tier.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "base/tensor.h"

namespace pq {

namespace {

using Keys = IndexOnlyTier::Keys;

// The chunks a build reads, held until it ends.
class IndexOnlySnapshot final : public KeySnapshot {
 public:
  IndexOnlySnapshot(std::vector<std::shared_ptr<const Keys>> chunks, int64_t tokens,
                    int32_t head_dim, int32_t dtype, size_t row_bytes, const float* key_scales)
      : chunks_(std::move(chunks)),
        tokens_(tokens),
        head_dim_(head_dim),
        dtype_(dtype),
        row_bytes_(row_bytes),
        key_scales_(key_scales) {}
  void keys_as_float(int32_t head, const int64_t* rows, int64_t count, float* out) const override {
    const float scale = key_scales_ != nullptr ? key_scales_[head] : 1.f;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = rows[i];
      const Keys& keys = *chunks_[static_cast<size_t>(row >> KvTier::kChunkShift)];
      const size_t offset =
          (static_cast<size_t>(head) * KvTier::kChunkTokens + (row & (KvTier::kChunkTokens - 1))) *
          row_bytes_;
      to_float(keys.block.get() + offset, dtype_, head_dim_, out + i * head_dim_, scale);
    }
  }
  int64_t tokens() const override { return tokens_; }

 private:
  std::vector<std::shared_ptr<const Keys>> chunks_;
  int64_t tokens_;
  int32_t head_dim_, dtype_;
  size_t row_bytes_;
  const float* key_scales_;  // the context's, which outlives its builds
};

[[noreturn]] void no_values(const char* what) {
  fail(PQ_ERR_UNSUPPORTED, std::string(what) +
                               ": an index-only layer (PQ_KV_TIER_CALLER) keeps no values and "
                               "no coded keys; read them from your own pool");
}

}  // namespace

IndexOnlyTier::IndexOnlyTier(const Geometry& g, MemoryBudget* budget, uint64_t chunk_charge,
                             uint64_t chunk_kv)
    : g_(g),
      element_size_(dtype_size(g.dtype)),
      row_bytes_(static_cast<size_t>(g.head_dim) * element_size_),
      budget_(budget),
      chunk_charge_(chunk_charge),
      chunk_kv_(std::min(chunk_kv, chunk_charge)) {}

int64_t IndexOnlyTier::shared_chunks() const {
  int64_t n = 0;
  for (const auto& c : chunks_) n += c->shared.load() ? 1 : 0;
  return n;
}

void IndexOnlyTier::recount() {
  held_ = 0;
  for (const auto& c : chunks_) held_ += c->keys != nullptr ? 1 : 0;
}

bool IndexOnlyTier::open_copies_last_chunk() const {
  return tokens_ % kChunkTokens > 0 &&
         (chunks_.back()->shared.load() || chunks_.back()->keys == nullptr);
}

void IndexOnlyTier::open(int64_t count) {
  if (count <= 0) return;
  if (tokens_ + count > INT32_MAX)
    fail(PQ_ERR_INVALID_ARGUMENT, "a sequence holds at most 2147483647 tokens per layer; " +
                                      std::to_string(tokens_) + " stored, " +
                                      std::to_string(count) + " more given");
  const int64_t end = tokens_ + count;
  const size_t needed = static_cast<size_t>((end + kChunkTokens - 1) / kChunkTokens);
  const size_t opening = needed > chunks_.size() ? needed - chunks_.size() : 0;
  const bool copy_last = open_copies_last_chunk();
  // A copied last chunk is charged in full: the chunk it replaces keeps its
  // own charge while a fork or a snapshot holds it.
  const uint64_t bytes = (opening + (copy_last ? 1 : 0)) * (state_part() + key_part());
  Reservation charge;
  if (bytes > 0)
    charge = budget_->reserve(
        bytes,
        "keeping the keys of " + std::to_string(count) + " more tokens (index only; " +
            std::to_string(opening) + " new chunks)",
        "; per 256-token chunk an index-only layer counts " + std::to_string(state_part()) +
            " bytes of codes and state, and " + std::to_string(key_part()) +
            " of keys until they are coded");
  // Everything that can fail, before anything changes.
  std::shared_ptr<Chunk> last_copy;
  if (copy_last) {
    const Chunk& from = *chunks_.back();
    auto keys = std::make_shared<Keys>(block_bytes());
    if (from.keys != nullptr) {  // shared: its rows so far (a dropped chunk's rows are coded)
      const size_t head_bytes = static_cast<size_t>(kChunkTokens) * row_bytes_;
      const size_t used = static_cast<size_t>(tokens_ % kChunkTokens) * row_bytes_;
      for (int32_t h = 0; h < g_.heads; ++h)
        std::memcpy(keys->block.get() + h * head_bytes, from.keys->block.get() + h * head_bytes,
                    used);
    }
    last_copy = std::make_shared<Chunk>();
    last_copy->keys = std::move(keys);
    last_copy->state_charge = charge.split(state_part());
    last_copy->keys_charge = charge.split(key_part());
  }
  std::vector<std::shared_ptr<Chunk>> fresh(opening);
  for (auto& chunk : fresh) {
    chunk = std::make_shared<Chunk>();
    chunk->keys = std::make_shared<Keys>(block_bytes());
    chunk->state_charge = charge.split(state_part());
    chunk->keys_charge = charge.split(key_part());
  }
  chunks_.reserve(needed);
  if (last_copy) {
    held_ -= chunks_.back()->keys != nullptr ? 1 : 0;
    chunks_.back() = std::move(last_copy);
    ++held_;
  }
  for (auto& c : fresh) chunks_.push_back(std::move(c));
  held_ += static_cast<int64_t>(opening);
  tokens_ = end;
}

void IndexOnlyTier::expect(int64_t) {
  fail(PQ_ERR_UNSUPPORTED,
       "an index-only layer (PQ_KV_TIER_CALLER) is not restored from saved K/V in this version");
}

bool IndexOnlyTier::copy_in(int64_t first, const pq_tensor& keys, const pq_tensor&, ThreadPool*) {
  const size_t head_bytes = static_cast<size_t>(kChunkTokens) * row_bytes_;
  for (int64_t t = 0; t < keys.tokens; ++t) {
    const int64_t pos = first + t;
    // open() made the chunk and its keys: written by this tier only.
    uint8_t* block = const_cast<uint8_t*>(
        chunks_[static_cast<size_t>(pos >> kChunkShift)]->keys->block.get());
    for (int32_t h = 0; h < g_.heads; ++h)
      if (!copy_if_finite(block + h * head_bytes +
                              static_cast<size_t>(pos & (kChunkTokens - 1)) * row_bytes_,
                          tensor_row(keys, t, h, element_size_), g_.head_dim, g_.dtype))
        return false;
  }
  return true;
}

void IndexOnlyTier::truncate(int64_t tokens) noexcept {
  if (tokens >= tokens_) return;
  const size_t keep = static_cast<size_t>((tokens + kChunkTokens - 1) / kChunkTokens);
  chunks_.resize(keep);
  tokens_ = tokens;
  kept_from_ = std::min(kept_from_, tokens);
  recount();
}

void IndexOnlyTier::truncate_under_readers(int64_t tokens) noexcept {
  truncate(tokens);
  if (tokens_ % kChunkTokens != 0) chunks_.back()->shared.store(true);
}

int64_t IndexOnlyTier::fork_from(const KvTier& parent_tier) {
  const auto* parent = dynamic_cast<const IndexOnlyTier*>(&parent_tier);
  if (parent == nullptr) fail(PQ_ERR_INTERNAL, "an index-only tier forks only from its kind");
  // Every chunk is shared, the partial last one too: the first append of
  // either copies it (open_copies_last_chunk).
  chunks_ = parent->chunks_;
  for (auto& c : chunks_) c->shared.store(true);
  tokens_ = parent->tokens_;
  kept_from_ = parent->kept_from_;
  dropping_ = parent->dropping_;
  recount();
  return static_cast<int64_t>(tokens_ / kChunkTokens);
}

void IndexOnlyTier::drop_coded_keys(int64_t coded) {
  dropping_ = true;
  const int64_t full = std::min(coded, tokens_) / kChunkTokens;  // chunks wholly coded
  for (int64_t c = kept_from_ / kChunkTokens; c < full; ++c) {
    Chunk& chunk = *chunks_[static_cast<size_t>(c)];
    if (chunk.shared.load() || chunk.keys == nullptr) continue;  // a fork may still read it
    chunk.keys.reset();
    chunk.keys_charge = Reservation{};
    --held_;
  }
  kept_from_ = std::max(kept_from_, full * kChunkTokens);
}

const uint8_t* IndexOnlyTier::key_row(int32_t head, int64_t row) const {
  const Chunk& chunk = *chunks_[static_cast<size_t>(row >> kChunkShift)];
  if (chunk.keys == nullptr)
    fail(PQ_ERR_INTERNAL, "the key of token " + std::to_string(row) +
                              " was let go once coded (index-only layer); nothing may read it");
  return chunk.keys->block.get() +
         (static_cast<size_t>(head) * kChunkTokens + (row & (kChunkTokens - 1))) * row_bytes_;
}

std::shared_ptr<const KeySnapshot> IndexOnlyTier::snapshot(int64_t tokens) const {
  const size_t n = static_cast<size_t>((tokens + kChunkTokens - 1) / kChunkTokens);
  std::vector<std::shared_ptr<const Keys>> chunks(n);
  for (size_t c = 0; c < n; ++c) {
    chunks[c] = chunks_[c]->keys;
    if (chunks[c] == nullptr)
      fail(PQ_ERR_INTERNAL, "an index build over " + std::to_string(tokens) +
                                " tokens needs keys an index-only layer let go once coded");
  }
  return std::make_shared<IndexOnlySnapshot>(std::move(chunks), tokens, g_.head_dim, g_.dtype,
                                             row_bytes_, key_scales());
}

void IndexOnlyTier::keys_as_float(int32_t head, int64_t first, int64_t count, float* out) const {
  for (int64_t i = 0; i < count; ++i)
    to_float(key_row(head, first + i), g_.dtype, g_.head_dim, out + i * g_.head_dim, key_scale(head));
}

void IndexOnlyTier::keys_as_float(int32_t head, const int32_t* positions, int64_t count,
                                  float* out) const {
  for (int64_t i = 0; i < count; ++i)
    to_float(key_row(head, positions[i]), g_.dtype, g_.head_dim, out + i * g_.head_dim, key_scale(head));
}

void IndexOnlyTier::keys_as_float(int32_t head, const int64_t* rows, int64_t count,
                                  float* out) const {
  for (int64_t i = 0; i < count; ++i)
    to_float(key_row(head, rows[i]), g_.dtype, g_.head_dim, out + i * g_.head_dim, key_scale(head));
}

void IndexOnlyTier::key_columns_as_float(int32_t, int64_t, int64_t, const int32_t*, int32_t,
                                         float*) const {
  no_values("reading key columns");
}
void IndexOnlyTier::gather(int32_t, const int32_t*, int64_t, uint8_t*, size_t, uint8_t*,
                           size_t) const {
  no_values("gathering K/V");
}
SelectedRows IndexOnlyTier::select_rows(int32_t, const int32_t*, int64_t, RowStaging&) const {
  no_values("reading selected rows");
}
void IndexOnlyTier::for_each_run(bool, int32_t, int64_t, int64_t,
                                 const std::function<void(const uint8_t*, int64_t)>&) const {
  no_values("writing K/V to a state");
}

}  // namespace pq
