#include <vector>

#include "error.h"
#include "selector.h"
#include "topk.h"

namespace pq {

std::unique_ptr<Selector> make_selector(int32_t kind) {
  switch (kind) {
    case PQ_SELECTOR_PQ: return make_pq_selector();
    case PQ_SELECTOR_EXACT: return make_exact_selector();
    case PQ_SELECTOR_WINDOW: return make_window_selector();
    case PQ_SELECTOR_SPARQ: return make_sparq_selector();
    case PQ_SELECTOR_INFLLM: return make_infllm_selector();
    case PQ_SELECTOR_QUEST: return make_quest_selector();
    case PQ_SELECTOR_RANDOM: return make_random_selector();
    case PQ_SELECTOR_H2O: return make_h2o_selector();
    case PQ_SELECTOR_SCOPE: return make_scope_selector();
    case PQ_SELECTOR_SNAPKV: return make_snapkv_selector();
    case PQ_SELECTOR_PYRAMIDKV: return make_pyramidkv_selector();
    default: return nullptr;
  }
}

uint64_t Selector::score(const SelectionRequest&, float*) const {
  fail(PQ_ERR_INTERNAL, std::string("selector ") + name() + " has no score()");
}

bool Selector::select_without_scoring(const SelectionRequest& r, int32_t* out) {
  const int64_t m = r.middle();
  if (r.k != 0 && r.k != m) return false;
  for (int64_t i = 0; i < r.k; ++i) out[i] = static_cast<int32_t>(r.mid_begin + i);
  return true;
}

uint64_t Selector::select_middle(const SelectionRequest& r, int32_t* out) const {
  const int64_t m = r.middle();
  if (select_without_scoring(r, out)) return 0;
  std::vector<float>& raw = r.scratch.raw;
  raw.resize(static_cast<size_t>(r.group_size) * m);
  uint64_t bytes = score(r, raw.data());
  select_from_raw(r, raw.data(), out);
  return bytes;
}

void Selector::select_from_raw(const SelectionRequest& r, const float* raw, int32_t* out) const {
  const int64_t m = r.middle();
  std::vector<float>& combined = r.scratch.combined;
  combined.resize(static_cast<size_t>(m));
  combine_group_scores(raw, r.group_size, m, r.combine, r.scale, combined.data(), r.scratch);
  select_top_k(combined.data(), m, r.k, r.mid_begin, out, r.scratch);
}

}  // namespace pq
