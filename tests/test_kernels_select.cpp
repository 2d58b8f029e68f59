// The host select step's kernels at the level PQ_CPU_LEVEL asks
// (tests/kernel_level.h), against plain scalar references written here:
// PQ scores bit-identical (the same additions in the same order), the GQA
// softmax combine within a tight tolerance of a double-precision reference,
// and the top k identical, ties to the larger position.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "base/scratch.h"
#include "base/topk.h"
#include "base/weighted_rows.h"
#include "kernel_level.h"
#include "pq/codebook.h"
#include "pqcache.h"

namespace {

// raw[g][t] = lut[g][0][c0] + lut[g][1][c1] for two subspaces, else
// 0 + lut[g][0][c0] + ... + lut[g][m-1][c_{m-1}], left to right.
std::vector<float> reference_scores(const std::vector<float>& lut, int group, int m, int centroids,
                                    const std::vector<uint8_t>& codes, int64_t n) {
  std::vector<float> raw(static_cast<size_t>(group) * n);
  for (int g = 0; g < group; ++g)
    for (int64_t t = 0; t < n; ++t) {
      const float* l = lut.data() + static_cast<size_t>(g) * m * centroids;
      const uint8_t* c = codes.data() + t * m;
      float s;
      if (m == 2) {
        s = l[c[0]] + l[centroids + c[1]];
      } else {
        s = 0.f;
        for (int j = 0; j < m; ++j) s = s + l[j * centroids + c[j]];
      }
      raw[static_cast<size_t>(g) * n + t] = s;
    }
  return raw;
}

TEST(SelectKernels, ScoresAreBitIdenticalToTheScalarSum) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 3.f);
  for (int m : {1, 2, 3, 4, 8})
    for (int bits : {4, 6, 8})
      for (int group = 1; group <= 8; ++group)
        for (int64_t n : {1, 15, 17, 333}) {
          const int centroids = 1 << bits;
          std::vector<float> lut(static_cast<size_t>(group) * m * centroids);
          for (float& v : lut) v = normal(rng);
          lut[0] = -0.f;  // a signed zero must keep its sign only as the scalar sum does
          std::vector<uint8_t> codes(static_cast<size_t>(n) * m);
          for (uint8_t& c : codes) c = static_cast<uint8_t>(rng() % centroids);
          const std::vector<float> want = reference_scores(lut, group, m, centroids, codes, n);
          // A stride past n: the gap must stay untouched.
          const int64_t stride = n + 5;
          std::vector<float> got(static_cast<size_t>(group) * stride, 12345.f);
          pq::PqCodebook::pq_scores(lut.data(), group, m, centroids, codes.data(), n, got.data(),
                                    stride);
          for (int g = 0; g < group; ++g) {
            ASSERT_EQ(std::memcmp(got.data() + g * stride, want.data() + g * n, n * sizeof(float)), 0)
                << "m " << m << " b " << bits << " group " << group << " n " << n << " head " << g;
            for (int64_t t = n; t < stride; ++t) ASSERT_EQ(got[g * stride + t], 12345.f);
          }
        }
}

// sum over g of softmax(raw[g] * scale), in double.
std::vector<double> reference_sum_softmax(const std::vector<float>& raw, int group, int64_t n,
                                          float scale, const std::vector<uint32_t>* counts) {
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  for (int g = 0; g < group; ++g) {
    const float* r = raw.data() + static_cast<size_t>(g) * n;
    double mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(r[i]) * scale);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i)
      sum += (counts ? (*counts)[i] : 1.0) * std::exp(static_cast<double>(r[i]) * scale - mx);
    for (int64_t i = 0; i < n; ++i) out[i] += std::exp(static_cast<double>(r[i]) * scale - mx) / sum;
  }
  return out;
}

// The specification of PqCodebook::lut: each entry is q . c with eight
// partial sums by dimension mod 8 (each from 0, a product then an add),
// added left to right from 0, then the dimensions past the last eight.
float specified_dot(const float* q, const float* c, int32_t n) {
  float lanes[8] = {};
  int32_t d = 0;
  for (; d + 8 <= n; d += 8)
    for (int l = 0; l < 8; ++l) {
      const float product = q[d + l] * c[d + l];
      lanes[l] = lanes[l] + product;
    }
  float s = 0.f;
  for (int l = 0; l < 8; ++l) s = s + lanes[l];
  for (; d < n; ++d) {
    const float product = q[d] * c[d];
    s = s + product;
  }
  return s;
}

