// The core's default choice of a layer's middle (selector.h): every kv head
// by select_middle, which scores each middle token with the selector's
// score(), combines the GQA group and takes the top k (ties: the larger
// position). A selector that chooses otherwise overrides select_middle or
// select_layer and reuses the parts it needs (select_without_scoring,
// select_from_raw).
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/scratch.h"
#include "base/topk.h"
#include "selectors/selection_request.h"
#include "selectors/selector.h"

namespace pq {

uint64_t Selector::score(const SelectionRequest&, float*) const {
  fail(PQ_ERR_INTERNAL, std::string("selector ") + name() + " has no score()");
}

bool Selector::select_without_scoring(const SelectionRequest& r, int32_t* out) {
  const int64_t m = r.middle();
  // With config.top_p, a k of the whole middle is a ceiling: still scored.
  if (r.k() != 0 && (r.k() != m || r.config().top_p > 0.f)) return false;
  for (int64_t i = 0; i < r.k(); ++i) out[i] = static_cast<int32_t>(r.mid_begin() + i);
  return true;
}

uint64_t Selector::select_layer(const LayerSelection& r, int32_t* out) const {
  std::vector<uint64_t> bytes(static_cast<size_t>(r.context.kv_heads()), 0);
  r.for_each_head([&](int64_t h) {
    ScratchLease scratch(r.scratch);
    bytes[static_cast<size_t>(h)] =
        select_middle(r.head(static_cast<int32_t>(h), *scratch), out + h * r.k);
  });
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  return total;
}

uint64_t Selector::select_middle(const SelectionRequest& r, int32_t* out) const {
  const int64_t m = r.middle();
  if (select_without_scoring(r, out)) return 0;
  std::vector<float>& raw = r.scratch.raw;
  raw.resize(static_cast<size_t>(r.group_size()) * m);
  uint64_t bytes = score(r, raw.data());
  select_from_raw(r, raw.data(), out);
  return bytes;
}

void Selector::select_from_raw(const SelectionRequest& r, const float* raw, int32_t* out) const {
  const int64_t m = r.middle();
  std::vector<float>& combined = r.scratch.combined;
  combined.resize(static_cast<size_t>(m));
  combine_group_scores(raw, r.group_size(), m, r.combine(), r.scale(), combined.data(), r.scratch);
  r.select_best(combined.data(), out);
}

}  // namespace pq
