// K-Means training and PQ encoding (src/pq/kmeans.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "base/error.h"
#include "pq/kmeans.h"
#include "pqcache.h"
#include "pq/nearest_centroid.h"
#include "base/thread_pool.h"

namespace {

// Dense keys [head][token][head_dim] served through a KeyGather.
struct Keys {
  int32_t heads = 0;
  int64_t tokens = 0;
  int32_t head_dim = 0;
  std::vector<float> data;

  Keys(int32_t h, int64_t t, int32_t d)
      : heads(h), tokens(t), head_dim(d), data(static_cast<size_t>(h) * t * d) {}

  float* row(int32_t head, int64_t token) {
    return data.data() + (static_cast<size_t>(head) * tokens + token) * head_dim;
  }
  const float* row(int32_t head, int64_t token) const {
    return data.data() + (static_cast<size_t>(head) * tokens + token) * head_dim;
  }

  pq::KeyGather gather() const {
    return [this](int32_t head, const int64_t* rows, int64_t count, float* out) {
      for (int64_t i = 0; i < count; ++i) {
        EXPECT_GE(rows[i], 0);
        EXPECT_LT(rows[i], tokens);
        std::memcpy(out + i * head_dim, row(head, rows[i]), sizeof(float) * head_dim);
      }
    };
  }
};

Keys uniform_keys(int32_t heads, int64_t tokens, int32_t head_dim, uint32_t seed) {
  Keys keys(heads, tokens, head_dim);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (float& v : keys.data) v = value(rng);
  return keys;
}

// Gaussian blobs around `clusters` random centres per head.
Keys clustered_keys(int32_t heads, int64_t tokens, int32_t head_dim, int32_t clusters,
                    uint32_t seed) {
  Keys keys(heads, tokens, head_dim);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> centre_value(-10.0f, 10.0f);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  for (int32_t h = 0; h < heads; ++h) {
    std::vector<float> centres(static_cast<size_t>(clusters) * head_dim);
    for (float& v : centres) v = centre_value(rng);
    for (int64_t t = 0; t < tokens; ++t) {
      const float* centre = centres.data() + (rng() % clusters) * head_dim;
      for (int32_t d = 0; d < head_dim; ++d) keys.row(h, t)[d] = centre[d] + noise(rng);
    }
  }
  return keys;
}

pq::KMeansParams make_params(int32_t subspaces, int32_t bits, int32_t iterations, uint64_t seed,
                             int32_t init = PQ_KMEANS_INIT_KMEANSPP) {
  pq::KMeansParams params;
  params.subspaces = subspaces;
  params.bits = bits;
  params.max_iterations = iterations;
  params.tolerance = 0.0f;
  params.init = init;
  params.seed = seed;
  return params;
}

// Codes of every token, [head][token * subspaces + j].
std::vector<std::vector<uint8_t>> encode_all(const pq::PqCodebook& codebook, const Keys& keys,
                                             pq::ThreadPool* pool) {
  std::vector<std::vector<uint8_t>> codes(keys.heads);
  std::vector<uint8_t*> pointers(keys.heads);
  for (int32_t h = 0; h < keys.heads; ++h) {
    codes[h].assign(static_cast<size_t>(keys.tokens) * codebook.subspaces, 0xEE);
    pointers[h] = codes[h].data();
  }
  codebook.encode(keys.head_dim, 0, keys.tokens, keys.gather(), pool, pointers.data());
  return codes;
}

void expect_objective_non_increasing(const pq::KMeansReport& report) {
  for (size_t g = 0; g < report.objective.size(); ++g) {
    const std::vector<double>& history = report.objective[g];
    for (size_t t = 1; t < history.size(); ++t) {
      EXPECT_LE(history[t], history[t - 1] * (1.0 + 1e-6))
          << "group " << g << " iteration " << t;
    }
  }
}

TEST(KMeans, ObjectiveNeverRises) {
  pq::ThreadPool pool(2);
  for (uint64_t seed : {1u, 2u, 3u}) {
    for (int32_t init : {PQ_KMEANS_INIT_RANDOM, PQ_KMEANS_INIT_KMEANSPP}) {
      for (bool clustered : {false, true}) {
        const Keys keys = clustered ? clustered_keys(2, 3000, 16, 10, static_cast<uint32_t>(seed))
                                    : uniform_keys(2, 3000, 16, static_cast<uint32_t>(seed));
        pq::PqCodebook codebook;
        const pq::KMeansParams params = make_params(2, 4, 30, seed, init);
        const pq::KMeansReport report =
            pq::train_codebook(2, 16, 3000, keys.gather(), params, pool, nullptr, &codebook);
        ASSERT_EQ(report.objective.size(), 4u);
        EXPECT_GT(report.iterations, 1);
        for (const auto& history : report.objective) {
          ASSERT_FALSE(history.empty());
          EXPECT_GT(history.front(), 0.0);
        }
        expect_objective_non_increasing(report);
      }
    }
  }
}

TEST(KMeans, ObjectiveHistoryMatchesIterations) {
  pq::ThreadPool pool(2);
  const Keys keys = uniform_keys(1, 2000, 8, 7);
  pq::PqCodebook codebook;
  pq::KMeansParams params = make_params(1, 3, 5, 9);
  pq::KMeansReport report =
      pq::train_codebook(1, 8, 2000, keys.gather(), params, pool, nullptr, &codebook);
  EXPECT_EQ(report.iterations, 5);  // tolerance 0: every iteration runs
  ASSERT_EQ(report.objective.size(), 1u);
  EXPECT_EQ(report.objective[0].size(), 6u);  // t = 0 plus one per iteration

  params.max_iterations = 0;  // init only
  report = pq::train_codebook(1, 8, 2000, keys.gather(), params, pool, nullptr, &codebook);
  EXPECT_EQ(report.iterations, 0);
  EXPECT_EQ(report.objective[0].size(), 1u);

  // A loose tolerance stops well before the cap.
  params.max_iterations = 100;
  params.tolerance = 0.05f;
  report = pq::train_codebook(1, 8, 2000, keys.gather(), params, pool, nullptr, &codebook);
  EXPECT_LT(report.iterations, 100);
  EXPECT_GE(report.iterations, 1);
}

TEST(KMeans, SameSeedIsBitIdenticalAcrossPoolSizes) {
  const Keys keys = clustered_keys(2, 5000, 32, 20, 11);
  const pq::KMeansParams params = make_params(2, 5, 10, 42);
  std::vector<float> reference_centroids;
  std::vector<std::vector<uint8_t>> reference_codes;
  std::vector<std::vector<double>> reference_objective;
  for (int threads : {1, 2, 4, 1}) {
    pq::ThreadPool pool(threads);
    pq::PqCodebook codebook;
    const pq::KMeansReport report =
        pq::train_codebook(2, 32, 5000, keys.gather(), params, pool, nullptr, &codebook);
    const auto codes = encode_all(codebook, keys, &pool);
    if (reference_centroids.empty()) {
      reference_centroids = codebook.data;
      reference_codes = codes;
      reference_objective = report.objective;
      continue;
    }
    ASSERT_EQ(codebook.data.size(), reference_centroids.size());
    EXPECT_EQ(0, std::memcmp(codebook.data.data(), reference_centroids.data(),
                             sizeof(float) * reference_centroids.size()))
        << threads << " threads";
    EXPECT_EQ(codes, reference_codes) << threads << " threads";
    EXPECT_EQ(report.objective, reference_objective) << threads << " threads";
  }
  // Serial encoding (no pool) gives the same codes too.
  pq::ThreadPool pool(1);
  pq::PqCodebook codebook;
  pq::train_codebook(2, 32, 5000, keys.gather(), params, pool, nullptr, &codebook);
  EXPECT_EQ(encode_all(codebook, keys, nullptr), reference_codes);
}

TEST(KMeans, SampledTrainingIsDeterministicAcrossPoolSizes) {
  const Keys keys = uniform_keys(2, 3000, 8, 5);
  pq::KMeansParams params = make_params(2, 3, 8, 77, PQ_KMEANS_INIT_RANDOM);
  params.max_points_per_centroid = 40;  // 320 of 3000 rows
  std::vector<float> reference;
  for (int threads : {1, 2, 4}) {
    pq::ThreadPool pool(threads);
    pq::PqCodebook codebook;
    const pq::KMeansReport report =
        pq::train_codebook(2, 8, 3000, keys.gather(), params, pool, nullptr, &codebook);
    EXPECT_EQ(report.training_points, 320);
    if (reference.empty()) {
      reference = codebook.data;
    } else {
      EXPECT_EQ(0, std::memcmp(codebook.data.data(), reference.data(),
                               sizeof(float) * reference.size()));
    }
  }
}

TEST(KMeans, DifferentSeedsOrLayersGiveDifferentCodebooks) {
  pq::ThreadPool pool(2);
  const Keys keys = uniform_keys(1, 2000, 16, 3);
  for (int32_t init : {PQ_KMEANS_INIT_RANDOM, PQ_KMEANS_INIT_KMEANSPP}) {
    pq::KMeansParams params = make_params(2, 4, 3, 1, init);
    pq::PqCodebook first, second, third;
    pq::train_codebook(1, 16, 2000, keys.gather(), params, pool, nullptr, &first);
    params.seed = 2;
    pq::train_codebook(1, 16, 2000, keys.gather(), params, pool, nullptr, &second);
    params.seed = 1;
    params.layer = 5;
    pq::train_codebook(1, 16, 2000, keys.gather(), params, pool, nullptr, &third);
    EXPECT_NE(first.data, second.data);
    EXPECT_NE(first.data, third.data);
    // The two subspaces of a head use different streams as well.
    EXPECT_FALSE(std::equal(first.at(0, 0), first.at(0, 0) + 16 * 8, first.at(0, 1)));
  }
}

// Few natural clusters, every point duplicated many times: random init
// almost surely picks the same value twice, and such a twin stays empty
// forever unless it is repaired.
TEST(KMeans, EmptyClustersAreRepaired) {
  pq::ThreadPool pool(2);
  const int32_t head_dim = 4;
  const int64_t tokens = 512;
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    Keys keys(1, tokens, head_dim);
    std::mt19937 rng(seed);
    std::normal_distribution<float> noise(0.0f, 0.1f);
    // 4 blobs x 8 distinct points = 32 distinct values, 16 copies each.
    std::vector<float> distinct(32 * head_dim);
    for (int32_t p = 0; p < 32; ++p)
      for (int32_t d = 0; d < head_dim; ++d)
        distinct[p * head_dim + d] = static_cast<float>((p / 8) * 10 * (d + 1)) + noise(rng);
    for (int64_t t = 0; t < tokens; ++t)
      std::memcpy(keys.row(0, t), &distinct[(t % 32) * head_dim], sizeof(float) * head_dim);

    for (int32_t init : {PQ_KMEANS_INIT_RANDOM, PQ_KMEANS_INIT_KMEANSPP}) {
      for (int32_t iterations : {1, 3, 20}) {
        const pq::KMeansParams params = make_params(1, 4, iterations, seed, init);  // k = 16
        pq::PqCodebook codebook;
        const pq::KMeansReport report = pq::train_codebook(1, head_dim, tokens, keys.gather(),
                                                           params, pool, nullptr, &codebook);
        ASSERT_EQ(report.training_points, tokens);  // every row trained on
        expect_objective_non_increasing(report);
        const auto codes = encode_all(codebook, keys, &pool);
        std::vector<int> members(16, 0);
        for (uint8_t code : codes[0]) ++members[code];
        for (int c = 0; c < 16; ++c)
          EXPECT_GT(members[c], 0) << "centroid " << c << " unused, init " << init
                                   << " seed " << seed << " iterations " << iterations;
      }
    }
  }
}

