// The context's calls of a decode step kept on the device
// (pq_decode_select_device, pq_fetch_kv_device): the checks that need no
// layer, on copies of the descriptors; the selection's arrays are device
// memory, so only their addresses are checked here, never their contents.
#include <optional>
#include <string>
#include <vector>

#include "base/call_args.h"
#include "sequence/context.h"
#include "base/error.h"
#include "base/tensor.h"
#include "pq/rerank.h"
#include "sequence/batch_items.h"

namespace pq {

namespace {

// A device selection's descriptor, read once: capacity >= 0, arrays given,
// positions and counts apart.
pq_selection device_selection(const pq_selection* sel, const char* name, int32_t kv_heads) {
  if (sel == nullptr) invalid(std::string(name) + " is NULL");
  const pq_selection copy = *sel;
  if (copy.capacity < 0)
    invalid(std::string(name) + "->capacity is " + str(copy.capacity) + "; expected >= 0");
  if (copy.positions == nullptr && copy.capacity > 0) invalid(std::string(name) + "->positions is NULL");
  if (copy.counts == nullptr) invalid(std::string(name) + "->counts is NULL");
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(copy.capacity),
                             static_cast<uint64_t>(kv_heads) * sizeof(int32_t), &bytes) ||
      reinterpret_cast<uintptr_t>(copy.positions) > UINTPTR_MAX - bytes)
    invalid(std::string(name) + "->capacity is " + str(copy.capacity) +
            "; num_kv_heads x capacity positions overflow the address space");
  require_apart(copy.positions, bytes, (std::string(name) + "->positions").c_str(), copy.counts,
                static_cast<uint64_t>(kv_heads) * sizeof(int32_t),
                (std::string(name) + "->counts").c_str());
  return copy;
}

}  // namespace

void Context::require_device_step(const char* call, const pq_tensor& t, const char* name) const {
  if (shared_.backend->device_step() == nullptr)
    fail(PQ_ERR_UNSUPPORTED, std::string(call) + " needs the CUDA backend; this context runs on the " +
                                 shared_.backend->name() + " backend (use the host-positions call)");
  if (t.memory != PQ_MEMORY_DEVICE)
    fail(PQ_ERR_UNSUPPORTED, std::string(call) + ": " + name +
                                 ".memory is PQ_MEMORY_HOST; this call reads and writes device "
                                 "memory only");
}

void Context::decode_select_device(uint64_t id, int32_t layer, const pq_tensor* query_arg,
                                   pq_selection* out) {
  check_layer(layer);
  pq_selection sel;
  const pq_tensor query = device_select_checks(query_arg, out, &sel);
  std::shared_ptr<Sequence> seq = find(id);
  ScopedTimer timer(&shared_.counters.select_ns, &seq->counters->select_ns);
  seq->layers[static_cast<size_t>(layer)]->select_to_device(query, sel, seq->info());
}

pq_tensor Context::device_select_checks(const pq_tensor* query_arg, const pq_selection* out,
                                        pq_selection* sel) const {
  const pq_config& c = shared_.config;
  const pq_tensor query = copy_descriptor(query_arg, "query");
  validate_tensor(&query,
                  {"query", c.num_q_heads, c.head_dim, query_dtype(c.dtype, query, "query"), 1, 1});
  *sel = device_selection(out, "out", c.num_kv_heads);
  require_device_step("pq_decode_select_device", query, "query");
  if (!shared_.selector->needs_index())
    fail(PQ_ERR_UNSUPPORTED, std::string("pq_decode_select_device chooses on the device with the "
                                         "PQ selector only; this context's selector is ") +
                                 shared_.selector->name());
  if (c.kv_tier == PQ_KV_TIER_CALLER && c.pq_rerank > 0.f)
    fail(PQ_ERR_UNSUPPORTED, "pq_decode_select_device: " + index_only_rerank_refusal());
  if (c.pq_outliers > 0.f)
    fail(PQ_ERR_UNSUPPORTED,
         "pq_decode_select_device: config.pq_outliers is " + number_text(c.pq_outliers) +
             "; outliers are scored exactly on the host (use pq_decode_select, or set "
             "pq_outliers to 0)");
  if (c.top_p > 0.f)
    fail(PQ_ERR_UNSUPPORTED, "pq_decode_select_device: config.top_p is " + number_text(c.top_p) +
                                 "; top-p budgets are chosen on the host (use pq_decode_select, "
                                 "or set top_p to 0)");
  return query;
}

