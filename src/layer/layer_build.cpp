// A layer's PQ index as the layer uses it: the build's part (index_build.h)
// under the layer's lock, and the coding of the tokens that leave the local
// window.
#include <algorithm>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "layer/layer.h"
#include "pq/pq_tuple_select.h"

namespace pq {

void Layer::cancel_build() {
  std::lock_guard<std::mutex> lock(mutex_);
  build_.cancel();
}

void Layer::finish_build() {
  std::lock_guard<std::mutex> lock(mutex_);
  install_build();
}

void Layer::poll_build() {
  if (build_.poll()) update_mirrors();
}

// Waits for the pending build, if any, and installs its result. Throws the
// build's error.
void Layer::install_build() {
  if (build_.install()) update_mirrors();
}

void Layer::require_index(uint64_t seq_id) {
  require_prefill(seq_id, "reading the index");
  if (build_.background() && build_.index() && build_.pending()) {
    // No pause for a long output's rebuild: the old index serves until the
    // new one is done. A failed rebuild leaves it serving (the failure is
    // in the build facts, the log and the build_done hook).
    try {
      poll_build();
    } catch (const Error&) {
    }
  } else {
    install_build();
  }
  if (!build_.pending()) build_.set_background(false);
  if (!build_.index())
    fail(PQ_ERR_BAD_STATE, "layer " + std::to_string(layer_index_) + " of seq_id " +
                               std::to_string(seq_id) + " has no index: " +
                               (build_.facts().error.empty() ? "no build finished"
                                                             : build_.facts().error) +
                               "; call pq_prefill_layer again to rebuild");
}

void Layer::rebuild_for_long_output(const SequenceInfo& seq) {
  const float share = shared_.config.pq_rebuild_share;
  const PqIndex* index = build_.index();
  if (!(share > 0.f) || index == nullptr || build_.pending() || awaiting_kv_) return;
  const int64_t n = store_->tokens();
  if (static_cast<double>(n - index->built_tokens) <= static_cast<double>(share) * n) return;
  land_device_writes(/*wait=*/true);  // the build reads every row
  build_.schedule(*store_, n, seq);
  build_.set_background(true);
}

void Layer::code_tokens(int64_t end) {
  PqIndex& index = *build_.index();
  const float outlier_share = shared_.config.pq_outliers;
  const bool find = outlier_share > 0.f && index.outliers.empty() && index.coded_tokens > 0;
  if (index.coded_tokens >= end && !find) return;
  // Coding reads the keys: those the device is still appending land first.
  const int64_t pending = device_appends_.first.load();
  if (pending >= 0 && pending < std::max(end, index.coded_tokens))
    land_device_writes(/*wait=*/true);
  const int32_t head_dim = shared_.config.head_dim;
  const KvTier& store = *store_;
  KeyGather gather = [&store](int32_t head, const int64_t* rows, int64_t count, float* out) {
    store.keys_as_float(head, rows, count, out);
  };
  // A restored index's outliers: found from the store's keys at its first
  // coding, since a restore may hold the codes before the keys arrive.
  if (find)
    find_outliers(index, head_dim, shared_.config.sink_tokens, outlier_share, gather,
                  shared_.pool.get());
  if (index.coded_tokens >= end) return;
  std::vector<uint8_t*> heads(index.codes.size());
  // Capacity in whole chunks, never more: the memory limit counts the codes
  // per chunk of the store (memory_cost.h), which resize's doubling passes.
  const int64_t chunked =
      (end + KvStore::kChunkTokens - 1) / KvStore::kChunkTokens * KvStore::kChunkTokens;
  for (size_t h = 0; h < heads.size(); ++h) heads[h] = index.codes[h].grow(end, chunked);
  const int64_t count = end - index.coded_tokens;
  // A decode step codes one token: not worth waking the pool.
  index.codebook->encode(head_dim, index.coded_tokens, count, gather,
                count >= 4096 ? shared_.pool.get() : nullptr, heads.data());
  pq_index_count_tuples(index, index.coded_tokens, end);
  add_outliers(index, head_dim, index.coded_tokens, end, gather);
  index.coded_tokens = end;
  update_mirrors();
}

}  // namespace pq
