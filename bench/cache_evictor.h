// What the other layers' decode step leaves in the caches, for benchmarks
// that time one layer's call "cold": a read of twice the last-level cache,
// on two threads, so that the call's data is not in any cache when it
// starts. A fixed read is not enough everywhere: the Intel Xeon KVM guest
// of docs/perf.md reports a 480 MiB last-level cache, which a 256 MiB read
// leaves holding much of a 128K selection's 107 MB of rows.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

namespace pqbench {

// The last-level cache's size as the C library reports it (the L3, else
// the L2), or 512 MiB where it reports neither.
inline size_t last_level_cache_bytes() {
  long bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (bytes <= 0) bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return bytes > 0 ? static_cast<size_t>(bytes) : size_t{512} << 20;
}

class CacheEvictor {
 public:
  // At least 256 MiB (bench/select_keys.py's cold read), else twice the
  // last-level cache.
  CacheEvictor() : CacheEvictor(std::max(size_t{256} << 20, 2 * last_level_cache_bytes())) {}
  // A read of `bytes` (0: none).
  explicit CacheEvictor(size_t bytes) : words_(bytes / sizeof(uint64_t), 1) {}

  size_t bytes() const { return words_.size() * sizeof(uint64_t); }

  // Reads the whole buffer, half on another thread; returns its sum, which
  // the caller should use so that the reads are not optimised away.
  uint64_t evict() const {
    if (words_.empty()) return 0;
    const size_t half = words_.size() / 2;
    uint64_t other = 0;
    std::thread t([&] { other = sum(half, words_.size()); });
    const uint64_t mine = sum(0, half);
    t.join();
    return mine + other;
  }

 private:
  uint64_t sum(size_t from, size_t to) const {
    uint64_t s = 0;
    for (size_t i = from; i < to; ++i) s += words_[i];
    return s;
  }
  std::vector<uint64_t> words_;
};

}  // namespace pqbench
