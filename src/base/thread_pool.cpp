#include "base/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <new>

namespace pq {

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) threads = 1;
  workers_.reserve(threads);
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() { shutdown(); }

void ThreadPool::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

std::future<void> ThreadPool::submit(std::function<void()> task, std::function<void()> after) {
  Entry entry{std::packaged_task<void()>(std::move(task)), std::move(after)};
  std::future<void> future = entry.task.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(entry));
  }
  cv_.notify_one();
  return future;
}

void ThreadPool::worker_loop() {
  for (;;) {
    Entry entry;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      entry = std::move(queue_.front());
      queue_.pop_front();
    }
    entry.task();
    entry.task = std::packaged_task<void()>();  // its callable goes before `after` runs
    if (entry.after) {
      try {
        entry.after();
      } catch (...) {
      }
    }
  }
}

namespace {
struct ParallelState {
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  int64_t completed = 0;  // guarded by mutex
  std::mutex mutex;
  std::condition_variable done_cv;
  std::exception_ptr error;
};
}  // namespace

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  auto state = std::make_shared<ParallelState>();
  // Every index is claimed exactly once by a thread that is running, and
  // counted as completed once its call returned (or was skipped after an
  // error). The caller waits for completed == n, never for queued helpers,
  // so nested use from pool tasks cannot deadlock. A helper that starts after
  // the work is gone claims nothing and never touches fn.
  auto run = [state, n, &fn] {
    for (;;) {
      int64_t i = state->next.fetch_add(1);
      if (i >= n) return;
      if (!state->failed.load()) {
        try {
          fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(state->mutex);
          if (!state->error) state->error = std::current_exception();
          state->failed.store(true);
        }
      }
      std::lock_guard<std::mutex> lock(state->mutex);
      if (++state->completed == n) state->done_cv.notify_all();
    }
  };
  int64_t helpers = std::min<int64_t>(n - 1, size());
  for (int64_t h = 0; h < helpers; ++h) {
    try {
      submit(run);
    } catch (const std::bad_alloc&) {
      break;  // out of memory for a helper: fewer threads do the work, and
              // we must not leave while the helpers queued so far run
    }
  }
  run();
  std::unique_lock<std::mutex> lock(state->mutex);
  state->done_cv.wait(lock, [&] { return state->completed == n; });
  if (state->error) std::rethrow_exception(state->error);
}

}  // namespace pq
