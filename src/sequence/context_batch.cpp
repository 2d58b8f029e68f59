// The calls over a batch of sequences at one layer (pq_decode_select_batch,
// pq_fetch_kv_batch): the per-sequence calls' checks item by item, then the
// items on the worker pool, each succeeding or failing on its own.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <unordered_set>

#include "backend/staging.h"
#include "base/call_args.h"
#include "sequence/batch_items.h"
#include "sequence/context.h"
#include "selectors/selector_capabilities.h"
#include "base/error.h"
#include "base/tensor.h"

namespace pq {

namespace {

// Locks every mutex, in no order the rest of the library must share: one
// is locked, the others tried, and on a busy one everything is let go and
// the next round starts by waiting for that one (no deadlock with a thread
// that holds one of them and waits for another).
class LockAll {
 public:
  explicit LockAll(const std::vector<std::mutex*>& mutexes) {
    for (std::mutex* m : mutexes) locks_.emplace_back(*m, std::defer_lock);
    size_t first = 0;
    while (!locks_.empty()) {
      locks_[first].lock();
      size_t busy = locks_.size();
      for (size_t i = 0; i < locks_.size() && busy == locks_.size(); ++i)
        if (i != first && !locks_[i].try_lock()) busy = i;
      if (busy == locks_.size()) return;
      for (auto& l : locks_)
        if (l.owns_lock()) l.unlock();
      first = busy;
      std::this_thread::yield();
    }
  }

 private:
  std::vector<std::unique_lock<std::mutex>> locks_;
};


}  // namespace

// Both batched calls read the caller's items once, into `local`, before any
// item runs: an item's outputs may then lie over another item's inputs (its
// selection, its query) without changing what that item was checked with.

void Context::decode_select_batch(int32_t layer, pq_select_item* items, int64_t count) {
  check_batch(items, count);
  check_layer(layer);
  const size_t n = static_cast<size_t>(count);
  const std::vector<pq_select_item> local(items, items + n);
  require_unique_ids(local.data(), count);
  const int32_t kv_heads = shared_.config.num_kv_heads;
  std::vector<Outcome> outcomes(n);
  std::vector<pq_tensor> queries(n);  // checked; read on each sequence's stream
  std::vector<pq_selection> outs(n);
  std::vector<OutputSpan> spans;
  spans.reserve(2 * n + 1);
  spans.push_back(items_span(items, count));
  for (size_t i = 0; i < n; ++i) {
    run_item(outcomes[i], [&] {
      require_not_saving(local[i].seq_id);
      queries[i] = select_args(&local[i].query, &local[i].out, &outs[i]);
    });
    if (outcomes[i].status != PQ_OK) continue;
    add_selection_spans(spans, outs[i], kv_heads, PQ_MEMORY_HOST, static_cast<int64_t>(i));
  }
  require_disjoint_items(spans);
  if (!select_batch_on_device(layer, local, queries, outs, outcomes))
    shared_.pool->parallel_for(count, [&](int64_t i) {
      Outcome& outcome = outcomes[static_cast<size_t>(i)];
      if (outcome.status != PQ_OK) return;
      run_item(outcome, [&] {
        std::shared_ptr<Sequence> seq = find(local[static_cast<size_t>(i)].seq_id);
        ScopedTimer timer(&shared_.counters.select_ns, &seq->counters->select_ns);
        seq->layers[static_cast<size_t>(layer)]->select(
            read_query(queries[static_cast<size_t>(i)], *seq), &outs[static_cast<size_t>(i)],
            seq->info());
      });
    });
  finish_batch(items, local, outcomes);
}

// The frame of a batch whose device work is one backend call: the items
// still OK are found; unless fewer than two are left or their sequences are
// on different streams (then false, nothing done), their layers are settled
// and locked together and run(items, layers, infos) does the work under the
// locks. Each sequence's `time` counter gets the whole batch's time (it
// waited that long), the context's once.
bool Context::run_batch_locked(int32_t layer, const std::vector<uint64_t>& ids,
                               std::vector<BatchOutcome>& outcomes,
                               std::atomic<uint64_t> Counters::*time, const BatchRun& run,
                               bool device_step) {
  std::vector<size_t> live;
  std::vector<std::shared_ptr<Sequence>> seqs(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (outcomes[i].status != PQ_OK) continue;
    run_item(outcomes[i], [&] { seqs[i] = find(ids[i]); });
    if (outcomes[i].status == PQ_OK) live.push_back(i);
  }
  if (live.size() < 2) return false;
  for (size_t i : live)
    if (seqs[i]->info().stream != seqs[live.front()]->info().stream) return false;
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::mutex*> mutexes;
  std::vector<size_t> settled;
  std::vector<Layer*> layers;
  std::vector<SequenceInfo> infos;
  for (size_t i : live) {
    Layer& l = *seqs[i]->layers[static_cast<size_t>(layer)];
    run_item(outcomes[i], [&] { device_step ? l.settle_device() : l.settle(); });
    if (outcomes[i].status != PQ_OK) continue;
    mutexes.push_back(&l.mutex());
    settled.push_back(i);
    layers.push_back(&l);
    infos.push_back(seqs[i]->info());
  }
  {
    LockAll lock(mutexes);
    run(settled, layers, infos);
  }
  const auto ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                            std::chrono::steady_clock::now() - started)
                                            .count());
  (shared_.counters.*time).fetch_add(ns);
  for (size_t i : live) (seqs[i]->counters.get()->*time).fetch_add(ns);
  return true;
}

