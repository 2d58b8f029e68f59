// PqCodebook (codebook.h): the LUT, the host scan, the encoding.
#include "pq/codebook.h"

#include <algorithm>
#include <string>

#include "base/error.h"
#include "pqcache.h"
#include "base/vector_math.h"
#include "pq/nearest_centroid.h"

namespace pq {

namespace {
constexpr int64_t kGatherRows = 256;  // rows fetched through KeyGather at once
}  // namespace

std::vector<int32_t> rotary_dim_order(int32_t head_dim, int32_t key_rotary) {
  std::vector<int32_t> order;
  if (key_rotary != PQ_ROTARY_HALF) return order;  // pairs already adjacent, or none
  const int32_t half = head_dim / 2;
  order.reserve(static_cast<size_t>(head_dim));
  for (int32_t i = 0; i < half; ++i) {
    order.push_back(i);
    order.push_back(i + half);
  }
  return order;
}

namespace {
// dst's rows are src's with their dimensions in `order`: dst[p] = src[order[p]].
void gather_dims(const std::vector<int32_t>& order, int32_t head_dim, int64_t rows,
                 const float* src, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int32_t p = 0; p < head_dim; ++p)
      dst[r * head_dim + p] = src[r * head_dim + order[static_cast<size_t>(p)]];
}

// gather_dims in place, row by row through `row`.
void reorder_rows(const std::vector<int32_t>& order, int32_t head_dim, int64_t rows, float* data,
                  std::vector<float>& row) {
  row.resize(static_cast<size_t>(head_dim));
  for (int64_t r = 0; r < rows; ++r) {
    float* x = data + r * head_dim;
    std::copy(x, x + head_dim, row.begin());
    gather_dims(order, head_dim, 1, row.data(), x);
  }
}
}  // namespace

KeyGather in_dim_order(const KeyGather& gather, const std::vector<int32_t>& order,
                       int32_t head_dim) {
  if (order.empty()) return gather;
  return [gather, order, head_dim](int32_t head, const int64_t* rows, int64_t count, float* out) {
    gather(head, rows, count, out);
    std::vector<float> row;
    reorder_rows(order, head_dim, count, out, row);
  };
}

void PqCodebook::lut(int32_t head, const float* queries, int32_t group, int32_t head_dim,
                     float* out) const {
  std::vector<float> ordered;
  if (!dim_order.empty()) {  // the queries in the codebook's order, gathered in one pass
    ordered.resize(static_cast<size_t>(group) * head_dim);
    gather_dims(dim_order, head_dim, group, queries, ordered.data());
    queries = ordered.data();
  }
  for (int32_t g = 0; g < group; ++g)
    for (int32_t j = 0; j < subspaces; ++j) {
      const float* q = queries + static_cast<size_t>(g) * head_dim + j * sub_dim;
      const float* c = at(head, j);
      float* l = out + (static_cast<size_t>(g) * subspaces + j) * centroids;
      for (int32_t ci = 0; ci < centroids; ++ci)
        l[ci] = dot(q, c + static_cast<size_t>(ci) * sub_dim, sub_dim);
    }
}

void PqCodebook::encode(int32_t head_dim, int64_t first, int64_t count, const KeyGather& gather,
                        ThreadPool* pool, uint8_t* const* codes) const {
  const PqCodebook& codebook = *this;
  const int32_t heads = codebook.heads;
  const int32_t m = codebook.subspaces;
  const int32_t k = codebook.centroids;
  const int32_t dim = codebook.sub_dim;
  if (heads < 1 || m < 1 || dim < 1 || k < 1 || k > 256 || head_dim != m * dim ||
      codebook.data.size() != static_cast<size_t>(heads) * m * k * dim)
    fail(PQ_ERR_INVALID_ARGUMENT, "PqCodebook::encode: codebook does not match head_dim " +
                                      std::to_string(head_dim));
  if (first < 0 || count < 0) fail(PQ_ERR_INVALID_ARGUMENT, "PqCodebook::encode: negative range");
  if (count == 0) return;
  if (!gather || codes == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, "PqCodebook::encode: null gather or codes");

  if (!dim_order.empty() && dim_order.size() != static_cast<size_t>(head_dim))
    fail(PQ_ERR_INVALID_ARGUMENT, "PqCodebook::encode: the dimension order does not match head_dim");
  const KeyGather ordered = in_dim_order(gather, dim_order, head_dim);

  std::vector<PreparedCentroids> prepared(static_cast<size_t>(heads) * m);
  for (int32_t h = 0; h < heads; ++h)
    for (int32_t j = 0; j < m; ++j)
      prepare_centroids(codebook.at(h, j), k, dim, &prepared[static_cast<size_t>(h) * m + j]);

  const int64_t chunks = (count + kGatherRows - 1) / kGatherRows;
  auto encode_chunk = [&](int64_t task) {
    const int32_t h = static_cast<int32_t>(task / chunks);
    const int64_t start = (task % chunks) * kGatherRows;
    const int64_t rows = std::min(kGatherRows, count - start);
    std::vector<int64_t> row_ids(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) row_ids[r] = first + start + r;
    std::vector<float> buffer(static_cast<size_t>(rows) * head_dim);
    ordered(h, row_ids.data(), rows, buffer.data());
    std::vector<float> scores(static_cast<size_t>(kScoreBlock) *
                              prepared[static_cast<size_t>(h) * m].padded);
    for (int32_t j = 0; j < m; ++j) {
      assign_points(prepared[static_cast<size_t>(h) * m + j],
                    buffer.data() + static_cast<size_t>(j) * dim, rows, head_dim, nullptr,
                    codes[h] + start * m + j, m, nullptr, scores.data());
    }
  };
  const int64_t tasks = static_cast<int64_t>(heads) * chunks;
  if (pool != nullptr) {
    pool->parallel_for(tasks, encode_chunk);
  } else {
    for (int64_t task = 0; task < tasks; ++task) encode_chunk(task);
  }
}

}  // namespace pq