void Context::fetch_kv_device(uint64_t id, int32_t layer, const pq_selection* selection,
                              const pq_tensor* out_keys, const pq_tensor* out_values) {
  require_kv_kept();
  check_layer(layer);
  pq_selection sel;
  pq_tensor keys, values;
  device_fetch_checks(selection, out_keys, out_values, &sel, &keys, &values);
  std::shared_ptr<Sequence> seq = find(id);
  ScopedTimer timer(&shared_.counters.fetch_ns, &seq->counters->fetch_ns);
  seq->layers[static_cast<size_t>(layer)]->fetch_device_selection(sel, keys, values, seq->info());
}

void Context::device_fetch_checks(const pq_selection* selection, const pq_tensor* out_keys,
                                  const pq_tensor* out_values, pq_selection* sel, pq_tensor* keys,
                                  pq_tensor* values) const {
  const pq_config& c = shared_.config;
  *sel = device_selection(selection, "selection", c.num_kv_heads);
  *keys = copy_descriptor(out_keys, "out_keys");
  *values = copy_descriptor(out_values, "out_values");
  // The counts are on the device: the outputs must hold a whole capacity.
  validate_tensor(keys, {"out_keys", c.num_kv_heads, c.head_dim, c.dtype, sel->capacity, -1});
  validate_tensor(values, {"out_values", c.num_kv_heads, c.head_dim, c.dtype, sel->capacity, -1});
  require_device_step("pq_fetch_kv_device", *keys, "out_keys");
  require_device_step("pq_fetch_kv_device", *values, "out_values");
  require_disjoint_rows(*keys, "out_keys");
  require_disjoint_rows(*values, "out_values");
  require_disjoint_outputs(*keys, "out_keys", *values, "out_values");
}

// The batched calls: every item checked as its per-sequence call checks it;
// then, when the items share a stream (run_batch_locked), every layer
// prepared under its lock and the backend's one launch chain over them all;
// else, or where the backend declines, the items one by one. Items run as
// one launch chain, so no two may write the same device bytes: outputs of
// two items that overlap are PQ_ERR_INVALID_ARGUMENT before any item runs,
// as in pq_decode_select_batch (addresses only: the host never reads them).

void Context::decode_select_device_batch(int32_t layer, pq_select_item* items, int64_t count) {
  check_batch(items, count);
  check_layer(layer);
  const size_t n = static_cast<size_t>(count);
  const std::vector<pq_select_item> local(items, items + n);
  require_unique_ids(local.data(), count);
  std::vector<BatchOutcome> outcomes(n);
  std::vector<pq_tensor> queries(n);
  std::vector<pq_selection> sels(n);
  std::vector<uint64_t> ids(n);
  const int32_t kv_heads = shared_.config.num_kv_heads;
  std::vector<OutputSpan> spans;
  for (size_t i = 0; i < n; ++i) {
    ids[i] = local[i].seq_id;
    run_item(outcomes[i], [&] {
      require_not_saving(local[i].seq_id);
      queries[i] = device_select_checks(&local[i].query, &local[i].out, &sels[i]);
    });
    if (outcomes[i].status != PQ_OK) continue;
    add_selection_spans(spans, sels[i], kv_heads, PQ_MEMORY_DEVICE, static_cast<int64_t>(i));
  }
  require_disjoint_items(spans);
  const bool batched = run_batch_locked(
      layer, ids, outcomes, &Counters::select_ns,
      [&](const std::vector<size_t>& live, const std::vector<Layer*>& layers,
          const std::vector<SequenceInfo>& infos) {
        std::vector<Layer::PreparedSelect> prepared(live.size());
        std::vector<std::optional<DeviceSelectArgs>> args(live.size());
        std::vector<size_t> ready;  // indices into live
        for (size_t j = 0; j < live.size(); ++j) {
          const size_t i = live[j];
          run_item(outcomes[i], [&] {
            layers[j]->device_select_prepare(&sels[i], infos[j], prepared[j]);
            args[j].emplace(DeviceSelectArgs{prepared[j].request->pq_args(nullptr), queries[i],
                                             prepared[j].regions.n, sels[i],
                                             prepared[j].request->store});
          });
          if (outcomes[i].status == PQ_OK) ready.push_back(j);
        }
        std::vector<const DeviceSelectArgs*> chain;
        for (size_t j : ready) chain.push_back(&*args[j]);
        BatchOutcome chosen;
        bool one_chain = false;
        const DeviceStep* step = shared_.backend->device_step();
        run_item(chosen, [&] { one_chain = step && step->select_batch_to_device(chain); });
        for (size_t j : ready) {
          const size_t i = live[j];
          if (chosen.status != PQ_OK) {  // the one launch chain failed: every item with it
            outcomes[i] = chosen;
            continue;
          }
          run_item(outcomes[i], [&] {
            if (!one_chain && !(step && step->select_to_device(*args[j])))
              fail(PQ_ERR_UNSUPPORTED, std::string("pq_decode_select_device_batch: the ") +
                                           shared_.backend->name() + " backend has no device");
            layers[j]->device_select_finish(prepared[j], infos[j]);
          });
        }
      },
      /*device_step=*/true);
  if (!batched)
    for (size_t i = 0; i < n; ++i) {
      if (outcomes[i].status != PQ_OK) continue;
      run_item(outcomes[i], [&] {
        std::shared_ptr<Sequence> seq = find(ids[i]);
        ScopedTimer timer(&shared_.counters.select_ns, &seq->counters->select_ns);
        seq->layers[static_cast<size_t>(layer)]->select_to_device(queries[i], sels[i], seq->info());
      });
    }
  finish_batch(items, local, outcomes);
}