// The batch's middles chosen in one device call (PQ on the CUDA backend):
// every item prepared, the selector's select_layers over all of them, then
// each finished. Not taken (false) for a selector or backend without such a
// call, or where run_batch_locked declines: the items then run on the pool
// one by one.
bool Context::select_batch_on_device(int32_t layer, const std::vector<pq_select_item>& local,
                                     const std::vector<pq_tensor>& queries,
                                     std::vector<pq_selection>& outs,
                                     std::vector<Outcome>& outcomes) {
  const BatchSelection* batch = shared_.selector->batch_selection();
  if (batch == nullptr || shared_.backend->device_kernels() == nullptr) return false;
  std::vector<uint64_t> ids;
  for (const pq_select_item& item : local) ids.push_back(item.seq_id);
  return run_batch_locked(layer, ids, outcomes, &Counters::select_ns,
                          [&](const std::vector<size_t>& items, const std::vector<Layer*>& layers,
                              const std::vector<SequenceInfo>& infos) {
    // The device queries come over in one read with one wait (on the one
    // stream of the batch), then become floats item by item.
    const pq_config& c = shared_.config;
    std::vector<StagedTensor> staged;
    std::vector<Backend::HostRead> reads;
    for (size_t i : items) {
      staged.push_back(staging_for(queries[i]));
      if (!staged.back().buffer.empty())
        reads.push_back({staged.back().buffer.data(), queries[i].data, staged.back().buffer.size()});
    }
    Outcome read;
    run_item(read, [&] { shared_.backend->read_to_host(reads, infos.front().stream); });
    std::vector<std::vector<float>> floats(items.size());
    std::vector<Layer::PreparedSelect> prepared(items.size());
    std::vector<size_t> ready;  // indices into items
    for (size_t j = 0; j < items.size(); ++j) {
      const size_t i = items[j];
      if (read.status != PQ_OK) {
        outcomes[i] = read;
        continue;
      }
      run_item(outcomes[i], [&] {
        floats[j] = query_floats(staged[j].view, c.num_q_heads, c.head_dim, queries[i].dtype);
        layers[j]->select_prepare(floats[j], &outs[i], infos[j], prepared[j]);
      });
      if (outcomes[i].status == PQ_OK) ready.push_back(j);
    }
    std::vector<const LayerSelection*> requests;
    std::vector<int32_t*> middles;
    for (size_t j : ready) {
      requests.push_back(&*prepared[j].request);
      middles.push_back(prepared[j].middle.data());
    }
    std::vector<uint64_t> bytes;
    Outcome chosen;
    run_item(chosen, [&] { batch->select_layers(requests, middles, bytes); });
    for (size_t r = 0; r < ready.size(); ++r) {
      const size_t j = ready[r], i = items[j];
      if (chosen.status != PQ_OK) {  // the one device call failed: every item with it
        outcomes[i] = chosen;
        continue;
      }
      prepared[j].bytes = bytes[r];
      run_item(outcomes[i], [&] { layers[j]->select_finish(prepared[j], &outs[i], infos[j]); });
    }
  });
}

