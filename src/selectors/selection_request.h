// What a selector is asked: LayerSelection for every kv head of a layer
// (the layer's context, its tokens, the call's queries, middle and k),
// SelectionRequest for one kv head of it. Both are set by name, so two
// numbers cannot trade places unnoticed, and what the configuration says
// (head shape, GQA group, combine, scale) is read from it.
#pragma once

#include <cstdint>
#include <functional>

#include "backend/backend.h"
#include "backend/layer_context.h"
#include "base/scratch.h"
#include "base/weighted_rows.h"
#include "pq/pq_index.h"
#include "selectors/layer_share.h"
#include "store/kv_store.h"

namespace pq {

class SelectorState;
struct PqLayerSelectArgs;  // backend/device_kernels.h
struct SelectionRequest;

// LayerSelection s{LayerContext{config}, store, backend, scratch};
// s.index = ...; s.queries = ...; s.middle = {begin, end}; s.k = ...;
struct LayerSelection {
  LayerContext context;
  const KvTier& store;
  const Backend& backend;
  ScratchPool& scratch;              // the heads' working memory, reused across calls
  const PqIndex* index = nullptr;    // non-null when the selector needs_index()
  SelectorState* state = nullptr;    // from make_state(); may be null
  const float* queries = nullptr;    // [kv_heads][group_size][head_dim]
  TokenRange middle{};               // the middle tokens, chosen from
  int64_t k = 0;                     // per kv head, 0 <= k <= middle.size(); a head's row
                                     // in the output is k entries long
  int64_t k_mean = 0;                // the layer's budget per kv head (k unless heads differ)
  int32_t* head_counts = nullptr;    // [kv_heads], each k; a selector whose heads take
                                     // different numbers (at most k) writes them here
  int64_t prefill_tokens = 0;        // of the layer's tokens, those pq_prefill_layer gave
  const LayerShares* layer_shares = nullptr;  // every layer's, when the selector
                                             // has CrossLayerShares

  // The request of kv head h, working in `scratch`.
  SelectionRequest head(int32_t h, SelectScratch& scratch) const;
  // Runs fn(h) for every kv head: on the pool for a large middle (the
  // caller's thread works too), else in turn on the caller's thread.
  void for_each_head(const std::function<void(int64_t)>& fn) const;
  // The backend's PQ selection of this layer with the kv heads' `luts`
  // (index must be set).
  PqLayerSelectArgs pq_args(const float* luts) const;
};

// One kv head of a LayerSelection: what select_middle() and score() see.
struct SelectionRequest {
  const LayerSelection& layer;
  int32_t kv_head;
  SelectScratch& scratch;            // this head's working memory

  // This kv head's query heads, [group_size][head_dim].
  const float* queries() const {
    return layer.queries + static_cast<size_t>(kv_head) * group_size() * head_dim();
  }
  const KvTier& store() const { return layer.store; }
  const Backend& backend() const { return layer.backend; }
  const PqIndex* index() const { return layer.index; }
  SelectorState* state() const { return layer.state; }
  const pq_config& config() const { return layer.context.config; }
  int32_t layer_index() const { return layer.context.layer; }
  int64_t mid_begin() const { return layer.middle.begin; }
  int64_t mid_end() const { return layer.middle.end; }
  int64_t middle() const { return layer.middle.size(); }
  int64_t k() const { return layer.k; }
  int64_t prefill_tokens() const { return layer.prefill_tokens; }
  int32_t group_size() const { return layer.context.group_size(); }
  int32_t head_dim() const { return layer.context.head_dim(); }
  int32_t dtype() const { return layer.context.dtype(); }
  int32_t combine() const { return layer.context.combine(); }
  float scale() const { return layer.context.scale(); }

  // Exact q.k of `count` tokens of this kv head (positions[i], or first + i
  // when positions is null) against each query of the group, into raw
  // [group][count]; returns the key bytes read. The oracle's scores and
  // PQ's re-ranking both come from here.
  uint64_t exact_logits(const int32_t* positions, int64_t first, int64_t count, float* raw) const;

  // The choice from the combined scores of the middle (combined[i] for
  // token mid_begin + i), into out, ascending: the top k; with
  // config.top_p, the fewest of them whose estimated mass reaches that
  // share of the middle's, their count in layer.head_counts[kv_head].
  void select_best(const float* combined, int32_t* out) const;
  // The same choice from combined scores given as weighted rows (the fused
  // PQ scan's softmax shares): the top k without writing them.
  void select_best(const WeightedRows& combined, int32_t* out) const;
};

}  // namespace pq
