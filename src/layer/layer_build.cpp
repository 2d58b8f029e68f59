// A layer's PQ index: the build on the worker pool (K-Means over every
// token, paper section 3.3), its installation, and the coding of the tokens
// that leave the local window.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "pq/kmeans.h"
#include "layer/layer.h"
#include "pq/nearest_centroid.h"
#include "pq/pq_tuple_select.h"

namespace pq {

void BuildTask::stop(ContextShared& shared) {
  std::shared_ptr<const KvStore::Snapshot> dropped;  // released after the lock
  std::lock_guard<std::mutex> lock(mutex_);
  if (cancel.exchange(true)) return;
  dropped = std::move(snapshot_);
  if (running_) {
    draining_ = true;
    shared.add_draining_build();
  }
}

std::shared_ptr<const KvStore::Snapshot> BuildTask::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  running_ = snapshot_ != nullptr;
  return std::move(snapshot_);
}

void BuildTask::end(ContextShared& shared) {
  bool was_draining;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = false;
    was_draining = draining_;
    draining_ = false;
  }
  if (was_draining) shared.remove_draining_build();
}

void Layer::cancel_build() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (pending_) pending_->stop(shared_);
}

void Layer::finish_build() {
  std::lock_guard<std::mutex> lock(mutex_);
  install_build();
}

void Layer::poll_build() {
  if (pending_ && pending_done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready)
    install_build();
}

// Waits for the pending build, if any, and installs its result. Throws the
// build's error.
void Layer::install_build() {
  if (!pending_) return;
  std::shared_ptr<BuildTask> task = std::move(pending_);
  std::future<void> done = std::move(pending_done_);
  pending_.reset();
  try {
    done.get();
  } catch (const Error& e) {
    build_error_ = e.what();
    throw;
  } catch (const std::bad_alloc&) {
    build_error_ = "the index build ran out of memory";
    fail(PQ_ERR_OUT_OF_MEMORY, build_error_);
  } catch (const std::exception& e) {
    build_error_ = std::string("the index build failed: ") + e.what();
    fail(PQ_ERR_INTERNAL, build_error_);
  }
  if (!task->result) {
    build_error_ = "the index build was cancelled";
    fail(PQ_ERR_BAD_STATE, build_error_);
  }
  index_ = std::move(task->result);
  ++index_generation_;
  build_error_.clear();
  last_iterations_ = index_->iterations;
  last_budget_ = index_->budget;
  last_build_seconds_ = index_->seconds;
  update_mirrors();
}

void Layer::require_index(uint64_t seq_id) {
  require_prefill(seq_id, "reading the index");
  install_build();
  if (!index_)
    fail(PQ_ERR_BAD_STATE, "layer " + std::to_string(layer_index_) + " of seq_id " +
                               std::to_string(seq_id) + " has no index: " +
                               (build_error_.empty() ? "no build finished" : build_error_) +
                               "; call pq_prefill_layer again to rebuild");
}

void Layer::schedule_build(const SequenceInfo& seq, int64_t tokens) {
  auto snapshot = std::make_shared<KvStore::Snapshot>(store_.snapshot());
  snapshot->tokens = tokens;
  snapshot->chunks.resize(static_cast<size_t>((tokens + KvStore::kChunkTokens - 1) /
                                              KvStore::kChunkTokens));
  auto task = std::make_shared<BuildTask>(std::move(snapshot));
  task->tokens = tokens;
  ContextShared& shared = shared_;
  const int32_t layer_index = layer_index_;
  std::shared_ptr<Counters> seq_counters = seq.counters;
  const uint64_t seq_id = seq.id;
  // Once the build's future is ready: the log and the caller's
  // notification (which may call into this layer: it waits on that future).
  auto after = [&shared, task, layer_index, seq_id] {
    report_build(shared, task->outcome, seq_id, layer_index);
  };
  std::future<void> done = shared_.submit(
      [&shared, task, layer_index, seq_counters] {
        // The snapshot keeps the layer's chunks and their share of the
        // memory limit: the task holds it while queued (a cancel drops it
        // there), this frame while the build runs, and it goes as soon as
        // the build ends, even when it throws (this callable outlives the
        // build in the future's shared state, so it must not hold it).
        struct Release {
          BuildTask& task;
          ContextShared& shared;
          std::shared_ptr<const KvStore::Snapshot> snapshot;
          ~Release() {
            snapshot.reset();
            task.end(shared);
          }
        } held{*task, shared, task->start()};
        BuildTask::Outcome& out = task->outcome;
        try {
          run_build(shared, *task, held.snapshot.get(), layer_index, *seq_counters);
        } catch (const Error& e) {
          out.status = e.status();
          out.error = e.what();
          throw;
        } catch (const std::bad_alloc&) {
          out.status = PQ_ERR_OUT_OF_MEMORY;
          out.error = "the index build ran out of memory";
          throw;
        } catch (const std::exception& e) {
          out.status = PQ_ERR_INTERNAL;
          out.error = e.what();
          throw;
        }
        if (const PqIndex* index = task->result.get()) {
          out.built = true;
          out.tokens = index->coded_tokens;
          out.iterations = index->iterations;
          out.budget = index->budget;
          out.seconds = index->seconds;
        }
      },
      std::move(after));
  // Only now, with the new build queued, is the old one superseded (it
  // covers fewer tokens): nothing below can fail.
  if (pending_) pending_->stop(shared_);
  pending_done_ = std::move(done);
  pending_ = std::move(task);
}