TEST(SelectKernels, LookupTableIsBitIdenticalToTheScalarDot) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 2.f);
  for (int32_t m : {1, 2, 4})
    for (int32_t sub_dim : {1, 3, 8, 12, 32, 40})
      for (int bits : {1, 2, 4, 5, 8})
        for (int32_t group : {1, 3, 4}) {
          pq::PqCodebook cb;
          cb.heads = 2;
          cb.subspaces = m;
          cb.centroids = 1 << bits;
          cb.sub_dim = sub_dim;
          cb.data.resize(static_cast<size_t>(cb.heads) * m * cb.centroids * sub_dim);
          for (float& v : cb.data) v = normal(rng);
          const int32_t head_dim = m * sub_dim;
          std::vector<float> queries(static_cast<size_t>(group) * head_dim);
          for (float& v : queries) v = normal(rng);
          // A zero centroid: negative query elements make -0 products, and
          // only sums from +0, as specified, give +0.
          queries[0] = -1.f;
          std::fill(cb.at(1, 0), cb.at(1, 0) + sub_dim, 0.f);
          for (int32_t head = 0; head < cb.heads; ++head) {
            std::vector<float> got(cb.lut_floats(group), 7.f);
            cb.lut(head, queries.data(), group, head_dim, got.data());
            for (int32_t g = 0; g < group; ++g)
              for (int32_t j = 0; j < m; ++j)
                for (int32_t c = 0; c < cb.centroids; ++c) {
                  const float want = specified_dot(
                      queries.data() + static_cast<size_t>(g) * head_dim + j * sub_dim,
                      cb.at(head, j) + static_cast<size_t>(c) * sub_dim, sub_dim);
                  const float have = got[(static_cast<size_t>(g) * m + j) * cb.centroids + c];
                  ASSERT_EQ(std::memcmp(&want, &have, sizeof want), 0)
                      << "m " << m << " sub_dim " << sub_dim << " bits " << bits << " group "
                      << group << " head " << head << " g " << g << " j " << j << " c " << c
                      << ": " << have << " want " << want;
                }
          }
        }
}

TEST(SelectKernels, SoftmaxCombineMatchesADoubleReference) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 4.f);
  pq::SelectScratch scratch;
  for (int group : {2, 3, 4, 8})
    for (int64_t n : {7, 8, 61, 4099}) {
      std::vector<float> raw(static_cast<size_t>(group) * n);
      for (float& v : raw) v = normal(rng);
      std::vector<uint32_t> counts(static_cast<size_t>(n));
      for (uint32_t& c : counts) c = 1 + rng() % 50;
      const float scale = 0.35f;
      std::vector<float> got(static_cast<size_t>(n));
      pq::combine_group_scores(raw.data(), group, n, PQ_GQA_SUM_SOFTMAX, scale, got.data(), scratch);
      std::vector<double> want = reference_sum_softmax(raw, group, n, scale, nullptr);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(got[i], want[i], 2e-6 * want[i] + 1e-30) << "group " << group << " n " << n << " i " << i;
      pq::combine_softmax_weighted(raw.data(), counts.data(), group, n, scale, got.data(), scratch);
      want = reference_sum_softmax(raw, group, n, scale, &counts);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(got[i], want[i], 2e-6 * want[i] + 1e-30) << "weighted, group " << group << " n " << n;
    }
}

