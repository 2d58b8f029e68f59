// SlabPool (src/store/slab_pool.h), the CUDA backend's pool of page-locked K/V
// blocks, over plain memory with counted slab allocations: blocks come from
// few slabs, slabs go back when empty (but one spare), allocation failures
// reach the caller as null, and the pool works as a store's HostAllocator.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "base/hooks.h"
#include "store/kv_store.h"
#include "store/slab_pool.h"

namespace {

struct CountingMemory {
  int64_t slabs_allocated = 0, slabs_freed = 0;
  size_t live_bytes = 0;
  bool fail = false;
  pq::SlabPool::AllocFn alloc() {
    return [this](size_t bytes) -> void* {
      if (fail) return nullptr;
      ++slabs_allocated;
      live_bytes += bytes;
      return std::aligned_alloc(256, bytes);
    };
  }
  pq::SlabPool::FreeFn free() {
    return [this](void* p, size_t bytes) {
      ++slabs_freed;
      live_bytes -= bytes;
      std::free(p);
    };
  }
};

TEST(SlabPool, BlocksComeFromFewSlabsAndDoNotOverlap) {
  CountingMemory mem;
  pq::SlabPool pool(mem.alloc(), mem.free(), "test slabs", 64 * 1024);
  std::vector<void*> blocks;
  for (int i = 0; i < 40; ++i) {
    void* p = pool.allocate(4000);  // rounded to 4096: 16 per slab
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    std::memset(p, i, 4000);
    blocks.push_back(p);
  }
  EXPECT_EQ(mem.slabs_allocated, 3);  // ceil(40 / 16)
  for (int i = 0; i < 40; ++i)
    EXPECT_EQ(static_cast<unsigned char*>(blocks[i])[3999], static_cast<unsigned char>(i));
  std::set<uintptr_t> distinct;
  for (void* p : blocks) distinct.insert(reinterpret_cast<uintptr_t>(p));
  EXPECT_EQ(distinct.size(), 40u);
  EXPECT_TRUE(pool.owns(blocks[17]));
  int stack_value = 0;
  EXPECT_FALSE(pool.owns(&stack_value));
  for (void* p : blocks) pool.release(p, 4000);
}

TEST(SlabPool, EmptySlabsGoBackButOneSpare) {
  CountingMemory mem;
  {
    pq::SlabPool pool(mem.alloc(), mem.free(), "test slabs", 64 * 1024);
    std::vector<void*> blocks;
    for (int i = 0; i < 48; ++i) blocks.push_back(pool.allocate(4096));  // 3 slabs
    ASSERT_EQ(mem.slabs_allocated, 3);
    for (void* p : blocks) pool.release(p, 4096);
    EXPECT_EQ(mem.slabs_freed, 2);  // one empty slab kept as the spare
    EXPECT_EQ(pool.bytes_held(), size_t{64} * 1024);
    // The spare serves the next allocations without a new slab.
    void* again = pool.allocate(4096);
    EXPECT_EQ(mem.slabs_allocated, 3);
    pool.release(again, 4096);
  }
  EXPECT_EQ(mem.slabs_freed, mem.slabs_allocated);
  EXPECT_EQ(mem.live_bytes, 0u);
}

TEST(SlabPool, LargeBlocksGetASlabOfTheirOwnAndFailuresAreNull) {
  CountingMemory mem;
  pq::SlabPool pool(mem.alloc(), mem.free(), "test slabs", 64 * 1024);
  void* big = pool.allocate(200 * 1024);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(pool.bytes_held(), size_t{200} * 1024);
  mem.fail = true;
  EXPECT_EQ(pool.allocate(100), nullptr);  // a new size needs a new slab: refused
  pool.release(big, 200 * 1024);
}

TEST(SlabPool, ServesAKvStoreAsItsAllocator) {
  CountingMemory mem;
  pq::SlabPool pool(mem.alloc(), mem.free(), "test slabs", 1 << 20);
  pq::MemoryBudget budget(0);
  {
    pq::KvStore store(2, 16, PQ_DTYPE_F32, &budget, 1 << 16, pool.allocator());
    const int64_t tokens = 700;  // 3 chunks
    std::vector<float> k(static_cast<size_t>(tokens) * 2 * 16), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = static_cast<float>(i);
      v[i] = -static_cast<float>(i);
    }
    pq_tensor kt, vt;
    ASSERT_EQ(pq_tensor_init(&kt, k.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, tokens, 2, 16), PQ_OK);
    ASSERT_EQ(pq_tensor_init(&vt, v.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, tokens, 2, 16), PQ_OK);
    store.append(kt, vt);
    EXPECT_TRUE(pool.owns(store.key_row(0, 0)));
    EXPECT_TRUE(pool.owns(store.value_row(699, 1)));
    float got;
    std::memcpy(&got, store.key_row(513, 1) + 4 * 3, 4);
    EXPECT_EQ(got, static_cast<float>((513 * 2 + 1) * 16 + 3));
    EXPECT_EQ(mem.slabs_allocated, 1);  // 6 blocks of 32 KB share one slab
  }
  EXPECT_EQ(pool.bytes_held(), size_t{1} << 20);  // the spare
}

}  // namespace