TEST(KMeans, TrainingSampleCapIsHonoured) {
  pq::ThreadPool pool(2);
  for (int64_t tokens : {5000, 200, 256, 257}) {
    const Keys keys = uniform_keys(2, tokens, 8, 13);
    std::mutex mutex;
    std::vector<std::multiset<int64_t>> requested(2);
    const pq::KeyGather base = keys.gather();
    pq::KeyGather recording = [&](int32_t head, const int64_t* rows, int64_t count, float* out) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        requested[head].insert(rows, rows + count);
      }
      base(head, rows, count, out);
    };
    pq::KMeansParams params = make_params(2, 4, 2, 99);  // k = 16
    params.max_points_per_centroid = 16;                 // cap = 256 points
    pq::PqCodebook codebook;
    const pq::KMeansReport report =
        pq::train_codebook(2, 8, tokens, recording, params, pool, nullptr, &codebook);
    const int64_t expected = std::min<int64_t>(tokens, 256);
    EXPECT_EQ(report.training_points, expected) << tokens;
    for (int32_t h = 0; h < 2; ++h) {
      EXPECT_EQ(static_cast<int64_t>(requested[h].size()), expected);
      const std::set<int64_t> distinct(requested[h].begin(), requested[h].end());
      EXPECT_EQ(static_cast<int64_t>(distinct.size()), expected) << "rows must be distinct";
    }
  }
}

