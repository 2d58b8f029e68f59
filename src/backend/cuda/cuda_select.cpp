// The CUDA backend's selection on the device (cuda_backend.h): a layer, a
// batch of layers in one launch chain, and the selection kept in device
// memory; the resident codes they scan.
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

bool CudaBackend::pq_select_layer(const PqLayerSelectArgs& a, int32_t* out) const {
  use_device();
  char err[512] = {0};
  void* s = a.stream();
  StreamScratch& scratch = scratch_for(s);
  std::lock_guard<std::mutex> lock(scratch.mutex);
  const Touch touch(*this, s);
  DeviceArena& arena = scratch.arena;
  const int64_t n = a.middle.size();
  const int32_t m = a.subspaces();
  const size_t lut_bytes =
      static_cast<size_t>(a.kv_heads()) * a.group_size() * m * a.centroids() * sizeof(float);
  const size_t out_bytes = static_cast<size_t>(a.kv_heads()) * a.k * sizeof(int32_t);
  const size_t scan_ws = k_->pq_scan_workspace_size(a.kv_heads(), a.group_size(), m, n, a.combine());
  const size_t topk_ws = k_->topk_workspace_size(a.kv_heads(), n, a.k);
  void* d_lut = arena.get(StreamScratch::kLut, lut_bytes);
  auto* d_scores = static_cast<float*>(
      arena.get(StreamScratch::kScores, static_cast<size_t>(a.kv_heads()) * n * sizeof(float)));
  auto* d_out = static_cast<int32_t*>(arena.get(StreamScratch::kPositions, out_bytes));
  void* d_scan_ws = scan_ws ? arena.get(StreamScratch::kScanWorkspace, scan_ws) : nullptr;
  void* d_topk_ws = topk_ws ? arena.get(StreamScratch::kTopkWorkspace, topk_ws) : nullptr;
  check(k_->copy_async(d_lut, a.lut, lut_bytes, s, err, sizeof err), "LUT upload", err);

  const uint8_t* d_codes = nullptr;
  int64_t stride = 0, begin = a.middle.begin, end = a.middle.end;
  if (auto* layer = static_cast<CudaLayer*>(a.device())) {
    d_codes = resident_codes(*layer, a, s);
    stride = layer->codes_capacity;
  } else {  // no device state: the middle's codes go up at every call
    auto* d = static_cast<uint8_t*>(arena.get(
        StreamScratch::kCodes, static_cast<size_t>(a.kv_heads()) * n * m));
    for (int32_t h = 0; h < a.kv_heads(); ++h)
      upload_codes(a.codes[h], a.middle.begin, a.middle.end, d + static_cast<size_t>(h) * n * m, s);
    d_codes = d;
    stride = n;
    begin = 0;
    end = n;
  }
  check(k_->pq_scan(static_cast<const float*>(d_lut), d_codes, a.kv_heads(), a.group_size(), m,
                    a.centroids(), stride, begin, end, a.combine(), a.scale(), d_scores, d_scan_ws,
                    scan_ws, s, err, sizeof err),
        "pq_scan", err);
  check(k_->topk(d_scores, a.kv_heads(), n, a.k, a.middle.begin, d_out, d_topk_ws, topk_ws, s, err,
                 sizeof err),
        "topk", err);
  // Through pinned memory: a copy into pageable memory would be a second
  // wait. The earlier positions were read by the host already (below).
  uint8_t* positions = scratch.positions.acquire(out_bytes);
  check(k_->copy_async(positions, d_out, out_bytes, s, err, sizeof err), "positions download",
        err);
  // The positions must reach the host: the one wait of the selection.
  check(k_->stream_synchronize(s, err, sizeof err), "selection", err);
  std::memcpy(out, positions, out_bytes);
  return true;
}

