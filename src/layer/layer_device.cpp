// A layer's decode step kept on the device (pq_decode_select_device,
// pq_fetch_kv_device): the checks and the bookkeeping of pq_decode_select
// and pq_fetch_kv, with the selection itself written and read by the
// backend's device on the sequence's stream.
#include <string>

#include "base/error.h"
#include "layer/layer.h"

namespace pq {

void Layer::select_to_device(const pq_tensor& query, const pq_selection& out,
                             const SequenceInfo& seq) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  PreparedSelect prepared;
  const std::vector<float> no_host_queries;  // the LUT is built on the device
  pq_selection descriptor = out;
  select_prepare(no_host_queries, &descriptor, seq, prepared, /*host_out=*/false);
  const LayerSelection& r = *prepared.request;
  const Regions& regions = prepared.regions;
  const bool scored = r.k > 0 && r.k < r.middle.size();
  const DeviceSelectArgs args{r.pq_args(/*luts=*/nullptr), query, regions.n, descriptor};
  if (!shared_.backend->select_to_device(args))
    fail(PQ_ERR_UNSUPPORTED, std::string("pq_decode_select_device: the ") +
                                 shared_.backend->name() + " backend has no device");
  prepared.bytes = scored ? static_cast<uint64_t>(r.middle.size()) *
                                r.index->codebook->subspaces * r.context.kv_heads()
                          : 0;
  select_finish(prepared, nullptr, seq);
}

void Layer::fetch_device_selection(const pq_selection& sel, const pq_tensor& out_keys,
                                   const pq_tensor& out_values, const SequenceInfo& seq) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  require_prefill(seq.id, "pq_fetch_kv_device");
  require_kv(seq.id, "pq_fetch_kv_device");
  if (!shared_.backend->fetch_device_selection(
          DeviceSelectionFetchArgs{context(seq), store_, sel, out_keys, out_values}))
    fail(PQ_ERR_UNSUPPORTED, std::string("pq_fetch_kv_device: the ") + shared_.backend->name() +
                                 " backend has no device");
  const uint64_t bytes = static_cast<uint64_t>(sel.capacity) * shared_.config.num_kv_heads *
                         store_.row_bytes() * 2;
  for (Counters* c : {&shared_.counters, seq.counters.get()}) {
    c->fetch_calls.fetch_add(1);
    // The counts are on the device: the bytes the outputs can hold.
    c->bytes_fetched.fetch_add(bytes);
  }
}

}  // namespace pq
