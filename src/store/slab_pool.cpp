// SlabPool (slab_pool.h).
#include "store/slab_pool.h"

#include <algorithm>
#include <string>
#include <utility>

namespace pq {

SlabPool::SlabPool(AllocFn alloc, FreeFn free, const char* name, size_t slab_bytes)
    : alloc_(std::move(alloc)), free_(std::move(free)), name_(name), slab_bytes_(slab_bytes) {}

SlabPool::~SlabPool() {
  for (const auto& [base, slab] : slabs_) free_(reinterpret_cast<void*>(base), slab.bytes);
}

bool SlabPool::cut_slab(size_t block) {
  std::vector<void*>& free_blocks = blocks_[block];
  // A block too large to share a slab gets a slab of its own.
  const size_t per_slab = std::max<size_t>(slab_bytes_ / block, 1);
  const size_t bytes_of_slab = (per_slab * block + slab_align_ - 1) / slab_align_ * slab_align_;
  Reservation charge;
  if (budget_ != nullptr) {
    charge = budget_->reserve_or_describe(bytes_of_slab, [] {
      return std::make_pair(std::string("a slab of the host K/V store"), std::string());
    });
  }
  void* base = alloc_(bytes_of_slab);
  if (base == nullptr) return false;
  slack_.absorb(std::move(charge));
  slack_bytes_ += bytes_of_slab;
  slabs_[reinterpret_cast<uintptr_t>(base)] = Slab{bytes_of_slab, block, 0};
  free_blocks.reserve(free_blocks.size() + per_slab);
  // Handed out from the front of the slab first (popped from the back).
  for (size_t i = per_slab; i-- > 0;) free_blocks.push_back(static_cast<uint8_t*>(base) + i * block);
  return true;
}

void* SlabPool::allocate(size_t bytes) noexcept {
  const size_t block = rounded(std::max<size_t>(bytes, 1));
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    if (!quarantine_.empty()) reclaim();
    std::vector<void*>& free_blocks = blocks_[block];
    if (free_blocks.empty() && !cut_slab(block)) return nullptr;
    void* p = free_blocks.back();
    free_blocks.pop_back();
    Slab* slab = slab_of(p);
    ++slab->in_use;
    slack_bytes_ -= slab->block;
    if (budget_ != nullptr) slack_.split(slab->block);  // now its owner's charge
    auto r = reserved_.find(block);
    if (r != reserved_.end() && r->second > 0) --r->second;
    return p;
  } catch (...) {  // bad_alloc of the bookkeeping
    return nullptr;
  }
}

bool SlabPool::reserve(size_t bytes, size_t count) noexcept {
  const size_t block = rounded(std::max<size_t>(bytes, 1));
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    if (!quarantine_.empty()) reclaim();
    size_t& promised = reserved_[block];
    promised += count;
    while (blocks_[block].size() < promised)
      if (!cut_slab(block)) return false;
    return true;
  } catch (...) {
    return false;
  }
}

void SlabPool::set_fence(Fence* fence) {
  std::lock_guard<std::mutex> lock(mutex_);
  fence_ = fence;
}

void SlabPool::reclaim() {
  // Blocks released together share a mark: each mark is asked once.
  const Fence::Mark* asked = nullptr;
  bool passed = false;
  std::vector<Quarantined> still;
  std::vector<void*> ready;
  for (Quarantined& q : quarantine_) {
    if (asked == nullptr || q.mark != *asked) {
      asked = &q.mark;
      passed = fence_ == nullptr || fence_->passed(q.mark);
    }
    (passed ? ready.push_back(q.ptr) : still.push_back(std::move(q)));
  }
  quarantine_ = std::move(still);
  for (void* p : ready) give_back(p);
}

void SlabPool::release(void* ptr, size_t) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (fence_ != nullptr && find_slab(ptr) != slabs_.end()) {
    try {
      quarantine_.push_back(Quarantined{ptr, fence_->mark()});
      return;
    } catch (...) {
      // No room to remember it (or no event to fence it): the block is lost
      // to the pool until the pool goes, which is safe.
      return;
    }
  }
  give_back(ptr);
}

void SlabPool::give_back(void* ptr) {
  auto it = find_slab(ptr);
  if (it == slabs_.end()) return;  // not ours: never handed out
  Slab& slab = it->second;
  blocks_[slab.block].push_back(ptr);  // capacity reserved when the slab was cut
  slack_bytes_ += slab.block;
  // Its owner's charge is (being) released: the slack holds the bytes again.
  if (budget_ != nullptr) slack_.absorb(budget_->hold(slab.block));
  if (--slab.in_use > 0) return;
  if (budget_ != nullptr && fence_ == nullptr && reserved_[slab.block] == 0) {
    drop_slab(it->first);  // charged: no spare, the budget goes back to baseline
    return;
  }
  // Under a fence (the CUDA backend) empty slabs are kept: freeing pinned
  // memory waits for the whole device. Reserved blocks are kept too.
  if (fence_ != nullptr || reserved_[slab.block] > 0) return;
  // Keep one empty slab of this size as a spare; give back any other.
  int64_t empty = 0;
  for (const auto& [base, other] : slabs_)
    if (other.block == slab.block && other.in_use == 0) ++empty;
  if (empty > 1) drop_slab(it->first);
}

std::map<uintptr_t, SlabPool::Slab>::iterator SlabPool::find_slab(const void* ptr) {
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  auto it = slabs_.upper_bound(a);
  if (it == slabs_.begin()) return slabs_.end();
  --it;
  return a < it->first + it->second.bytes ? it : slabs_.end();
}

SlabPool::Slab* SlabPool::slab_of(const void* ptr) {
  auto it = find_slab(ptr);
  return it == slabs_.end() ? nullptr : &it->second;
}

void SlabPool::drop_slab(uintptr_t base) {
  auto it = slabs_.find(base);
  if (it == slabs_.end()) return;
  const Slab slab = it->second;
  std::vector<void*>& free_blocks = blocks_[slab.block];
  free_blocks.erase(std::remove_if(free_blocks.begin(), free_blocks.end(),
                                   [&](void* p) {
                                     const auto a = reinterpret_cast<uintptr_t>(p);
                                     return a >= base && a < base + slab.bytes;
                                   }),
                    free_blocks.end());
  slabs_.erase(it);
  slack_bytes_ -= slab.bytes;
  if (budget_ != nullptr) slack_.split(slab.bytes);  // released
  free_(reinterpret_cast<void*>(base), slab.bytes);
}

bool SlabPool::owns(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return const_cast<SlabPool*>(this)->slab_of(ptr) != nullptr;
}

size_t SlabPool::bytes_held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const auto& [base, slab] : slabs_) total += slab.bytes;
  return total;
}

void SlabPool::charge_slack(MemoryBudget* budget, size_t slab_align) {
  std::lock_guard<std::mutex> lock(mutex_);
  budget_ = budget;
  slab_align_ = std::max<size_t>(slab_align, 1);
}

size_t SlabPool::slack_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slack_bytes_;
}

HostAllocator SlabPool::allocator() {
  HostAllocator a;
  a.alloc = [](void* user, size_t bytes, size_t) -> void* {
    return static_cast<SlabPool*>(user)->allocate(bytes);
  };
  a.free = [](void* user, void* ptr, size_t bytes) {
    static_cast<SlabPool*>(user)->release(ptr, bytes);
  };
  a.user = this;
  a.name = name_;
  return a;
}

}  // namespace pq
