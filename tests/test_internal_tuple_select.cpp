// The tuple path of PQ selection (src/pq/pq_tuple_select.cpp) against the
// per-token pipeline it replaces (pq_scores, combine_group_scores,
// select_top_k): bit-identical selections for MAX, MEAN and single-head
// softmax, over shapes, many ties and the k edges; for softmax over a
// group, the overlap the different rounding of the normalisers leaves.
// Codes split into runs, as a fork leaves them (code_column.h), select as
// contiguous ones do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "pq/pq_index.h"
#include "pq/pq_tuple_select.h"
#include "store/code_column.h"
#include "base/scratch.h"
#include "base/topk.h"

namespace {

struct Case {
  int32_t m, bits, group, combine;
  int64_t n, k;
  bool coarse;  // LUT values from a few levels: many equal scores
};

std::vector<int32_t> reference(const std::vector<float>& lut, const std::vector<uint8_t>& codes,
                               const Case& c, int64_t first) {
  pq::SelectScratch scratch;
  const int32_t centroids = 1 << c.bits;
  std::vector<float> raw(static_cast<size_t>(c.group) * c.n), combined(static_cast<size_t>(c.n));
  pq::PqCodebook::pq_scores(lut.data(), c.group, c.m, centroids, codes.data(), c.n,
                                    raw.data(), c.n);
  pq::combine_group_scores(raw.data(), c.group, c.n, c.combine, 0.125f, combined.data(), scratch);
  std::vector<int32_t> out(static_cast<size_t>(c.k));
  pq::select_top_k(combined.data(), c.n, c.k, first, out.data(), scratch);
  return out;
}

// The codes as a column; split, as forks leave them: frozen runs of a
// little more than kMinFrozenTokens tokens each, then the tail.
pq::CodeColumn column_of(const std::vector<uint8_t>& codes, int32_t m, bool split,
                         int64_t first = 0) {
  const int64_t n = static_cast<int64_t>(codes.size()) / m;
  pq::CodeColumn column(m);
  const int64_t step = split ? pq::CodeColumn::kMinFrozenTokens + 123 : n;
  if (first > 0) std::memset(column.grow(first), 0, static_cast<size_t>(first) * m);
  for (int64_t at = 0; at < n;) {
    const int64_t end = std::min(n, at + step);
    std::memcpy(column.grow(first + end), codes.data() + at * m, static_cast<size_t>(end - at) * m);
    at = end;
    if (at < n) column.fork();  // freezes the tail
  }
  return column;
}

std::vector<int32_t> tuple_path(const std::vector<float>& lut, const std::vector<uint8_t>& codes,
                                const Case& c, int64_t first, bool split = false) {
  pq::SelectScratch scratch;
  std::vector<int32_t> out(static_cast<size_t>(c.k), -1);
  const pq::CodeColumn column = column_of(codes, c.m, split, first);
  if (split) EXPECT_GT(column.runs(), 1u);
  pq::pq_tuple_select(lut.data(), c.group, c.m, 1 << c.bits, column, c.n, first, c.combine,
                      0.125f, c.k, out.data(), scratch);
  return out;
}

void make_data(const Case& c, uint32_t seed, std::vector<float>* lut, std::vector<uint8_t>* codes) {
  std::mt19937 rng(seed);
  const int32_t centroids = 1 << c.bits;
  lut->resize(static_cast<size_t>(c.group) * c.m * centroids);
  std::normal_distribution<float> normal(0.f, 3.f);
  for (float& v : *lut) v = c.coarse ? static_cast<float>(static_cast<int>(rng() % 5) - 2) : normal(rng);
  codes->resize(static_cast<size_t>(c.n) * c.m);
  // Skewed codes, as trained ones are: some tuples common, some absent.
  for (uint8_t& v : *codes) {
    const uint32_t r = rng() % 100;
    v = static_cast<uint8_t>(r < 60 ? rng() % std::max(1, centroids / 8) : rng() % centroids);
  }
}

TEST(TupleSelect, AppliesOnlyToFewTuplesAndLongMiddles) {
  EXPECT_TRUE(pq::pq_tuple_select_applies(2, 64, 32768));
  EXPECT_FALSE(pq::pq_tuple_select_applies(2, 64, 32767));
  EXPECT_FALSE(pq::pq_tuple_select_applies(2, 256, 65536));
  EXPECT_TRUE(pq::pq_tuple_select_applies(2, 256, 524288));
  EXPECT_TRUE(pq::pq_tuple_select_applies(4, 16, 524288));
  EXPECT_FALSE(pq::pq_tuple_select_applies(4, 64, 1 << 30));  // 2^24 tuples
  EXPECT_FALSE(pq::pq_tuple_select_applies(3, 256, 1 << 30));
}

// Between one and eight tokens per tuple the path follows the keys: a
// sample of the middle with at most one distinct tuple in four takes it.
TEST(TupleSelect, PaysWhereTheSampledKeysRepeat) {
  pq::SelectScratch scratch;
  std::mt19937 rng(3);
  auto column = [&](int64_t n, int distinct) {  // 2 x 8 bits
    pq::CodeColumn c(2);
    uint8_t* p = c.grow(n);
    for (int64_t i = 0; i < 2 * n; ++i) p[i] = static_cast<uint8_t>(rng() % distinct);
    return c;
  };
  const pq::CodeColumn random = column(131072, 256), repeating = column(131072, 16);
  EXPECT_FALSE(pq::pq_tuple_select_pays(random, 2, 256, 0, 131072, scratch));
  EXPECT_TRUE(pq::pq_tuple_select_pays(repeating, 2, 256, 0, 131072, scratch));  // 256 tuples
  EXPECT_TRUE(pq::pq_tuple_select_pays(repeating, 2, 256, 7, 131000, scratch));
  EXPECT_FALSE(pq::pq_tuple_select_pays(repeating, 2, 256, 0, 65535, scratch));  // < 1 per tuple
  const pq::CodeColumn long_random = column(524288, 256);
  EXPECT_TRUE(pq::pq_tuple_select_pays(long_random, 2, 256, 0, 524288, scratch));  // 8 per tuple
  EXPECT_FALSE(pq::pq_tuple_select_pays(repeating, 4, 64, 0, 32768, scratch));     // 2^24 tuples
}

TEST(TupleSelect, ExactCombinesSelectBitIdentically) {
  std::vector<Case> cases;
  for (int32_t combine : {PQ_GQA_MAX, PQ_GQA_MEAN})
    for (bool coarse : {false, true}) {
      cases.push_back({2, 6, 4, combine, 20000, 4000, coarse});
      cases.push_back({2, 6, 1, combine, 5000, 1, coarse});
      cases.push_back({2, 6, 4, combine, 5000, 4999, coarse});
      cases.push_back({2, 8, 2, combine, 70000, 14000, coarse});
      cases.push_back({4, 4, 8, combine, 70000, 333, coarse});
      cases.push_back({1, 8, 3, combine, 3000, 700, coarse});
      cases.push_back({3, 5, 2, combine, 40000, 8000, coarse});
    }
  // Softmax over one query head is the logit itself: exact too.
  cases.push_back({2, 6, 1, PQ_GQA_SUM_SOFTMAX, 30000, 6000, false});
  cases.push_back({2, 6, 1, PQ_GQA_SUM_SOFTMAX, 30000, 6000, true});
  uint32_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "m " << c.m << " b " << c.bits << " group " << c.group
                                      << " combine " << c.combine << " n " << c.n << " k " << c.k
                                      << " coarse " << c.coarse);
    std::vector<float> lut;
    std::vector<uint8_t> codes;
    make_data(c, seed++, &lut, &codes);
    const std::vector<int32_t> expected = reference(lut, codes, c, 77);
    EXPECT_EQ(tuple_path(lut, codes, c, 77), expected);
    if (c.n > 2 * pq::CodeColumn::kMinFrozenTokens)
      EXPECT_EQ(tuple_path(lut, codes, c, 77, true), expected) << "split into runs";
  }
}

