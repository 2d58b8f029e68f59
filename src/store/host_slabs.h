// The CPU backend's host K/V store on 2 MiB slabs (issue 43): chunk blocks
// carved from 2 MiB-aligned slabs advised MADV_HUGEPAGE, so that transparent
// huge pages back them where the kernel allows it ("madvise" or "always" in
// /sys/kernel/mm/transparent_hugepage/enabled): a 128K attend walks the
// chunks with far fewer TLB misses. The pool charges the context's memory
// limit for the slabs' slack (slab_pool.h), so the limit counts what the
// slabs reserve, and gives empty slabs back at once.
//
// PQ_HOST_HUGE_PAGES=0 in the environment (read when a context is created)
// keeps the store on operator new, one block per allocation.
#pragma once

#include <cstddef>
#include <memory>

#include "store/memory_budget.h"
#include "store/slab_pool.h"

namespace pq {

constexpr size_t kHostSlabBytes = size_t{2} << 20;  // one huge page
// Chunk blocks (one chunk's K or V of a layer) smaller than this stay on
// operator new: the slack of a partly used slab would be most of a small
// context's limit, and small stores gain little from huge pages.
constexpr size_t kHostSlabMinBlock = size_t{128} << 10;

// Whether PQ_HOST_HUGE_PAGES leaves host slabs on.
bool host_slabs_enabled();

// A pool of kHostSlabBytes-aligned slabs charging `budget` for its slack.
std::unique_ptr<SlabPool> make_host_slabs(MemoryBudget* budget);

}  // namespace pq
