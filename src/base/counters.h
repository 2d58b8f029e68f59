// Statistics counters, kept per context and per sequence; lock-free so that
// reading statistics never waits for a build.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "pqcache.h"

namespace pq {

struct Counters {
  std::atomic<uint64_t> builds_finished{0};
  std::atomic<uint64_t> builds_cancelled{0};
  std::atomic<uint64_t> kmeans_iterations{0};
  std::atomic<uint64_t> select_calls{0};
  std::atomic<uint64_t> fetch_calls{0};
  std::atomic<uint64_t> build_ns{0};
  std::atomic<uint64_t> select_ns{0};
  std::atomic<uint64_t> fetch_ns{0};
  std::atomic<uint64_t> bytes_scored{0};
  std::atomic<uint64_t> bytes_fetched{0};
  std::atomic<uint64_t> cache_hits{0};
  std::atomic<uint64_t> cache_misses{0};
  std::atomic<uint64_t> bytes_staged{0};
  std::atomic<uint64_t> hint_tokens{0};
  std::atomic<uint64_t> hint_covered{0};

  void add_to(pq_stats* s) const {
    s->builds_finished += builds_finished.load();
    s->builds_cancelled += builds_cancelled.load();
    s->kmeans_iterations += kmeans_iterations.load();
    s->select_calls += select_calls.load();
    s->fetch_calls += fetch_calls.load();
    s->build_seconds += build_ns.load() * 1e-9;
    s->select_seconds += select_ns.load() * 1e-9;
    s->fetch_seconds += fetch_ns.load() * 1e-9;
    s->bytes_scored += bytes_scored.load();
    s->bytes_fetched += bytes_fetched.load();
    s->cache_hits += cache_hits.load();
    s->cache_misses += cache_misses.load();
    s->bytes_staged += bytes_staged.load();
    s->hint_tokens += hint_tokens.load();
    s->hint_covered += hint_covered.load();
  }
};

// Adds the elapsed time since construction to one counter of each of two
// Counters (the context's and the sequence's) when it goes out of scope.
class ScopedTimer {
 public:
  ScopedTimer(std::atomic<uint64_t>* a, std::atomic<uint64_t>* b)
      : a_(a), b_(b), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() {
    auto ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now() - start_)
                                        .count());
    a_->fetch_add(ns);
    if (b_) b_->fetch_add(ns);
  }

 private:
  std::atomic<uint64_t>* a_;
  std::atomic<uint64_t>* b_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace pq