TEST(TupleSelect, GroupSoftmaxAgreesUpToTheNormalisersRounding) {
  int64_t total = 0, shared = 0;
  uint32_t seed = 100;
  for (const Case& c : {Case{2, 6, 4, PQ_GQA_SUM_SOFTMAX, 50000, 10000, false},
                        Case{2, 8, 8, PQ_GQA_SUM_SOFTMAX, 131072, 26214, false},
                        Case{4, 4, 4, PQ_GQA_SUM_SOFTMAX, 70000, 14000, false}}) {
    std::vector<float> lut;
    std::vector<uint8_t> codes;
    make_data(c, seed++, &lut, &codes);
    const std::vector<int32_t> a = tuple_path(lut, codes, c, 0), b = reference(lut, codes, c, 0);
    ASSERT_TRUE(std::is_sorted(a.begin(), a.end()));
    ASSERT_EQ(std::adjacent_find(a.begin(), a.end()), a.end());
    std::vector<int32_t> both;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
    total += c.k;
    shared += static_cast<int64_t>(both.size());
  }
  // Measured: every selection identical on these cases; allow 0.1%.
  EXPECT_GE(static_cast<double>(shared) / total, 0.999) << shared << " of " << total;
  std::printf("group softmax: %lld of %lld selected positions shared\n", static_cast<long long>(shared),
              static_cast<long long>(total));
}

}  // namespace

