#include <iterator>
#include <vector>

#include "base/error.h"
#include "selectors/selector.h"
#include "base/topk.h"

namespace pq {

namespace {

// Indexed by pq_selector value: entry i is the selector of value i.
constexpr SelectorInfo kSelectors[] = {
    {PQ_SELECTOR_PQ, "pq", "PQ_SELECTOR_PQ", make_pq_selector},
    {PQ_SELECTOR_EXACT, "exact", "PQ_SELECTOR_EXACT", make_exact_selector},
    {PQ_SELECTOR_WINDOW, "window", "PQ_SELECTOR_WINDOW", make_window_selector},
    {PQ_SELECTOR_SPARQ, "sparq", "PQ_SELECTOR_SPARQ", make_sparq_selector},
    {PQ_SELECTOR_INFLLM, "infllm", "PQ_SELECTOR_INFLLM", make_infllm_selector},
    {PQ_SELECTOR_QUEST, "quest", "PQ_SELECTOR_QUEST", make_quest_selector},
    {PQ_SELECTOR_RANDOM, "random", "PQ_SELECTOR_RANDOM", make_random_selector},
    {PQ_SELECTOR_H2O, "h2o", "PQ_SELECTOR_H2O", make_h2o_selector},
    {PQ_SELECTOR_SCOPE, "scope", "PQ_SELECTOR_SCOPE", make_scope_selector},
    {PQ_SELECTOR_SNAPKV, "snapkv", "PQ_SELECTOR_SNAPKV", make_snapkv_selector},
    {PQ_SELECTOR_PYRAMIDKV, "pyramidkv", "PQ_SELECTOR_PYRAMIDKV", make_pyramidkv_selector},
    {PQ_SELECTOR_SCISSORHANDS, "scissorhands", "PQ_SELECTOR_SCISSORHANDS",
     make_scissorhands_selector},
    {PQ_SELECTOR_KEYFORMER, "keyformer", "PQ_SELECTOR_KEYFORMER", make_keyformer_selector},
    {PQ_SELECTOR_CLUSTERKV, "clusterkv", "PQ_SELECTOR_CLUSTERKV", make_clusterkv_selector},
    {PQ_SELECTOR_ADAKV, "adakv", "PQ_SELECTOR_ADAKV", make_adakv_selector},
    {PQ_SELECTOR_ZIGZAGKV, "zigzagkv", "PQ_SELECTOR_ZIGZAGKV", make_zigzagkv_selector},
    {PQ_SELECTOR_PYRAMIDINFER, "pyramidinfer", "PQ_SELECTOR_PYRAMIDINFER",
     make_pyramidinfer_selector},
    {PQ_SELECTOR_FASTGEN, "fastgen", "PQ_SELECTOR_FASTGEN", make_fastgen_selector},
    {PQ_SELECTOR_INFINIGEN, "infinigen", "PQ_SELECTOR_INFINIGEN", make_infinigen_selector},
};

constexpr bool values_are_indices() {
  for (size_t i = 0; i < std::size(kSelectors); ++i)
    if (kSelectors[i].value != static_cast<int32_t>(i)) return false;
  return true;
}

// A pq_selector value without its line here (or a line out of order) fails
// the build, not a test: PQ_SELECTOR_COUNT counts the header's values.
static_assert(std::size(kSelectors) == PQ_SELECTOR_COUNT,
              "registry.cpp lists a different number of selectors than PQ_SELECTOR_COUNT");
static_assert(values_are_indices(),
              "registry.cpp: entry i must be the selector of pq_selector value i");

}  // namespace

const std::vector<SelectorInfo>& selector_registry() {
  static const std::vector<SelectorInfo> registry(std::begin(kSelectors), std::end(kSelectors));
  return registry;
}

std::unique_ptr<Selector> make_selector(int32_t kind) {
  for (const SelectorInfo& s : selector_registry())
    if (s.value == kind) return s.make();
  return nullptr;
}

uint64_t Selector::score(const SelectionRequest&, float*) const {
  fail(PQ_ERR_INTERNAL, std::string("selector ") + name() + " has no score()");
}

bool Selector::select_without_scoring(const SelectionRequest& r, int32_t* out) {
  const int64_t m = r.middle();
  if (r.k() != 0 && r.k() != m) return false;
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

void Selector::select_layers(const std::vector<const LayerSelection*>& requests,
                             const std::vector<int32_t*>& outs,
                             std::vector<uint64_t>& bytes) const {
  bytes.assign(requests.size(), 0);
  for (size_t i = 0; i < requests.size(); ++i) bytes[i] = select_layer(*requests[i], outs[i]);
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
  select_top_k(combined.data(), m, r.k(), r.mid_begin(), out, r.scratch);
}

}  // namespace pq
