// The selector interface. A selector picks, for one kv head, k of the middle
// tokens of a layer (selection_request.h says what it is asked). Adding one
// touches: its file src/selectors/<name>_selector.cpp (the build compiles
// every file there), its make_<name>_selector() declaration at the end of
// this header, its line in registry.cpp, its PQ_SELECTOR_ value in
// pqcache.h (and PQ_SELECTOR_COUNT), and the bindings' copies of that enum
// (Python, Go, Java, Rust); docs/design.md, "Adding a selector", lists each
// place and the test that fails when one is missed.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "pqcache.h"
#include "selectors/selector_state.h"

namespace pq {

class KvTier;
struct LayerSelection;
struct SelectionRequest;
// The capabilities a selector may opt into (selector_capabilities.h).
class BatchSelection;
class CrossLayerShares;
class LayerBudgets;
class TokenClassObserver;

// The core every selector implements: its name, its per-layer state and
// what feeds it, and the choice of a layer's middle. The default choice
// (default_selection.cpp) scores head by head with score() and takes the
// top k; a selector overrides select_middle or select_layer to choose
// otherwise. What only some selectors do is a capability they inherit and
// hand out through its query below (null: the selector has none).
class Selector {
 public:
  virtual ~Selector() = default;
  virtual const char* name() const = 0;
  // Whether the layer's PQ index must be built (and tokens coded) first.
  virtual bool needs_index() const { return false; }
  // Writes exactly r.k distinct positions from [mid_begin, mid_end) into out,
  // ascending. Returns the bytes it read to decide (for statistics). The
  // default scores every middle token with score(), combines the GQA group
  // and takes the top k (ties: the larger position).
  virtual uint64_t select_middle(const SelectionRequest& r, int32_t* out) const;

  // The layer-level seam: the middle positions of every kv head of a layer,
  // k per head at out[h * k], ascending per head; returns the bytes read.
  // The default runs select_middle head by head (heads in parallel for a
  // large layer); a selector that does better over a whole layer overrides
  // it (PQ: the lookup tables of all heads, and on a device one scan, one
  // top-k and one wait for all of them).
  virtual uint64_t select_layer(const LayerSelection& r, int32_t* out) const;

  // Whether select_layer leaves the state as it was (it only reads it): a
  // speculation (pq_decode_speculate) then needs no copy of it.
  virtual bool selects_without_changing_state() const { return false; }
  // Per-(sequence, layer) state, or null if the selector keeps none.
  virtual std::unique_ptr<SelectorState> make_state(const pq_config& c, int32_t layer) const {
    return nullptr;
  }
  // What make_state's state (and the PQ index, for PQ) may hold.
  virtual StateCost state_cost(const pq_config& c) const { return {}; }
  // Brings the state up to the store's first n tokens, whose middle is
  // [mid_begin, mid_end) (the core's regions), before the selection that
  // uses that middle (e.g. summaries of blocks that filled up). The layer
  // lock is held.
  virtual void update_state(SelectorState* state, const KvTier& store, int64_t n,
                            int64_t mid_begin, int64_t mid_end, const pq_config& c) const {}
  // pq_prefill_queries: queries[t][q_head][dim] for the last w prompt tokens.
  virtual void observe_queries(SelectorState* state, const KvTier& store, const float* queries,
                               int64_t w, const pq_config& c) const {}
  // pq_observe_attention for one kv head: probs[i] belongs to positions[i].
  virtual void observe_attention(SelectorState* state, int32_t kv_head, const int32_t* positions,
                                 const float* probs, int64_t count) const {}

  // The capabilities (selector_capabilities.h): a selector that inherits
  // one returns itself from its query.
  virtual const LayerBudgets* layer_budgets() const { return nullptr; }
  virtual const CrossLayerShares* cross_layer_shares() const { return nullptr; }
  virtual const BatchSelection* batch_selection() const { return nullptr; }
  virtual const TokenClassObserver* token_class_observer() const { return nullptr; }

 protected:
  // Raw dot-product estimates, raw[g * middle + i] for query head g of the
  // group and token mid_begin + i. Returns bytes read.
  virtual uint64_t score(const SelectionRequest& r, float* raw) const;
  // The GQA combine of raw scores ([group][middle]) and the top k into out.
  void select_from_raw(const SelectionRequest& r, const float* raw, int32_t* out) const;

  // k == 0 (nothing) and k == middle (every middle token, ascending) need no
  // scoring: handles them and returns true, else returns false.
  static bool select_without_scoring(const SelectionRequest& r, int32_t* out);
};

// The built-in selectors, once: their pq_selector value, names and factory.
// make_selector and the validation of config.selector read it.
struct SelectorInfo {
  int32_t value;          // pq_selector
  const char* name;       // "pq", "h2o", ...
  const char* enum_name;  // "PQ_SELECTOR_PQ", ...
  std::unique_ptr<Selector> (*make)();
};
const std::vector<SelectorInfo>& selector_registry();

// The selector for a pq_selector value, or null if there is none.
std::unique_ptr<Selector> make_selector(int32_t kind);

// One factory per selector file.
std::unique_ptr<Selector> make_pq_selector();
std::unique_ptr<Selector> make_exact_selector();
std::unique_ptr<Selector> make_window_selector();
std::unique_ptr<Selector> make_sparq_selector();
std::unique_ptr<Selector> make_infllm_selector();
std::unique_ptr<Selector> make_quest_selector();
std::unique_ptr<Selector> make_random_selector();
std::unique_ptr<Selector> make_h2o_selector();
std::unique_ptr<Selector> make_scope_selector();
std::unique_ptr<Selector> make_snapkv_selector();
std::unique_ptr<Selector> make_pyramidkv_selector();
std::unique_ptr<Selector> make_scissorhands_selector();
std::unique_ptr<Selector> make_keyformer_selector();
std::unique_ptr<Selector> make_clusterkv_selector();
std::unique_ptr<Selector> make_adakv_selector();
std::unique_ptr<Selector> make_zigzagkv_selector();
std::unique_ptr<Selector> make_pyramidinfer_selector();
std::unique_ptr<Selector> make_fastgen_selector();
std::unique_ptr<Selector> make_infinigen_selector();

}  // namespace pq