// Each subspace has at most 2^b distinct sub-vectors: k-means++ makes every
// one of them a centroid and the codes reconstruct the keys bit for bit.
TEST(KMeans, ExactRegimeReconstructsKeysExactly) {
  pq::ThreadPool pool(2);
  const int32_t heads = 2, head_dim = 12, subspaces = 3, sub_dim = 4;
  for (int32_t distinct_values : {8, 5}) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      const int64_t tokens = 3000;  // more than the 8 * 256 cap: sampled
      Keys keys(heads, tokens, head_dim);
      std::mt19937 rng(seed);
      for (int32_t h = 0; h < heads; ++h) {
        for (int32_t j = 0; j < subspaces; ++j) {
          std::vector<float> values(distinct_values * sub_dim);
          for (float& v : values) v = static_cast<float>(static_cast<int>(rng() % 9) - 4) * 0.75f;
          for (int64_t t = 0; t < tokens; ++t)
            std::memcpy(keys.row(h, t) + j * sub_dim, &values[(rng() % distinct_values) * sub_dim],
                        sizeof(float) * sub_dim);
        }
      }
      const pq::KMeansParams params = make_params(subspaces, 3, 10, seed);  // k = 8
      pq::PqCodebook codebook;
      const pq::KMeansReport report = pq::train_codebook(heads, head_dim, tokens, keys.gather(),
                                                         params, pool, nullptr, &codebook);
      for (const auto& history : report.objective) EXPECT_EQ(history.back(), 0.0);
      const auto codes = encode_all(codebook, keys, &pool);
      for (int32_t h = 0; h < heads; ++h)
        for (int64_t t = 0; t < tokens; ++t)
          for (int32_t j = 0; j < subspaces; ++j) {
            const float* centroid = codebook.at(h, j) + codes[h][t * subspaces + j] * sub_dim;
            ASSERT_EQ(0, std::memcmp(centroid, keys.row(h, t) + j * sub_dim, sizeof(float) * sub_dim))
                << "head " << h << " token " << t << " subspace " << j;
          }
    }
  }
}