void Context::fetch_batch(int32_t layer, pq_fetch_item* items, int64_t count) {
  require_kv_kept();
  check_batch(items, count);
  check_layer(layer);
  const size_t n = static_cast<size_t>(count);
  const std::vector<pq_fetch_item> local(items, items + n);
  require_unique_ids(local.data(), count);
  std::vector<Outcome> outcomes(n);
  std::vector<FetchArgs> args(n);
  std::vector<OutputSpan> spans;
  spans.reserve(2 * n + 1);
  spans.push_back(items_span(items, count));
  for (size_t i = 0; i < n; ++i) {
    const pq_fetch_item& item = local[i];
    run_item(outcomes[i], [&] {
      require_not_saving(item.seq_id);
      args[i] = fetch_args(&item.selection, &item.out_keys, &item.out_values);
    });
    if (outcomes[i].status != PQ_OK) continue;
    add_output_spans(spans, args[i].keys, args[i].values, static_cast<int64_t>(i));  // checked to fit
  }
  require_disjoint_items(spans);
  if (!fetch_batch_on_device(layer, local, args, outcomes))
    shared_.pool->parallel_for(count, [&](int64_t i) {
      Outcome& outcome = outcomes[static_cast<size_t>(i)];
      if (outcome.status != PQ_OK) return;
      const FetchArgs& a = args[static_cast<size_t>(i)];
      run_item(outcome, [&] {
        std::shared_ptr<Sequence> seq = find(local[static_cast<size_t>(i)].seq_id);
        ScopedTimer timer(&shared_.counters.fetch_ns, &seq->counters->fetch_ns);
        seq->layers[static_cast<size_t>(layer)]->fetch(&a.selection.view, a.selection.max_count,
                                                       a.keys, a.values, seq->info());
      });
    });
  finish_batch(items, local, outcomes);
}

// The batch's device fetches in one gather launch: every item prepared, one
// backend call over them, then each finished. Not taken (false) on a backend
// without such a call, for host outputs, or where run_batch_locked declines.
bool Context::fetch_batch_on_device(int32_t layer, const std::vector<pq_fetch_item>& local,
                                    const std::vector<FetchArgs>& args,
                                    std::vector<Outcome>& outcomes) {
  const DeviceKernels* device = shared_.backend->device_kernels();
  if (device == nullptr) return false;
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < local.size(); ++i) {
    if (outcomes[i].status == PQ_OK &&
        (args[i].keys.memory != PQ_MEMORY_DEVICE || args[i].values.memory != PQ_MEMORY_DEVICE))
      return false;
    ids.push_back(local[i].seq_id);
  }
  return run_batch_locked(layer, ids, outcomes, &Counters::fetch_ns,
                          [&](const std::vector<size_t>& items, const std::vector<Layer*>& layers,
                              const std::vector<SequenceInfo>& infos) {
    std::vector<Layer::PreparedFetch> prepared(items.size());
    std::vector<size_t> ready;  // indices into items
    std::vector<DeviceFetchArgs> device_items;
    for (size_t j = 0; j < items.size(); ++j) {
      const size_t i = items[j];
      const FetchArgs& a = args[i];
      run_item(outcomes[i], [&] {
        layers[j]->fetch_prepare(&a.selection.view, a.selection.max_count, a.keys, a.values,
                                 infos[j], prepared[j]);
      });
      if (outcomes[i].status != PQ_OK) continue;
      ready.push_back(j);
      device_items.push_back(*prepared[j].device_args);
    }
    Outcome gathered;
    bool on_device = false;
    run_item(gathered, [&] { on_device = device->fetch_batch_to_device(device_items); });
    for (size_t j : ready) {
      const size_t i = items[j];
      if (gathered.status != PQ_OK) {  // the one launch failed: every item with it
        outcomes[i] = gathered;
        continue;
      }
      run_item(outcomes[i], [&] { layers[j]->fetch_finish(prepared[j], on_device, infos[j]); });
    }
  });
}

}  // namespace pq
