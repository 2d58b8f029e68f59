// The fused scan + GQA softmax of the PQ host path (pq/pq_softmax_scan.h)
// and the products kernel under it, at the level PQ_CPU_LEVEL asks
// (tests/kernel_level.h): the products and their lane sums bit-identical to
// a scalar walk, the combined scores bit-identical to the specification
// written out here in scalar float, within a tight tolerance of a
// double-precision softmax,
// the same bits for a fork's runs as for one run, and the fallback where
// the shift bound lies far above every logit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "base/fast_exp.h"
#include "base/scratch.h"
#include "base/topk.h"
#include "base/weighted_rows.h"
#include "kernel_level.h"
#include "pq/codebook.h"
#include "pq/pq_softmax_scan.h"
#include "store/code_column.h"

namespace {

// The products and their lanes: token t is index first + t; indices below
// `whole` go to lane index mod 4, in order; tops the largest product.
TEST(SoftmaxScanKernels, ProductsAndTheirSumsAreBitIdenticalToAScalarWalk) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> factor(0.01f, 1.f);
  for (int m : {1, 2, 3, 4, 8})
    for (int bits : {4, 8})
      for (int group = 1; group <= 9; ++group)
        for (int64_t n : {1, 15, 17, 333})
          for (int64_t first : {0, 3}) {
            const int centroids = 1 << bits;
            const int64_t whole = first + n - 2;  // the last two tokens outside the lanes
            std::vector<float> table(static_cast<size_t>(group) * m * centroids);
            for (float& v : table) v = factor(rng);
            std::vector<uint8_t> codes(static_cast<size_t>(n) * m);
            for (uint8_t& c : codes) c = static_cast<uint8_t>(rng() % centroids);
            const int64_t stride = n + 3;
            std::vector<float> got(static_cast<size_t>(group) * stride, 12345.f);
            std::vector<float> lanes(static_cast<size_t>(group) * pq::kProductLanes, 0.5f);
            std::vector<float> tops(static_cast<size_t>(group), 0.f);
            pq::PqCodebook::pq_products_summed(table.data(), group, m, centroids, codes.data(), n,
                                               got.data(), stride,
                                               {first, whole, lanes.data(), tops.data()});
            for (int g = 0; g < group; ++g) {
              float want_lanes[pq::kProductLanes] = {0.5f, 0.5f, 0.5f, 0.5f};
              float want_top = 0.f;
              for (int64_t t = 0; t < stride; ++t) {
                float want = 12345.f;
                if (t < n) {
                  want = 1.f;
                  for (int j = 0; j < m; ++j)
                    want = want * table[(static_cast<size_t>(g) * m + j) * centroids + codes[t * m + j]];
                  if (first + t < whole) want_lanes[(first + t) % 4] += want;
                  want_top = std::max(want_top, want);
                }
                ASSERT_EQ(std::memcmp(&got[g * stride + t], &want, sizeof want), 0)
                    << "m " << m << " b " << bits << " group " << group << " n " << n
                    << " first " << first << " head " << g << " token " << t;
              }
              ASSERT_EQ(std::memcmp(&lanes[g * pq::kProductLanes], want_lanes, sizeof want_lanes), 0)
                  << "lanes, m " << m << " group " << group << " n " << n << " first " << first;
              ASSERT_EQ(tops[g], want_top) << "top, m " << m << " group " << group << " n " << n;
            }
          }
}

struct Case {
  int32_t group, m, centroids;
  int64_t tokens, begin;
  float spread;  // standard deviation of the table entries
};

pq::PqCodebook codebook_of(const Case& c) {
  pq::PqCodebook cb;
  cb.subspaces = c.m;
  cb.centroids = c.centroids;
  return cb;
}

// The specification of pq_softmax_scan.h in plain scalar float.
std::vector<float> specified(const std::vector<float>& lut, const Case& c,
                             const std::vector<uint8_t>& codes, float scale) {
  const int64_t n = c.tokens - c.begin;
  const size_t per_query = static_cast<size_t>(c.m) * c.centroids;
  std::vector<float> table(lut.size());
  for (size_t row = 0; row < lut.size() / c.centroids; ++row) {
    const float* l = lut.data() + row * c.centroids;
    const float top = *std::max_element(l, l + c.centroids) * scale;
    for (int32_t k = 0; k < c.centroids; ++k)
      table[row * c.centroids + k] = pq::exp_nonpositive(l[k] * scale - top);
  }
  std::vector<float> out(static_cast<size_t>(n), 0.f);
  for (int32_t g = 0; g < c.group; ++g) {
    std::vector<float> e(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      float p = 1.f;
      for (int32_t j = 0; j < c.m; ++j)
        p = p * table[g * per_query + j * c.centroids + codes[(c.begin + i) * c.m + j]];
      e[i] = p;
    }
    const int64_t whole4 = n - n % 4;
    float lanes[4] = {};
    for (int64_t i = 0; i < whole4; ++i) lanes[i % 4] = lanes[i % 4] + e[i];
    float sum = 0.f;
    for (float l : lanes) sum = sum + l;
    for (int64_t i = whole4; i < n; ++i) sum = sum + e[i];
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; ++i) out[i] = g == 0 ? e[i] * inv : out[i] + e[i] * inv;
  }
  return out;
}

