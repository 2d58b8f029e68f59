// The host K/V store's 2 MiB slabs (src/store/host_slabs.h): a SlabPool that
// charges a MemoryBudget for its slack. The budget holds whole slabs (the
// blocks handed out move to their owners' charge), a slab the budget cannot
// take is refused, and empty slabs go back at once, so the budget returns
// to its baseline.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "store/host_slabs.h"
#include "store/memory_budget.h"

namespace {

constexpr size_t kBlock = size_t{512} << 10;  // a Llama chunk's K: 4 per slab

TEST(HostSlabs, TheBudgetHoldsWholeSlabsAndReturnsToBaseline) {
  pq::MemoryBudget budget(0);
  auto pool = pq::make_host_slabs(&budget);
  std::vector<pq::Reservation> owners;  // what a store's chunks charge
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) {
    owners.push_back(budget.reserve(kBlock, "a test block"));
    void* p = pool->allocate(kBlock);
    ASSERT_NE(p, nullptr);
    std::memset(p, i, kBlock);  // the memory is there
    blocks.push_back(p);
  }
  // Two slabs: 5 blocks charged by their owners, 3 free blocks of slack.
  EXPECT_EQ(pool->bytes_held(), 2 * pq::kHostSlabBytes);
  EXPECT_EQ(pool->slack_bytes(), 3 * kBlock);
  EXPECT_EQ(budget.used(), 2 * pq::kHostSlabBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(blocks[0]) % pq::kHostSlabBytes, 0u);
  // The owners let go (as a chunk does: its charge, then its blocks).
  for (int i = 4; i >= 0; --i) {
    owners.pop_back();
    pool->release(blocks[static_cast<size_t>(i)], kBlock);
  }
  EXPECT_EQ(pool->bytes_held(), 0u);  // no spare slab is kept
  EXPECT_EQ(pool->slack_bytes(), 0u);
  EXPECT_EQ(budget.used(), 0u);
}

TEST(HostSlabs, ASlabTheBudgetCannotTakeIsRefused) {
  // Room for one slab and a block of the next, not for the next slab whole.
  pq::MemoryBudget budget(pq::kHostSlabBytes + kBlock);
  auto pool = pq::make_host_slabs(&budget);
  std::vector<pq::Reservation> owners;
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) {
    void* p = pool->allocate(kBlock);
    ASSERT_NE(p, nullptr) << i;
    blocks.push_back(p);
  }
  EXPECT_EQ(budget.used(), 0u);  // every block moved to its (absent) owner
  owners.push_back(budget.reserve(4 * kBlock, "the owners"));
  EXPECT_EQ(pool->allocate(kBlock), nullptr);  // a second slab passes the limit
  EXPECT_EQ(budget.used(), 4 * kBlock);       // and holds nothing
  EXPECT_EQ(pool->bytes_held(), pq::kHostSlabBytes);
  owners.clear();
  for (void* p : blocks) pool->release(p, kBlock);
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_EQ(pool->bytes_held(), 0u);
}

TEST(HostSlabs, ReservedSlabsAreChargedAndKept) {
  pq::MemoryBudget budget(0);
  auto pool = pq::make_host_slabs(&budget);
  ASSERT_TRUE(pool->reserve(kBlock, 6));
  EXPECT_EQ(budget.used(), 2 * pq::kHostSlabBytes);
  void* p = pool->allocate(kBlock);
  ASSERT_NE(p, nullptr);
  pool->release(p, kBlock);
  EXPECT_EQ(budget.used(), 2 * pq::kHostSlabBytes);  // still promised
}

}  // namespace
