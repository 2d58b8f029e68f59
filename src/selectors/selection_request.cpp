#include "selectors/selection_request.h"

#include <cmath>
#include <vector>

#include "base/dtype.h"
#include "base/top_p.h"
#include "base/topk.h"
#include "base/thread_pool.h"
#include "base/vector_math.h"
#include "backend/device_kernels.h"

namespace pq {

SelectionRequest LayerSelection::head(int32_t h, SelectScratch& s) const {
  return SelectionRequest{*this, h, s};
}

void LayerSelection::for_each_head(const std::function<void(int64_t)>& fn) const {
  // A large middle: heads in parallel (the caller's thread works too, so a
  // pool busy with builds cannot stall the decode step).
  const int32_t kv_heads = context.kv_heads();
  if (context.pool != nullptr && kv_heads > 1 && middle.size() >= 4096)
    context.pool->parallel_for(kv_heads, fn);
  else
    for (int32_t h = 0; h < kv_heads; ++h) fn(h);
}

PqLayerSelectArgs LayerSelection::pq_args(const float* luts) const {
  PqLayerSelectArgs a{context, *index->codebook};
  a.lut = luts;
  a.codes = index->codes.data();
  a.coded_tokens = index->coded_tokens;
  a.middle = middle;
  a.k = k;
  return a;
}

uint64_t SelectionRequest::exact_logits(const int32_t* positions, int64_t first, int64_t count,
                                       float* raw) const {
  const int32_t group = group_size(), dim = head_dim();
  // Keys in blocks: a tier reads a block in one call, the scratch stays small.
  constexpr int64_t kBlock = 256;
  std::vector<float> keys(static_cast<size_t>(std::min(count, kBlock)) * dim);
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t n = std::min(kBlock, count - b);
    if (positions != nullptr)
      store().keys_as_float(kv_head, positions + b, n, keys.data());
    else
      store().keys_as_float(kv_head, first + b, n, keys.data());
    for (int64_t i = 0; i < n; ++i)
      for (int32_t g = 0; g < group; ++g)
        raw[static_cast<size_t>(g) * count + b + i] =
            dot(queries() + static_cast<size_t>(g) * dim, keys.data() + i * dim, dim);
  }
  return static_cast<uint64_t>(count) * store().row_bytes();
}

void SelectionRequest::select_best(const float* combined, int32_t* out) const {
  const pq_config& c = config();
  if (c.top_p <= 0.f) {
    select_top_k(combined, middle(), k(), mid_begin(), out, scratch);
    return;
  }
  // The config allows top_p with PQ_GQA_SUM_SOFTMAX only: a group's
  // combined scores are sums of softmaxes, a single head's its logits.
  const ScoreMass kind = group_size() > 1 ? ScoreMass::kMassSums : ScoreMass::kLogits;
  const auto floor = static_cast<int64_t>(std::ceil(static_cast<double>(c.top_p_floor) *
                                                    static_cast<double>(middle())));
  layer.head_counts[kv_head] = static_cast<int32_t>(
      select_top_p(combined, middle(), k(), mid_begin(), kind, c.top_p, floor, out, scratch));
}

void SelectionRequest::select_best(const WeightedRows& combined, int32_t* out) const {
  if (config().top_p <= 0.f) {
    select_top_k_weighted(combined, k(), mid_begin(), out, scratch);
    return;
  }
  std::vector<float>& sums = scratch.combined;  // top-p reads every score
  sums.resize(static_cast<size_t>(combined.n));
  weighted_rows_sum(combined, sums.data());
  select_best(sums.data(), out);
}

}  // namespace pq
