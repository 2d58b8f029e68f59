// IndexBuild (index_build.h): a layer's build on the worker pool (K-Means
// over every token, paper section 3.3), its report and its installation.
#include "layer/index_build.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "pq/kmeans.h"
#include "pq/pq_tuple_select.h"

namespace pq {
namespace {

// Tokens coded between two calls of the build_progress hook.
constexpr int64_t kProgressTokens = 65536;

// A build's calls of the build_progress hook (pq_build_progress): the
// fraction weighs K-Means by iteration budget x training points and the
// encode by tokens, the vectors each compares with every centroid.
class BuildProgress {
 public:
  BuildProgress(const Hooks& hooks, uint64_t seq_id, int32_t layer, int32_t budget,
                int64_t training, int64_t tokens)
      : hooks_(hooks),
        seq_id_(seq_id),
        layer_(layer),
        budget_(budget),
        kmeans_work_(static_cast<double>(budget) * static_cast<double>(training)),
        training_(static_cast<double>(training)),
        tokens_(tokens) {}

  void kmeans(int32_t iterations) const {
    call(PQ_BUILD_STAGE_KMEANS, iterations, budget_, iterations * training_);
  }
  void encoded(int64_t tokens) const {
    call(PQ_BUILD_STAGE_ENCODE, tokens, tokens_, kmeans_work_ + static_cast<double>(tokens));
  }

 private:
  void call(int32_t stage, int64_t done, int64_t total, double work) const {
    if (hooks_.build_progress == nullptr) return;
    pq_build_progress p{};
    p.struct_size = sizeof p;
    p.seq_id = seq_id_;
    p.layer = layer_;
    p.stage = stage;
    p.done = done;
    p.total = total;
    const double all = kmeans_work_ + static_cast<double>(tokens_);
    p.fraction = all > 0 ? std::min(1.0, work / all) : 1.0;
    hooks_.build_progress(hooks_.build_progress_user, &p);
  }

