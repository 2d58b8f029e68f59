// The built-in selectors, once (selector.h, SelectorInfo).
#include <iterator>
#include <vector>

#include "selectors/selector.h"

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

}  // namespace pq
