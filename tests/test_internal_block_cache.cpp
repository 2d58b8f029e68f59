// The block cache's bookkeeping (src/store/block_cache.h): ranking, admission,
// LRU and LFU eviction, partial blocks. It runs the same on every backend,
// so it is tested here without a GPU.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "store/block_cache.h"
#include "pqcache.h"

namespace {

using pq::BlockCache;

constexpr int32_t kBlock = 4;

// `count` positions inside block b (all in the same block).
std::vector<int64_t> in_block(int64_t b, int count) {
  std::vector<int64_t> p;
  for (int i = 0; i < count; ++i) p.push_back(b * kBlock + i % kBlock);
  return p;
}

std::vector<int64_t> concat(std::initializer_list<std::vector<int64_t>> parts) {
  std::vector<int64_t> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

constexpr int64_t kAllComplete = 1 << 20;

TEST(BlockCache, CapacityBelowOneBlockHasNoSlotsAndNeverAdmits) {
  BlockCache cache(kBlock - 1, kBlock, PQ_CACHE_LRU);
  EXPECT_EQ(cache.slot_count(), 0);
  EXPECT_TRUE(cache.update(in_block(0, 3), kAllComplete).empty());
  EXPECT_EQ(cache.lookup(0), -1);
}

TEST(BlockCache, SlotsAreWholeBlocksOfTheCapacity) {
  EXPECT_EQ(BlockCache(4 * kBlock + 3, kBlock, PQ_CACHE_LRU).slot_count(), 4);
  EXPECT_EQ(BlockCache(4 * kBlock, kBlock, PQ_CACHE_LFU).slot_count(), 4);
}

TEST(BlockCache, AdmitsTheBlocksHoldingTheMostTokensFirst) {
  BlockCache cache(2 * kBlock, kBlock, PQ_CACHE_LRU);
  // Block 7 holds 1 token, block 2 holds 2, block 5 holds 3 (counted over
  // heads: the same position twice counts twice).
  auto adm = cache.update(concat({in_block(7, 1), in_block(2, 2), in_block(5, 3)}), kAllComplete);
  ASSERT_EQ(adm.size(), 2u);
  EXPECT_EQ(adm[0].block, 5);
  EXPECT_EQ(adm[1].block, 2);
  EXPECT_EQ(adm[0].evicted, -1);
  EXPECT_NE(adm[0].slot, adm[1].slot);
  EXPECT_EQ(cache.lookup(5 * kBlock + 3), adm[0].slot);
  EXPECT_EQ(cache.lookup(2 * kBlock), adm[1].slot);
  EXPECT_EQ(cache.lookup(7 * kBlock), -1);
  EXPECT_EQ(cache.block_in(adm[0].slot), 5);
}

TEST(BlockCache, TiesGoToTheLaterBlock) {
  BlockCache cache(1 * kBlock, kBlock, PQ_CACHE_LRU);
  auto adm = cache.update(concat({in_block(3, 2), in_block(9, 2), in_block(6, 2)}), kAllComplete);
  ASSERT_EQ(adm.size(), 1u);
  EXPECT_EQ(adm[0].block, 9);
}

TEST(BlockCache, RepeatsCountOncePerOccurrence) {
  BlockCache cache(1 * kBlock, kBlock, PQ_CACHE_LRU);
  // Position 8 fetched for three kv heads outweighs two distinct tokens.
  auto adm = cache.update({8, 8, 8, 12, 13}, kAllComplete);
  ASSERT_EQ(adm.size(), 1u);
  EXPECT_EQ(adm[0].block, 2);
}

TEST(BlockCache, PartialBlocksAreNotAdmitted) {
  BlockCache cache(2 * kBlock, kBlock, PQ_CACHE_LRU);
  // 10 tokens stored: block 2 (positions 8..11) is incomplete.
  auto adm = cache.update(concat({in_block(2, 2), in_block(1, 1)}), 10);
  ASSERT_EQ(adm.size(), 1u);
  EXPECT_EQ(adm[0].block, 1);
  EXPECT_EQ(cache.lookup(8), -1);
  // Once complete it is admitted.
  adm = cache.update(in_block(2, 2), 12);
  ASSERT_EQ(adm.size(), 1u);
  EXPECT_EQ(adm[0].block, 2);
}

TEST(BlockCache, LruEvictsTheBlockUnusedForLongest) {
  BlockCache cache(2 * kBlock, kBlock, PQ_CACHE_LRU);
  cache.update(concat({in_block(0, 2), in_block(1, 1)}), kAllComplete);  // step 1: 0, 1
  cache.update(in_block(0, 1), kAllComplete);                            // step 2: touches 0
  auto adm = cache.update(in_block(2, 1), kAllComplete);                 // step 3: 2 evicts 1
  ASSERT_EQ(adm.size(), 1u);
  EXPECT_EQ(adm[0].block, 2);
  EXPECT_EQ(adm[0].evicted, 1);
  EXPECT_GE(cache.lookup(0), 0);
  EXPECT_EQ(cache.lookup(1 * kBlock), -1);
}

TEST(BlockCache, LfuEvictsTheLeastUsedEvenIfRecent) {
  BlockCache cache(2 * kBlock, kBlock, PQ_CACHE_LFU);
  cache.update(concat({in_block(0, 2), in_block(1, 1)}), kAllComplete);  // 0:1 use, 1:1 use
  cache.update(in_block(0, 1), kAllComplete);                            // 0:2
  cache.update(in_block(0, 1), kAllComplete);                            // 0:3
  cache.update(in_block(1, 1), kAllComplete);                            // 1:2, most recent
  cache.update(in_block(2, 1), kAllComplete);  // 2 evicts 1 (2 uses) not 0 (3 uses)
  EXPECT_GE(cache.lookup(0), 0);
  EXPECT_GE(cache.lookup(2 * kBlock), 0);
  EXPECT_EQ(cache.lookup(1 * kBlock), -1);

  BlockCache lru(2 * kBlock, kBlock, PQ_CACHE_LRU);  // the same steps under LRU evict 0
  lru.update(concat({in_block(0, 2), in_block(1, 1)}), kAllComplete);
  lru.update(in_block(0, 1), kAllComplete);
  lru.update(in_block(0, 1), kAllComplete);
  lru.update(in_block(1, 1), kAllComplete);
  lru.update(in_block(2, 1), kAllComplete);
  EXPECT_EQ(lru.lookup(0), -1);
  EXPECT_GE(lru.lookup(1 * kBlock), 0);
}

TEST(BlockCache, BlocksRankedAtTheSameStepAreNeverEvictedForEachOther) {
  BlockCache cache(2 * kBlock, kBlock, PQ_CACHE_LRU);
  cache.update(concat({in_block(0, 2), in_block(1, 1)}), kAllComplete);
  // Step 2 ranks 0 (cached), 5 (new): 5 takes 1's slot, never 0's.
  auto adm = cache.update(concat({in_block(0, 3), in_block(5, 2)}), kAllComplete);
  ASSERT_EQ(adm.size(), 1u);
  EXPECT_EQ(adm[0].block, 5);
  EXPECT_EQ(adm[0].evicted, 1);
  EXPECT_GE(cache.lookup(0), 0);
}

TEST(BlockCache, OnlyTheTopSlotCountBlocksAreConsidered) {
  BlockCache cache(1 * kBlock, kBlock, PQ_CACHE_LRU);
  cache.update(in_block(4, 3), kAllComplete);
  // Block 4 ranks first again, block 6 second: 6 is beyond k_cache = 1.
  auto adm = cache.update(concat({in_block(4, 3), in_block(6, 2)}), kAllComplete);
  EXPECT_TRUE(adm.empty());
  EXPECT_EQ(cache.lookup(6 * kBlock), -1);
}

TEST(BlockCache, NegativePositionsAreIgnored) {
  BlockCache cache(1 * kBlock, kBlock, PQ_CACHE_LRU);
  EXPECT_TRUE(cache.update({-1, -5}, kAllComplete).empty());
  EXPECT_EQ(cache.lookup(-1), -1);
}

}  // namespace

namespace {

using pq::BlockCache;

// With k_cache below the slot count, blocks the update does not rank can
// survive, and the policy picks which: LRU keeps the recent one, LFU the
// often used one.
TEST(BlockCache, FewerUpdateBlocksThanSlotsLetThePolicyDecide) {
  constexpr int32_t kB = 4;
  auto run = [](int32_t policy) {
    BlockCache cache(2 * kB, kB, policy, /*update_blocks=*/1);
    cache.update({0}, 1 << 20);   // block 0 (1 use)
    cache.update({0}, 1 << 20);   // block 0 (2 uses)
    cache.update({4}, 1 << 20);   // block 1 (1 use), more recent; both cached
    cache.update({8}, 1 << 20);   // block 2 evicts 0 (LRU) or 1 (LFU)
    return std::make_pair(cache.lookup(0) >= 0, cache.lookup(4) >= 0);
  };
  EXPECT_EQ(run(PQ_CACHE_LRU), std::make_pair(false, true));
  EXPECT_EQ(run(PQ_CACHE_LFU), std::make_pair(true, false));
}

TEST(BlockCache, UpdateBlocksAreClippedToTheSlots) {
  BlockCache cache(2 * 4, 4, PQ_CACHE_LRU, /*update_blocks=*/10);
  EXPECT_EQ(cache.update({0, 4, 8}, 1 << 20).size(), 2u);
}

}  // namespace