void Context::fetch_kv_device_batch(int32_t layer, pq_fetch_item* items, int64_t count) {
  require_kv_kept();
  check_batch(items, count);
  check_layer(layer);
  const size_t n = static_cast<size_t>(count);
  const std::vector<pq_fetch_item> local(items, items + n);
  require_unique_ids(local.data(), count);
  std::vector<BatchOutcome> outcomes(n);
  std::vector<pq_selection> sels(n);
  std::vector<pq_tensor> keys(n), values(n);
  std::vector<uint64_t> ids(n);
  std::vector<OutputSpan> spans;
  for (size_t i = 0; i < n; ++i) {
    ids[i] = local[i].seq_id;
    run_item(outcomes[i], [&] {
      require_not_saving(local[i].seq_id);
      device_fetch_checks(&local[i].selection, &local[i].out_keys, &local[i].out_values, &sels[i],
                          &keys[i], &values[i]);
    });
    if (outcomes[i].status != PQ_OK) continue;
    add_output_spans(spans, keys[i], values[i], static_cast<int64_t>(i));  // checked to fit
  }
  require_disjoint_items(spans);
  const bool batched = run_batch_locked(
      layer, ids, outcomes, &Counters::fetch_ns,
      [&](const std::vector<size_t>& live, const std::vector<Layer*>& layers,
          const std::vector<SequenceInfo>& infos) {
        std::vector<std::optional<DeviceSelectionFetchArgs>> args(live.size());
        std::vector<size_t> ready;
        for (size_t j = 0; j < live.size(); ++j) {
          const size_t i = live[j];
          run_item(outcomes[i], [&] {
            args[j].emplace(layers[j]->device_fetch_args(sels[i], keys[i], values[i], infos[j]));
          });
          if (outcomes[i].status == PQ_OK) ready.push_back(j);
        }
        std::vector<const DeviceSelectionFetchArgs*> chain;
        for (size_t j : ready) chain.push_back(&*args[j]);
        BatchOutcome gathered;
        bool one_launch = false;
        const DeviceStep* step = shared_.backend->device_step();
        run_item(gathered, [&] { one_launch = step && step->fetch_batch_device_selection(chain); });
        for (size_t j : ready) {
          const size_t i = live[j];
          if (gathered.status != PQ_OK) {
            outcomes[i] = gathered;
            continue;
          }
          run_item(outcomes[i], [&] {
            if (!one_launch && !(step && step->fetch_device_selection(*args[j])))
              fail(PQ_ERR_UNSUPPORTED, std::string("pq_fetch_kv_device_batch: the ") +
                                           shared_.backend->name() + " backend has no device");
            layers[j]->count_device_fetch(sels[i], infos[j]);
          });
        }
      },
      /*device_step=*/true);
  if (!batched)
    for (size_t i = 0; i < n; ++i) {
      if (outcomes[i].status != PQ_OK) continue;
      run_item(outcomes[i], [&] {
        std::shared_ptr<Sequence> seq = find(ids[i]);
        ScopedTimer timer(&shared_.counters.fetch_ns, &seq->counters->fetch_ns);
        seq->layers[static_cast<size_t>(layer)]->fetch_device_selection(sels[i], keys[i], values[i],
                                                                        seq->info());
      });
    }
  finish_batch(items, local, outcomes);
}

}  // namespace pq
