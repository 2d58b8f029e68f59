// The disk tier's reads (disk_tier.h): rows of chunks in memory are read in
// place, rows of chunks in the file are read with one transfer per run of
// consecutive positions in a chunk (a selection's rows are mostly
// scattered; a block of a selector or a build is one run per chunk).
#include <algorithm>
#include <cstring>

#include "base/dtype.h"
#include "base/error.h"
#include "store/disk_tier.h"

namespace pq {

namespace {

constexpr int64_t kChunkTokens = KvTier::kChunkTokens;

// Reads runs of one head's rows from chunks, wherever each chunk is.
struct RunReader {
  size_t row_bytes, block_bytes;
  // Rows [r, r + n) of chunk `source`'s head `head` (K or V): a pointer to
  // them in memory, or `buffer` (n rows) filled from the file.
  const uint8_t* run(const DiskKvTier::Rows* rows, const DiskSlot* slot, bool key, int32_t head,
                     int64_t r, int64_t n, std::vector<uint8_t>& buffer) const {
    const size_t offset = (static_cast<size_t>(head) * kChunkTokens + r) * row_bytes;
    if (rows != nullptr) return (key ? rows->keys.get() : rows->values.get()) + offset;
    if (slot == nullptr) fail(PQ_ERR_INTERNAL, "the disk tier read a chunk whose rows never came");
    buffer.resize(static_cast<size_t>(n) * row_bytes);
    slot->file().read(slot->index(), (key ? 0 : block_bytes) + offset, buffer.data(),
                      buffer.size());
    return buffer.data();
  }
};

// Calls fn(i, n) for each run pos[i..i+n) of consecutive tokens in one chunk.
template <typename Pos, typename Fn>
void for_each_position_run(const Pos* pos, int64_t count, Fn&& fn) {
  for (int64_t i = 0; i < count;) {
    int64_t n = 1;
    while (i + n < count && pos[i + n] == pos[i + n - 1] + 1 && pos[i + n] % kChunkTokens != 0) ++n;
    fn(i, n);
    i += n;
  }
}

// Keys of positions pos[0..count) as float, from chunk sources `at(c)`.
template <typename Pos, typename At>
void keys_at(const RunReader& reader, At&& at, int32_t dtype, int32_t head_dim, int32_t head,
             float scale, const Pos* pos, int64_t count, float* out) {
  std::vector<uint8_t> buffer;
  for_each_position_run(pos, count, [&](int64_t i, int64_t n) {
    const auto c = static_cast<size_t>(pos[i] / kChunkTokens);
    const auto [rows, slot] = at(c);
    const uint8_t* p = reader.run(rows, slot, true, head, pos[i] % kChunkTokens, n, buffer);
    to_float(p, dtype, n * head_dim, out + i * head_dim, scale);
  });
}

class DiskKeySnapshot final : public KeySnapshot {
 public:
  DiskKeySnapshot(std::vector<DiskKvTier::Source> sources, int64_t tokens, RunReader reader,
                  int32_t dtype, int32_t head_dim, const float* key_scales)
      : sources_(std::move(sources)), tokens_(tokens), reader_(reader), dtype_(dtype),
        head_dim_(head_dim), key_scales_(key_scales) {}
  void keys_as_float(int32_t head, const int64_t* rows, int64_t count,
                     float* out) const override {
    keys_at(reader_, [this](size_t c) {
      return std::make_pair(sources_[c].rows.get(), sources_[c].slot.get());
    }, dtype_, head_dim_, head, key_scales_ ? key_scales_[head] : 1.f, rows, count, out);
  }
  int64_t tokens() const override { return tokens_; }

