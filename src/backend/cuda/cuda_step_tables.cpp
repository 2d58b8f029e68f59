// The decode step a CUDA graph may capture (cuda_backend.h, CudaLayer::step):
// after pq_sequence_reserve, the backend keeps each layer's scan, top-k,
// fill, gather and (pq_rerank) re-ranking arguments as row tables in device
// memory. An uncaptured
// select or fetch writes the caller's fields (query, selection, outputs);
// every append writes the lengths and uploads the codes of the token that
// left the window. Inside a capture, select and fetch only launch the row
// kernels over those tables (pq_lut, pq_scan_rows, topk_rows,
// pq_rerank_rows, fill_selection_rows, gather_selected_rows), at sizes
// fixed by the reserve, so a replay after the next append selects and
// fetches at the new length. Nothing here waits, allocates or copies from pageable memory.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "base/dtype.h"
#include "base/error.h"
#include "pq/rerank.h"

namespace pq {
namespace cuda_detail {

namespace {

// Byte offsets of the device table: [scan rows][top-k rows][fill][gather]
// [re-rank rows].
struct StepLayout {
  size_t scan = 0, topk, fill, gather, rerank, bytes;
  explicit StepLayout(int32_t kv_heads) {
    topk = scan + kv_heads * sizeof(pq_scan_row);
    fill = topk + kv_heads * sizeof(pq_topk_row);
    gather = fill + sizeof(pq_fill_row);
    rerank = gather + sizeof(pq_selected_gather);
    bytes = rerank + kv_heads * sizeof(pq_rerank_row);
  }
};

}  // namespace

void CudaBackend::step_select_rows(CudaLayer& layer, const PqLayerSelectArgs& l,
                                   int64_t tokens) const {
  const int32_t kv = layer.kv_heads, g = l.group_size(), m = l.subspaces(), C = l.centroids();
  CudaLayer::StepTables& t = layer.step;
  t.scan.resize(static_cast<size_t>(kv));
  t.topk.resize(static_cast<size_t>(kv));
  t.rerank.assign(static_cast<size_t>(kv), pq_rerank_row{});  // count 0: no re-ranking
  const int64_t n = l.middle.size();
  const bool scored = l.k > 0 && l.k < n;
  // With pq_rerank the top-k picks `wide` candidates, which the re-ranking
  // rows turn into the k (the caller checked wide against the reserve).
  const int64_t wide = scored ? rerank_candidates(l.context.config.pq_rerank, l.k, n) : 0;
  const bool rerank = wide > l.k;
  for (int32_t h = 0; h < kv; ++h) {
    // Scores of head h at h x the reserved middle: the layout stays put as
    // the middle grows, so that replays find it.
    float* scores = layer.step_scores + static_cast<size_t>(h) * layer.step_max_n;
    int32_t* middle = layer.step_middle + static_cast<size_t>(h) * l.k;
    t.scan[static_cast<size_t>(h)] = {
        layer.step_lut + static_cast<size_t>(h) * g * m * C,
        static_cast<const uint8_t*>(layer.d_codes) + static_cast<size_t>(h) * layer.codes_capacity * m,
        scores, l.middle.begin, scored ? l.middle.end : l.middle.begin};
    if (!rerank) {
      t.topk[static_cast<size_t>(h)] = {scores, middle, scored ? n : 0, scored ? l.k : 0,
                                        l.middle.begin};
      continue;
    }
    int32_t* candidates = layer.step_candidates + static_cast<size_t>(h) * wide;
    t.topk[static_cast<size_t>(h)] = {scores, candidates, n, wide, l.middle.begin};
    pq_rerank_row& r = t.rerank[static_cast<size_t>(h)];
    r.query = static_cast<const uint8_t*>(layer.step_query) +
              static_cast<int64_t>(h) * g * layer.step_query_stride;
    r.candidates = candidates;
    r.out = middle;
    r.key_chunks = layer.step_key_chunks;
    r.head = h;
    r.count = wide;
    r.k = l.k;
  }
  const int64_t sinks = scored || l.k == 0 ? l.middle.begin : l.middle.end;
  t.fill.middle = scored ? layer.step_middle : nullptr;
  t.fill.sink_end = sinks;
  t.fill.k = scored ? l.k : 0;
  t.fill.mid_end = l.middle.end;
  t.fill.n = tokens;
}

void CudaBackend::send_step(CudaLayer& layer, void* s) const {
  const StepLayout at(layer.kv_heads);
  if (layer.d_step == nullptr) {
    size_t got = 0;
    layer.d_step = recycler_.acquire(at.bytes, false, "the step's row tables", &got);
    layer.step_bytes = got;
    layer.step_sent.clear();
  }
  std::vector<uint8_t> bytes(at.bytes, 0);
  const CudaLayer::StepTables& t = layer.step;
  if (!t.scan.empty()) {
    std::memcpy(bytes.data() + at.scan, t.scan.data(), t.scan.size() * sizeof(pq_scan_row));
    std::memcpy(bytes.data() + at.topk, t.topk.data(), t.topk.size() * sizeof(pq_topk_row));
  }
  std::memcpy(bytes.data() + at.fill, &t.fill, sizeof t.fill);
  std::memcpy(bytes.data() + at.gather, &t.gather, sizeof t.gather);
  if (!t.rerank.empty())
    std::memcpy(bytes.data() + at.rerank, t.rerank.data(), t.rerank.size() * sizeof(pq_rerank_row));
  // Only the bytes that changed (a step: the lengths), by value.
  size_t first = 0, end = bytes.size();
  if (layer.step_sent.size() == bytes.size()) {
    while (first < end && bytes[first] == layer.step_sent[first]) ++first;
    while (end > first && bytes[end - 1] == layer.step_sent[end - 1]) --end;
  }
  char err[512] = {0};
  for (size_t at_byte = first; at_byte < end; at_byte += PQ_INLINE_BYTES) {
    pq_inline_copies args{};
    const size_t piece = std::min<size_t>(PQ_INLINE_BYTES, end - at_byte);
    std::memcpy(args.payload, bytes.data() + at_byte, piece);
    args.pieces = 1;
    args.piece_dst[0] = static_cast<uint8_t*>(layer.d_step) + at_byte;
    args.piece_at[0] = 0;
    args.piece_bytes[0] = static_cast<uint16_t>(piece);
    check(k_->inline_copies(&args, s, err, sizeof err), "step tables update", err);
  }
  layer.step_sent = std::move(bytes);
}

void CudaBackend::refresh_device_step(DeviceLayer* device, const PqLayerSelectArgs& l,
                                      int64_t tokens, const KvTier& tier, void* s) const {
  auto* layer = static_cast<CudaLayer*>(device);
  if (layer == nullptr || !(layer->step_selected || layer->step_fetched)) return;
  use_device();
  char err[512] = {0};
  StreamScratch& scratch = scratch_for(s);
  std::lock_guard<std::mutex> lock(scratch.mutex);
  const Touch touch(*this, s);
  const int64_t wide = rerank_candidates(l.context.config.pq_rerank, l.k, l.middle.size());
  if (l.middle.size() > layer->step_max_n ||
      (wide > l.k && l.k < l.middle.size() && wide > layer->step_max_candidates)) {
    // Past the reserve: the tables can no longer follow (a replay would run
    // at the reserved sizes). An uncaptured step starts them again.
    layer->step_selected = layer->step_fetched = false;
    return;
  }
  // A re-ranking reads the keys through the chunk tables: new chunks go up.
  // (An index-only tier has no store: it neither re-ranks nor fetches on
  // the device, so its tables never read one.)
  if (layer->step_selected && layer->step_max_candidates > 0)
    layer->step_key_chunks = chunk_tables(*layer, host_rows(tier), s);
  if (layer->step_selected) {
    if (layer->centroids_generation != l.index_generation()) {
      const size_t bytes = l.codebook.data.size() * sizeof(float);
      grow(layer->d_centroids, layer->centroids_bytes, bytes, "the layer's centroids");
      check(k_->copy_async(layer->d_centroids, l.codebook.data.data(), bytes, s, err, sizeof err),
            "centroids upload", err);
      layer->centroids_generation = l.index_generation();
    }
    if (l.k > 0 && l.k < l.middle.size()) resident_codes(*layer, l, s);
    step_select_rows(*layer, l, tokens);
  }
  if (layer->step_fetched) {
    const KvStore& store = host_rows(tier);
    const uint8_t* const* tables = chunk_tables(*layer, store, s);
    layer->step.gather.key_chunks = tables;
    layer->step.gather.value_chunks = tables + layer->table_capacity;
    layer->step.gather.tokens = store.tokens();
  }
  send_step(*layer, s);
}

bool CudaBackend::select_captured(CudaLayer& layer, const DeviceSelectArgs& a,
                                  StreamScratch& scratch, void* s) const {
  const PqLayerSelectArgs& l = a.pq;
  const int64_t head_stride =
      a.query.head_stride * static_cast<int64_t>(dtype_size(a.query.dtype));
  const CudaLayer::StepTables& t = layer.step;
  std::string why;
  if (layer.step_max_n == 0)
    why = "the sequence has no pq_sequence_reserve";
  else if (!layer.step_selected)
    why = "no uncaptured pq_decode_select_device ran on this layer since the reserve (or the "
          "sequence outgrew it)";
  else if (layer.step_query != a.query.data || layer.step_query_dtype != a.query.dtype ||
           layer.step_query_stride != head_stride || t.fill.positions != a.out.positions ||
           t.fill.counts != a.out.counts || t.fill.capacity != a.out.capacity)
    why = "the query or the selection arrays differ from those of the last uncaptured "
          "pq_decode_select_device on this layer";
  else if (layer.centroids_generation != l.index_generation())
    why = "the layer's index changed since the last uncaptured pq_decode_select_device";
  if (!why.empty())
    fail(PQ_ERR_BAD_STATE, "pq_decode_select_device in a CUDA graph capture: " + why +
                               "; a captured step replays the buffers and sizes of an "
                               "uncaptured one");
  char err[512] = {0};
  const int32_t kv = layer.kv_heads, g = l.group_size(), m = l.subspaces(), C = l.centroids();
  const StepLayout at(kv);
  const auto* d_step = static_cast<const uint8_t*>(layer.d_step);
  check(k_->pq_lut_ordered(a.query.data, a.query.dtype, head_stride, kv, g,
                           static_cast<const float*>(layer.d_centroids), m, C, l.codebook.sub_dim,
                           l.context.config.key_rotary, layer.step_lut, s, err, sizeof err),
        "pq_lut", err);
  const size_t scan_ws = k_->pq_scan_rows_workspace_size(kv, g, m, layer.step_max_n, l.combine());
  const size_t topk_ws = k_->topk_rows_workspace_size(kv, layer.step_max_n);
  void* d_scan_ws = scan_ws ? scratch.arena.get(StreamScratch::kStepScanWorkspace, scan_ws) : nullptr;
  void* d_topk_ws = topk_ws ? scratch.arena.get(StreamScratch::kStepTopkWorkspace, topk_ws) : nullptr;
  check(k_->pq_scan_rows(reinterpret_cast<const pq_scan_row*>(d_step + at.scan), kv,
                         layer.step_max_n, g, m, C, l.combine(), l.scale(), d_scan_ws, scan_ws, s,
                         err, sizeof err),
        "pq_scan_rows", err);
  check(k_->topk_rows(reinterpret_cast<const pq_topk_row*>(d_step + at.topk), kv,
                      layer.step_max_n, d_topk_ws, topk_ws, s, err, sizeof err),
        "topk_rows", err);
  if (layer.step_max_candidates > 0) {  // pq_rerank: rows of count 0 write nothing
    const pq_rerank_shape shape = rerank_shape(a, layer.step_max_candidates);
    const size_t ws = k_->pq_rerank_workspace_size(kv, layer.step_max_candidates, g);
    void* d_ws = ws ? scratch.arena.get(StreamScratch::kStepRerankWorkspace, ws) : nullptr;
    check(k_->pq_rerank_rows(reinterpret_cast<const pq_rerank_row*>(d_step + at.rerank), kv,
                             &shape, d_ws, ws, s, err, sizeof err),
          "pq_rerank_rows", err);
  }
  check(k_->fill_selection_rows(reinterpret_cast<const pq_fill_row*>(d_step + at.fill), 1, kv,
                                layer.step_max_count, s, err, sizeof err),
        "fill_selection_rows", err);
  return true;
}

bool CudaBackend::fetch_captured(CudaLayer& layer, const pq_selected_gather& g, void* s) const {
  const pq_selected_gather& t = layer.step.gather;
  if (!layer.step_fetched || t.positions != g.positions || t.counts != g.counts ||
      t.capacity != g.capacity || t.out_keys != g.out_keys || t.out_values != g.out_values ||
      t.keys_token_stride != g.keys_token_stride || t.keys_head_stride != g.keys_head_stride ||
      t.values_token_stride != g.values_token_stride ||
      t.values_head_stride != g.values_head_stride)
    fail(PQ_ERR_BAD_STATE,
         "pq_fetch_kv_device in a CUDA graph capture: the selection or the outputs differ from "
         "those of the last uncaptured pq_fetch_kv_device on this layer since the reserve (or "
         "none ran); a captured step replays the buffers of an uncaptured one");
  char err[512] = {0};
  const StepLayout at(layer.kv_heads);
  const int64_t per_row = (static_cast<int64_t>(layer.row_bytes) + 15) / 16;
  check(k_->gather_selected_rows(
            reinterpret_cast<const pq_selected_gather*>(static_cast<const uint8_t*>(layer.d_step) +
                                                        at.gather),
            1, int64_t{layer.kv_heads} * t.capacity * 2 * per_row, s, err, sizeof err),
        "gather_selected_rows", err);
  return true;
}

}  // namespace cuda_detail
}  // namespace pq