bool CudaBackend::pq_select_batch(const std::vector<PqLayerSelectArgs>& items,
                     const std::vector<int32_t*>& outs) const {
  if (items.empty()) return true;
  const PqLayerSelectArgs& first = items.front();
  for (const PqLayerSelectArgs& a : items)
    if (a.stream() != first.stream() || a.device() == nullptr || a.kv_heads() != first.kv_heads() ||
        a.group_size() != first.group_size() || a.subspaces() != first.subspaces() ||
        a.centroids() != first.centroids() || a.combine() != first.combine() || a.scale() != first.scale())
      return false;  // one launch chain needs one stream and one shape
  use_device();
  char err[512] = {0};
  void* s = first.stream();
  StreamScratch& scratch = scratch_for(s);
  std::lock_guard<std::mutex> lock(scratch.mutex);
  const Touch touch(*this, s);
  const int32_t m = first.subspaces();
  const size_t lut_floats = static_cast<size_t>(first.group_size()) * m * first.centroids();
  const size_t rows = items.size() * static_cast<size_t>(first.kv_heads());
  if (rows > 65535) return false;  // past the kernels' grid: the selector scores on the host
  size_t score_floats = 0, out_ints = 0;
  int64_t max_n = 0;
  for (const PqLayerSelectArgs& a : items) {
    score_floats += static_cast<size_t>(a.kv_heads()) * (a.middle.size());
    out_ints += static_cast<size_t>(a.kv_heads()) * a.k;
    max_n = std::max(max_n, a.middle.size());
  }
  // One upload: [LUTs][scan rows][top-k rows], pointers to device memory.
  const size_t lut_bytes = rows * lut_floats * sizeof(float);
  const size_t scan_at = lut_bytes;
  const size_t topk_at = scan_at + rows * sizeof(pq_scan_row);
  const size_t up_bytes = topk_at + rows * sizeof(pq_topk_row);
  uint8_t* up = scratch.batch_staging.acquire(up_bytes);
  auto* d_up = static_cast<uint8_t*>(scratch.arena.get(StreamScratch::kLut, up_bytes));
  auto* d_scores = static_cast<float*>(
      scratch.arena.get(StreamScratch::kScores, std::max<size_t>(score_floats, 1) * sizeof(float)));
  auto* d_out = static_cast<int32_t*>(
      scratch.arena.get(StreamScratch::kPositions, std::max<size_t>(out_ints, 1) * sizeof(int32_t)));
  auto* scan_rows = reinterpret_cast<pq_scan_row*>(up + scan_at);
  auto* topk_rows = reinterpret_cast<pq_topk_row*>(up + topk_at);
  size_t row = 0, score_at = 0, out_at = 0;
  for (const PqLayerSelectArgs& a : items) {
    auto& layer = *static_cast<CudaLayer*>(a.device());
    const uint8_t* d_codes = resident_codes(layer, a, s);
    const int64_t n = a.middle.size();
    for (int32_t h = 0; h < a.kv_heads(); ++h, ++row) {
      std::memcpy(up + row * lut_floats * sizeof(float), a.lut + h * lut_floats,
                  lut_floats * sizeof(float));
      scan_rows[row] = {reinterpret_cast<const float*>(d_up + row * lut_floats * sizeof(float)),
                        d_codes + static_cast<size_t>(h) * layer.codes_capacity * m,
                        d_scores + score_at, a.middle.begin, a.middle.end};
      topk_rows[row] = {d_scores + score_at, d_out + out_at, n, a.k, a.middle.begin};
      score_at += static_cast<size_t>(n);
      out_at += static_cast<size_t>(a.k);
    }
  }
  check(k_->copy_async(d_up, up, up_bytes, s, err, sizeof err), "batch upload", err);
  scratch.batch_staging.release(s);
  const int32_t r = static_cast<int32_t>(rows);
  const size_t scan_ws = k_->pq_scan_rows_workspace_size(r, first.group_size(), m, max_n,
                                                         first.combine());
  const size_t topk_ws = k_->topk_rows_workspace_size(r, max_n);
  void* d_scan_ws = scan_ws ? scratch.arena.get(StreamScratch::kScanWorkspace, scan_ws) : nullptr;
  void* d_topk_ws = topk_ws ? scratch.arena.get(StreamScratch::kTopkWorkspace, topk_ws) : nullptr;
  check(k_->pq_scan_rows(reinterpret_cast<const pq_scan_row*>(d_up + scan_at), r, max_n,
                         first.group_size(), m, first.centroids(), first.combine(), first.scale(),
                         d_scan_ws, scan_ws, s, err, sizeof err),
        "pq_scan_rows", err);
  check(k_->topk_rows(reinterpret_cast<const pq_topk_row*>(d_up + topk_at), r, max_n, d_topk_ws,
                      topk_ws, s, err, sizeof err),
        "topk_rows", err);
  const size_t out_bytes = out_ints * sizeof(int32_t);
  uint8_t* positions = scratch.positions.acquire(std::max<size_t>(out_bytes, 1));
  check(k_->copy_async(positions, d_out, out_bytes, s, err, sizeof err), "positions download",
        err);
  check(k_->stream_synchronize(s, err, sizeof err), "batched selection", err);
  out_at = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const size_t bytes = static_cast<size_t>(items[i].kv_heads()) * items[i].k * sizeof(int32_t);
    std::memcpy(outs[i], positions + out_at, bytes);
    out_at += bytes;
  }
  return true;
}

