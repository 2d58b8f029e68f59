// CodeColumn (src/store/code_column.h): a fork shares the frozen prefix with its
// parent, and from then on neither side's appends, truncates or further
// forks change what the other reads.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "store/code_column.h"

namespace {

constexpr int32_t kM = 3;
constexpr int64_t kLong = pq::CodeColumn::kMinFrozenTokens + 500;

// Token t's codes in a column written by `writer` (a tag per writer, so the
// two sides of a fork write different bytes).
uint8_t code(int64_t t, int32_t j, int writer) {
  return static_cast<uint8_t>((t * 7 + j * 31 + writer * 101) & 0xff);
}

void append(pq::CodeColumn& c, int64_t tokens, int writer) {
  const int64_t from = c.tokens();
  uint8_t* p = c.grow(from + tokens);
  for (int64_t t = 0; t < tokens; ++t)
    for (int32_t j = 0; j < kM; ++j) p[t * kM + j] = code(from + t, j, writer);
}

// The column's codes, read three ways that must agree: at(), copy_out()
// and the runs.
std::vector<uint8_t> read(const pq::CodeColumn& c) {
  const int64_t n = c.tokens();
  std::vector<uint8_t> copied(static_cast<size_t>(n) * kM), walked, pointwise;
  c.copy_out(0, n, copied.data());
  int64_t next = 0;
  c.for_each_run(0, n, [&](int64_t first, int64_t count, const uint8_t* data) {
    EXPECT_EQ(first, next) << "runs in order, without gaps";
    walked.insert(walked.end(), data, data + count * kM);
    next = first + count;
  });
  for (int64_t t = 0; t < n; ++t) pointwise.insert(pointwise.end(), c.at(t), c.at(t) + kM);
  EXPECT_EQ(walked, copied);
  EXPECT_EQ(pointwise, copied);
  return copied;
}

std::vector<uint8_t> expected(const std::vector<std::pair<int64_t, int>>& spans) {
  std::vector<uint8_t> out;
  int64_t t = 0;
  for (const auto& [tokens, writer] : spans)
    for (int64_t end = t + tokens; t < end; ++t)
      for (int32_t j = 0; j < kM; ++j) out.push_back(code(t, j, writer));
  return out;
}

TEST(CodeColumn, ForkSharesALongPrefixAndEachSideAppendsAlone) {
  pq::CodeColumn parent(kM);
  append(parent, kLong, 1);
  const uint8_t* before = parent.at(0);
  pq::CodeColumn child = parent.fork();
  EXPECT_EQ(parent.at(0), before) << "freezing moves no bytes";
  EXPECT_EQ(child.at(0), parent.at(0)) << "the prefix is held once";
  EXPECT_EQ(child.own_bytes(), 0u);
  EXPECT_GE(child.shared_bytes(), static_cast<uint64_t>(kLong) * kM);

  append(parent, 1000, 1);
  append(child, 700, 2);
  EXPECT_EQ(read(parent), expected({{kLong + 1000, 1}}));
  EXPECT_EQ(read(child), expected({{kLong, 1}, {700, 2}}));
  EXPECT_EQ(parent.runs(), 2u);
  EXPECT_EQ(child.runs(), 2u);
}

TEST(CodeColumn, ForkCopiesAShortTail) {
  pq::CodeColumn parent(kM);
  append(parent, 100, 1);
  pq::CodeColumn child = parent.fork();
  EXPECT_NE(child.at(0), parent.at(0));
  EXPECT_EQ(parent.runs(), 1u);
  EXPECT_EQ(child.runs(), 1u);
  append(child, 5, 2);
  EXPECT_EQ(read(parent), expected({{100, 1}}));
  EXPECT_EQ(read(child), expected({{100, 1}, {5, 2}}));
}

TEST(CodeColumn, TruncateIntoASharedRunLeavesTheOtherSideWhole) {
  pq::CodeColumn parent(kM);
  append(parent, kLong, 1);
  pq::CodeColumn child = parent.fork();
  append(child, kLong, 2);
  pq::CodeColumn grandchild = child.fork();  // runs [0, kLong), [kLong, 2 kLong)
  EXPECT_EQ(grandchild.runs(), 2u);

  child.shrink(kLong - 10);  // into the run all three share
  EXPECT_EQ(read(child), expected({{kLong - 10, 1}}));
  append(child, 20, 3);
  EXPECT_EQ(read(child), expected({{kLong - 10, 1}, {20, 3}}));
  EXPECT_EQ(read(parent), expected({{kLong, 1}}));
  EXPECT_EQ(read(grandchild), expected({{kLong, 1}, {kLong, 2}}));

  grandchild.shrink(kLong + 5);  // into its second run
  append(grandchild, 3, 4);
  EXPECT_EQ(read(grandchild), expected({{kLong, 1}, {5, 2}, {3, 4}}));
  grandchild.shrink(0);
  EXPECT_EQ(grandchild.tokens(), 0);
  append(grandchild, 2, 5);
  EXPECT_EQ(read(grandchild), expected({{2, 5}}));
  EXPECT_EQ(read(parent), expected({{kLong, 1}}));
}

TEST(CodeColumn, RunsClipToTheAskedRange) {
  pq::CodeColumn c(kM);
  append(c, kLong, 1);
  (void)c.fork();
  append(c, 50, 1);
  std::vector<std::pair<int64_t, int64_t>> runs;
  c.for_each_run(kLong - 3, kLong + 4, [&](int64_t first, int64_t count, const uint8_t* data) {
    runs.emplace_back(first, count);
    EXPECT_EQ(std::memcmp(data, c.at(first), kM), 0);
  });
  EXPECT_EQ(runs, (std::vector<std::pair<int64_t, int64_t>>{{kLong - 3, 3}, {kLong, 4}}));
  runs.clear();
  c.for_each_run_reverse(kLong - 3, kLong + 4,
                         [&](int64_t first, int64_t count, const uint8_t*) {
                           runs.emplace_back(first, count);
                         });
  EXPECT_EQ(runs, (std::vector<std::pair<int64_t, int64_t>>{{kLong, 4}, {kLong - 3, 3}}));
  int calls = 0;
  c.for_each_run(5, 5, [&](int64_t, int64_t, const uint8_t*) { ++calls; });
  EXPECT_EQ(calls, 0);
}

}  // namespace
