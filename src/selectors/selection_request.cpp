#include "selectors/selection_request.h"

#include "base/thread_pool.h"

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

}  // namespace pq
