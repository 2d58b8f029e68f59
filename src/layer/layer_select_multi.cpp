// Several query tokens of one sequence in one select (pq_decode_select_multi):
// each token selected as pq_decode_select would, under one hold of the
// layer, and the rows written per token, per kv head or per request.
#include <algorithm>
#include <cstring>
#include <string>

#include "base/error.h"
#include "layer/layer.h"
#include "store/pool_keys.h"

namespace pq {

namespace {

// How many of the per-token rows one output row unites.
int64_t united(int64_t q, int32_t rows, int32_t kv_heads) {
  return rows == PQ_ROWS_PER_TOKEN ? 1 : rows == PQ_ROWS_PER_HEAD ? q : q * kv_heads;
}

}  // namespace

void Layer::multi_capacity(int64_t q, int32_t rows, int64_t* out_rows,
                           int64_t* out_capacity) const {
  const int32_t kv = shared_.config.num_kv_heads;
  const Regions r = shared_.regions(mirrors_.tokens(), layer_index_);
  const int64_t u = united(q, rows, kv);
  const int64_t middle = r.mid_end - r.sink_end;
  // u * k may pass int64 only for absurd q: the middle bounds it first.
  const int64_t picked = r.k == 0 ? 0 : (u > middle / r.k ? middle : std::min(middle, u * r.k));
  if (out_rows) *out_rows = rows == PQ_ROWS_PER_TOKEN ? q * kv : rows == PQ_ROWS_PER_HEAD ? kv : 1;
  if (out_capacity) *out_capacity = r.sink_end + (r.n - r.mid_end) + picked;
}

void Layer::select_multi(const std::vector<float>& queries, int64_t q, int32_t rows,
                         const PoolKeys* pool, pq_selection* out, const SequenceInfo& seq) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  const int32_t kv = shared_.config.num_kv_heads;
  int64_t out_rows = 0, needed = 0;
  multi_capacity(q, rows, &out_rows, &needed);
  if (out->capacity < needed) {
    for (int64_t row = 0; row < out_rows; ++row) out->counts[row] = static_cast<int32_t>(needed);
    fail(PQ_ERR_BUFFER_TOO_SMALL, "out->capacity is " + str(out->capacity) +
                                      "; these rows need " + str(needed) +
                                      " entries each (written to out->counts; see "
                                      "pq_selection_capacity_multi)");
  }
  std::unique_ptr<KvTier> pool_reader;
  if (pool != nullptr && !store_->keeps_values())
    pool_reader = pool_key_reader(*pool, store_->tokens(), *store_);

  // Every token's selection aside first: outputs are written only on success.
  const int64_t per_token = capacity();
  const size_t query_floats = static_cast<size_t>(shared_.config.num_q_heads) *
                              static_cast<size_t>(shared_.config.head_dim);
  std::vector<int32_t> positions(static_cast<size_t>(q * kv * per_token));
  std::vector<int32_t> counts(static_cast<size_t>(q * kv));
  std::vector<float> query(query_floats);
  for (int64_t t = 0; t < q; ++t) {
    std::copy(queries.begin() + static_cast<std::ptrdiff_t>(t * query_floats),
              queries.begin() + static_cast<std::ptrdiff_t>((t + 1) * query_floats), query.begin());
    pq_selection one{positions.data() + t * kv * per_token, counts.data() + t * kv, per_token};
    PreparedSelect prepared;
    select_prepare(query, &one, seq, prepared, /*host_out=*/true, pool_reader.get());
    prepared.bytes = shared_.selector->select_layer(*prepared.request, prepared.middle.data());
    select_finish(prepared, &one, seq);
  }

  // Rows: a per-token row as it is, a union sorted and unique, -1 after.
  std::vector<int32_t> merged;
  auto write_row = [&](int64_t row, const int32_t* from, int64_t count) {
    int32_t* dst = out->positions + row * out->capacity;
    std::memcpy(dst, from, static_cast<size_t>(count) * sizeof(int32_t));
    std::fill(dst + count, dst + out->capacity, -1);
    out->counts[row] = static_cast<int32_t>(count);
  };
  auto unite = [&](int64_t row, int64_t first_token_row, int64_t rows_apart, int64_t n) {
    merged.clear();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = first_token_row + i * rows_apart;
      const int32_t* from = positions.data() + r * per_token;
      merged.insert(merged.end(), from, from + counts[static_cast<size_t>(r)]);
    }
    std::sort(merged.begin(), merged.end());
    merged.erase(std::unique(merged.begin(), merged.end()), merged.end());
    write_row(row, merged.data(), static_cast<int64_t>(merged.size()));
  };
  if (rows == PQ_ROWS_PER_TOKEN) {
    for (int64_t r = 0; r < q * kv; ++r)
      write_row(r, positions.data() + r * per_token, counts[static_cast<size_t>(r)]);
  } else if (rows == PQ_ROWS_PER_HEAD) {
    for (int32_t h = 0; h < kv; ++h) unite(h, h, kv, q);
  } else {
    unite(0, 0, 1, q * kv);
  }
}

}  // namespace pq
