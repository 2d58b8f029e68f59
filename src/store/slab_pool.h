// Blocks carved from large slabs of memory that is costly to allocate one
// block at a time: the CUDA backend's K/V store lives in page-locked,
// device-mapped host memory (the plug-in's host_alloc, cudaHostAlloc), which
// pins every page when it is allocated, so a store of 128K tokens in 1,024
// chunk blocks would pay that 1,024 times. The pool asks for a slab at a
// time and hands out blocks of the sizes asked for (a context asks for one
// size: a chunk's K or V tensor). A slab goes back once none of its blocks
// is in use, except one spare per block size, so that adding and removing
// sequences does not pin and unpin at every turn; under a fence (the CUDA
// backend, whose device work reads the blocks) every slab is kept until
// the pool goes, since giving pinned memory back waits for the whole device.
//
// The CPU backend's host K/V store uses one too, of 2 MiB slabs on
// transparent huge pages (host_slabs.h): there the pool charges a memory
// budget for the slabs' slack (bytes held but not handed out, partly used
// slabs included; the blocks handed out are their chunks' charge) and gives
// every empty slab back at once, so that the budget returns to what it was
// once the sequences are removed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "base/hooks.h"
#include "store/memory_budget.h"

namespace pq {

class SlabPool {
 public:
  // Whether device work that may read a released block has run: a block
  // released under a fence waits in quarantine until passed(mark) says so
  // (asked when blocks are handed out; never waited for).
  class Fence {
   public:
    using Mark = std::shared_ptr<const void>;
    virtual ~Fence() = default;
    virtual Mark mark() = 0;
    virtual bool passed(const Mark& mark) = 0;
  };

  // alloc returns `bytes` of memory (aligned to 256) or null; free gives it
  // back. Neither may throw.
  using AllocFn = std::function<void*(size_t bytes)>;
  using FreeFn = std::function<void(void* ptr, size_t bytes)>;
  static constexpr size_t kDefaultSlabBytes = size_t{32} << 20;

  // name: what a failed allocation names in messages (hooks.h).
  SlabPool(AllocFn alloc, FreeFn free, const char* name, size_t slab_bytes = kDefaultSlabBytes);
  // Every block must have been released.
  ~SlabPool();
  SlabPool(const SlabPool&) = delete;
  SlabPool& operator=(const SlabPool&) = delete;

  // A block of `bytes` (rounded up to 256), or null when a slab could not
  // be allocated.
  void* allocate(size_t bytes) noexcept;
  void release(void* ptr, size_t bytes) noexcept;
  // Blocks released from now on are fenced (null: reused at once). The
  // fence must outlive the pool.
  void set_fence(Fence* fence);
  // Cuts slabs now so that `count` more blocks of `bytes` can be handed out
  // without allocating (pq_sequence_reserve): the decode step that opens a
  // chunk then pins nothing. Reserved blocks are counted down as blocks of
  // that size are handed out. False when a slab could not be allocated.
  bool reserve(size_t bytes, size_t count) noexcept;
  // Charges `budget` for the slack from now on (before any block is handed
  // out): a slab is cut only if the budget takes its bytes, each block handed
  // out moves its bytes from the slack to its owner's charge (and back when
  // released), and no empty slab is kept as a spare. Slabs are sized up to
  // a multiple of `slab_align` (what alloc reserves). The budget must
  // outlive the pool.
  void charge_slack(MemoryBudget* budget, size_t slab_align);
  // Bytes of the slabs not handed out (charged when charge_slack is set).
  size_t slack_bytes() const;

  // The pool as a K/V store allocator (hooks.h): the store's HostBlocks
  // allocate and free through it.
  HostAllocator allocator();
  // Whether ptr lies in one of the pool's slabs.
  bool owns(const void* ptr) const;
  // Bytes of slabs held, in use or not.
  size_t bytes_held() const;

 private:
  struct Slab {
    size_t bytes = 0;
    size_t block = 0;    // the block size it is cut into
    int64_t in_use = 0;  // blocks handed out
  };
  static size_t rounded(size_t bytes) { return (bytes + 255) / 256 * 256; }
  std::map<uintptr_t, Slab>::iterator find_slab(const void* ptr);
  Slab* slab_of(const void* ptr);
  void drop_slab(uintptr_t base);
  // Quarantined blocks whose fence passed back to the free lists.
  void reclaim();
  void give_back(void* ptr);
  bool cut_slab(size_t block);

  const AllocFn alloc_;
  const FreeFn free_;
  const char* const name_;
  const size_t slab_bytes_;
  mutable std::mutex mutex_;
  std::map<uintptr_t, Slab> slabs_;               // by base address
  std::map<size_t, std::vector<void*>> blocks_;   // free blocks by size
  std::map<size_t, size_t> reserved_;             // blocks promised, by size
  struct Quarantined {
    void* ptr;
    Fence::Mark mark;
  };
  Fence* fence_ = nullptr;
  std::vector<Quarantined> quarantine_;           // released, maybe still read
  MemoryBudget* budget_ = nullptr;                // charge_slack's
  size_t slab_align_ = 1;
  Reservation slack_;                             // held against budget_
  size_t slack_bytes_ = 0;                        // with or without a budget
};

}  // namespace pq
