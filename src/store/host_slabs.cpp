// Host K/V slabs on transparent huge pages (host_slabs.h).
#include "store/host_slabs.h"

#include <cstdlib>
#include <cstring>

#include <cstdint>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif

namespace pq {

bool host_slabs_enabled() {
  const char* env = std::getenv("PQ_HOST_HUGE_PAGES");
  if (env == nullptr || *env == '\0') return true;
  return std::strcmp(env, "0") != 0;
}

namespace {

// Exactly `bytes` (a multiple of kHostSlabBytes) at a kHostSlabBytes
// boundary, mapped on its own: posix_memalign would map twice the slab to
// align it (glibc's heap figures, and the address space, would count that).
void* map_slab(size_t bytes) {
#if defined(__unix__) || defined(__APPLE__)
  const size_t span = bytes + kHostSlabBytes;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHostSlabBytes - 1) / kHostSlabBytes * kHostSlabBytes;
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = aligned + bytes;
  if (start + span > end) munmap(reinterpret_cast<void*>(end), start + span - end);
  void* p = reinterpret_cast<void*>(aligned);
#if defined(MADV_HUGEPAGE)
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: a refusal leaves 4 KiB pages
#endif
  return p;
#else
  void* p = nullptr;
  return posix_memalign(&p, kHostSlabBytes, bytes) == 0 ? p : nullptr;
#endif
}

void unmap_slab(void* p, size_t bytes) {
#if defined(__unix__) || defined(__APPLE__)
  munmap(p, bytes);
#else
  (void)bytes;
  std::free(p);
#endif
}

}  // namespace

std::unique_ptr<SlabPool> make_host_slabs(MemoryBudget* budget) {
  auto alloc = [](size_t bytes) -> void* { return map_slab(bytes); };
  auto release = [](void* p, size_t bytes) { unmap_slab(p, bytes); };
  auto pool = std::make_unique<SlabPool>(
      alloc, release, "the host K/V slab pool (host_memory_limit, slabs counted whole)",
      kHostSlabBytes);
  pool->charge_slack(budget, kHostSlabBytes);
  return pool;
}

}  // namespace pq