TEST(KMeans, FewerPointsThanCentroidsAreTheCentroids) {
  pq::ThreadPool pool(2);
  for (int32_t init : {PQ_KMEANS_INIT_RANDOM, PQ_KMEANS_INIT_KMEANSPP}) {
    const Keys keys = uniform_keys(2, 5, 6, 21);
    const pq::KMeansParams params = make_params(2, 4, 10, 8, init);  // 5 points, k = 16
    pq::PqCodebook codebook;
    const pq::KMeansReport report =
        pq::train_codebook(2, 6, 5, keys.gather(), params, pool, nullptr, &codebook);
    EXPECT_EQ(report.training_points, 5);
    EXPECT_EQ(report.iterations, 0);
    EXPECT_EQ(codebook.centroids, 16);
    EXPECT_EQ(codebook.sub_dim, 3);
    const auto codes = encode_all(codebook, keys, &pool);
    for (int32_t h = 0; h < 2; ++h)
      for (int64_t t = 0; t < 5; ++t)
        for (int32_t j = 0; j < 2; ++j) {
          const float* centroid = codebook.at(h, j) + codes[h][t * 2 + j] * 3;
          EXPECT_EQ(0, std::memcmp(centroid, keys.row(h, t) + j * 3, sizeof(float) * 3));
        }
    // Exactly the points, then repeats of them.
    for (int32_t c = 0; c < 16; ++c)
      EXPECT_EQ(0, std::memcmp(codebook.at(1, 1) + c * 3, keys.row(1, c % 5) + 3, sizeof(float) * 3));
  }
}

