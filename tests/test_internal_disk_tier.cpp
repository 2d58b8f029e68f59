// The disk tier's sizes (src/store/disk_tier.h): it keeps what it holds in
// memory and what it is charged as counts updated at every change, so that
// an append publishes them without walking its chunks. Checked against the
// budget, which sees every reservation the tier's chunks hold, after each
// kind of change.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "store/disk_tier.h"
#include "store/memory_budget.h"

namespace {

constexpr int32_t kHeads = 2, kDim = 4;
constexpr uint64_t kChunkKv = 2 * 256 * kHeads * kDim * 4;  // K and V of a chunk, f32
constexpr uint64_t kChunkCharge = kChunkKv + 1000;           // and some state

struct Rows {
  std::vector<float> data;
  pq_tensor t{};
  explicit Rows(int64_t tokens) : data(static_cast<size_t>(tokens * kHeads * kDim), 1.f) {
    t = pq_tensor{data.data(), PQ_DTYPE_F32, PQ_MEMORY_HOST, tokens, kHeads, kDim,
                  kHeads * kDim, kDim};
  }
};

struct Fixture {
  std::string dir;
  std::shared_ptr<pq::ChunkFile> file;
  pq::MemoryBudget budget{0};
  Fixture() {
    std::string pattern = "/tmp/pqdisk-internal-XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) dir = pattern;
    file = std::make_shared<pq::ChunkFile>(dir, 2 * 256 * kHeads * kDim * 4, pq::DiskIo{});
  }
  ~Fixture() { rmdir(dir.c_str()); }
  pq::DiskKvTier tier() {
    return pq::DiskKvTier({kHeads, kDim, PQ_DTYPE_F32, 4, 16}, &budget, kChunkCharge, kChunkKv,
                          file);
  }
};

// What the chunks' reservations hold, and the rows in memory they imply.
void expect_sizes(const pq::DiskKvTier& t, const pq::MemoryBudget& budget, const char* after) {
  EXPECT_EQ(t.bytes_charged(), budget.used()) << "after " << after;
  EXPECT_EQ(t.bytes_held(), static_cast<uint64_t>(t.chunks_in_memory()) * kChunkKv)
      << "after " << after;
}

TEST(DiskTier, SizesFollowEveryChange) {
  Fixture f;
  ASSERT_FALSE(f.dir.empty());
  pq::DiskKvTier t = f.tier();
  t.append(Rows(1000).t, Rows(1000).t);
  expect_sizes(t, f.budget, "a prefill of 1000 tokens");
  EXPECT_EQ(t.chunks_in_memory(), 2) << "the sink chunk and the window's";
  for (int i = 0; i < 300; ++i) t.append(Rows(1).t, Rows(1).t);
  expect_sizes(t, f.budget, "300 appends");
  t.truncate_under_readers(700);  // into a chunk in the file
  expect_sizes(t, f.budget, "a truncate into the file");
  t.append(Rows(5).t, Rows(5).t);  // copies that chunk back
  expect_sizes(t, f.budget, "an append into a chunk in the file");
  t.truncate(3);
  expect_sizes(t, f.budget, "a truncate to the sinks");
  EXPECT_EQ(t.chunks_in_memory(), 1);
}

TEST(DiskTier, SizesOfARestoreAndAFork) {
  Fixture f;
  ASSERT_FALSE(f.dir.empty());
  pq::DiskKvTier t = f.tier();
  t.expect(2000);
  expect_sizes(t, f.budget, "expect");
  EXPECT_EQ(t.chunks_in_memory(), 0) << "no rows before they come";
  ASSERT_TRUE(t.copy_in(0, Rows(2000).t, Rows(2000).t, nullptr));
  expect_sizes(t, f.budget, "copy_in");
  pq::MemoryBudget child_budget{0};
  pq::DiskKvTier child({kHeads, kDim, PQ_DTYPE_F32, 4, 16}, &child_budget, kChunkCharge,
                       kChunkKv, f.file);
  EXPECT_EQ(child.fork_from(t), 7);
  // The child is charged only for its copy of the partial last chunk; it
  // counts the shared chunks too, as the host store does.
  EXPECT_EQ(child_budget.used(), kChunkCharge);
  EXPECT_EQ(child.bytes_charged(), t.bytes_charged());
  EXPECT_EQ(child.bytes_held(), static_cast<uint64_t>(child.chunks_in_memory()) * kChunkKv);
}

}  // namespace
