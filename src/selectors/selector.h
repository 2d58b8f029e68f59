// The selector interface. A selector picks, for one kv head, k of the middle
// tokens of a layer (selection_request.h says what it is asked). Adding one
// touches: its file src/selectors/<name>_selector.cpp (the build compiles
// every file there), its make_<name>_selector() declaration at the end of
// this header, its line in registry.cpp, its PQ_SELECTOR_ value in
// pqcache.h (and PQ_SELECTOR_COUNT), and the bindings' copies of that enum
// (Python, Go, Java, Rust); docs/design.md, "Adding a selector", lists each
// place and the test that fails when one is missed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/cut_to.h"
#include "base/error.h"
#include "pqcache.h"
#include "store/kv_store.h"
#include "pq/pq_index.h"
#include "base/scratch.h"
#include "base/thread_pool.h"
#include "selectors/layer_share.h"
#include "selectors/selection_request.h"

namespace pq {

class ByteReader;
class ByteWriter;

// What a selector keeps per (sequence, layer) between calls: block
// summaries, accumulated attention, prompt scores, a random stream. It
// follows the sequence through the state calls of pq_sequence_truncate,
// pq_sequence_fork, pq_sequence_save and pq_sequence_restore.
class SelectorState {
 public:
  virtual ~SelectorState() = default;
  // A copy for a forked sequence.
  virtual std::unique_ptr<SelectorState> clone() const = 0;
  // Forgets what it holds of the tokens at or after `tokens`.
  virtual void truncate(int64_t tokens) = 0;
  // What cannot be recomputed from the stored K/V (derived summaries are
  // rebuilt instead); load() reads it into a fresh state, checking it
  // against the layer's `tokens` and the configuration (PQ_ERR_CORRUPT).
  virtual void save(ByteWriter& out) const = 0;
  virtual void load(ByteReader& in, int64_t tokens, const pq_config& c) = 0;

  // Host bytes held for what the caller described ahead of, or apart from,
  // the stored tokens, which the per-chunk StateCost cannot bound (FastGen's
  // token classes may describe a prompt before its K/V): the layer charges
  // them to the memory limit as they are, after every change.
  virtual uint64_t caller_bytes() const { return 0; }
  // An upper bound of caller_bytes() after observe_token_classes of
  // positions up to `end`, reserved before the call so that a refusal
  // changes nothing.
  virtual uint64_t caller_bytes_after_classes(int64_t end) const { return caller_bytes(); }
};

// clone() for a state that is copyable as it is.
template <typename State>
struct CopyableState : SelectorState {
  std::unique_ptr<SelectorState> clone() const override {
    return std::make_unique<State>(static_cast<const State&>(*this));
  }
};

// A selector's own state, typed: the layer made it with the selector's
// make_state, so a missing or foreign state is a bug, and it says so
// instead of a downcast that silently does nothing or misreads memory.
template <typename State>
State& state_of(SelectorState* state, const char* selector) {
  auto* typed = dynamic_cast<State*>(state);
  if (typed == nullptr)
    fail(PQ_ERR_INTERNAL, std::string("selector ") + selector + ": its state is " +
                              (state ? "of another type" : "missing"));
  return *typed;
}

// Host bytes a selector's state and index may take for one (sequence,
// layer), for the host memory limit (memory_cost.h): an upper bound, with
// room for a vector's geometric growth where the state grows by resizing.
struct StateCost {
  uint64_t per_layer = 0;   // held from pq_sequence_add
  uint64_t per_chunk = 0;   // per KvStore::kChunkTokens tokens stored
};

// State that grows by resize() may hold twice what it uses; a truncate
// cuts it with cut_to (base/cut_to.h), which keeps it so.
constexpr uint64_t kGrowthRoom = 2;

// Per-token state of `bytes_per_token` for every kv head, per chunk.
inline uint64_t per_token_cost(const pq_config& c, uint64_t bytes_per_token) {
  return kGrowthRoom * static_cast<uint64_t>(KvStore::kChunkTokens) * c.num_kv_heads *
         bytes_per_token;
}

// Blocks of block_tokens a chunk of tokens can open: kChunkTokens /
// block_tokens, rounded up, plus one for a block that straddles chunks.
inline uint64_t blocks_per_chunk(int32_t block_tokens) {
  return (KvStore::kChunkTokens + block_tokens - 1) / block_tokens + 1;
}

// Per-block state of `bytes_per_block` for every kv head, per chunk.
inline uint64_t per_block_cost(const pq_config& c, int32_t block_tokens,
                               uint64_t bytes_per_block) {
  return kGrowthRoom * blocks_per_chunk(block_tokens) * c.num_kv_heads * bytes_per_block;
}

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

  // select_layer for the same layer of several sequences (a batch), each
  // request's middle into outs[i]; bytes[i] gets what each read. Whether a
  // batch is worth a call of its own is the backend's to say (a device
  // chooses every middle in one launch chain); the default selects item by
  // item, and batched_layers() says whether a selector does better.
  virtual void select_layers(const std::vector<const LayerSelection*>& requests,
                             const std::vector<int32_t*>& outs, std::vector<uint64_t>& bytes) const;
  virtual bool batched_layers() const { return false; }

  // Middle tokens to select at `layer`, given the configured k and the
  // number of middle tokens (PyramidKV varies it by layer). At most middle.
  virtual int64_t budget(int64_t k, int64_t middle, int32_t layer, const pq_config& c) const {
    return k;
  }
  // The most middle tokens one kv head may take when the layer's heads take
  // k each on average: k, unless the heads share a layer's budget unevenly
  // (AdaKV), which then writes each head's count to
  // LayerSelection::head_counts. It sizes the selection (at least k).
  virtual int64_t head_capacity(int64_t k, int64_t middle, const pq_config& c) const { return k; }
  // Whether the selection of a layer reads what every layer of the sequence
  // shares (LayerSelection::layer_shares, layer_share.h): ZigZagKV,
  // PyramidInfer. layer_share() makes a layer's share from its state, or
  // null while it has nothing to share (no pq_prefill_queries yet).
  virtual bool reads_layer_shares() const { return false; }
  virtual std::shared_ptr<LayerShare> layer_share(const SelectorState* state,
                                                  const pq_config& c) const {
    return nullptr;
  }
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
  // pq_sequence_token_classes: the pq_token_class flags of positions
  // [first, first + count), checked; first may pass the stored tokens.
  virtual void observe_token_classes(SelectorState* state, int64_t first, int64_t count,
                                     const uint8_t* classes) const {}

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

// The configured budget of a middle of `middle` tokens, per kv head, before
// a selector's budget() varies it by layer: topk_tokens, or topk_fraction of
// the middle rounded up, at most the middle.
inline int64_t configured_k(const pq_config& c, int64_t middle) {
  if (c.topk_tokens > 0) return std::min<int64_t>(c.topk_tokens, middle);
  // ceil, forgiving the float representation of the fraction (0.2f is a
  // hair above 0.2, and 0.2 * 1000 must give 200, not 201).
  const double want = std::ceil(static_cast<double>(c.topk_fraction) * middle * (1.0 - 1e-6));
  return std::min<int64_t>(middle, static_cast<int64_t>(want));
}

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
