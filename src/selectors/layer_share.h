// What one layer's selector state shares with the other layers of its
// sequence, for a selector whose choice in one layer depends on the others:
// ZigZagKV's budgets by each layer's LMBA, PyramidInfer's kept sets nested
// layer in layer. The layer publishes it whenever its selector state
// changes other than by appends (pq_prefill_queries, a truncate, fork or
// restore); a select reads every layer's without their locks (layers select
// concurrently, and two that locked each other would deadlock). Immutable
// once published.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

namespace pq {

struct LayerShare {
  double weight = std::numeric_limits<double>::quiet_NaN();  // ZigZagKV: the layer's LMBA
  // PyramidInfer: the layer's score of each prompt token (the state's own
  // vector, which is never changed once made: shared, not copied).
  std::shared_ptr<const std::vector<float>> scores;
};

// Every layer's share, [num_layers]; null where a layer has none yet.
using LayerShares = std::vector<std::shared_ptr<const LayerShare>>;

}  // namespace pq
