// The CUDA backend's multi-token select (cuda_backend.h;
// pq_decode_select_multi_device): the query tokens of one sequence are the
// items of the batched launch chain (cuda_device_batch.cpp), each selecting
// into the stream's scratch, and one multi_rows call writes the caller's
// rows from there. Everything is enqueued on the sequence's stream.
#include <algorithm>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "base/error.h"

namespace pq {
namespace cuda_detail {

bool CudaBackend::select_multi_to_device(const DeviceMultiSelectArgs& m) const {
  if (m.tokens.empty()) return true;
  const DeviceSelectArgs& first = m.tokens.front();
  const PqLayerSelectArgs& l = first.pq;
  if (l.device() == nullptr) return false;
  for (const DeviceSelectArgs& a : m.tokens) require_device_memory(a.query.data, "queries.data");
  if (m.out.capacity > 0) require_device_memory(m.out.positions, "out->positions");
  require_device_memory(m.out.counts, "out->counts");
  if (l.context.config.pq_rerank > 0.f) rerank_store(first.store);
  const int32_t kv = l.kv_heads();
  const size_t q = m.tokens.size();
  const size_t per_token = static_cast<size_t>(std::max<int64_t>(m.per_token, 0));
  use_device();
  char err[512] = {0};
  void* s = l.stream();
  StreamScratch& scratch = scratch_for(s);
  std::lock_guard<std::mutex> lock(scratch.mutex);
  const Touch touch(*this, s);
  // Token t's selection of kv head h: row t * kv + h of the scratch.
  const size_t token_rows = q * static_cast<size_t>(kv);
  auto* d_positions = static_cast<int32_t*>(scratch.arena.get(
      StreamScratch::kMultiPositions, std::max<size_t>(token_rows * per_token, 1) * sizeof(int32_t)));
  auto* d_counts = static_cast<int32_t*>(
      scratch.arena.get(StreamScratch::kMultiCounts, token_rows * sizeof(int32_t)));
  std::vector<pq_selection> sels(q);
  std::vector<DeviceSelectArgs> items;
  items.reserve(q);
  for (size_t t = 0; t < q; ++t) {
    const DeviceSelectArgs& a = m.tokens[t];
    sels[t] = pq_selection{d_positions + t * kv * per_token, d_counts + t * kv,
                           static_cast<int64_t>(per_token)};
    items.push_back(DeviceSelectArgs{a.pq, a.query, a.tokens, sels[t], a.store});
  }
  // As many tokens a chain as the kernels' grid takes (65535 kv heads).
  const size_t per_chain = std::max<size_t>(1, 65535 / static_cast<size_t>(kv));
  std::vector<const DeviceSelectArgs*> chain;
  for (size_t at = 0; at < q; at += per_chain) {
    chain.clear();
    for (size_t t = at; t < std::min(q, at + per_chain); ++t) chain.push_back(&items[t]);
    select_batch_chain(chain, scratch, s);
  }
  const size_t ws = k_->multi_rows_workspace_size(m.rows, kv, first.tokens);
  void* d_ws = ws ? scratch.arena.get(StreamScratch::kMultiWorkspace, ws) : nullptr;
  check(k_->multi_rows(d_positions, d_counts, static_cast<int64_t>(per_token),
                       static_cast<int32_t>(q), kv, m.rows, first.tokens, m.out.positions,
                       m.out.counts, m.out.capacity, d_ws, ws, s, err, sizeof err),
        "multi_rows", err);
  return true;
}

}  // namespace cuda_detail
}  // namespace pq
