// Memory a sequence lets go of while device work may still read it: the
// blocks of its K/V store (pinned, read by the fetch kernels across PCIe)
// and its layers' device buffers (codes, window, cache slots, tables). Such
// memory is handed out again only once the work enqueued before the
// release has run, which an event per stream tells without a wait
// (cudaEventQuery). cudaFree and cudaFreeHost, which the release used to
// be, wait for the whole device instead: a truncate or a remove stalled
// every stream, and a block freed by an append after a truncate went back
// to the pool with a fetch of it still queued (another sequence's K/V then
// came out of that fetch). Internal to the CUDA backend.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_plugin_abi.h"
#include "store/slab_pool.h"

namespace pq {
namespace cuda_detail {

// The latest event of every stream that has touched a store or a layer's
// device memory. Events come from a pool: steady steps create none.
class ReleaseFences final : public SlabPool::Fence {
 public:
  explicit ReleaseFences(const pq_cuda_plugin* k) : k_(k) {}
  ~ReleaseFences() override;
  ReleaseFences(const ReleaseFences&) = delete;
  ReleaseFences& operator=(const ReleaseFences&) = delete;

  // After enqueuing work on `stream` that reads or writes a store's chunks
  // or a layer's device buffers. Records nothing while the stream is being
  // captured into a CUDA graph (the caller then orders the graph's replays
  // before a truncate or remove of the sequence, docs in pqcache.h).
  void after_access(void* stream);
  // What must have run before memory released now is reused; passed()
  // queries it and never waits.
  Mark mark() override;
  bool passed(const Mark& mark) override;

 private:
  struct Event {
    Event(ReleaseFences* o, void* e) : owner(o), event(e) {}
    ~Event();
    ReleaseFences* owner;
    void* event;
    std::atomic<bool> done{false};  // queried done once: stays done (asked from any thread)
  };
  using Events = std::vector<std::shared_ptr<Event>>;
  std::shared_ptr<Event> take_event();

  const pq_cuda_plugin* k_;
  std::mutex mutex_;                                          // latest_
  std::unordered_map<void*, std::shared_ptr<Event>> latest_;  // by stream
  std::mutex pool_mutex_;                                     // free_ (taken after mutex_)
  std::vector<void*> free_;
};

// Device and pinned buffers handed back by layers and working buffers,
// reused once their fence has passed; allocated only when none fits.
class Recycler {
 public:
  Recycler(const pq_cuda_plugin* k, ReleaseFences* fences) : k_(k), fences_(fences) {}
  ~Recycler();  // frees everything (the context is going: waits are fine)
  Recycler(const Recycler&) = delete;
  Recycler& operator=(const Recycler&) = delete;

  // At least `bytes` of device (or pinned, mapped) memory: a released
  // buffer of 1 to 2 times the size whose fence passed, else a new one.
  // Throws PQ_ERR_OUT_OF_MEMORY naming `what`; *got receives the size.
  void* acquire(size_t bytes, bool pinned, const char* what, size_t* got);
  // Hands a buffer back (null: nothing), fenced by the work enqueued so far.
  void release(void* ptr, size_t bytes, bool pinned);
  // Grows *ptr (of *bytes) to at least `want`, to twice its size at least,
  // the old buffer handed back fenced; contents are not kept. No-op when it
  // is large enough.
  void grow(void** ptr, size_t* bytes, size_t want, bool pinned, const char* what);

 private:
  struct Held {
    void* ptr;
    size_t bytes;
    SlabPool::Fence::Mark mark;
  };
  const pq_cuda_plugin* k_;
  ReleaseFences* fences_;
  std::mutex mutex_;
  std::multimap<size_t, Held> device_, pinned_;  // by size
};

}  // namespace cuda_detail
}  // namespace pq
