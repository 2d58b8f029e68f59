// PQ outliers: residuals, thresholds and the per-head lists (outliers.h).
#include "pq/outliers.h"

#include <algorithm>
#include <cmath>

#include "pq/nearest_centroid.h"
#include "pq/pq_index.h"

namespace pq {

namespace {

// Rows gathered at once: bounds the keys held to 1 MiB at head_dim 64
// whatever the sequence's length (a restored index finds its outliers over
// every coded token).
constexpr int64_t kResidualRows = 4096;

// Squared residuals |k - centroids(codes)|^2 of kv head h's tokens [from,
// to): in the codebook's dimension order, summed over the subspaces.
std::vector<float> head_residuals(const PqIndex& index, int32_t head_dim, int32_t h, int64_t from,
                                  int64_t to, const KeyGather& gather) {
  const PqCodebook& cb = *index.codebook;
  const int32_t m = cb.subspaces, dim = cb.sub_dim;
  const KeyGather ordered = in_dim_order(gather, cb.dim_order, head_dim);
  std::vector<float> residuals(static_cast<size_t>(to - from), 0.f);
  std::vector<int64_t> rows;
  std::vector<uint8_t> codes;
  std::vector<float> keys;
  for (int64_t first = from; first < to; first += kResidualRows) {
    const int64_t n = std::min(kResidualRows, to - first);
    rows.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) rows[static_cast<size_t>(i)] = first + i;
    codes.resize(static_cast<size_t>(n) * m);
    index.codes[static_cast<size_t>(h)].copy_out(first, n, codes.data());
    keys.resize(static_cast<size_t>(n) * head_dim);
    ordered(h, rows.data(), n, keys.data());
    float* out = residuals.data() + (first - from);
    for (int64_t t = 0; t < n; ++t)
      for (int32_t j = 0; j < m; ++j)
        out[t] += squared_distance(
            keys.data() + static_cast<size_t>(t) * head_dim + static_cast<size_t>(j) * dim,
            cb.at(h, j) + static_cast<size_t>(codes[static_cast<size_t>(t) * m + j]) * dim, dim);
  }
  return residuals;
}

}  // namespace

void find_outliers(PqIndex& index, int32_t head_dim, int64_t from, float share,
                   const KeyGather& gather, ThreadPool* pool) {
  const int32_t heads = static_cast<int32_t>(index.codes.size());
  from = std::min(from, index.coded_tokens);
  const int64_t n = index.coded_tokens - from;
  // Nothing coded past the sinks: no threshold yet (the next call tries again).
  if (n <= 0 || !(share > 0.f)) return;
  std::vector<OutlierList> lists(static_cast<size_t>(heads));
  const int64_t wanted = std::clamp<int64_t>(
      static_cast<int64_t>(std::ceil(static_cast<double>(share) * static_cast<double>(n))), 1, n);
  auto one_head = [&](int64_t h) {
    OutlierList& list = lists[static_cast<size_t>(h)];
    const std::vector<float> residuals =
        head_residuals(index, head_dim, static_cast<int32_t>(h), from, index.coded_tokens, gather);
    std::vector<float> sorted = residuals;
    std::nth_element(sorted.begin(), sorted.begin() + (wanted - 1), sorted.end(),
                     std::greater<float>());
    list.threshold = sorted[static_cast<size_t>(wanted - 1)];
    for (int64_t i = 0; i < n; ++i)
      if (residuals[static_cast<size_t>(i)] >= list.threshold)
        list.positions.push_back(static_cast<int32_t>(from + i));
  };
  if (pool != nullptr && n >= 4096) {
    pool->parallel_for(heads, one_head);
  } else {
    for (int32_t h = 0; h < heads; ++h) one_head(h);
  }
  index.outliers = std::move(lists);
}

void add_outliers(PqIndex& index, int32_t head_dim, int64_t from, int64_t to,
                  const KeyGather& gather) {
  if (index.outliers.empty() || to <= from) return;
  for (size_t h = 0; h < index.outliers.size(); ++h) {
    OutlierList& list = index.outliers[h];
    const std::vector<float> residuals =
        head_residuals(index, head_dim, static_cast<int32_t>(h), from, to, gather);
    for (int64_t i = 0; i < to - from; ++i)
      if (residuals[static_cast<size_t>(i)] >= list.threshold)
        list.positions.push_back(static_cast<int32_t>(from + i));
  }
}

void shrink_outliers(PqIndex& index, int64_t tokens) {
  for (OutlierList& list : index.outliers) {
    auto& p = list.positions;
    p.erase(std::lower_bound(p.begin(), p.end(), tokens), p.end());
  }
}

OutlierSpan outliers_between(const PqIndex& index, int32_t head, int64_t begin, int64_t end) {
  if (static_cast<size_t>(head) >= index.outliers.size()) return {};
  const auto& p = index.outliers[static_cast<size_t>(head)].positions;
  const auto lo = std::lower_bound(p.begin(), p.end(), begin);
  const auto hi = std::lower_bound(lo, p.end(), end);
  return {p.data() + (lo - p.begin()), hi - lo};
}

}  // namespace pq
