// PqCodebook (codebook.h): the LUT, the host scan, the encoding.
#include "pq/codebook.h"

#include <algorithm>
#include <string>

#include "base/cpu_dispatch.h"
#include "base/error.h"
#include "base/vector_math.h"
#include "base/x86_intrinsics.h"
#include "pqcache.h"
#include "pq/nearest_centroid.h"

namespace pq {

namespace {
constexpr int64_t kGatherRows = 256;  // rows fetched through KeyGather at once

// out[c] = dot(q, centroid c, set.dim) (base/vector_math.h) for every
// centroid of a laid-out set: dot()'s operations in dot()'s order (eight
// partial sums by dimension mod 8, added left to right from 0, then the
// rest of the dimensions), formed for many centroids at once down the
// transposed columns instead of one centroid's row at a time, whose
// horizontal sums made the table 11% of a 32K select. The same bits at
// every level: a product, then an add, never fused.
constexpr int32_t kDotLanes = 8;  // dot()'s partial sums

// The portable level: dot() itself, over the centroids' rows.
void lut_row_portable(const float* q, const PreparedCentroids& set, float* out) {
  for (int32_t c = 0; c < set.count; ++c)
    out[c] = dot(q, set.rows + static_cast<size_t>(c) * set.dim, set.dim);
}

#if PQ_X86_KERNELS
// The vector levels: a register of centroids per partial sum (the
// compiler, left to a loop of this form, vectorised across the partial
// sums and spent a third of a select on shuffles). Padding columns are
// read (set.padded is a multiple of 16) but not written. The two levels
// are one algorithm in two register widths (a template over them made GCC
// warn of vector returns without the target's ABI).
PQ_TARGET_AVX512 void lut_row_avx512(const float* q, const PreparedCentroids& set, float* out) {
  const int32_t dim = set.dim, whole = dim - dim % kDotLanes;
  const float* t = set.transposed.data();
  const size_t padded = static_cast<size_t>(set.padded);
  for (int32_t first = 0; first < set.count; first += 16) {
    __m512 lanes[kDotLanes];
    for (int32_t l = 0; l < kDotLanes; ++l) lanes[l] = _mm512_setzero_ps();
    for (int32_t d = 0; d < whole; d += kDotLanes)
      for (int32_t l = 0; l < kDotLanes; ++l) {
        const __m512 column = _mm512_loadu_ps(t + (d + l) * padded + first);
        lanes[l] = _mm512_add_ps(lanes[l], _mm512_mul_ps(_mm512_set1_ps(q[d + l]), column));
      }
    __m512 sum = _mm512_setzero_ps();
    for (int32_t l = 0; l < kDotLanes; ++l) sum = _mm512_add_ps(sum, lanes[l]);
    for (int32_t d = whole; d < dim; ++d)
      sum = _mm512_add_ps(
          sum, _mm512_mul_ps(_mm512_set1_ps(q[d]), _mm512_loadu_ps(t + d * padded + first)));
    const int32_t valid = std::min(16, set.count - first);
    _mm512_mask_storeu_ps(out + first, static_cast<__mmask16>((1u << valid) - 1), sum);
  }
}

PQ_TARGET_AVX2 void lut_row_avx2(const float* q, const PreparedCentroids& set, float* out) {
  const int32_t dim = set.dim, whole = dim - dim % kDotLanes;
  const float* t = set.transposed.data();
  const size_t padded = static_cast<size_t>(set.padded);
  for (int32_t first = 0; first < set.count; first += 8) {
    __m256 lanes[kDotLanes];
    for (int32_t l = 0; l < kDotLanes; ++l) lanes[l] = _mm256_setzero_ps();
    for (int32_t d = 0; d < whole; d += kDotLanes)
      for (int32_t l = 0; l < kDotLanes; ++l) {
        const __m256 column = _mm256_loadu_ps(t + (d + l) * padded + first);
        lanes[l] = _mm256_add_ps(lanes[l], _mm256_mul_ps(_mm256_set1_ps(q[d + l]), column));
      }
    __m256 sum = _mm256_setzero_ps();
    for (int32_t l = 0; l < kDotLanes; ++l) sum = _mm256_add_ps(sum, lanes[l]);
    for (int32_t d = whole; d < dim; ++d)
      sum = _mm256_add_ps(
          sum, _mm256_mul_ps(_mm256_set1_ps(q[d]), _mm256_loadu_ps(t + d * padded + first)));
    alignas(32) float all[8];
    _mm256_store_ps(all, sum);
    std::copy(all, all + std::min(8, set.count - first), out + first);
  }
}
#endif

void lut_row(const float* q, const PreparedCentroids& set, float* out) {
#if PQ_X86_KERNELS
  static const auto fn = cpu_level() >= CpuLevel::kAvx512 ? lut_row_avx512
                         : cpu_level() >= CpuLevel::kAvx2 ? lut_row_avx2
                                                          : lut_row_portable;
#else
  static const auto fn = lut_row_portable;
#endif
  fn(q, set, out);
}
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
  for (int32_t j = 0; j < subspaces; ++j) {
    const PreparedCentroids& set = prepared(head, j);
    for (int32_t g = 0; g < group; ++g)
      lut_row(queries + static_cast<size_t>(g) * head_dim + j * sub_dim, set,
              out + (static_cast<size_t>(g) * subspaces + j) * centroids);
  }
}

const PreparedCentroids& PqCodebook::prepared(int32_t head, int32_t subspace) const {
  const std::vector<PreparedCentroids>& sets = layouts.get([this] {
    std::vector<PreparedCentroids> made(static_cast<size_t>(heads) * subspaces);
    for (int32_t h = 0; h < heads; ++h)
      for (int32_t j = 0; j < subspaces; ++j)
        prepare_centroids(at(h, j), centroids, sub_dim,
                          &made[static_cast<size_t>(h) * subspaces + j]);
    return made;
  });
  return sets[static_cast<size_t>(head) * subspaces + subspace];
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

  const int64_t chunks = (count + kGatherRows - 1) / kGatherRows;
  auto encode_chunk = [&](int64_t task) {
    const int32_t h = static_cast<int32_t>(task / chunks);
    const int64_t start = (task % chunks) * kGatherRows;
    const int64_t rows = std::min(kGatherRows, count - start);
    std::vector<int64_t> row_ids(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) row_ids[r] = first + start + r;
    std::vector<float> buffer(static_cast<size_t>(rows) * head_dim);
    ordered(h, row_ids.data(), rows, buffer.data());
    // Rows for the points scored at once: one for a decode step's token
    // (the whole block, zeroed, was 64 KiB per kv head and step).
    std::vector<float> scores(static_cast<size_t>(std::min(rows, kScoreBlock)) *
                              codebook.prepared(h, 0).padded);
    for (int32_t j = 0; j < m; ++j) {
      assign_points(codebook.prepared(h, j),
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