 private:
  std::vector<DiskKvTier::Source> sources_;
  int64_t tokens_;
  RunReader reader_;
  int32_t dtype_, head_dim_;
  const float* key_scales_;  // the context's, which outlives its builds
};

}  // namespace

auto DiskKvTier::chunk_at() const {
  return [this](size_t c) {
    return std::make_pair(static_cast<const Rows*>(chunks_[c]->rows.get()), chunks_[c]->slot.get());
  };
}

std::shared_ptr<const KeySnapshot> DiskKvTier::snapshot(int64_t tokens) const {
  std::vector<Source> sources(static_cast<size_t>((tokens + kChunkTokens - 1) / kChunkTokens));
  for (size_t c = 0; c < sources.size(); ++c) sources[c] = source(c);
  return std::make_shared<DiskKeySnapshot>(std::move(sources), tokens,
                                           RunReader{row_bytes_, block_bytes()}, g_.dtype,
                                           g_.head_dim, key_scales());
}

void DiskKvTier::for_each_range_run(
    bool keys, int32_t head, int64_t first, int64_t end,
    const std::function<void(const uint8_t*, int64_t, int64_t)>& fn) const {
  const RunReader reader{row_bytes_, block_bytes()};
  std::vector<uint8_t> buffer;
  for (int64_t t = first; t < end;) {
    const int64_t n = std::min(end - t, kChunkTokens - t % kChunkTokens);
    const Chunk& c = *chunks_[static_cast<size_t>(t / kChunkTokens)];
    fn(reader.run(c.rows.get(), c.slot.get(), keys, head, t % kChunkTokens, n, buffer), t - first,
       n);
    t += n;
  }
}

void DiskKvTier::keys_as_float(int32_t head, int64_t first, int64_t count, float* out) const {
  for_each_range_run(true, head, first, first + count,
                     [&](const uint8_t* p, int64_t i, int64_t n) {
                       to_float(p, g_.dtype, n * g_.head_dim, out + i * g_.head_dim,
                                key_scale(head));
                     });
}

void DiskKvTier::keys_as_float(int32_t head, const int32_t* positions, int64_t count,
                               float* out) const {
  keys_at(RunReader{row_bytes_, block_bytes()}, chunk_at(), g_.dtype, g_.head_dim, head,
          key_scale(head), positions, count, out);
}

void DiskKvTier::keys_as_float(int32_t head, const int64_t* rows, int64_t count,
                               float* out) const {
  keys_at(RunReader{row_bytes_, block_bytes()}, chunk_at(), g_.dtype, g_.head_dim, head,
          key_scale(head), rows, count, out);
}

void DiskKvTier::key_columns_as_float(int32_t head, int64_t first, int64_t count,
                                      const int32_t* cols, int32_t ncols, float* out) const {
  const float scale = key_scale(head);
  for_each_range_run(true, head, first, first + count,
                     [&](const uint8_t* p, int64_t at, int64_t n) {
                       for (int64_t i = 0; i < n; ++i)
                         for (int32_t j = 0; j < ncols; ++j)
                           out[(at + i) * ncols + j] = load_element(
                               p + i * row_bytes_ + static_cast<size_t>(cols[j]) * element_size_,
                               g_.dtype) * scale;
                     });
}

void DiskKvTier::gather(int32_t head, const int32_t* positions, int64_t count, uint8_t* keys,
                        size_t key_stride, uint8_t* values, size_t value_stride) const {
  const RunReader reader{row_bytes_, block_bytes()};
  std::vector<uint8_t> buffer;
  for_each_position_run(positions, count, [&](int64_t i, int64_t n) {
    const Chunk& c = *chunks_[static_cast<size_t>(positions[i] / kChunkTokens)];
    const int64_t r = positions[i] % kChunkTokens;
    for (const bool key : {true, false}) {
      const uint8_t* p = reader.run(c.rows.get(), c.slot.get(), key, head, r, n, buffer);
      uint8_t* dst = key ? keys : values;
      const size_t stride = key ? key_stride : value_stride;
      for (int64_t j = 0; j < n; ++j)
        std::memcpy(dst + (i + j) * stride, p + j * row_bytes_, row_bytes_);
    }
  });
}

SelectedRows DiskKvTier::select_rows(int32_t head, const int32_t* positions, int64_t count,
                                     RowStaging& staging) const {
  // The rows land one after another; a table whose "chunks" are runs of
  // kChunkTokens of them (head_bytes 0) finds row i as token i.
  const size_t bytes = static_cast<size_t>(count) * row_bytes_;
  staging.keys.resize(bytes);
  staging.values.resize(bytes);
  gather(head, positions, count, staging.keys.data(), row_bytes_, staging.values.data(),
         row_bytes_);
  const size_t chunks = static_cast<size_t>((count + kChunkTokens - 1) / kChunkTokens);
  RowTable& t = staging.table;
  t.keys.resize(chunks);
  t.values.resize(chunks);
  for (size_t c = 0; c < chunks; ++c) {
    t.keys[c] = staging.keys.data() + c * kChunkTokens * row_bytes_;
    t.values[c] = staging.values.data() + c * kChunkTokens * row_bytes_;
  }
  t.row_bytes = row_bytes_;
  t.head_bytes = 0;
  t.head_dim = g_.head_dim;
  t.dtype = g_.dtype;
  staging.positions.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) staging.positions[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  return {&staging.table, staging.positions.data()};
}

void DiskKvTier::for_each_run(bool keys, int32_t head, int64_t first, int64_t end,
                              const std::function<void(const uint8_t*, int64_t)>& fn) const {
  for_each_range_run(keys, head, first, end,
                     [&](const uint8_t* p, int64_t, int64_t n) { fn(p, n); });
}

}  // namespace pq