TEST(KMeans, EncodeMatchesBruteForce) {
  pq::ThreadPool pool(2);
  struct Geometry {
    int32_t head_dim, subspaces, bits;
  };
  // Covers sub_dim not a multiple of 8, k below the 16-lane padding, k = 256.
  for (const Geometry& geometry : {Geometry{128, 2, 6}, Geometry{10, 2, 2}, Geometry{12, 3, 8},
                                   Geometry{7, 1, 1}, Geometry{64, 4, 5}}) {
    const int64_t tokens = 1500;
    const Keys keys = clustered_keys(3, tokens, geometry.head_dim, 7, 17);
    const pq::KMeansParams params = make_params(geometry.subspaces, geometry.bits, 4, 5);
    pq::PqCodebook codebook;
    pq::train_codebook(3, geometry.head_dim, tokens, keys.gather(), params, pool, nullptr,
                       &codebook);
    const int32_t sub_dim = codebook.sub_dim;
    // Encode a middle range so that `first` is exercised.
    const int64_t first = 37, count = tokens - 100;
    std::vector<std::vector<uint8_t>> codes(3, std::vector<uint8_t>(count * geometry.subspaces));
    std::vector<uint8_t*> pointers = {codes[0].data(), codes[1].data(), codes[2].data()};
    codebook.encode(geometry.head_dim, first, count, keys.gather(), &pool,
                      pointers.data());
    for (int32_t h = 0; h < 3; ++h)
      for (int64_t i = 0; i < count; ++i)
        for (int32_t j = 0; j < geometry.subspaces; ++j) {
          const int32_t expected = pq::nearest_centroid(
              codebook.at(h, j), codebook.centroids, sub_dim, keys.row(h, first + i) + j * sub_dim);
          ASSERT_EQ(codes[h][i * geometry.subspaces + j], expected)
              << "head_dim " << geometry.head_dim << " head " << h << " token " << first + i;
        }
  }
}

