// The CUDA backend's batched decode step kept on the device (cuda_backend.h):
// the selections of B sequences at one layer in one launch chain (LUTs,
// scan, top-k, fill: four launches and one table upload, whatever B; a
// fifth, the re-ranking, with pq_rerank), and
// their fetches in one gather launch. No host wait: the tables go up from a
// ring of pinned buffers (device_state.h), so consecutive layers do not wait
// for each other's uploads.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "base/dtype.h"
#include "base/error.h"
#include "pq/rerank.h"

namespace pq {
namespace cuda_detail {

namespace {

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

bool CudaBackend::select_batch_to_device(const std::vector<const DeviceSelectArgs*>& items) const {
  if (items.empty()) return true;
  const PqLayerSelectArgs& first = items.front()->pq;
  void* s = first.stream();
  for (const DeviceSelectArgs* a : items)
    if (a->pq.stream() != s || a->pq.device() == nullptr || a->query.dtype != items.front()->query.dtype ||
        a->query.head_stride != items.front()->query.head_stride)
      return false;  // one launch chain: one stream, one query layout
  const size_t n_items = items.size();
  if (n_items * static_cast<size_t>(first.kv_heads()) > 65535) return false;  // grid limit
  for (const DeviceSelectArgs* a : items) {
    require_device_memory(a->query.data, "query.data");
    if (a->out.capacity > 0) require_device_memory(a->out.positions, "out->positions");
    require_device_memory(a->out.counts, "out->counts");
    if (a->pq.context.config.pq_rerank > 0.f) rerank_store(a->store);
  }
  use_device();
  StreamScratch& scratch = scratch_for(s);
  std::lock_guard<std::mutex> lock(scratch.mutex);
  const Touch touch(*this, s);
  select_batch_chain(items, scratch, s);
  return true;
}

void CudaBackend::select_batch_chain(const std::vector<const DeviceSelectArgs*>& items,
                                     StreamScratch& scratch, void* s) const {
  const PqLayerSelectArgs& first = items.front()->pq;
  const size_t n_items = items.size();
  char err[512] = {0};
  const int32_t kv = first.kv_heads(), g = first.group_size(), m = first.subspaces(),
                C = first.centroids();
  // Which items are scored (k in 1..n-1), and the sizes of their work; with
  // pq_rerank the top-k picks `wide` candidates per kv head, re-ranked then.
  std::vector<size_t> scored;
  std::vector<int64_t> wide(n_items, 0);
  size_t score_floats = 0, middle_ints = 0, candidate_ints = 0, reranked = 0;
  int64_t max_n = 0, max_count = 0, max_wide = 0;
  for (size_t i = 0; i < n_items; ++i) {
    const PqLayerSelectArgs& l = items[i]->pq;
    const int64_t n = l.middle.size();
    if (l.k == 0 || l.k >= n) continue;
    scored.push_back(i);
    score_floats += static_cast<size_t>(kv) * n;
    middle_ints += static_cast<size_t>(kv) * l.k;
    max_n = std::max(max_n, n);
    wide[i] = rerank_candidates(l.context.config.pq_rerank, l.k, n);
    if (wide[i] > l.k) {
      candidate_ints += static_cast<size_t>(kv) * wide[i];
      reranked += static_cast<size_t>(kv);
      max_wide = std::max(max_wide, wide[i]);
    }
  }
  const size_t R = scored.size();
  const size_t rows = R * static_cast<size_t>(kv);
  const size_t lut_floats = static_cast<size_t>(kv) * g * m * C;  // per item
  // The tables, one upload: [lut rows][scan rows][top-k rows][re-rank
  // rows][fill rows].
  const size_t lut_at = 0;
  const size_t scan_at = aligned(lut_at + R * sizeof(pq_lut_row));
  const size_t topk_at = aligned(scan_at + rows * sizeof(pq_scan_row));
  const size_t rerank_at = aligned(topk_at + rows * sizeof(pq_topk_row));
  const size_t fill_at = aligned(rerank_at + reranked * sizeof(pq_rerank_row));
  const size_t table_bytes = fill_at + n_items * sizeof(pq_fill_row);
  uint8_t* pinned = nullptr;
  PinnedStaging& staging = scratch.device_tables.acquire(table_bytes, &pinned);
  auto* d_tables = static_cast<uint8_t*>(scratch.arena.get(StreamScratch::kBatchTables, table_bytes));
  auto* d_luts = static_cast<float*>(scratch.arena.get(
      StreamScratch::kBatchLut, std::max<size_t>(R * lut_floats, 1) * sizeof(float)));
  auto* d_scores = static_cast<float*>(scratch.arena.get(
      StreamScratch::kBatchScores, std::max<size_t>(score_floats, 1) * sizeof(float)));
  auto* d_middle = static_cast<int32_t*>(scratch.arena.get(
      StreamScratch::kBatchMiddle, std::max<size_t>(middle_ints, 1) * sizeof(int32_t)));
  auto* d_candidates = reranked == 0 ? nullptr
                                     : static_cast<int32_t*>(scratch.arena.get(
                                           StreamScratch::kBatchCandidates,
                                           candidate_ints * sizeof(int32_t)));
  auto* lut_rows = reinterpret_cast<pq_lut_row*>(pinned + lut_at);
  auto* scan_rows = reinterpret_cast<pq_scan_row*>(pinned + scan_at);
  auto* topk_rows = reinterpret_cast<pq_topk_row*>(pinned + topk_at);
  auto* rerank_rows = reinterpret_cast<pq_rerank_row*>(pinned + rerank_at);
  auto* fill_rows = reinterpret_cast<pq_fill_row*>(pinned + fill_at);
  const int64_t query_stride =
      items.front()->query.head_stride * static_cast<int64_t>(dtype_size(items.front()->query.dtype));
  size_t score_at = 0, middle_at = 0, candidate_at = 0, row = 0, r = 0, rr = 0;
  std::vector<const int32_t*> item_middle(n_items, nullptr);
  for (size_t i : scored) {
    const DeviceSelectArgs& a = *items[i];
    const PqLayerSelectArgs& l = a.pq;
    auto& layer = *static_cast<CudaLayer*>(l.device());
    const PqCodebook& cb = l.codebook;
    if (layer.centroids_generation != l.index_generation()) {
      const size_t bytes = cb.data.size() * sizeof(float);
      grow(layer.d_centroids, layer.centroids_bytes, bytes, "the layer's centroids");
      check(k_->copy_async(layer.d_centroids, cb.data.data(), bytes, s, err, sizeof err),
            "centroids upload", err);
      layer.centroids_generation = l.index_generation();
    }
    float* lut = d_luts + r * lut_floats;
    lut_rows[r] = {a.query.data, static_cast<const float*>(layer.d_centroids), lut};
    const uint8_t* codes = resident_codes(layer, l, s);
    const int64_t n = l.middle.size();
    item_middle[i] = d_middle + middle_at;
    const bool rerank = wide[i] > l.k;
    const uint8_t* const* key_chunks =
        rerank ? chunk_tables(layer, host_rows(a.store), s) : nullptr;
    for (int32_t h = 0; h < kv; ++h, ++row) {
      scan_rows[row] = {lut + static_cast<size_t>(h) * g * m * C,
                        codes + static_cast<size_t>(h) * layer.codes_capacity * m,
                        d_scores + score_at, l.middle.begin, l.middle.end};
      if (!rerank) {
        topk_rows[row] = {d_scores + score_at, d_middle + middle_at, n, l.k, l.middle.begin};
      } else {
        int32_t* candidates = d_candidates + candidate_at;
        topk_rows[row] = {d_scores + score_at, candidates, n, wide[i], l.middle.begin};
        pq_rerank_row& x = rerank_rows[rr++];
        x = pq_rerank_row{};
        x.query = static_cast<const uint8_t*>(a.query.data) + int64_t{h} * g * query_stride;
        x.candidates = candidates;
        x.out = d_middle + middle_at;
        x.key_chunks = key_chunks;
        x.head = h;
        x.count = wide[i];
        x.k = l.k;
        candidate_at += static_cast<size_t>(wide[i]);
      }
      score_at += static_cast<size_t>(n);
      middle_at += static_cast<size_t>(l.k);
    }
    ++r;
  }
  for (size_t i = 0; i < n_items; ++i) {
    const DeviceSelectArgs& a = *items[i];
    const PqLayerSelectArgs& l = a.pq;
    const int64_t n = l.middle.size();
    const bool whole = l.k >= n && l.k > 0;
    const int64_t sinks = item_middle[i] != nullptr ? l.middle.begin
                          : whole                   ? l.middle.end
                                                    : l.middle.begin;
    fill_rows[i] = {a.out.positions, a.out.counts, item_middle[i], a.out.capacity, sinks,
                    item_middle[i] != nullptr ? l.k : 0, l.middle.end, a.tokens};
    const pq_fill_row& f = fill_rows[i];
    max_count = std::max(max_count, f.sink_end + f.k + (f.n - f.mid_end));
  }
  check(k_->copy_async(d_tables, pinned, table_bytes, s, err, sizeof err), "batch tables upload",
        err);
  staging.release(s);
  const auto r32 = static_cast<int32_t>(R), rows32 = static_cast<int32_t>(rows);
  if (R > 0) {
    check(k_->pq_lut_rows_ordered(reinterpret_cast<const pq_lut_row*>(d_tables + lut_at), r32,
                                  items.front()->query.dtype, query_stride, kv, g, m, C,
                                  first.codebook.sub_dim, first.context.config.key_rotary, s, err,
                                  sizeof err),
          "pq_lut_rows", err);
    const size_t scan_ws = k_->pq_scan_rows_workspace_size(rows32, g, m, max_n, first.combine());
    const size_t topk_ws = k_->topk_rows_workspace_size(rows32, max_n);
    void* d_scan_ws = scan_ws ? scratch.arena.get(StreamScratch::kBatchScanWorkspace, scan_ws) : nullptr;
    void* d_topk_ws = topk_ws ? scratch.arena.get(StreamScratch::kBatchTopkWorkspace, topk_ws) : nullptr;
    check(k_->pq_scan_rows(reinterpret_cast<const pq_scan_row*>(d_tables + scan_at), rows32, max_n,
                           g, m, C, first.combine(), first.scale(), d_scan_ws, scan_ws, s, err,
                           sizeof err),
          "pq_scan_rows", err);
    check(k_->topk_rows(reinterpret_cast<const pq_topk_row*>(d_tables + topk_at), rows32, max_n,
                        d_topk_ws, topk_ws, s, err, sizeof err),
          "topk_rows", err);
  }
  if (reranked > 0) {  // the fifth launch: every re-ranked kv head of every item
    const pq_rerank_shape shape = rerank_shape(*items.front(), max_wide);
    const auto rr32 = static_cast<int32_t>(reranked);
    const size_t ws = k_->pq_rerank_workspace_size(rr32, max_wide, g);
    void* d_ws = ws ? scratch.arena.get(StreamScratch::kBatchRerankWorkspace, ws) : nullptr;
    check(k_->pq_rerank_rows(reinterpret_cast<const pq_rerank_row*>(d_tables + rerank_at), rr32,
                             &shape, d_ws, ws, s, err, sizeof err),
          "pq_rerank_rows", err);
  }
  check(k_->fill_selection_rows(reinterpret_cast<const pq_fill_row*>(d_tables + fill_at),
                                static_cast<int32_t>(n_items), kv, max_count, s, err, sizeof err),
        "fill_selection_rows", err);
}

bool CudaBackend::fetch_batch_device_selection(
    const std::vector<const DeviceSelectionFetchArgs*>& items) const {
  if (items.empty()) return true;
  void* s = items.front()->context.stream;
  for (const DeviceSelectionFetchArgs* a : items)
    if (a->context.stream != s || a->context.device == nullptr) return false;
  if (items.size() > 65535) return false;
  for (const DeviceSelectionFetchArgs* a : items) {
    require_device_memory(a->out_keys.data, "out_keys.data");
    require_device_memory(a->out_values.data, "out_values.data");
    if (a->selection.capacity > 0) require_device_memory(a->selection.positions, "selection->positions");
    require_device_memory(a->selection.counts, "selection->counts");
    if (!device_reads(host_rows(a->store)))
      fail(PQ_ERR_UNSUPPORTED,
           "the K/V store is in the caller's host_alloc memory, which the device cannot read; "
           "a selection in device memory needs the CUDA backend's own store");
  }
  use_device();
  char err[512] = {0};
  StreamScratch& scratch = scratch_for(s);
  std::lock_guard<std::mutex> lock(scratch.mutex);
  const Touch touch(*this, s);
  std::vector<pq_selected_gather> table;
  int64_t max_chunks = 0;
  for (const DeviceSelectionFetchArgs* a : items) {
    auto& layer = *static_cast<CudaLayer*>(a->context.device);
    if (a->selection.capacity == 0 || host_rows(a->store).tokens() == 0) continue;
    table.push_back(selected_gather(layer, host_rows(a->store), a->selection.positions, a->selection.counts,
                                    a->selection.capacity, a->out_keys, a->out_values, s));
    const int64_t per_row = (static_cast<int64_t>(host_rows(a->store).row_bytes()) + 15) / 16;
    max_chunks = std::max(max_chunks, int64_t{layer.kv_heads} * a->selection.capacity * 2 * per_row);
  }
  if (table.empty()) return true;
  const size_t bytes = table.size() * sizeof(pq_selected_gather);
  uint8_t* pinned = nullptr;
  PinnedStaging& staging = scratch.device_tables.acquire(bytes, &pinned);
  std::memcpy(pinned, table.data(), bytes);
  void* d_table = scratch.arena.get(StreamScratch::kBatchFetchTables, bytes);
  check(k_->copy_async(d_table, pinned, bytes, s, err, sizeof err), "fetch tables upload", err);
  staging.release(s);
  check(k_->gather_selected_rows(static_cast<const pq_selected_gather*>(d_table),
                                 static_cast<int32_t>(table.size()), max_chunks, s, err,
                                 sizeof err),
        "gather_selected_rows", err);
  return true;
}

}  // namespace cuda_detail
}  // namespace pq