bool CudaBackend::select_to_device(const DeviceSelectArgs& a) const {
  const PqLayerSelectArgs& l = a.pq;
  require_device_memory(a.query.data, "query.data");
  if (a.out.capacity > 0) require_device_memory(a.out.positions, "out->positions");
  require_device_memory(a.out.counts, "out->counts");
  const int64_t n = l.middle.size();
  const bool scored = l.k > 0 && l.k < n;
  // With pq_rerank the codes pick `wide` candidates, re-ranked by their keys.
  const int64_t wide = scored ? rerank_candidates(l.context.config.pq_rerank, l.k, n) : l.k;
  if (l.context.config.pq_rerank > 0.f) rerank_store(a.store);  // refused at every length
  use_device();
  char err[512] = {0};
  void* s = l.stream();
  StreamScratch& scratch = scratch_for(s);
  std::lock_guard<std::mutex> lock(scratch.mutex);
  const Touch touch(*this, s);
  auto* step_layer = static_cast<CudaLayer*>(l.device());
  if (step_layer != nullptr && capturing(s)) return select_captured(*step_layer, a, scratch, s);
  // After a reserve, the step's row tables follow (a graph may capture it).
  const bool tables = step_layer != nullptr && step_layer->step_max_n > 0 &&
                      n <= step_layer->step_max_n &&
                      (wide <= l.k || wide <= step_layer->step_max_candidates);
  if (tables) {
    CudaLayer& t = *step_layer;
    const size_t lut_bytes = static_cast<size_t>(l.kv_heads()) * l.group_size() * l.subspaces() *
                             l.centroids() * sizeof(float);
    t.step_lut = static_cast<float*>(scratch.arena.get(StreamScratch::kLut, lut_bytes));
    t.step_scores = static_cast<float*>(scratch.arena.get(
        StreamScratch::kScores, static_cast<size_t>(l.kv_heads()) * t.step_max_n * sizeof(float)));
    t.step_middle = static_cast<int32_t*>(scratch.arena.get(
        StreamScratch::kPositions,
        static_cast<size_t>(l.kv_heads()) * std::max<int64_t>(l.k, 1) * sizeof(int32_t)));
    t.step_query = a.query.data;
    t.step_query_dtype = a.query.dtype;
    t.step_query_stride = a.query.head_stride * static_cast<int64_t>(dtype_size(a.query.dtype));
    if (t.step_max_candidates > 0) {
      t.step_candidates = static_cast<int32_t*>(scratch.arena.get(
          StreamScratch::kCandidates,
          static_cast<size_t>(l.kv_heads()) * t.step_max_candidates * sizeof(int32_t)));
      t.step_key_chunks = chunk_tables(t, host_rows(a.store), s);
    }
    t.step.fill.positions = a.out.positions;
    t.step.fill.counts = a.out.counts;
    t.step.fill.capacity = a.out.capacity;
  }
  // The tables follow once the step's launches are enqueued.
  auto send_tables = [&] {
    if (!tables) return;
    step_select_rows(*step_layer, l, a.tokens);
    step_layer->step_selected = true;
    send_step(*step_layer, s);
  };
  if (l.k == 0 || l.k >= n) {  // nothing to score: the whole middle, or none of it
    const int64_t sinks = l.k == 0 ? l.middle.begin : l.middle.end;
    check(k_->fill_selection(a.out.positions, a.out.counts, l.kv_heads(), a.out.capacity, sinks,
                             nullptr, 0, l.middle.end, a.tokens, s, err, sizeof err),
          "fill_selection", err);
    send_tables();
    return true;
  }
  auto& layer = *static_cast<CudaLayer*>(l.device());
  const PqCodebook& cb = l.codebook;
  const size_t centroid_bytes = cb.data.size() * sizeof(float);
  if (layer.centroids_generation != l.index_generation()) {
    grow(layer.d_centroids, layer.centroids_bytes, centroid_bytes, "the layer's centroids");
    check(k_->copy_async(layer.d_centroids, cb.data.data(), centroid_bytes, s, err, sizeof err),
          "centroids upload", err);
    layer.centroids_generation = l.index_generation();
  }
  const int32_t m = l.subspaces();
  const size_t lut_bytes =
      static_cast<size_t>(l.kv_heads()) * l.group_size() * m * l.centroids() * sizeof(float);
  auto* d_lut = static_cast<float*>(scratch.arena.get(StreamScratch::kLut, lut_bytes));
  const int64_t head_stride = a.query.head_stride * static_cast<int64_t>(dtype_size(a.query.dtype));
  check(k_->pq_lut_ordered(a.query.data, a.query.dtype, head_stride, l.kv_heads(), l.group_size(),
                           static_cast<const float*>(layer.d_centroids), m, l.centroids(),
                           cb.sub_dim, l.context.config.key_rotary, d_lut, s, err, sizeof err),
        "pq_lut", err);
  const uint8_t* d_codes = resident_codes(layer, l, s);
  const size_t scan_ws = k_->pq_scan_workspace_size(l.kv_heads(), l.group_size(), m, n, l.combine());
  const size_t topk_ws = k_->topk_workspace_size(l.kv_heads(), n, wide);
  // With the step's tables, the scores buffer is already the reserve's.
  const int64_t score_stride = tables ? layer.step_max_n : n;
  auto* d_scores = static_cast<float*>(scratch.arena.get(
      StreamScratch::kScores, static_cast<size_t>(l.kv_heads()) * score_stride * sizeof(float)));
  auto* d_middle = static_cast<int32_t*>(scratch.arena.get(
      StreamScratch::kPositions, static_cast<size_t>(l.kv_heads()) * l.k * sizeof(int32_t)));
  void* d_scan_ws = scan_ws ? scratch.arena.get(StreamScratch::kScanWorkspace, scan_ws) : nullptr;
  void* d_topk_ws = topk_ws ? scratch.arena.get(StreamScratch::kTopkWorkspace, topk_ws) : nullptr;
  check(k_->pq_scan(d_lut, d_codes, l.kv_heads(), l.group_size(), m, l.centroids(),
                    layer.codes_capacity, l.middle.begin, l.middle.end, l.combine(), l.scale(), d_scores,
                    d_scan_ws, scan_ws, s, err, sizeof err),
        "pq_scan", err);
  // Re-ranking: the codes' top `wide` are the candidates, and their keys
  // choose the k (in the step's buffers with the tables, for a capture).
  int32_t* d_picked = d_middle;
  if (wide > l.k)
    d_picked = tables ? layer.step_candidates
                      : static_cast<int32_t*>(scratch.arena.get(
                            StreamScratch::kCandidates,
                            static_cast<size_t>(l.kv_heads()) * wide * sizeof(int32_t)));
  check(k_->topk(d_scores, l.kv_heads(), n, wide, l.middle.begin, d_picked, d_topk_ws, topk_ws, s,
                 err, sizeof err),
        "topk", err);
  if (wide > l.k) rerank_on_device(layer, a, d_picked, wide, d_middle, scratch, s);
  check(k_->fill_selection(a.out.positions, a.out.counts, l.kv_heads(), a.out.capacity, l.middle.begin,
                           d_middle, l.k, l.middle.end, a.tokens, s, err, sizeof err),
        "fill_selection", err);
  send_tables();
  return true;
}

