// The asynchronous prefills from device memory of one layer (paper
// Algorithm 1): each one a pool task that waits for the ingest before it
// (so that they store in order) and then does its work; the error of one
// that failed is kept until the next call on the layer reports it, once.
// The layer owns one; it needs no lock of the layer's (a task takes the
// layer's lock itself to store).
#pragma once

#include <functional>
#include <future>
#include <mutex>
#include <string>

#include "layer/context_shared.h"
#include "pqcache.h"

namespace pq {

class Ingest {
 public:
  // Queues `work` on the pool after the ingests queued before it. A failure
  // (an exception of `work`) is kept, its message after `what`. The task
  // lets go of `work` (and what it holds) as soon as it has run: the caller
  // may make `work` hold the layer's owner, and the layer holds the task's
  // future, so nothing of this object is touched after that.
  void chain(ContextShared& shared, std::function<void()> work, std::string what);
  // Waits for every ingest queued so far.
  void wait();
  // wait(), then throws the error of an ingest that failed (once).
  void settle();

 private:
  std::mutex mutex_;
  std::shared_future<void> done_;  // the last ingest's completion
  std::string error_;
  pq_status status_ = PQ_OK;
};

}  // namespace pq
