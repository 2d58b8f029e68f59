// The top-k radix select and the GQA combine against plain reference code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "pqcache.h"
#include "base/topk.h"

namespace {

// The library's order: higher score first, ties to the larger position.
std::vector<int32_t> reference_top_k(const std::vector<float>& s, int64_t k, int64_t first) {
  std::vector<int32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    return s[a] > s[b] || (s[a] == s[b] && a > b);
  });
  idx.resize(static_cast<size_t>(k));
  for (auto& i : idx) i += static_cast<int32_t>(first);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<int32_t> library_top_k(const std::vector<float>& s, int64_t k, int64_t first,
                                   pq::SelectScratch& scratch) {
  std::vector<int32_t> out(static_cast<size_t>(k) + 1, -1);  // +1: no write past k
  pq::select_top_k(s.data(), static_cast<int64_t>(s.size()), k, first, out.data(), scratch);
  EXPECT_EQ(out[static_cast<size_t>(k)], -1) << "wrote past k";
  out.resize(static_cast<size_t>(k));
  return out;
}

TEST(TopK, MatchesFullSortOnRandomScores) {
  std::mt19937 rng(5);
  pq::SelectScratch scratch;  // reused on purpose: stale contents must not leak through
  for (int64_t n : {1, 2, 7, 100, 1000, 8192, 50000}) {
    std::normal_distribution<float> normal(0.f, 3.f);
    std::vector<float> s(static_cast<size_t>(n));
    for (auto& x : s) x = normal(rng);
    for (int64_t k : {int64_t{1}, n / 10 + 1, n / 2, n - 1, n}) {
      if (k < 1 || k > n) continue;
      EXPECT_EQ(library_top_k(s, k, 100, scratch), reference_top_k(s, k, 100))
          << "n " << n << " k " << k;
    }
  }
}

TEST(TopK, TiesGoToTheLargerPosition) {
  pq::SelectScratch scratch;
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> few(0, 3);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> s(3000);
    for (auto& x : s) x = static_cast<float>(few(rng)) * 0.25f;  // massive ties
    for (int64_t k : {1, 10, 700, 1500, 2999})
      EXPECT_EQ(library_top_k(s, k, 0, scratch), reference_top_k(s, k, 0)) << "k " << k;
  }
  std::vector<float> zeros = {0.f, -0.f, 0.f, -0.f, -1.f, 1.f};  // -0 equals +0
  EXPECT_EQ(library_top_k(zeros, 3, 0, scratch), reference_top_k(zeros, 3, 0));
}

// From 16K scores the select samples a band of keys around k's rank and
// sends only the keys inside it through the radix passes; each input below
// makes one of its guesses right or wrong on purpose.
TEST(TopK, SampledBandMatchesFullSortWhereItsGuessesHoldOrFail) {
  pq::SelectScratch scratch;
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::uniform_int_distribution<int> few(0, 5);
  for (int64_t n : {16384, 50001, 131072}) {
    const int64_t stride = n / std::min<int64_t>(4096, n / 8);  // the sample's
    for (int shape = 0; shape < 4; ++shape) {
      std::vector<float> s(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        float& x = s[static_cast<size_t>(i)];
        switch (shape) {
          case 0: x = normal(rng); break;                              // both guesses hold
          case 1: x = static_cast<float>(few(rng)) * 0.5f; break;      // massive ties at the k-th
          case 2: x = i % stride == 0 ? 10.f + normal(rng) : normal(rng); break;  // the sample sees only highs: fewer than k above the low key
          case 3: x = i % 2 == 0 ? 7.f : normal(rng); break;            // half the scores tie at the top: k or more above the high key
        }
      }
      for (int64_t k : {int64_t{1}, n / 50, n / 5, n / 2, n - 1})
        EXPECT_EQ(library_top_k(s, k, 3, scratch), reference_top_k(s, k, 3))
            << "n " << n << " shape " << shape << " k " << k;
    }
  }
}

TEST(TopK, NegativeAndTinyScoresKeepTheirOrder) {
  pq::SelectScratch scratch;
  std::vector<float> s = {-1e30f, -3.f, 1e-38f, 2e-38f, -1e-38f, 5.f, -0.5f, 1e30f, 0.f};
  for (int64_t k = 1; k <= static_cast<int64_t>(s.size()); ++k)
    EXPECT_EQ(library_top_k(s, k, 7, scratch), reference_top_k(s, k, 7)) << "k " << k;
}

TEST(Combine, SumOfSoftmaxMatchesDoublePrecision) {
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.f, 20.f);  // wide logits, deep exp tails
  const int32_t group = 4;
  const int64_t n = 5000;
  const float scale = 0.125f;
  std::vector<float> raw(group * n);
  for (auto& x : raw) x = normal(rng);
  raw[3] = -1e6f;  // far below exp's range: must give 0, not garbage
  std::vector<float> out(n);
  pq::SelectScratch scratch;
  pq::combine_group_scores(raw.data(), group, n, PQ_GQA_SUM_SOFTMAX, scale, out.data(), scratch);
  std::vector<double> want(n, 0.0);
  for (int32_t g = 0; g < group; ++g) {
    const float* r = raw.data() + g * n;
    double mx = -INFINITY, sum = 0.0;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(r[i]) * scale);
    for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(r[i]) * scale - mx);
    for (int64_t i = 0; i < n; ++i) want[i] += std::exp(static_cast<double>(r[i]) * scale - mx) / sum;
  }
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    total += out[i];
    // Relative 1e-5 where it matters; absolute 1e-30 in the far tail.
    EXPECT_NEAR(out[i], want[i], 1e-5 * want[i] + 1e-30) << "i " << i;
  }
  EXPECT_NEAR(total, group, 1e-4);
  EXPECT_EQ(out[3] >= 0.f, true);
}

TEST(Combine, MaxAndMeanOfScaledLogits) {
  std::vector<float> raw = {1.f, -2.f, 3.f,   // head 0
                            4.f, -5.f, 0.f};  // head 1
  std::vector<float> out(3);
  pq::SelectScratch scratch;
  pq::combine_group_scores(raw.data(), 2, 3, PQ_GQA_MAX, 0.5f, out.data(), scratch);
  EXPECT_EQ(out, (std::vector<float>{2.f, -1.f, 1.5f}));
  pq::combine_group_scores(raw.data(), 2, 3, PQ_GQA_MEAN, 0.5f, out.data(), scratch);
  EXPECT_EQ(out, (std::vector<float>{1.25f, -1.75f, 0.75f}));
}

}  // namespace
