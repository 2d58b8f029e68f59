// What a selector may opt into beyond the core (selector.h): each
// capability is an interface that a selector inherits beside Selector and
// hands out through the core's one query for it (Selector::layer_budgets()
// and the like, null by default), so the core's callers ask once and a
// selector without it is never asked the question.
//
//   LayerBudgets        k varied by layer or spread unevenly over the kv
//                       heads: PyramidKV, PyramidInfer (budget); AdaKV,
//                       ZigZagKV, FastGen (head_capacity)
//   CrossLayerShares    a layer's choice reads the other layers' states:
//                       ZigZagKV, PyramidInfer
//   BatchSelection      the same layer of several sequences in one call: PQ
//   TokenClassObserver  pq_sequence_token_classes: FastGen
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "pqcache.h"

namespace pq {

class SelectorState;
struct LayerSelection;
struct LayerShare;

// The configured budget of a middle of `middle` tokens, per kv head, before
// a selector's LayerBudgets vary it: topk_tokens, or topk_fraction of the
// middle rounded up, at most the middle.
inline int64_t configured_k(const pq_config& c, int64_t middle) {
  if (c.topk_tokens > 0) return std::min<int64_t>(c.topk_tokens, middle);
  // ceil, forgiving the float representation of the fraction (0.2f is a
  // hair above 0.2, and 0.2 * 1000 must give 200, not 201).
  const double want = std::ceil(static_cast<double>(c.topk_fraction) * middle * (1.0 - 1e-6));
  return std::min<int64_t>(middle, static_cast<int64_t>(want));
}

// A budget other than the configured k (ContextShared::regions applies
// both, the layer's first). Each defaults to k: a selector overrides what
// it varies.
class LayerBudgets {
 public:
  virtual ~LayerBudgets() = default;
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
};

// The selection of a layer reads what every layer of the sequence shares
// (LayerSelection::layer_shares, layer_share.h): ZigZagKV, PyramidInfer.
class CrossLayerShares {
 public:
  virtual ~CrossLayerShares() = default;
  // The layer's share, made from its state, or null while it has nothing to
  // share (no pq_prefill_queries yet). The layer publishes it whenever its
  // state changes other than by appends.
  virtual std::shared_ptr<LayerShare> layer_share(const SelectorState* state,
                                                  const pq_config& c) const = 0;
};

// select_layer for the same layer of several sequences (a batch), each
// request's middle into outs[i]; bytes[i] gets what each read. Whether a
// batch is worth a call of its own is the backend's to say (a device
// chooses every middle in one launch chain): the context takes this path
// only on a backend with DeviceKernels (backend/device_kernels.h).
class BatchSelection {
 public:
  virtual ~BatchSelection() = default;
  virtual void select_layers(const std::vector<const LayerSelection*>& requests,
                             const std::vector<int32_t*>& outs,
                             std::vector<uint64_t>& bytes) const = 0;
};

// pq_sequence_token_classes: the pq_token_class flags of positions
// [first, first + count), checked; first may pass the stored tokens. The
// state's caller_bytes() says what they hold (selector_state.h).
class TokenClassObserver {
 public:
  virtual ~TokenClassObserver() = default;
  virtual void observe_token_classes(SelectorState* state, int64_t first, int64_t count,
                                     const uint8_t* classes) const = 0;
};

}  // namespace pq
