// The host tier's reads (KvTier): rows straight from the chunks in memory.
#include <algorithm>
#include <cstring>
#include <utility>

#include "base/dtype.h"
#include "base/error.h"
#include "base/tensor.h"
#include "store/kv_store.h"

namespace pq {

namespace {

// An index build's view: the chunks it holds stay alive and unchanged.
class HostKeySnapshot final : public KeySnapshot {
 public:
  HostKeySnapshot(KvStore::Snapshot s, int32_t dtype, const float* key_scales)
      : s_(std::move(s)), dtype_(dtype), key_scales_(key_scales) {}
  void keys_as_float(int32_t head, const int64_t* rows, int64_t count,
                     float* out) const override {
    const float scale = key_scales_ ? key_scales_[head] : 1.f;
    for (int64_t i = 0; i < count; ++i)
      to_float(s_.key_row(rows[i], head), dtype_, s_.head_dim, out + i * s_.head_dim, scale);
  }
  int64_t tokens() const override { return s_.tokens; }

 private:
  KvStore::Snapshot s_;
  int32_t dtype_;
  const float* key_scales_;  // the context's, which outlives its builds
};

// Rows ahead of the one being copied that a gather asks the memory system
// for (the rows are scattered over chunks), every 64-byte line of them, into
// L2: 8 rows ahead and the first line only took a 128K pq_fetch_kv 20.5-21.9
// ms (f16) and 18.5-24.1 ms (bf16) where this takes 11.6-18.4 and 13.3-17.1
// (AMD EPYC, 2 cores, load 4-6, three alternated processes each, 2026-11-29).
constexpr int64_t kPrefetchAhead = 32;

}  // namespace

std::shared_ptr<const KeySnapshot> KvStore::snapshot(int64_t tokens) const {
  Snapshot s = snapshot();
  s.tokens = tokens;
  s.chunks.resize(static_cast<size_t>((tokens + kChunkTokens - 1) / kChunkTokens));
  return std::make_shared<HostKeySnapshot>(std::move(s), dtype_, key_scales());
}

void KvStore::keys_as_float(int32_t head, int64_t first, int64_t count, float* out) const {
  const int32_t d = head_dim_;
  // A chunk's rows of one head are contiguous: one conversion per chunk.
  for (int64_t t = first; t < first + count;) {
    const int64_t run = std::min(first + count - t, kChunkTokens - t % kChunkTokens);
    to_float(key_row(t, head), dtype_, run * d, out + (t - first) * d, key_scale(head));
    t += run;
  }
}

namespace {

// Keys of listed tokens (int32 positions or int64 rows), through the table.
template <typename Pos>
void keys_at(const RowTable& table, int32_t head, float scale, const Pos* pos, int64_t count,
             float* out) {
  for (int64_t i = 0; i < count; ++i)
    to_float(table.key_row(static_cast<int32_t>(pos[i]), head), table.dtype, table.head_dim,
             out + i * table.head_dim, scale);
}

}  // namespace

void KvStore::keys_as_float(int32_t head, const int32_t* positions, int64_t count,
                            float* out) const {
  keys_at(table_, head, key_scale(head), positions, count, out);
}

void KvStore::keys_as_float(int32_t head, const int64_t* rows, int64_t count, float* out) const {
  keys_at(table_, head, key_scale(head), rows, count, out);
}

void KvStore::key_columns_as_float(int32_t head, int64_t first, int64_t count,
                                   const int32_t* cols, int32_t ncols, float* out) const {
  const float scale = key_scale(head);
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* row = key_row(first + i, head);
    for (int32_t j = 0; j < ncols; ++j)
      out[i * ncols + j] =
          load_element(row + static_cast<size_t>(cols[j]) * element_size_, dtype_) * scale;
  }
}

void KvStore::gather(int32_t head, const int32_t* positions, int64_t count, uint8_t* keys,
                     size_t key_stride, uint8_t* values, size_t value_stride) const {
  const size_t rb = row_bytes();
  for (int64_t i = 0; i < count; ++i) {
    if (i + kPrefetchAhead < count) {
      const uint8_t* k = table_.key_row(positions[i + kPrefetchAhead], head);
      const uint8_t* v = table_.value_row(positions[i + kPrefetchAhead], head);
      for (size_t b = 0; b < rb; b += 64) {  // every line of the rows, into L2
        __builtin_prefetch(k + b, 0, 2);
        __builtin_prefetch(v + b, 0, 2);
      }
    }
    std::memcpy(keys + i * key_stride, table_.key_row(positions[i], head), rb);
    std::memcpy(values + i * value_stride, table_.value_row(positions[i], head), rb);
  }
}

SelectedRows KvStore::select_rows(int32_t, const int32_t* positions, int64_t,
                                  RowStaging&) const {
  return {&table_, positions};
}

void KvStore::for_each_run(bool keys, int32_t head, int64_t first, int64_t end,
                           const std::function<void(const uint8_t*, int64_t)>& fn) const {
  for (int64_t t = first; t < end;) {  // a chunk's rows of one head are contiguous
    const int64_t run = std::min(end - t, kChunkTokens - t % kChunkTokens);
    fn(keys ? key_row(t, head) : value_row(t, head), run);
    t += run;
  }
}

void KvStore::reject_non_finite_rows(int64_t first, int64_t end, int64_t* run_first) const {
  // The rows of [first, end), chunk by chunk, as K and V tensors
  // ([token][head] with the chunk's head stride).
  for (int64_t t = first; t < end;) {
    const int64_t n = std::min(end - t, kChunkTokens - t % kChunkTokens);
    *run_first = t;
    for (const bool key : {true, false}) {
      pq_tensor view{};
      view.data = const_cast<uint8_t*>(key ? key_row(t, 0) : value_row(t, 0));
      view.dtype = dtype_;
      view.memory = PQ_MEMORY_HOST;
      view.tokens = n;
      view.heads = heads_;
      view.head_dim = head_dim_;
      view.token_stride = head_dim_;
      view.head_stride = kChunkTokens * static_cast<int64_t>(head_dim_);
      reject_non_finite(view, key ? "keys" : "values");
    }
    t += n;
  }
}

const KvStore& host_rows(const KvTier& tier) {
  const KvStore* store = tier.host_store();
  if (store == nullptr) fail(PQ_ERR_INTERNAL, "this path reads K/V rows in host memory only");
  return *store;
}

KvStore& host_rows(KvTier& tier) { return const_cast<KvStore&>(host_rows(std::as_const(tier))); }

}  // namespace pq