// Issue 26: the sinks are left out of training (first_token). Sink keys far
// from every other key would otherwise draw a centroid of their own in
// every subspace; trained on the tokens after them, every centroid stays
// among the ordinary keys.
TEST(KMeans, TrainingLeavesOutTheTokensBeforeFirstToken) {
  pq::ThreadPool pool(2);
  const int32_t head_dim = 8, sinks = 4;
  const int64_t tokens = 600;
  Keys keys = uniform_keys(2, tokens, head_dim, 31);
  for (int32_t h = 0; h < 2; ++h)
    for (int64_t t = 0; t < sinks; ++t)
      for (int32_t d = 0; d < head_dim; ++d) keys.row(h, t)[d] = 1000.0f;
  auto largest_coordinate = [&](const pq::PqCodebook& cb) {
    float largest = 0.f;
    for (float v : cb.data) largest = std::max(largest, std::fabs(v));
    return largest;
  };
  pq::KMeansParams params = make_params(2, 3, 10, 5);
  pq::PqCodebook with_sinks, without;
  pq::train_codebook(2, head_dim, tokens, keys.gather(), params, pool, nullptr, &with_sinks);
  EXPECT_GE(largest_coordinate(with_sinks), 100.f);  // the sinks own a centroid
  params.first_token = sinks;
  const pq::KMeansReport report =
      pq::train_codebook(2, head_dim, tokens, keys.gather(), params, pool, nullptr, &without);
  EXPECT_EQ(report.training_points, tokens - sinks);
  EXPECT_LE(largest_coordinate(without), 1.0f);
  // Fewer tokens than first_token + 1: all of them train.
  params.first_token = tokens;
  EXPECT_EQ(pq::train_codebook(2, head_dim, tokens, keys.gather(), params, pool, nullptr, &without)
                .training_points,
            tokens);
}

// Issue 26: under PQ_ROTARY_HALF the codebook reads dimension i next to
// i + D/2, in training, encoding and the lookup table alike: the same as a
// codebook without an order trained on keys reordered so by hand.
TEST(KMeans, RotaryOrderEqualsKeysReorderedByHand) {
  pq::ThreadPool pool(2);
  const int32_t head_dim = 16, heads = 2;
  const int64_t tokens = 700;
  const Keys keys = clustered_keys(heads, tokens, head_dim, 9, 3);
  const std::vector<int32_t> order = pq::rotary_dim_order(head_dim, PQ_ROTARY_HALF);
  ASSERT_EQ(order, (std::vector<int32_t>{0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15}));
  EXPECT_TRUE(pq::rotary_dim_order(head_dim, PQ_ROTARY_NONE).empty());
  EXPECT_TRUE(pq::rotary_dim_order(head_dim, PQ_ROTARY_INTERLEAVED).empty());
  Keys reordered(heads, tokens, head_dim);
  for (int32_t h = 0; h < heads; ++h)
    for (int64_t t = 0; t < tokens; ++t)
      for (int32_t p = 0; p < head_dim; ++p) reordered.row(h, t)[p] = keys.row(h, t)[order[p]];

  pq::KMeansParams params = make_params(4, 4, 5, 11);
  pq::PqCodebook by_hand, ordered;
  pq::train_codebook(heads, head_dim, tokens, reordered.gather(), params, pool, nullptr, &by_hand);
  params.dim_order = order;
  pq::train_codebook(heads, head_dim, tokens, keys.gather(), params, pool, nullptr, &ordered);
  EXPECT_EQ(ordered.dim_order, order);
  EXPECT_EQ(ordered.data, by_hand.data);
  EXPECT_EQ(encode_all(ordered, keys, &pool), encode_all(by_hand, reordered, &pool));
  // The lookup table of a query equals that of the query reordered by hand.
  std::vector<float> query(2 * head_dim), query_by_hand(2 * head_dim);
  for (int32_t i = 0; i < 2 * head_dim; ++i) query[i] = std::sin(0.37f * i) * 3.f;
  for (int32_t g = 0; g < 2; ++g)
    for (int32_t p = 0; p < head_dim; ++p)
      query_by_hand[g * head_dim + p] = query[g * head_dim + order[p]];
  std::vector<float> lut(ordered.lut_floats(2)), lut_by_hand(by_hand.lut_floats(2));
  ordered.lut(1, query.data(), 2, head_dim, lut.data());
  by_hand.lut(1, query_by_hand.data(), 2, head_dim, lut_by_hand.data());
  EXPECT_EQ(lut, lut_by_hand);
}

