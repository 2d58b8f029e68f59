// ReleaseFences and Recycler (deferred_release.h).
#include "backend/cuda/deferred_release.h"

#include <algorithm>
#include <string>

#include "base/error.h"

namespace pq {
namespace cuda_detail {

ReleaseFences::~ReleaseFences() {
  char err[256];
  latest_.clear();  // returns their events to free_
  for (void* e : free_) k_->event_destroy(e, err, sizeof err);
}

ReleaseFences::Event::~Event() {
  std::lock_guard<std::mutex> lock(owner->pool_mutex_);
  owner->free_.push_back(event);
}

std::shared_ptr<ReleaseFences::Event> ReleaseFences::take_event() {
  void* e = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!free_.empty()) {
      e = free_.back();
      free_.pop_back();
    }
  }
  char err[512] = {0};
  if (e == nullptr && k_->event_create(&e, err, sizeof err) != 0)
    fail(PQ_ERR_BACKEND, std::string("event create (a release fence): ") + err);
  return std::make_shared<Event>(this, e);
}

void ReleaseFences::after_access(void* stream) {
  char err[512] = {0};
  const int capturing = k_->stream_capturing(stream, err, sizeof err);
  if (capturing != 0) return;  // 1: in a capture; -1: nothing recordable
  std::shared_ptr<Event> e = take_event();
  if (k_->event_record(e->event, stream, err, sizeof err) != 0)
    fail(PQ_ERR_BACKEND, std::string("event record (a release fence): ") + err);
  std::shared_ptr<Event> old;  // dies after the lock: its destructor takes pool_mutex_
  std::lock_guard<std::mutex> lock(mutex_);
  old = std::move(latest_[stream]);
  latest_[stream] = std::move(e);
}

SlabPool::Fence::Mark ReleaseFences::mark() {
  auto events = std::make_shared<Events>();
  std::lock_guard<std::mutex> lock(mutex_);
  events->reserve(latest_.size());
  for (const auto& [stream, e] : latest_)
    if (!e->done) events->push_back(e);
  return events;
}

bool ReleaseFences::passed(const Mark& mark) {
  if (!mark) return true;
  const auto& events = *std::static_pointer_cast<const Events>(mark);
  char err[512] = {0};
  for (const auto& e : events) {
    if (e->done) continue;
    const int done = k_->event_query(e->event, err, sizeof err);
    if (done != 1) return false;  // not yet, or unknown (in a capture): later
    e->done = true;
  }
  return true;
}

Recycler::~Recycler() {
  char err[256];
  for (auto& [bytes, h] : device_) k_->device_free(h.ptr, err, sizeof err);
  for (auto& [bytes, h] : pinned_) k_->host_free(h.ptr, err, sizeof err);
}

void* Recycler::acquire(size_t bytes, bool pinned, const char* what, size_t* got) {
  if (bytes == 0) {
    *got = 0;
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& held = pinned ? pinned_ : device_;
    for (auto it = held.lower_bound(bytes); it != held.end() && it->first <= 2 * bytes; ++it)
      if (fences_->passed(it->second.mark)) {
        void* p = it->second.ptr;
        *got = it->first;
        held.erase(it);
        return p;
      }
  }
  char err[512] = {0};
  void* p = nullptr;
  const int rc = pinned ? k_->host_alloc(&p, bytes, err, sizeof err)
                        : k_->device_alloc(&p, bytes, err, sizeof err);
  if (rc != 0)
    fail(PQ_ERR_OUT_OF_MEMORY, std::string("the ") + std::to_string(bytes) +
                                   (pinned ? " pinned host bytes of " : " device bytes of ") +
                                   what + " could not be allocated: " + err);
  *got = bytes;
  return p;
}

void Recycler::grow(void** ptr, size_t* bytes, size_t want, bool pinned, const char* what) {
  if (*bytes >= want) return;
  size_t got = 0;
  void* p = acquire(std::max(want, 2 * *bytes), pinned, what, &got);
  release(*ptr, *bytes, pinned);
  *ptr = p;
  *bytes = got;
}

void Recycler::release(void* ptr, size_t bytes, bool pinned) {
  if (ptr == nullptr) return;
  SlabPool::Fence::Mark mark = fences_->mark();
  std::lock_guard<std::mutex> lock(mutex_);
  (pinned ? pinned_ : device_).emplace(bytes, Held{ptr, bytes, std::move(mark)});
}

}  // namespace cuda_detail
}  // namespace pq
