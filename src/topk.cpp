#include "topk.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "pqcache.h"

namespace pq {

void combine_group_scores(const float* raw, int32_t group_size, int64_t n, int32_t mode,
                          float scale, float* out) {
  if (mode == PQ_GQA_SUM_SOFTMAX && group_size > 1) {
    std::fill(out, out + n, 0.f);
    for (int32_t g = 0; g < group_size; ++g) {
      const float* r = raw + static_cast<size_t>(g) * n;
      float max_logit = -INFINITY;
      for (int64_t i = 0; i < n; ++i) max_logit = std::max(max_logit, r[i] * scale);
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum += std::exp(r[i] * scale - max_logit);
      float inv = static_cast<float>(1.0 / sum);
      for (int64_t i = 0; i < n; ++i) out[i] += std::exp(r[i] * scale - max_logit) * inv;
    }
    return;
  }
  if (mode == PQ_GQA_MAX) {
    for (int64_t i = 0; i < n; ++i) out[i] = raw[i] * scale;
    for (int32_t g = 1; g < group_size; ++g) {
      const float* r = raw + static_cast<size_t>(g) * n;
      for (int64_t i = 0; i < n; ++i) out[i] = std::max(out[i], r[i] * scale);
    }
    return;
  }
  // MEAN, and SUM_SOFTMAX of a single head (same order as its logit).
  for (int64_t i = 0; i < n; ++i) out[i] = raw[i];
  for (int32_t g = 1; g < group_size; ++g) {
    const float* r = raw + static_cast<size_t>(g) * n;
    for (int64_t i = 0; i < n; ++i) out[i] += r[i];
  }
  float s = scale / static_cast<float>(group_size);
  for (int64_t i = 0; i < n; ++i) out[i] *= s;
}

void select_top_k(const float* scores, int64_t n, int64_t k, int64_t first, int32_t* out) {
  if (k <= 0) return;
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  // A strict total order (score, then position, descending) makes the chosen
  // set unique, so every selector and backend breaks ties the same way.
  auto better = [scores](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a > b);
  };
  if (k < n) std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), better);
  for (int64_t i = 0; i < k; ++i) out[i] = static_cast<int32_t>(first + idx[static_cast<size_t>(i)]);
}

}  // namespace pq