// The centroids' layout for the kernels (centroid_layouts.h) is made once
// per codebook and follows its centroids: a copy lays out its own, and
// training into a used codebook lays out the new centroids.
TEST(KMeans, CentroidLayoutsFollowTheCentroids) {
  pq::ThreadPool pool(2);
  const int32_t head_dim = 16, heads = 2;
  const Keys keys = clustered_keys(heads, 600, head_dim, 8, 5);
  const Keys other = clustered_keys(heads, 600, head_dim, 8, 6);
  const pq::KMeansParams params = make_params(2, 4, 5, 3);
  pq::PqCodebook used, fresh;
  pq::train_codebook(heads, head_dim, 600, keys.gather(), params, pool, nullptr, &used);
  const auto first_codes = encode_all(used, keys, &pool);  // lays out `used`
  EXPECT_GT(used.layouts.bytes(), 0u);
  EXPECT_EQ(fresh.layouts.bytes(), 0u);

  // A copy with other centroids scores and codes with those.
  pq::PqCodebook copy = used;
  EXPECT_EQ(copy.layouts.bytes(), 0u);
  for (float& v : copy.data) v = -v;
  std::vector<float> query(head_dim), lut(used.lut_floats(1)), lut_copy(copy.lut_floats(1));
  for (int32_t i = 0; i < head_dim; ++i) query[i] = std::cos(0.3f * i);
  used.lut(0, query.data(), 1, head_dim, lut.data());
  copy.lut(0, query.data(), 1, head_dim, lut_copy.data());
  for (size_t i = 0; i < lut.size(); ++i) ASSERT_EQ(lut_copy[i], -lut[i]) << i;
  EXPECT_EQ(encode_all(used, keys, &pool), first_codes);

  // Trained again on other keys: the codes are those of a fresh codebook.
  pq::train_codebook(heads, head_dim, 600, other.gather(), params, pool, nullptr, &used);
  pq::train_codebook(heads, head_dim, 600, other.gather(), params, pool, nullptr, &fresh);
  ASSERT_EQ(used.data, fresh.data);
  EXPECT_EQ(encode_all(used, other, &pool), encode_all(fresh, other, nullptr));
}

// Threads that first use a codebook at once all wait for one layout.
TEST(KMeans, FirstUsersOfACodebookShareOneLayout) {
  pq::ThreadPool pool(2);
  const int32_t head_dim = 32, heads = 4;
  const Keys keys = clustered_keys(heads, 800, head_dim, 16, 7);
  pq::PqCodebook trained;
  pq::train_codebook(heads, head_dim, 800, keys.gather(), make_params(4, 6, 5, 9), pool, nullptr,
                     &trained);
  std::vector<float> query(head_dim);
  for (int32_t i = 0; i < head_dim; ++i) query[i] = std::sin(0.7f * i);
  std::vector<float> want(trained.lut_floats(1));
  {
    const pq::PqCodebook reference = trained;  // its own layout
    reference.lut(3, query.data(), 1, head_dim, want.data());
  }
  const pq::PqCodebook shared = trained;
  std::vector<std::vector<float>> got(8, std::vector<float>(want.size()));
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] { shared.lut(3, query.data(), 1, head_dim, got[t].data()); });
  for (auto& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
  EXPECT_EQ(shared.layouts.bytes(),
            pq::CentroidLayouts::bytes_for(static_cast<uint64_t>(heads) * 4, 64, head_dim / 4));
}

