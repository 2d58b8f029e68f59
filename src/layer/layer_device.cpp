// A layer's decode step kept on the device (pq_decode_select_device,
// pq_fetch_kv_device): the checks and the bookkeeping of pq_decode_select
// and pq_fetch_kv, with the selection itself written and read by the
// backend's device on the sequence's stream.
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "layer/layer.h"
#include "pq/rerank.h"

namespace pq {

void Layer::select_to_device(const pq_tensor& query, const pq_selection& out,
                             const SequenceInfo& seq) {
  settle_device();
  std::lock_guard<std::mutex> lock(mutex_);
  PreparedSelect prepared;
  pq_selection descriptor = out;
  device_select_prepare(&descriptor, seq, prepared);
  const DeviceSelectArgs args{prepared.request->pq_args(/*luts=*/nullptr), query,
                              prepared.regions.n, descriptor, prepared.request->store};
  const DeviceStep* step = shared_.backend->device_step();
  if (step == nullptr || !step->select_to_device(args))
    fail(PQ_ERR_UNSUPPORTED, std::string("pq_decode_select_device: the ") +
                                 shared_.backend->name() + " backend has no device");
  device_select_finish(prepared, seq);
}

void Layer::select_multi_to_device(const pq_tensor& queries, int32_t rows,
                                   const pq_selection& out, const SequenceInfo& seq) {
  settle_device();
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t q = queries.tokens;
  int64_t needed = 0;
  multi_capacity(q, rows, nullptr, &needed);
  // The counts are device memory: the needed capacity is in the message only.
  if (out.capacity < needed)
    fail(PQ_ERR_BUFFER_TOO_SMALL, "out->capacity is " + str(out.capacity) +
                                      "; these rows need " + str(needed) +
                                      " entries each (see pq_selection_capacity_multi); nothing "
                                      "was written");
  // One token's select after another, as pq_decode_select_multi makes them:
  // prepared all first (the same length and index for every token).
  const int64_t per_token = capacity();
  const size_t n = static_cast<size_t>(q);
  std::vector<PreparedSelect> prepared(n);
  std::vector<pq_tensor> token_queries(n, queries);
  std::vector<pq_selection> unread(n, pq_selection{nullptr, nullptr, per_token});
  std::vector<DeviceSelectArgs> tokens;
  tokens.reserve(n);
  const int64_t token_bytes = queries.token_stride * static_cast<int64_t>(dtype_size(queries.dtype));
  for (size_t t = 0; t < n; ++t) {
    token_queries[t].data = static_cast<uint8_t*>(queries.data) + static_cast<int64_t>(t) * token_bytes;
    token_queries[t].tokens = 1;
    device_select_prepare(&unread[t], seq, prepared[t]);
    tokens.push_back(DeviceSelectArgs{prepared[t].request->pq_args(/*luts=*/nullptr),
                                      token_queries[t], prepared[t].regions.n, unread[t],
                                      prepared[t].request->store});
  }
  const DeviceStep* step = shared_.backend->device_step();
  if (step == nullptr || !step->select_multi_to_device(DeviceMultiSelectArgs{tokens, rows, per_token, out}))
    fail(PQ_ERR_UNSUPPORTED, std::string("pq_decode_select_multi_device: the ") +
                                 shared_.backend->name() + " backend has no device");
  for (size_t t = 0; t < n; ++t) device_select_finish(prepared[t], seq);
}

void Layer::device_select_prepare(pq_selection* out, const SequenceInfo& seq,
                                  PreparedSelect& prepared) {
  static const std::vector<float> no_host_queries;  // the LUT is built on the device
  select_prepare(no_host_queries, out, seq, prepared, /*host_out=*/false);
}

void Layer::device_select_finish(PreparedSelect& prepared, const SequenceInfo& seq) {
  const LayerSelection& r = *prepared.request;
  const bool scored = r.k > 0 && r.k < r.middle.size();
  // As the host path counts: the codes of the middle, and the key rows a
  // re-ranking reads.
  const int64_t wide = rerank_candidates(shared_.config.pq_rerank, r.k, r.middle.size());
  prepared.bytes = scored ? static_cast<uint64_t>(r.middle.size()) *
                                    r.index->codebook->subspaces * r.context.kv_heads() +
                                (wide > r.k ? static_cast<uint64_t>(wide) * r.context.kv_heads() *
                                                  store_->row_bytes()
                                            : 0)
                          : 0;
  select_finish(prepared, nullptr, seq);
}

void Layer::fetch_device_selection(const pq_selection& sel, const pq_tensor& out_keys,
                                   const pq_tensor& out_values, const SequenceInfo& seq) {
  settle_device();
  std::lock_guard<std::mutex> lock(mutex_);
  const DeviceStep* step = shared_.backend->device_step();
  if (step == nullptr ||
      !step->fetch_device_selection(device_fetch_args(sel, out_keys, out_values, seq)))
    fail(PQ_ERR_UNSUPPORTED, std::string("pq_fetch_kv_device: the ") + shared_.backend->name() +
                                 " backend has no device");
  count_device_fetch(sel, seq);
}

DeviceSelectionFetchArgs Layer::device_fetch_args(const pq_selection& sel,
                                                  const pq_tensor& out_keys,
                                                  const pq_tensor& out_values,
                                                  const SequenceInfo& seq) {
  require_prefill(seq.id, "pq_fetch_kv_device");
  require_kv(seq.id, "pq_fetch_kv_device");
  return DeviceSelectionFetchArgs{context(seq), *store_, sel, out_keys, out_values};
}

void Layer::count_device_fetch(const pq_selection& sel, const SequenceInfo& seq) {
  const uint64_t bytes = static_cast<uint64_t>(sel.capacity) * shared_.config.num_kv_heads *
                         store_->row_bytes() * 2;
  for (Counters* c : {&shared_.counters, seq.counters.get()}) {
    c->fetch_calls.fetch_add(1);
    // The counts are on the device: the bytes the outputs can hold.
    c->bytes_fetched.fetch_add(bytes);
  }
}

int64_t Layer::reserve(int64_t tokens, const SequenceInfo& seq) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  const pq_config& c = shared_.config;
  const Regions r = shared_.regions(tokens, layer_index_);
  if (const DeviceMemory* device = shared_.backend->device_memory()) {
    const DeviceMemory::ReserveArgs args{tokens,
                                         r.mid_end - r.sink_end,
                                         r.k,
                                         r.count(),
                                         c.num_q_heads / c.num_kv_heads,
                                         c.pq_subspaces,
                                         int32_t{1} << c.pq_bits,
                                         c.gqa_combine,
                                         seq.stream,
                                         rerank_candidates(c.pq_rerank, r.k, r.mid_end - r.sink_end)};
    device->reserve_layer(device_.get(), args);
  }
  // Store blocks for the chunks to come; an index-only tier's keys are not
  // in the backend's pool (and go once coded): none.
  if (store_->host_store() == nullptr) return 0;
  const int64_t chunks = (tokens + KvStore::kChunkTokens - 1) / KvStore::kChunkTokens;
  return 2 * std::max<int64_t>(0, chunks - static_cast<int64_t>(store_->chunk_count()));
}

void Layer::refresh_device_step(const SequenceInfo& seq) {
  const DeviceStep* step = shared_.backend->device_step();
  if (step == nullptr || !step->keeps_device_step(device_.get()) ||
      !shared_.selector->needs_index() || build_.index() == nullptr || awaiting_kv_)
    return;
  const Regions r = shared_.regions(store_->tokens(), layer_index_);
  code_tokens(r.mid_end);  // what the next select would code, now: a replay selects without it
  const PqIndex& index = *build_.index();
  const LayerContext c = context(seq);
  PqLayerSelectArgs args{c, *index.codebook};
  args.codes = index.codes.data();
  args.coded_tokens = index.coded_tokens;
  args.middle = {r.sink_end, r.mid_end};
  args.k = r.k;
  step->refresh_device_step(device_.get(), args, r.n, *store_, seq.stream);
}

}  // namespace pq