// sum over g of softmax(raw_g * scale) over the middle, in double.
std::vector<double> double_reference(const std::vector<float>& lut, const Case& c,
                                     const std::vector<uint8_t>& codes, float scale) {
  const int64_t n = c.tokens - c.begin;
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  for (int32_t g = 0; g < c.group; ++g) {
    std::vector<double> logit(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      double s = 0.0;
      for (int32_t j = 0; j < c.m; ++j)
        s += lut[(static_cast<size_t>(g) * c.m + j) * c.centroids + codes[(c.begin + i) * c.m + j]];
      logit[i] = s * scale;
    }
    const double top = *std::max_element(logit.begin(), logit.end());
    double sum = 0.0;
    for (double x : logit) sum += std::exp(x - top);
    for (int64_t i = 0; i < n; ++i) out[i] += std::exp(logit[i] - top) / sum;
  }
  return out;
}

struct Data {
  std::vector<float> lut;
  std::vector<uint8_t> codes;
  pq::CodeColumn column;
};

Data make_data(const Case& c, std::mt19937& rng) {
  Data d{{}, {}, pq::CodeColumn(c.m)};
  std::normal_distribution<float> normal(0.f, c.spread);
  d.lut.resize(static_cast<size_t>(c.group) * c.m * c.centroids);
  for (float& v : d.lut) v = normal(rng);
  d.codes.resize(static_cast<size_t>(c.tokens) * c.m);
  for (uint8_t& b : d.codes) b = static_cast<uint8_t>(rng() % c.centroids);
  std::memcpy(d.column.grow(c.tokens), d.codes.data(), d.codes.size());
  return d;
}

// A fork of d's first `shared` tokens, grown by the rest: its codes are a
// frozen run and its own tail (the parent's runs are shared, not copied).
pq::CodeColumn fork_of(const Data& d, const Case& c, int64_t shared) {
  pq::CodeColumn parent(c.m);
  std::memcpy(parent.grow(shared), d.codes.data(), static_cast<size_t>(shared) * c.m);
  pq::CodeColumn child = parent.fork();
  std::memcpy(child.grow(c.tokens), d.codes.data() + shared * c.m,
              static_cast<size_t>(c.tokens - shared) * c.m);
  return child;
}

TEST(SoftmaxScanKernels, CombinedScoresAreTheSpecifiedBitsAndMatchADoubleSoftmax) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::mt19937 rng(13);
  pq::SelectScratch scratch;
  const float scale = 0.125f;
  for (const Case& c : {Case{2, 2, 256, 70, 3, 4.f}, Case{4, 4, 256, 4099, 4, 3.f},
                        Case{3, 8, 16, 333, 0, 2.f}, Case{8, 4, 64, 20000, 17, 3.f},
                        Case{4, 3, 256, 16, 0, 1.f}, Case{7, 4, 256, 1, 0, 1.f},
                        Case{7, 4, 256, 5003, 2, 2.f}, Case{2, 1, 256, 999, 1, 5.f}}) {
    Data d = make_data(c, rng);
    const pq::PqCodebook cb = codebook_of(c);
    const int64_t n = c.tokens - c.begin;
    std::vector<float> got(static_cast<size_t>(n), -1.f);
    ASSERT_TRUE(pq::pq_scan_sum_softmax(cb, d.lut.data(), c.group, d.column, c.begin, c.tokens,
                                        scale, got.data(), scratch));
    const std::vector<float> want = specified(d.lut, c, d.codes, scale);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
        << "group " << c.group << " m " << c.m << " tokens " << c.tokens;
    const std::vector<double> ref = double_reference(d.lut, c, d.codes, scale);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(got[i], ref[i], 1e-5 * ref[i] + 1e-9) << "token " << i << " group " << c.group;
  }
}