// Points exactly between two centroids, and duplicated centroids: the
// lowest index wins, in nearest_centroid and in PqCodebook::encode alike.
TEST(KMeans, TiesPickTheLowestIndex) {
  pq::PqCodebook codebook;
  codebook.heads = 1;
  codebook.subspaces = 1;
  codebook.centroids = 4;
  codebook.sub_dim = 2;
  codebook.data = {2, 0, 0, 0, 1, 1, 0, 0};  // centroids 1 and 3 coincide
  Keys keys(1, 3, 2);
  const float rows[] = {1, 0, 0.25f, 0, 1, 0.5f};
  std::memcpy(keys.data.data(), rows, sizeof(rows));
  std::vector<uint8_t> codes(3);
  uint8_t* pointer = codes.data();
  codebook.encode(2, 0, 3, keys.gather(), nullptr, &pointer);
  // (1,0): centroids 0, 1, 2 (at (1,1)), 3 all at distance 1 -> 0.
  EXPECT_EQ(codes[0], 0);
  // (0.25,0): nearest are the coinciding 1 and 3 -> 1.
  EXPECT_EQ(codes[1], 1);
  // (1,0.5): centroid 2 (distance 0.25) beats 0 and 1 (1.25).
  EXPECT_EQ(codes[2], 2);
  for (int t = 0; t < 3; ++t)
    EXPECT_EQ(codes[t], pq::nearest_centroid(codebook.data.data(), 4, 2, keys.row(0, t)));
}

TEST(KMeans, CancelledBeforeTheCall) {
  pq::ThreadPool pool(2);
  const Keys keys = uniform_keys(1, 1000, 8, 1);
  std::atomic<bool> cancel{true};
  pq::PqCodebook codebook;
  const pq::KMeansReport report = pq::train_codebook(1, 8, 1000, keys.gather(), make_params(2, 4, 10, 1),
                                                     pool, &cancel, &codebook);
  EXPECT_TRUE(report.cancelled);
  EXPECT_EQ(report.iterations, 0);
}

TEST(KMeans, CancelledDuringTraining) {
  pq::ThreadPool pool(2);
  const Keys keys = uniform_keys(1, 4000, 8, 1);
  std::atomic<bool> cancel{false};
  const pq::KeyGather base = keys.gather();
  // The flag goes up while the keys are fetched; training stops at the next
  // check, before any Lloyd update.
  pq::KeyGather cancelling = [&](int32_t head, const int64_t* rows, int64_t count, float* out) {
    base(head, rows, count, out);
    cancel.store(true);
  };
  pq::PqCodebook codebook;
  const pq::KMeansReport report = pq::train_codebook(1, 8, 4000, cancelling, make_params(2, 4, 50, 1),
                                                     pool, &cancel, &codebook);
  EXPECT_TRUE(report.cancelled);
  EXPECT_EQ(report.iterations, 0);

  // Without the flag the same training runs to the end.
  pq::PqCodebook full;
  const pq::KMeansReport done = pq::train_codebook(1, 8, 4000, keys.gather(), make_params(2, 4, 50, 1),
                                                   pool, nullptr, &full);
  EXPECT_FALSE(done.cancelled);
  EXPECT_EQ(done.iterations, 50);
}

TEST(KMeans, InvalidParametersFail) {
  pq::ThreadPool pool(1);
  const Keys keys = uniform_keys(1, 100, 8, 1);
  pq::PqCodebook codebook;
  auto status_of = [&](int32_t head_dim, pq::KMeansParams params) {
    try {
      pq::train_codebook(1, head_dim, 100, keys.gather(), params, pool, nullptr, &codebook);
    } catch (const pq::Error& e) {
      return e.status();
    }
    return PQ_OK;
  };
  EXPECT_EQ(status_of(8, make_params(2, 0, 5, 1)), PQ_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of(8, make_params(2, 9, 5, 1)), PQ_ERR_UNSUPPORTED);
  EXPECT_EQ(status_of(8, make_params(3, 4, 5, 1)), PQ_ERR_INVALID_ARGUMENT);  // 8 % 3 != 0
  EXPECT_EQ(status_of(8, make_params(0, 4, 5, 1)), PQ_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of(8, make_params(2, 4, -1, 1)), PQ_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(status_of(8, make_params(2, 4, 5, 1, 7)), PQ_ERR_INVALID_ARGUMENT);  // unknown init
  EXPECT_EQ(status_of(8, make_params(2, 8, 5, 1)), PQ_OK);
  EXPECT_EQ(status_of(8, make_params(2, 1, 5, 1)), PQ_OK);
}

}  // namespace