uint32_t reference_key(float f) {
  f += 0.0f;
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The k largest (key, position) pairs, positions + first ascending.
std::vector<int32_t> reference_top_k(const std::vector<float>& s, int64_t k, int64_t first) {
  std::vector<std::pair<uint32_t, int32_t>> all;
  for (size_t i = 0; i < s.size(); ++i) all.emplace_back(reference_key(s[i]), static_cast<int32_t>(i));
  std::sort(all.begin(), all.end(), std::greater<>());
  std::vector<int32_t> out;
  for (int64_t i = 0; i < k; ++i) out.push_back(static_cast<int32_t>(first + all[i].second));
  std::sort(out.begin(), out.end());
  return out;
}

TEST(SelectKernels, TopKIsIdenticalToASortIncludingTies) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  pq::SelectScratch scratch;
  for (int64_t n : {100, 20001, 70003, 131072})
    for (int kind = 0; kind < 5; ++kind) {
      std::vector<float> s(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        switch (kind) {
          case 0: s[i] = normal(rng); break;                                  // distinct
          case 1: s[i] = static_cast<float>(rng() % 7) - 3.f; break;          // many ties
          case 2: s[i] = (rng() % 2) ? 0.f : -0.f; break;                      // signed zeros
          case 3: s[i] = 1.f; break;                                          // all equal
          default:  // the sampled positions hold the largest scores
            s[i] = (i % std::max<int64_t>(1, n / 4096) == 0) ? 1e9f : normal(rng);
        }
      }
      for (int64_t k : {int64_t{1}, n / 5, n / 2, n - 1}) {
        if (k <= 0) continue;
        std::vector<int32_t> got(static_cast<size_t>(k), -1);
        pq::select_top_k(s.data(), n, k, 1000, got.data(), scratch);
        ASSERT_EQ(got, reference_top_k(s, k, 1000)) << "n " << n << " kind " << kind << " k " << k;
      }
    }
}

// select_top_k_weighted forms each sum in the keep pass at the AVX-512
// level (and writes the sums first below it): the same positions as the top
// k of the sums written out, including ties, signed zeros, and inputs that
// make the sampled band's guesses fail (then the sums are written after
// all). weighted_rows_sum writes weighted_rows_at's bits, which are a
// product and an add per row, left to right.
TEST(SelectKernels, WeightedTopKIsTheTopKOfTheSums) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  pq::SelectScratch scratch;
  for (int32_t count : {1, 2, 4, 7})
    for (int64_t n : {100, 20001, 70003, 131072})
      for (int kind = 0; kind < 5; ++kind) {
        const int64_t stride = std::max<int64_t>(1, n / std::min<int64_t>(4096, n / 8));
        std::vector<float> rows(static_cast<size_t>(count) * n), weights(static_cast<size_t>(count));
        for (float& w : weights) w = 0.25f + std::abs(normal(rng));
        for (int32_t r = 0; r < count; ++r)
          for (int64_t i = 0; i < n; ++i) {
            float& x = rows[static_cast<size_t>(r) * n + i];
            switch (kind) {
              case 0: x = std::abs(normal(rng)); break;                       // distinct
              case 1: x = static_cast<float>(rng() % 3); break;               // many ties
              case 2: x = (rng() % 2) ? 0.f : -0.f; break;                    // signed zeros
              case 3: x = i % 2 == 0 ? 5.f : std::abs(normal(rng)); break;    // half tie at the top
              default: x = i % stride == 0 ? 1e6f : std::abs(normal(rng));   // the sample sees only highs
            }
          }
        const pq::WeightedRows w{rows.data(), count, n, weights.data()};
        std::vector<float> sums(static_cast<size_t>(n));
        pq::weighted_rows_sum(w, sums.data());
        for (int64_t i = 0; i < n; ++i) {
          float expect = rows[static_cast<size_t>(i)] * weights[0];
          for (int32_t r = 1; r < count; ++r)
            expect = expect + rows[static_cast<size_t>(r) * n + i] * weights[static_cast<size_t>(r)];
          ASSERT_EQ(std::memcmp(&expect, &sums[static_cast<size_t>(i)], sizeof expect), 0)
              << "count " << count << " n " << n << " kind " << kind << " i " << i;
        }
        for (int64_t k : {int64_t{0}, int64_t{1}, n / 5, n / 2, n - 1, n}) {
          std::vector<int32_t> got(static_cast<size_t>(std::max<int64_t>(k, 1)), -1);
          pq::select_top_k_weighted(w, k, 1000, got.data(), scratch);
          got.resize(static_cast<size_t>(k));
          ASSERT_EQ(got, reference_top_k(sums, k, 1000))
              << "count " << count << " n " << n << " kind " << kind << " k " << k;
        }
      }
}

}  // namespace