void Layer::report_build(const ContextShared& shared, const BuildTask::Outcome& out,
                         uint64_t seq_id, int32_t layer_index) {
  if (!out.built && out.status == PQ_OK) return;  // cancelled: nobody waits for it
  const std::string which =
      "seq_id " + std::to_string(seq_id) + " layer " + std::to_string(layer_index);
  if (out.built && shared.logs(PQ_LOG_INFO)) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.3f", out.seconds);
    shared.log(PQ_LOG_INFO, "index built: " + which + ", " + std::to_string(out.tokens) +
                                " tokens, " + std::to_string(out.iterations) + " of " +
                                std::to_string(out.budget) + " K-Means iterations, " + seconds +
                                " s");
  }
  if (!out.built) shared.log(PQ_LOG_WARN, "index build failed: " + which + ": " + out.error);
  if (shared.hooks.build_done)
    shared.hooks.build_done(shared.hooks.build_done_user, seq_id, layer_index,
                            out.built ? PQ_OK : out.status);
}

void Layer::run_build(ContextShared& shared, BuildTask& task, const KvStore::Snapshot* snapshot,
                      int32_t layer_index, Counters& seq_counters) {
  if (snapshot == nullptr || task.cancel.load()) {
    shared.counters.builds_cancelled.fetch_add(1);
    seq_counters.builds_cancelled.fetch_add(1);
    return;
  }
  const KvStore::Snapshot& snap = *snapshot;
  const pq_config& config = shared.config;
  const auto start = std::chrono::steady_clock::now();
  const int32_t dtype = config.dtype;
  const int32_t head_dim = config.head_dim;
  KeyGather gather = [&snap, dtype, head_dim](int32_t head, const int64_t* rows, int64_t count,
                                              float* out) {
    for (int64_t i = 0; i < count; ++i)
      to_float(snap.key_row(rows[i], head), dtype, head_dim, out + i * head_dim);
  };
  KMeansParams params;
  params.subspaces = config.pq_subspaces;
  params.bits = config.pq_bits;
  params.tolerance = config.kmeans_tolerance;
  params.init = config.kmeans_init;
  params.max_points_per_centroid = config.kmeans_max_points_per_centroid;
  params.seed = config.seed;
  params.layer = layer_index;
  const int64_t centroids = int64_t{1} << config.pq_bits;
  const int64_t training =
      std::min<int64_t>(snap.tokens, centroids * params.max_points_per_centroid);
  params.max_iterations = shared.iteration_budget(snap.tokens, training);

  auto index = std::make_unique<PqIndex>();
  auto codebook = std::make_shared<PqCodebook>();
  const KMeansReport report = train_codebook(config.num_kv_heads, head_dim, snap.tokens, gather,
                                             params, *shared.pool, &task.cancel, codebook.get());
  index->codebook = std::move(codebook);
  if (report.cancelled || task.cancel.load()) {
    shared.counters.builds_cancelled.fetch_add(1);
    seq_counters.builds_cancelled.fetch_add(1);
    return;
  }
  const int32_t m = config.pq_subspaces;
  index->codes.assign(static_cast<size_t>(config.num_kv_heads), CodeColumn(m));
  std::vector<uint8_t*> heads(index->codes.size());
  for (size_t h = 0; h < heads.size(); ++h) heads[h] = index->codes[h].grow(snap.tokens);
  index->codebook->encode(head_dim, 0, snap.tokens, gather, shared.pool.get(), heads.data());
  pq_index_count_tuples(*index, 0, snap.tokens);
  index->coded_tokens = snap.tokens;
  index->iterations = report.iterations;
  index->budget = params.max_iterations;
  index->training_points = report.training_points;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  index->seconds = ns * 1e-9;
  task.result = std::move(index);
  for (Counters* c : {&shared.counters, &seq_counters}) {
    c->builds_finished.fetch_add(1);
    c->kmeans_iterations.fetch_add(static_cast<uint64_t>(report.iterations));
    c->build_ns.fetch_add(static_cast<uint64_t>(ns));
  }
}

void Layer::code_tokens(int64_t end) {
  PqIndex& index = *index_;
  if (index.coded_tokens >= end) return;
  const int32_t dtype = shared_.config.dtype;
  const int32_t head_dim = shared_.config.head_dim;
  const KvStore& store = store_;
  KeyGather gather = [&store, dtype, head_dim](int32_t head, const int64_t* rows, int64_t count,
                                               float* out) {
    for (int64_t i = 0; i < count; ++i)
      to_float(store.key_row(rows[i], head), dtype, head_dim, out + i * head_dim);
  };
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
  index.coded_tokens = end;
  update_mirrors();
}

}  // namespace pq