const KvStore& CudaBackend::rerank_store(const KvTier& tier) const {
  if (tier.host_store() == nullptr) fail(PQ_ERR_UNSUPPORTED, index_only_rerank_refusal());
  const KvStore& store = host_rows(tier);
  if (!device_reads(store))
    fail(PQ_ERR_UNSUPPORTED,
         "pq_decode_select_device: config.pq_rerank re-ranks by the keys on the device, and the "
         "K/V store is in the caller's host_alloc memory, which the device cannot read; use the "
         "CUDA backend's own store (no host_alloc hook) or pq_decode_select");
  return store;
}

pq_rerank_shape CudaBackend::rerank_shape(const DeviceSelectArgs& a, int64_t max_count) const {
  const PqLayerSelectArgs& l = a.pq;
  pq_rerank_shape shape{};
  shape.group_size = l.group_size();
  shape.head_dim = l.context.head_dim();
  shape.query_dtype = a.query.dtype;
  shape.key_dtype = l.context.dtype();
  shape.combine = l.combine();
  shape.scale = l.scale();
  shape.query_head_stride = a.query.head_stride * static_cast<int64_t>(dtype_size(a.query.dtype));
  shape.chunk_tokens = KvStore::kChunkTokens;
  shape.max_count = max_count;
  return shape;
}

