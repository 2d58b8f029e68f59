// select_top_p (base/top_p.h) against a sort: the k best in order (higher
// score, ties to the larger position), the fewest of them whose masses reach
// p of all n's, at least the floor; masses as sums (each score its own) and
// as logits (each its softmax). Sizes across the quickselect's cut-over to a
// sort, scores with many ties, and a scratch reused across calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "base/top_p.h"

namespace {

using pq::ScoreMass;

std::vector<int32_t> reference(const std::vector<float>& s, int64_t k, int64_t first,
                               ScoreMass kind, double p, int64_t floor) {
  const double top = *std::max_element(s.begin(), s.end());
  auto mass = [&](float v) {
    return kind == ScoreMass::kLogits ? std::exp(double{v} - top) : double{v};
  };
  double total = 0;
  for (float v : s) total += mass(v);
  std::vector<int32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    return s[a] > s[b] || (s[a] == s[b] && a > b);
  });
  int64_t c = 0;
  double held = 0;
  while (c < k && (p >= 1.0 || held < p * total)) held += mass(s[idx[static_cast<size_t>(c++)]]);
  c = std::min(k, std::max(c, floor));
  idx.resize(static_cast<size_t>(c));
  for (int32_t& i : idx) i += static_cast<int32_t>(first);
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST(TopP, MatchesASortedWalk) {
  std::mt19937 rng(11);
  pq::SelectScratch scratch;  // reused: stale contents must not leak through
  int cases = 0, pruned = 0;
  for (int64_t n : {1, 5, 63, 64, 65, 200, 1000, 20000})
    for (ScoreMass kind : {ScoreMass::kMassSums, ScoreMass::kLogits})
      for (int levels : {0, 4}) {  // 0: continuous scores; 4: four values, ties everywhere
        std::vector<float> s(static_cast<size_t>(n));
        std::exponential_distribution<float> spread(1.0f);
        std::uniform_int_distribution<int> level(0, std::max(levels - 1, 0));
        for (float& v : s) {
          const float x = levels ? static_cast<float>(level(rng)) : spread(rng);
          v = kind == ScoreMass::kLogits ? 3.0f * x : std::exp(2.0f * x) / 100.0f;
        }
        for (double share : {0.05, 0.3, 1.0})
          for (double p : {0.01, 0.5, 0.9, 0.999, 1.0})
            for (double floor_share : {0.0, 0.02, 0.5}) {
              const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(share * n));
              const auto floor = static_cast<int64_t>(std::ceil(floor_share * n));
              std::vector<int32_t> out(static_cast<size_t>(k) + 1, -1);
              const int64_t c =
                  pq::select_top_p(s.data(), n, k, 7, kind, p, floor, out.data(), scratch);
              ASSERT_EQ(out[static_cast<size_t>(k)], -1) << "wrote past k";
              out.resize(static_cast<size_t>(c));
              ASSERT_EQ(out, reference(s, k, 7, kind, p, floor))
                  << "n " << n << " k " << k << " p " << p << " floor " << floor << " levels "
                  << levels << " kind " << static_cast<int>(kind);
              ++cases;
              pruned += c < k;
            }
      }
  EXPECT_GT(pruned, cases / 4) << "too few cases kept fewer than k";
}

}  // namespace