TEST(SoftmaxScanKernels, AForksRunsGiveTheBitsOfOneRun) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::mt19937 rng(17);
  pq::SelectScratch scratch;
  const Case c{4, 4, 256, pq::CodeColumn::kMinFrozenTokens + 1001, 5, 3.f};
  Data d = make_data(c, rng);
  const pq::CodeColumn child = fork_of(d, c, pq::CodeColumn::kMinFrozenTokens + 500);
  ASSERT_GE(child.runs(), 2u);
  const pq::PqCodebook cb = codebook_of(c);
  const int64_t n = c.tokens - c.begin;
  std::vector<float> one(static_cast<size_t>(n)), runs(static_cast<size_t>(n));
  ASSERT_TRUE(pq::pq_scan_sum_softmax(cb, d.lut.data(), c.group, d.column, c.begin, c.tokens,
                                      0.1f, one.data(), scratch));
  ASSERT_TRUE(pq::pq_scan_sum_softmax(cb, d.lut.data(), c.group, child, c.begin, c.tokens, 0.1f,
                                      runs.data(), scratch));
  EXPECT_EQ(std::memcmp(one.data(), runs.data(), one.size() * sizeof(float)), 0);
}

TEST(SoftmaxScanKernels, FallsBackWhereTheShiftBoundIsFarAboveEveryLogit) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::mt19937 rng(19);
  pq::SelectScratch scratch;
  const Case c{4, 4, 256, 3000, 0, 0.5f};
  Data d = make_data(c, rng);
  // Centroid 255 of every subspace scores 100 and no token uses it: the
  // bound lies 4 x 100 x scale = 40 above every logit of head 2.
  for (int32_t j = 0; j < c.m; ++j) d.lut[(2 * c.m + j) * c.centroids + 255] = 100.f;
  for (uint8_t& b : d.codes) b = static_cast<uint8_t>(b % 255);
  pq::CodeColumn column(c.m);
  std::memcpy(column.grow(c.tokens), d.codes.data(), d.codes.size());
  const pq::PqCodebook cb = codebook_of(c);
  std::vector<float> got(static_cast<size_t>(c.tokens), -1.f);
  EXPECT_FALSE(pq::pq_scan_sum_softmax(cb, d.lut.data(), c.group, column, 0, c.tokens, 0.1f,
                                       got.data(), scratch));
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float v) { return v == -1.f; }));
  // At 0.05 the bound is 20 above: within the slack, so no fallback.
  EXPECT_TRUE(pq::pq_scan_sum_softmax(cb, d.lut.data(), c.group, column, 0, c.tokens, 0.05f,
                                      got.data(), scratch));
}

// pq_softmax_shares leaves the numerators and their weights (one run, and a
// fork's runs): the top k taken from them without writing the combined
// scores (select_top_k_weighted, sampled from 16K scores) is the top k of
// the combined scores written out.
TEST(SoftmaxScanKernels, TheTopKOfTheSharesIsTheTopKOfTheCombinedScores) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::mt19937 rng(23);
  pq::SelectScratch scratch;
  const Case c{4, 4, 256, 50001, 7, 3.f};
  Data d = make_data(c, rng);
  const pq::CodeColumn child = fork_of(d, c, pq::CodeColumn::kMinFrozenTokens + 20011);
  ASSERT_GE(child.runs(), 2u);
  const pq::PqCodebook cb = codebook_of(c);
  const int64_t n = c.tokens - c.begin;
  ASSERT_GE(n, pq::kTopKSampledFrom);
  for (const pq::CodeColumn* column : {static_cast<const pq::CodeColumn*>(&d.column), &child}) {
    pq::WeightedRows shares{};
    ASSERT_TRUE(pq::pq_softmax_shares(cb, d.lut.data(), c.group, *column, c.begin, c.tokens, 0.1f,
                                      &shares, scratch));
    ASSERT_EQ(shares.n, n);
    ASSERT_EQ(shares.count, c.group);
    std::vector<float> combined(static_cast<size_t>(n));
    pq::weighted_rows_sum(shares, combined.data());
    std::vector<float> kept_combined = combined;  // the top-k below reuses the scratch
    for (int64_t k : {int64_t{1}, n / 5, n / 2}) {
      std::vector<int32_t> fused(static_cast<size_t>(k)), written(static_cast<size_t>(k));
      pq::select_top_k_weighted(shares, k, c.begin, fused.data(), scratch);
      pq::select_top_k(kept_combined.data(), n, k, c.begin, written.data(), scratch);
      ASSERT_EQ(fused, written) << "k " << k << " runs " << column->runs();
    }
  }
}

}  // namespace