void CudaBackend::rerank_on_device(CudaLayer& layer, const DeviceSelectArgs& a,
                                   const int32_t* d_candidates, int64_t wide, int32_t* d_middle,
                                   StreamScratch& scratch, void* s) const {
  const PqLayerSelectArgs& l = a.pq;
  char err[512] = {0};
  const pq_rerank_shape shape = rerank_shape(a, wide);
  pq_rerank_row head0{};
  head0.query = a.query.data;
  head0.candidates = d_candidates;
  head0.out = d_middle;
  head0.key_chunks = chunk_tables(layer, host_rows(a.store), s);
  head0.count = wide;
  head0.k = l.k;
  const size_t ws = k_->pq_rerank_workspace_size(l.kv_heads(), wide, l.group_size());
  void* d_ws = ws ? scratch.arena.get(StreamScratch::kRerankWorkspace, ws) : nullptr;
  check(k_->pq_rerank(&head0, l.kv_heads(), &shape, d_ws, ws, s, err, sizeof err), "pq_rerank",
        err);
}

void CudaBackend::upload_codes(const CodeColumn& codes, int64_t first, int64_t end, uint8_t* d,
                  void* s) const {
  char err[512] = {0};
  const int32_t m = codes.code_bytes();
  codes.for_each_run(first, end, [&](int64_t run_first, int64_t n, const uint8_t* p) {
    check(k_->copy_async(d + (run_first - first) * m, p, static_cast<size_t>(n) * m, s, err,
                         sizeof err),
          "codes upload", err);
  });
}

bool CudaBackend::upload_codes_inline(const PqLayerSelectArgs& a, int64_t from, int64_t end,
                                      uint8_t* d, int64_t stride, void* s) const {
  const int32_t m = a.subspaces();
  pq_inline_copies args{};
  size_t at = 0;
  bool fits = true;
  for (int32_t h = 0; h < a.kv_heads() && fits; ++h)
    a.codes[h].for_each_run(from, end, [&](int64_t run_first, int64_t n, const uint8_t* p) {
      const size_t bytes = static_cast<size_t>(n) * m;
      if (!fits || args.pieces == PQ_INLINE_PIECES || at + bytes > PQ_INLINE_BYTES) {
        fits = false;
        return;
      }
      std::memcpy(args.payload + at, p, bytes);
      args.piece_dst[args.pieces] = d + (static_cast<size_t>(h) * stride + run_first) * m;
      args.piece_at[args.pieces] = static_cast<uint16_t>(at);
      args.piece_bytes[args.pieces] = static_cast<uint16_t>(bytes);
      ++args.pieces;
      at += bytes;
    });
  if (!fits) return false;
  char err[512] = {0};
  check(k_->inline_copies(&args, s, err, sizeof err), "codes upload (inline)", err);
  return true;
}

void CudaBackend::grow_codes(CudaLayer& layer, int64_t tokens, int32_t kv_heads, int32_t m) const {
  // A multiple of 16 tokens: every kv head's codes then start 16-byte
  // aligned (the scan's vector loads, row by row). The old codes are not
  // kept (the layout changes with the capacity): all go up again.
  const int64_t grown =
      (std::max<int64_t>({tokens, 2 * layer.codes_capacity, 4096}) + 15) / 16 * 16;
  recycler_.grow(&layer.d_codes, &layer.codes_bytes, static_cast<size_t>(grown) * kv_heads * m,
                 false, "the layer's PQ codes");
  layer.codes_capacity = grown;
  layer.codes_uploaded = 0;
}

const uint8_t* CudaBackend::resident_codes(CudaLayer& layer, const PqLayerSelectArgs& a, void* s) const {
  const int32_t m = a.subspaces();
  if (layer.codes_generation != a.index_generation()) {
    layer.codes_generation = a.index_generation();
    layer.codes_uploaded = 0;
  }
  if (layer.codes_capacity < a.middle.end) grow_codes(layer, a.middle.end, a.kv_heads(), m);
  if (layer.codes_uploaded < a.middle.end) {
    auto* d = static_cast<uint8_t*>(layer.d_codes);
    const int64_t from = layer.codes_uploaded;
    // A decode step's token leaving the window: by value, nothing staged.
    if (!upload_codes_inline(a, from, a.middle.end, d, layer.codes_capacity, s))
      for (int32_t h = 0; h < a.kv_heads(); ++h)
        upload_codes(a.codes[h], from, a.middle.end,
                     d + (static_cast<size_t>(h) * layer.codes_capacity + from) * m, s);
    layer.codes_uploaded = a.middle.end;
  }
  return static_cast<const uint8_t*>(layer.d_codes);
}

}  // namespace cuda_detail
}  // namespace pq