namespace {

// The kept count table (counts over every coded token) less the tokens
// outside the middle gives the selection that counting the middle gives,
// whether the middle sits at the start, inside or at the end of the coded
// tokens, and when the outside outnumbers the middle (counted instead).
TEST(TupleSelect, KeptCountsSelectWhatCountingSelects) {
  const Case base{2, 6, 4, PQ_GQA_SUM_SOFTMAX, 9000, 0, false};
  std::vector<float> lut;
  std::vector<uint8_t> codes;
  make_data(base, 7, &lut, &codes);
  const int64_t coded = base.n;
  std::vector<uint32_t> table(size_t{1} << 12, 0);
  for (int64_t i = 0; i < coded; ++i) ++table[codes[size_t(2 * i)] | (codes[size_t(2 * i + 1)] << 6)];
  struct Middle { int64_t first, n; };
  const pq::CodeColumn whole = column_of(codes, 2, false), split = column_of(codes, 2, true);
  ASSERT_EQ(split.runs(), 3u);  // runs [0, 4219), [4219, 8438), [8438, 9000)
  for (const Middle mid : {Middle{0, 9000}, Middle{4, 8868}, Middle{4, 8996}, Middle{300, 5000},
                           Middle{4000, 4500}, Middle{4500, 4500}, Middle{6000, 2000}}) {
    for (int64_t k : {int64_t{1}, mid.n / 5, mid.n - 1}) {
      Case c = base;
      c.n = mid.n;
      c.k = k;
      std::vector<int32_t> counted(static_cast<size_t>(k), -1);
      pq::SelectScratch s1;
      pq::pq_tuple_select(lut.data(), c.group, 2, 64, whole, c.n, mid.first, c.combine, 0.125f, k,
                          counted.data(), s1);
      for (const pq::CodeColumn* column : {&whole, &split}) {
        std::vector<int32_t> kept(static_cast<size_t>(k), -2), runs(static_cast<size_t>(k), -3);
        pq::SelectScratch s2, s3;
        pq::pq_tuple_select(lut.data(), c.group, 2, 64, *column, c.n, mid.first, c.combine,
                            0.125f, k, kept.data(), s2, pq::TupleCountTable{table.data(), coded});
        pq::pq_tuple_select(lut.data(), c.group, 2, 64, *column, c.n, mid.first, c.combine,
                            0.125f, k, runs.data(), s3);
        const char* what = column == &whole ? "one run" : "three runs";
        EXPECT_EQ(counted, kept) << what << ", first " << mid.first << " n " << mid.n << " k " << k;
        EXPECT_EQ(counted, runs) << what << ", first " << mid.first << " n " << mid.n << " k " << k;
      }
    }
  }
}

// The index keeps its tables up to date as tokens are coded a few at a
// time (decode steps), equal to counting every coded token afresh; none are
// kept where the tuple space is large.
TEST(TupleSelect, IndexTablesFollowTheCodedTokens) {
  pq::PqIndex index;
  auto codebook = std::make_shared<pq::PqCodebook>();
  codebook->subspaces = 2;
  codebook->centroids = 64;
  index.codebook = codebook;
  std::mt19937 rng(3);
  std::vector<std::vector<uint8_t>> heads(3, std::vector<uint8_t>(2 * 5000));
  for (auto& head : heads) {
    for (uint8_t& c : head) c = static_cast<uint8_t>(rng() % 64);
    index.codes.push_back(column_of(head, 2, true));  // runs [0, 4219), [4219, 5000)
  }
  pq::pq_index_count_tuples(index, 0, 4000);
  for (int64_t t = 4000; t < 5000; t += 7) pq::pq_index_count_tuples(index, t, std::min<int64_t>(t + 7, 5000));
  ASSERT_EQ(index.tuple_counts.size(), 3u);
  for (size_t h = 0; h < 3; ++h) {
    std::vector<uint32_t> fresh(4096, 0);
    for (int64_t i = 0; i < 5000; ++i) ++fresh[heads[h][size_t(2 * i)] | (heads[h][size_t(2 * i + 1)] << 6)];
    EXPECT_EQ(index.tuple_counts[h], fresh) << "head " << h;
  }
  EXPECT_GE(index.bytes(), 3u * 4096 * sizeof(uint32_t));
  EXPECT_EQ(pq::pq_tuple_table_size(2, 64), 4096);
  EXPECT_EQ(pq::pq_tuple_table_size(2, 256), 0);  // 2x8: 64K tuples, not kept
  EXPECT_EQ(pq::pq_tuple_table_size(4, 16), 0);   // 4x4
  pq::PqIndex large;
  auto large_codebook = std::make_shared<pq::PqCodebook>();
  large_codebook->subspaces = 4;
  large_codebook->centroids = 16;
  large.codebook = large_codebook;
  large.codes.push_back(column_of(std::vector<uint8_t>(4 * 10, 1), 4, false));
  pq::pq_index_count_tuples(large, 0, 10);
  EXPECT_TRUE(large.tuple_counts.empty());
}

}  // namespace
