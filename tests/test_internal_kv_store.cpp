// The K/V store's sharing rules (src/store/kv_store.h): a row a snapshot or a
// fork can still read is never written again. Checked directly on the
// store, because through the API the readers (an index build in flight)
// are a race window that a test cannot hold open.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "store/kv_store.h"
#include "store/memory_budget.h"

namespace {

constexpr int32_t kHeads = 2, kDim = 4;

// A token-major f32 tensor of `tokens` rows whose every value is `value`
// plus the row's index.
struct Rows {
  std::vector<float> data;
  pq_tensor t{};
  Rows(int64_t tokens, float value) : data(static_cast<size_t>(tokens * kHeads * kDim)) {
    for (int64_t i = 0; i < tokens; ++i)
      for (int32_t j = 0; j < kHeads * kDim; ++j)
        data[static_cast<size_t>(i * kHeads * kDim + j)] = value + static_cast<float>(i);
    t.data = data.data();
    t.dtype = PQ_DTYPE_F32;
    t.memory = PQ_MEMORY_HOST;
    t.tokens = tokens;
    t.heads = kHeads;
    t.head_dim = kDim;
    t.token_stride = kHeads * kDim;
    t.head_stride = kDim;
  }
};

float key_at(const pq::KvStore::Snapshot& s, int64_t token) {
  float v;
  std::memcpy(&v, s.key_row(token, 1), sizeof v);
  return v;
}

TEST(KvStore, TruncateUnderReadersNeverWritesTheRowsASnapshotHolds) {
  pq::MemoryBudget budget(0);
  pq::KvStore store(kHeads, kDim, PQ_DTYPE_F32, &budget, 1 << 16);
  Rows first(300, 0.f);
  store.append(first.t, first.t);
  const pq::KvStore::Snapshot build = store.snapshot();  // an index build's view
  store.truncate_under_readers(260);                   // pq_sequence_truncate
  Rows next(40, 1000.f);
  store.append(next.t, next.t);                        // the decode that follows
  for (int64_t t = 256; t < 300; ++t) EXPECT_EQ(key_at(build, t), static_cast<float>(t)) << t;
  const pq::KvStore::Snapshot now = store.snapshot();
  for (int64_t t = 256; t < 260; ++t) EXPECT_EQ(key_at(now, t), static_cast<float>(t)) << t;
  for (int64_t t = 260; t < 300; ++t) EXPECT_EQ(key_at(now, t), 1000.f + (t - 260)) << t;
}

TEST(KvStore, APlainTruncateWritesInPlace) {
  // What truncate_under_readers prevents: the undo of a failed append may
  // write its rows again in place (no reader can hold them).
  pq::MemoryBudget budget(0);
  pq::KvStore store(kHeads, kDim, PQ_DTYPE_F32, &budget, 1 << 16);
  Rows first(300, 0.f);
  store.append(first.t, first.t);
  const pq::KvStore::Snapshot view = store.snapshot();
  store.truncate(260);
  Rows next(40, 1000.f);
  store.append(next.t, next.t);
  EXPECT_EQ(key_at(view, 280), 1020.f) << "the same chunk: rewritten in place";
}

TEST(KvStore, AForkSharesFullChunksAndCopiesThePartialOne) {
  pq::MemoryBudget budget(0);
  pq::KvStore parent(kHeads, kDim, PQ_DTYPE_F32, &budget, 1 << 16);
  Rows first(600, 0.f);
  parent.append(first.t, first.t);
  const uint64_t held = budget.used();
  pq::KvStore child(kHeads, kDim, PQ_DTYPE_F32, &budget, 1 << 16);
  EXPECT_EQ(child.fork_from(parent), 2);
  EXPECT_EQ(budget.used() - held, uint64_t{1} << 16) << "only the partial chunk is charged";
  EXPECT_EQ(child.shared_chunks(), 2);
  EXPECT_EQ(parent.shared_chunks(), 2);
  Rows more(10, 5000.f);
  child.append(more.t, more.t);
  parent.truncate_under_readers(500);
  parent.append(more.t, more.t);
  const pq::KvStore::Snapshot c = child.snapshot(), p = parent.snapshot();
  for (int64_t t = 0; t < 600; ++t) ASSERT_EQ(key_at(c, t), static_cast<float>(t)) << t;
  for (int64_t t = 600; t < 610; ++t) EXPECT_EQ(key_at(c, t), 5000.f + (t - 600)) << t;
  for (int64_t t = 500; t < 510; ++t) EXPECT_EQ(key_at(p, t), 5000.f + (t - 500)) << t;
}

}  // namespace