  const Hooks& hooks_;
  const uint64_t seq_id_;
  const int32_t layer_;
  const int32_t budget_;
  const double kmeans_work_;
  const double training_;
  const int64_t tokens_;
};

}  // namespace


void BuildTask::stop(ContextShared& shared) {
  std::shared_ptr<const KeySnapshot> dropped;  // released after the lock
  std::lock_guard<std::mutex> lock(mutex_);
  if (cancel.exchange(true)) return;
  dropped = std::move(snapshot_);
  if (running_) {
    draining_ = true;
    shared.add_draining_build();
  }
}

std::shared_ptr<const KeySnapshot> BuildTask::start() {
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

void IndexBuild::cancel() {
  if (pending_) pending_->stop(shared_);
}

void IndexBuild::forget() {
  cancel();
  pending_.reset();
  pending_done_ = std::future<void>();
}

bool IndexBuild::poll() {
  return pending_ &&
         pending_done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready &&
         install();
}

bool IndexBuild::install() {
  if (!pending_) return false;
  std::shared_ptr<BuildTask> task = std::move(pending_);
  std::future<void> done = std::move(pending_done_);
  pending_.reset();
  try {
    done.get();
  } catch (const Error& e) {
    facts_.error = e.what();
    throw;
  } catch (const std::bad_alloc&) {
    facts_.error = "the index build ran out of memory";
    fail(PQ_ERR_OUT_OF_MEMORY, facts_.error);
  } catch (const std::exception& e) {
    facts_.error = std::string("the index build failed: ") + e.what();
    fail(PQ_ERR_INTERNAL, facts_.error);
  }
  if (!task->result) {
    facts_.error = "the index build was cancelled";
    fail(PQ_ERR_BAD_STATE, facts_.error);
  }
  index_ = std::move(task->result);
  ++generation_;
  facts_ = Facts{"", index_->iterations, index_->budget, index_->seconds};
  return true;
}

void IndexBuild::set(std::unique_ptr<PqIndex> index, Facts facts) {
  index_ = std::move(index);
  ++generation_;
  facts_ = std::move(facts);
}

void IndexBuild::schedule(const KvTier& store, int64_t tokens, const SequenceInfo& seq) {
  auto task = std::make_shared<BuildTask>(store.snapshot(tokens));
  task->tokens = tokens;
  ContextShared& shared = shared_;
  const int32_t layer_index = layer_index_;
  std::shared_ptr<Counters> seq_counters = seq.counters;
  const uint64_t seq_id = seq.id;
  // Once the build's future is ready: the log and the caller's
  // notification (which may call into this layer: it waits on that future).
  auto after = [&shared, task, layer_index, seq_id] {
    report(shared, task->outcome, seq_id, layer_index);
  };
  std::future<void> done = shared_.submit(
      [&shared, task, seq_id, layer_index, seq_counters] {
        // The snapshot keeps the layer's chunks and their share of the
        // memory limit: the task holds it while queued (a cancel drops it
        // there), this frame while the build runs, and it goes as soon as
        // the build ends, even when it throws (this callable outlives the
        // build in the future's shared state, so it must not hold it).
        struct Release {
          BuildTask& task;
          ContextShared& shared;
          std::shared_ptr<const KeySnapshot> snapshot;
          ~Release() {
            snapshot.reset();
            task.end(shared);
          }
        } held{*task, shared, task->start()};
        BuildTask::Outcome& out = task->outcome;
        try {
          run(shared, *task, held.snapshot.get(), seq_id, layer_index, *seq_counters);
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

void IndexBuild::report(const ContextShared& shared, const BuildTask::Outcome& out,
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

void IndexBuild::run(ContextShared& shared, BuildTask& task, const KeySnapshot* snapshot,
                      uint64_t seq_id, int32_t layer_index, Counters& seq_counters) {
  // A build stopped before its end: counted, and nothing installed.
  const auto cancelled = [&shared, &seq_counters] {
    shared.counters.builds_cancelled.fetch_add(1);
    seq_counters.builds_cancelled.fetch_add(1);
  };
  if (snapshot == nullptr || task.cancel.load()) return cancelled();
  const KeySnapshot& snap = *snapshot;
  const pq_config& config = shared.config;
  const int32_t head_dim = config.head_dim;
  const auto start = std::chrono::steady_clock::now();
  KeyGather gather = [&snap](int32_t head, const int64_t* rows, int64_t count, float* out) {
    snap.keys_as_float(head, rows, count, out);
  };
  KMeansParams params;
  params.subspaces = config.pq_subspaces;
  params.bits = config.pq_bits;
  params.tolerance = config.kmeans_tolerance;
  params.init = config.kmeans_init;
  params.max_points_per_centroid = config.kmeans_max_points_per_centroid;
  params.seed = config.seed;
  params.layer = layer_index;
  params.head_offset = config.kv_head_offset;
  params.first_token = config.sink_tokens;
  params.dim_order = rotary_dim_order(head_dim, config.key_rotary);
  const int64_t centroids = int64_t{1} << config.pq_bits;
  const int64_t training =
      std::min<int64_t>(snap.tokens(), centroids * params.max_points_per_centroid);
  params.max_iterations = shared.iteration_budget(snap.tokens(), training);
  const BuildProgress progress(shared.hooks, seq_id, layer_index, params.max_iterations, training,
                               snap.tokens());
  params.on_iteration = [&progress](int32_t iterations) { progress.kmeans(iterations); };

  auto index = std::make_unique<PqIndex>();
  auto codebook = std::make_shared<PqCodebook>();
  const KMeansReport report = train_codebook(config.num_kv_heads, head_dim, snap.tokens(), gather,
                                             params, *shared.pool, &task.cancel, codebook.get());
  index->codebook = std::move(codebook);
  if (report.cancelled || task.cancel.load()) return cancelled();
  const int32_t m = config.pq_subspaces;
  index->codes.assign(static_cast<size_t>(config.num_kv_heads), CodeColumn(m));
  std::vector<uint8_t*> heads(index->codes.size());
  for (size_t h = 0; h < heads.size(); ++h) heads[h] = index->codes[h].grow(snap.tokens());
  // In slices, so that the progress hook hears of a long prompt's encode
  // and a cancelled build stops within one slice.
  std::vector<uint8_t*> slice_heads(heads.size());
  for (int64_t first = 0; first < snap.tokens(); first += kProgressTokens) {
    if (task.cancel.load()) return cancelled();
    const int64_t count = std::min(kProgressTokens, snap.tokens() - first);
    for (size_t h = 0; h < heads.size(); ++h) slice_heads[h] = heads[h] + first * m;
    index->codebook->encode(head_dim, first, count, gather, shared.pool.get(),
                            slice_heads.data());
    progress.encoded(first + count);
  }
  pq_index_count_tuples(*index, 0, snap.tokens());
  index->coded_tokens = snap.tokens();
  if (config.pq_outliers > 0.f)
    find_outliers(*index, head_dim, config.sink_tokens, config.pq_outliers, gather,
                  shared.pool.get());
  index->built_tokens = snap.tokens();
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

}  // namespace pq
