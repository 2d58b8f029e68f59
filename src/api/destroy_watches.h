// The watches of pq_watch_destroy: handles kept by other libraries (the
// Redis tier's transfers, bindings' objects) that must learn that their
// context is going before its memory is freed.
#pragma once

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "base/error.h"
#include "pqcache.h"

namespace pq::api {

class DestroyWatches {
 public:
  uint64_t add(pq_destroy_fn fn, void* user) {
    std::lock_guard<std::mutex> lock(mutex_);
    watches_.push_back({++last_id_, fn, user});  // may throw bad_alloc: nothing added
    return last_id_;
  }

  void remove(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = watches_.begin(); it != watches_.end(); ++it)
      if (it->id == id) {
        watches_.erase(it);
        return;
      }
    fail(PQ_ERR_NOT_FOUND, "watch " + std::to_string(id) +
                               " is not a watch of this context (never made, or ended)");
  }

  // pq_destroy: each watch once, newest first. The list is taken out first,
  // so a watch may end others (freeing its handle) without deadlock.
  void notify() noexcept {
    std::vector<Watch> watches;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      watches.swap(watches_);
    }
    for (auto it = watches.rbegin(); it != watches.rend(); ++it) it->fn(it->user);
  }

 private:
  struct Watch {
    uint64_t id;
    pq_destroy_fn fn;
    void* user;
  };
  std::mutex mutex_;
  std::vector<Watch> watches_;
  uint64_t last_id_ = 0;
};

}  // namespace pq::api
