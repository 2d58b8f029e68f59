// A fixed-size worker pool: submit() runs index builds in the background,
// parallel_for() splits one build across the pool. The calling thread of
// parallel_for() works too, so a parallel_for issued from inside a pool task
// cannot deadlock: it never waits for queued work that nobody runs.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace pq {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads >= 1
  ~ThreadPool();                     // shutdown()

  // Finishes the queued tasks, then joins the workers. Idempotent. The
  // pool stays a valid object: a task still running may call
  // parallel_for(), which then runs on the calling thread alone.
  void shutdown();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()); }

  // Queues task; the future carries its exception, if any. `after`, if
  // given, runs on the same worker once the future is ready (so it may
  // wait on that future, or on code that does); its exceptions are dropped.
  std::future<void> submit(std::function<void()> task, std::function<void()> after = nullptr);

  // Calls fn(i) for every i in [0, n) on the pool and the calling thread and
  // returns when all calls have returned. Which thread runs which index is
  // unspecified, so fn must make results independent of it. The first
  // exception thrown by fn is rethrown here (after all calls finished).
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void worker_loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  struct Entry {
    std::packaged_task<void()> task;
    std::function<void()> after;
  };
  std::deque<Entry> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace pq
