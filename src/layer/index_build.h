// A layer's PQ index and the build that makes it (paper section 3.3): the
// build runs on the worker pool over a snapshot of the store, the K-Means
// iteration budget keeping it hidden behind the caller's compute, and is
// installed when the next call on the layer finds it finished. The layer
// owns one and calls it under its own lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/counters.h"
#include "layer/context_shared.h"
#include "pq/pq_index.h"
#include "store/kv_tier.h"

namespace pq {

class Layer;

// What a call on a layer knows of its sequence.
struct SequenceInfo {
  uint64_t id;
  std::shared_ptr<Counters> counters;  // shared: a build may outlive the sequence
  void* stream;                        // the caller's cudaStream_t, or null
  // All the sequence's layers, for a selector that reads across them
  // (CrossLayerShares, selectors/selector_capabilities.h); valid for the
  // call only, never kept.
  const std::vector<std::unique_ptr<Layer>>* layers = nullptr;
};

// What a build shares with the layer. The future is kept beside it, not in
// it: libstdc++ stores the packaged callable (which owns this object) in the
// future's shared state, so holding the future here would be a cycle.
struct BuildTask {
  explicit BuildTask(std::shared_ptr<const KeySnapshot> snapshot)
      : snapshot_(std::move(snapshot)) {}

  // Cancels the build. A build still queued lets go of its snapshot of the
  // K/V at once, so a removed sequence's memory leaves the limit with the
  // remove, not when a worker reaches the build; a running build stops at
  // its next iteration and is counted in `shared` (ContextShared's
  // draining builds, which pq_wait_builds waits for) until it let go.
  void stop(ContextShared& shared);
  // The worker's start: the snapshot it then holds, or null when the build
  // was cancelled before it started.
  std::shared_ptr<const KeySnapshot> start();
  // The worker's end, once it let go of the snapshot.
  void end(ContextShared& shared);

  std::atomic<bool> cancel{false};  // read by K-Means between iterations
  std::unique_ptr<PqIndex> result;  // set by the task when it finished
  // What the build's report (log, build_done hook) says, written by the
  // worker before the future is ready; the layer may take `result` away
  // from then on, so the report reads only these.
  struct Outcome {
    bool built = false;
    pq_status status = PQ_OK;  // the error, when it failed
    std::string error;
    int64_t tokens = 0;
    int32_t iterations = 0, budget = 0;
    double seconds = 0.0;
  } outcome;
  int64_t tokens = 0;

 private:
  std::mutex mutex_;  // over the three below
  std::shared_ptr<const KeySnapshot> snapshot_;  // until start() or stop()
  bool running_ = false;
  bool draining_ = false;  // stopped while running: counted in ContextShared
};

// The index of one (sequence, layer) and its build in flight.
class IndexBuild {
 public:
  // What the last finished build was (restored and forked states carry it).
  struct Facts {
    std::string error;  // why the last build failed, if it did
    int32_t iterations = 0;
    int32_t budget = 0;
    double seconds = 0.0;
  };

  IndexBuild(ContextShared& shared, int32_t layer_index)
      : shared_(shared), layer_index_(layer_index) {}
  ~IndexBuild() { cancel(); }
  IndexBuild(const IndexBuild&) = delete;
  IndexBuild& operator=(const IndexBuild&) = delete;

  // Queues a build over the first `tokens` tokens of `store`; the build it
  // supersedes (over fewer tokens) is cancelled once the new one is queued.
  void schedule(const KvTier& store, int64_t tokens, const SequenceInfo& seq);
  // The build in flight stops at its next iteration (it stays pending);
  // forget() also lets go of it.
  void cancel();
  void forget();
  // Installs the build in flight if it finished (poll) or once it has
  // (install: waits, and throws the build's error). True when an index was
  // installed.
  bool poll();
  bool install();

  bool pending() const { return pending_ != nullptr; }
  int64_t pending_tokens() const { return pending_ ? pending_->tokens : 0; }
  PqIndex* index() { return index_.get(); }
  const PqIndex* index() const { return index_.get(); }
  // Replaces the index (a restore, a fork, a truncate), as an installed
  // build does: device-resident copies of the old one are stale.
  void set(std::unique_ptr<PqIndex> index, Facts facts);
  // Device state was reset: everything resident must go up again.
  void bump_generation() { ++generation_; }
  uint64_t generation() const { return generation_; }
  const Facts& facts() const { return facts_; }
  // The pending build was queued by rebuild_for_long_output: selects go on
  // with the installed index until it is done, instead of waiting.
  bool background() const { return background_; }
  void set_background(bool background) { background_ = background; }

 private:
  static void run(ContextShared& shared, BuildTask& task, const KeySnapshot* snapshot,
                  uint64_t seq_id, int32_t layer_index, Counters& seq_counters);
  // The log line and the build_done hook of a build that ended (not of a
  // cancelled one), once its future is ready.
  static void report(const ContextShared& shared, const BuildTask::Outcome& outcome,
                     uint64_t seq_id, int32_t layer_index);

  ContextShared& shared_;
  const int32_t layer_index_;
  std::shared_ptr<BuildTask> pending_;  // null when no build is in flight
  std::future<void> pending_done_;      // carries the build's exception, if any
  std::unique_ptr<PqIndex> index_;
  uint64_t generation_ = 0;             // bumped at every installed build
  Facts facts_;
  bool background_ = false;
};

}  // namespace pq
