// Selection semantics through the public API: the PQ selector agrees with
// the EXACT oracle in the exact regime, has high recall on clustered keys,
// keeps the sink/local bookkeeping, codes evicted decode tokens with their
// nearest centroids, and chunked / out-of-order prefill gives the same index.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"

using namespace pqt;

namespace {

const char* combine_name(int32_t c) {
  return c == PQ_GQA_SUM_SOFTMAX ? "SUM_SOFTMAX" : c == PQ_GQA_MAX ? "MAX" : "MEAN";
}

void prefill(pq_context* ctx, uint64_t seq, int32_t layer, const float* keys,
             const float* values, int64_t n, int32_t kvh, int32_t hd,
             int32_t dtype = PQ_DTYPE_F32) {
  HostTensor K = make_tensor(keys, n, kvh, hd, dtype);
  HostTensor V = make_tensor(values, n, kvh, hd, dtype);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, seq, layer, K.get(), V.get()));
}

void append(pq_context* ctx, uint64_t seq, int32_t layer, const float* keys, const float* values,
            int64_t n, int32_t kvh, int32_t hd) {
  HostTensor K = make_tensor(keys, n, kvh, hd, PQ_DTYPE_F32);
  HostTensor V = make_tensor(values, n, kvh, hd, PQ_DTYPE_F32);
  PQ_ASSERT_OK(pq_decode_append(ctx, seq, layer, K.get(), V.get()));
}

// Selects with a capacity of exactly pq_selection_capacity().
Sel select(pq_context* ctx, uint64_t seq, int32_t layer, const std::vector<float>& q,
           int32_t qh, int32_t kvh, int32_t hd) {
  int64_t cap = selection_capacity(ctx, seq, layer);
  EXPECT_GE(cap, 0) << pq_last_error();
  Sel s(kvh, std::max<int64_t>(cap, 1));
  HostTensor Q = make_tensor(q, 1, qh, hd, PQ_DTYPE_F32);
  EXPECT_TRUE(IsOk(pq_decode_select(ctx, seq, layer, Q.get(), s.get())));
  return s;
}

std::vector<float> centroids(pq_context* ctx, uint64_t seq, int32_t layer, int32_t h,
                             const pq_config& c) {
  int64_t nf = static_cast<int64_t>(c.pq_subspaces) * (1 << c.pq_bits) * (c.head_dim / c.pq_subspaces);
  std::vector<float> out(static_cast<size_t>(nf), std::nanf(""));
  EXPECT_TRUE(IsOk(pq_index_centroids(ctx, seq, layer, h, out.data(), nf)));
  return out;
}

std::vector<uint8_t> codes(pq_context* ctx, uint64_t seq, int32_t layer, int32_t h, int64_t first,
                           int64_t count, const pq_config& c) {
  std::vector<uint8_t> out(static_cast<size_t>(count * c.pq_subspaces), 0xff);
  EXPECT_TRUE(IsOk(pq_index_codes(ctx, seq, layer, h, first, count, out.data())));
  return out;
}

// Checks the structural invariants of a selection row for n tokens.
void check_bookkeeping(const std::vector<int32_t>& row, const Regions& r, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(static_cast<int64_t>(row.size()), r.count());
  for (size_t i = 1; i < row.size(); ++i) ASSERT_LT(row[i - 1], row[i]) << "not ascending/unique at " << i;
  for (int32_t p : row) {
    ASSERT_GE(p, 0);
    ASSERT_LT(p, r.n);
  }
  // Sinks and locals are all present.
  std::set<int32_t> s(row.begin(), row.end());
  for (int64_t p = 0; p < r.sink_end; ++p) EXPECT_TRUE(s.count(static_cast<int32_t>(p))) << "sink " << p;
  for (int64_t p = r.local_begin; p < r.n; ++p) EXPECT_TRUE(s.count(static_cast<int32_t>(p))) << "local " << p;
  EXPECT_EQ(static_cast<int64_t>(middle_of(row, r).size()), r.k);
}

// Every selected middle token scores at least as high (within tol) as every
// unselected one, by the test's own double-precision scores.
void check_topk_consistent(const std::vector<int32_t>& mid_sel, const std::vector<double>& scores,
                           const Regions& r, double rel_tol, const std::string& what) {
  SCOPED_TRACE(what);
  std::vector<char> chosen(scores.size(), 0);
  for (int32_t p : mid_sel) chosen[static_cast<size_t>(p - r.sink_end)] = 1;
  double min_sel = INFINITY, max_unsel = -INFINITY, max_abs = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(scores[i]));
    if (chosen[i]) min_sel = std::min(min_sel, scores[i]);
    else max_unsel = std::max(max_unsel, scores[i]);
  }
  if (mid_sel.empty() || static_cast<int64_t>(mid_sel.size()) == r.middle) return;
  EXPECT_GE(min_sel, max_unsel - rel_tol * std::max(max_abs, 1e-30))
      << "a selected middle token scores below an unselected one";
}

// ---------------------------------------------------------------------------
// Exact regime: PQ == EXACT
// ---------------------------------------------------------------------------

// Keys whose 4-dim sub-vectors (per kv head and subspace) take one of
// `patterns` distinct small-integer values.
std::vector<float> pattern_keys(int64_t n, int32_t kvh, int32_t hd, int32_t m, int32_t patterns,
                                uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed * 1000003u + 17u));
  std::uniform_int_distribution<int> val(-3, 3);
  std::uniform_int_distribution<int> pick(0, patterns - 1);
  int32_t sub = hd / m;
  // pats[h][s][p][d]
  std::vector<float> pats(static_cast<size_t>(kvh * m * patterns * sub));
  for (int32_t h = 0; h < kvh; ++h)
    for (int32_t s = 0; s < m; ++s) {
      std::set<std::vector<int>> seen;
      for (int32_t p = 0; p < patterns; ++p) {
        std::vector<int> v(static_cast<size_t>(sub));
        do {
          for (int& x : v) x = val(rng);
        } while (!seen.insert(v).second);
        for (int32_t d = 0; d < sub; ++d)
          pats[static_cast<size_t>(((h * m + s) * patterns + p) * sub + d)] = static_cast<float>(v[static_cast<size_t>(d)]);
      }
    }
  std::vector<float> keys(static_cast<size_t>(n * kvh * hd));
  for (int64_t t = 0; t < n; ++t)
    for (int32_t h = 0; h < kvh; ++h)
      for (int32_t s = 0; s < m; ++s) {
        int32_t p = pick(rng);
        for (int32_t d = 0; d < sub; ++d)
          keys[static_cast<size_t>((t * kvh + h) * hd + s * sub + d)] =
              pats[static_cast<size_t>(((h * m + s) * patterns + p) * sub + d)];
      }
  return keys;
}

class ApiSelectionExact : public ::testing::TestWithParam<std::tuple<int32_t, int32_t, int32_t>> {};

TEST_P(ApiSelectionExact, PqEqualsExactOnExactlyRepresentableKeys) {
  const int32_t G = std::get<0>(GetParam());
  const int32_t combine = std::get<1>(GetParam());
  const int32_t bits = std::get<2>(GetParam());
  const int32_t kvh = 2, qh = kvh * G, hd = 8, m = 2;
  const int64_t n = 600;
  // b = 2: exactly 2^b patterns; b = 3: fewer patterns than centroids.
  const int32_t patterns = bits == 2 ? 4 : 6;

  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " G " + std::to_string(G) + " combine " +
                 combine_name(combine) + " bits " + std::to_string(bits));
    pq_config c = make_config(1, qh, kvh, hd, PQ_DTYPE_F32);
    c.pq_subspaces = m;
    c.pq_bits = bits;
    c.sink_tokens = 4;
    c.local_tokens = 32;
    c.topk_fraction = 0.25f;  // exact in float: k = 141 of 564 middle tokens
    c.gqa_combine = combine;
    c.seed = 0x1000 + seed;
    c.worker_threads = 2;
    pq_config ce = c;
    ce.selector = PQ_SELECTOR_EXACT;
    Ctx pq(c), ex(ce);
    ASSERT_TRUE(pq.ok()) << pq_last_error();
    ASSERT_TRUE(ex.ok()) << pq_last_error();

    std::vector<float> keys = pattern_keys(n, kvh, hd, m, patterns, seed);
    std::vector<float> values = random_normal(static_cast<size_t>(n * kvh * hd), seed + 100);
    for (Ctx* x : {&pq, &ex}) {
      PQ_ASSERT_OK(pq_sequence_add(*x, 1));
      prefill(*x, 1, 0, keys.data(), values.data(), n, kvh, hd);
    }
    Regions r = regions(n, c);
    ASSERT_EQ(r.k, 141);

    // The codes reconstruct the keys exactly.
    for (int32_t h = 0; h < kvh; ++h) {
      std::vector<float> cent = centroids(pq, 1, 0, h, c);
      std::vector<uint8_t> cd = codes(pq, 1, 0, h, 0, n, c);
      int32_t sub = hd / m, K = 1 << bits;
      int64_t mismatches = 0;
      for (int64_t t = 0; t < n; ++t)
        for (int32_t s = 0; s < m; ++s) {
          uint8_t code = cd[static_cast<size_t>(t * m + s)];
          ASSERT_LT(code, K);
          for (int32_t d = 0; d < sub; ++d)
            if (cent[static_cast<size_t>((s * K + code) * sub + d)] !=
                keys[static_cast<size_t>((t * kvh + h) * hd + s * sub + d)])
              ++mismatches;
        }
      EXPECT_EQ(mismatches, 0) << "head " << h << ": centroids[codes] != keys in the exact regime";
    }

    for (int q_seed = 0; q_seed < 3; ++q_seed) {
      std::vector<float> q = random_ints(static_cast<size_t>(qh * hd), seed * 10 + q_seed, -3, 3);
      Sel sp = select(pq, 1, 0, q, qh, kvh, hd);
      Sel se = select(ex, 1, 0, q, qh, kvh, hd);
      for (int32_t h = 0; h < kvh; ++h) {
        std::vector<int32_t> rp = sp.row(h), re = se.row(h);
        check_bookkeeping(rp, r, "PQ head " + std::to_string(h));
        check_bookkeeping(re, r, "EXACT head " + std::to_string(h));
        EXPECT_EQ(rp, re) << "PQ selection differs from EXACT, head " << h << " query " << q_seed;

        // Cross-check EXACT against the test's own scores.
        std::vector<double> sc = combined_scores(keys, kvh, hd, q, qh, h, r.sink_end,
                                                 r.local_begin, combine);
        std::vector<int32_t> mid = middle_of(re, r);
        check_topk_consistent(mid, sc, r, 1e-6, "EXACT vs test scores, head " + std::to_string(h));
        if (G == 1 || combine == PQ_GQA_MAX) {
          // Scores are monotone in an integer: ties are real ties, broken in
          // favour of the larger position.
          EXPECT_EQ(mid, topk_positions(sc, r.sink_end, r.k)) << "head " << h;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Combos, ApiSelectionExact,
    ::testing::Combine(::testing::Values(1, 3),
                       ::testing::Values(PQ_GQA_SUM_SOFTMAX, PQ_GQA_MAX, PQ_GQA_MEAN),
                       ::testing::Values(2, 3)),
    [](const ::testing::TestParamInfo<std::tuple<int32_t, int32_t, int32_t>>& info) {
      return "G" + std::to_string(std::get<0>(info.param)) + "_" +
             combine_name(std::get<1>(info.param)) + "_b" + std::to_string(std::get<2>(info.param));
    });

// The same in the 16-bit dtypes: small integers are exact in f16 and bf16.
TEST(ApiSelection, PqEqualsExactInF16AndBf16) {
  const int32_t kvh = 2, G = 2, qh = kvh * G, hd = 8, m = 2;
  const int64_t n = 500;
  for (int32_t dtype : {PQ_DTYPE_F16, PQ_DTYPE_BF16}) {
    SCOPED_TRACE(dtype == PQ_DTYPE_F16 ? "F16" : "BF16");
    pq_config c = make_config(1, qh, kvh, hd, dtype);
    c.pq_bits = 2;
    c.sink_tokens = 3;
    c.local_tokens = 20;
    c.topk_tokens = 77;
    c.worker_threads = 2;
    pq_config ce = c;
    ce.selector = PQ_SELECTOR_EXACT;
    Ctx pq(c), ex(ce);
    ASSERT_TRUE(pq.ok() && ex.ok()) << pq_last_error();
    std::vector<float> keys = pattern_keys(n, kvh, hd, m, 4, 77 + dtype);
    std::vector<float> q = random_ints(static_cast<size_t>(qh * hd), 78 + dtype, -3, 3);
    HostTensor K = make_tensor(keys, n, kvh, hd, dtype);
    HostTensor Q = make_tensor(q, 1, qh, hd, dtype);
    Sel sp(kvh, 100), se(kvh, 100);
    for (Ctx* x : {&pq, &ex}) {
      PQ_ASSERT_OK(pq_sequence_add(*x, 1));
      PQ_ASSERT_OK(pq_prefill_layer(*x, 1, 0, K.get(), K.get()));
    }
    PQ_ASSERT_OK(pq_decode_select(pq, 1, 0, Q.get(), sp.get()));
    PQ_ASSERT_OK(pq_decode_select(ex, 1, 0, Q.get(), se.get()));
    Regions r = regions(n, c);
    for (int32_t h = 0; h < kvh; ++h) {
      check_bookkeeping(sp.row(h), r, "PQ");
      EXPECT_EQ(sp.row(h), se.row(h)) << "head " << h;
      std::vector<double> sc = combined_scores(keys, kvh, hd, q, qh, h, r.sink_end, r.local_begin,
                                               c.gqa_combine);
      check_topk_consistent(middle_of(se.row(h), r), sc, r, 1e-6, "EXACT vs test scores");
    }
  }
}

// ---------------------------------------------------------------------------
// Recall on clustered keys
// ---------------------------------------------------------------------------

struct RecallResult {
  double pq = 0, window = 0, exact_vs_test = 0, random = 0;
};

RecallResult measure_recall(int32_t hd, int32_t topk_tokens, uint64_t seed) {
  const int32_t kvh = 2, G = 2, qh = kvh * G, clusters = 32;
  const int64_t middle = 4000;
  pq_config c = make_config(1, qh, kvh, hd, PQ_DTYPE_F32);
  c.sink_tokens = 4;
  c.local_tokens = 128;
  c.topk_tokens = topk_tokens;
  c.kmeans_iterations = 20;
  c.worker_threads = 2;
  const int64_t n = c.sink_tokens + middle + c.local_tokens;

  // Cluster centres ~ N(0, 1); keys = centre + N(0, 0.25^2) noise.
  std::vector<float> centres = random_normal(static_cast<size_t>(kvh * clusters * hd), seed, 1.0f);
  std::vector<float> noise = random_normal(static_cast<size_t>(n * kvh * hd), seed + 1, 0.25f);
  std::mt19937 rng(static_cast<uint32_t>(seed + 2));
  std::uniform_int_distribution<int> pick(0, clusters - 1);
  std::vector<float> keys(static_cast<size_t>(n * kvh * hd));
  for (int64_t t = 0; t < n; ++t)
    for (int32_t h = 0; h < kvh; ++h) {
      int cl = pick(rng);
      for (int32_t d = 0; d < hd; ++d)
        keys[static_cast<size_t>((t * kvh + h) * hd + d)] =
            centres[static_cast<size_t>((h * clusters + cl) * hd + d)] +
            noise[static_cast<size_t>((t * kvh + h) * hd + d)];
    }
  std::vector<float> values = random_normal(static_cast<size_t>(n * kvh * hd), seed + 3);

  Ctx ctxs[3];
  const int32_t selectors[3] = {PQ_SELECTOR_PQ, PQ_SELECTOR_EXACT, PQ_SELECTOR_WINDOW};
  for (int i = 0; i < 3; ++i) {
    pq_config ci = c;
    ci.selector = selectors[i];
    ctxs[i] = Ctx(ci);
    EXPECT_TRUE(ctxs[i].ok()) << pq_last_error();
    if (!ctxs[i].ok()) return {};
    EXPECT_TRUE(IsOk(pq_sequence_add(ctxs[i], 1)));
    prefill(ctxs[i], 1, 0, keys.data(), values.data(), n, kvh, hd);
  }
  Regions r = regions(n, c);
  RecallResult res;
  res.random = static_cast<double>(r.k) / static_cast<double>(r.middle);
  int samples = 0;
  std::normal_distribution<float> qn(0.0f, 0.3f);
  for (int qi = 0; qi < 4; ++qi) {
    // Every query head of group h points at one planted cluster of kv head h.
    std::vector<float> q(static_cast<size_t>(qh * hd));
    for (int32_t h = 0; h < kvh; ++h) {
      int planted = pick(rng);
      for (int32_t g = 0; g < G; ++g)
        for (int32_t d = 0; d < hd; ++d)
          q[static_cast<size_t>((h * G + g) * hd + d)] =
              0.5f * centres[static_cast<size_t>((h * clusters + planted) * hd + d)] + qn(rng);
    }
    Sel sp = select(ctxs[0], 1, 0, q, qh, kvh, hd);
    Sel se = select(ctxs[1], 1, 0, q, qh, kvh, hd);
    Sel sw = select(ctxs[2], 1, 0, q, qh, kvh, hd);
    for (int32_t h = 0; h < kvh; ++h) {
      std::vector<int32_t> ep = middle_of(se.row(h), r);
      EXPECT_EQ(static_cast<int64_t>(ep.size()), r.k);
      double k = static_cast<double>(r.k);
      res.pq += overlap(middle_of(sp.row(h), r), ep) / k;
      res.window += overlap(middle_of(sw.row(h), r), ep) / k;
      std::vector<double> sc = combined_scores(keys, kvh, hd, q, qh, h, r.sink_end, r.local_begin,
                                               c.gqa_combine);
      res.exact_vs_test += overlap(topk_positions(sc, r.sink_end, r.k), ep) / k;
      ++samples;
    }
  }
  res.pq /= samples;
  res.window /= samples;
  res.exact_vs_test /= samples;
  return res;
}

// Measured with the first complete implementation (seed 7, 4000 middle
// tokens, 32 clusters, noise 0.25, 20 K-Means iterations, m = 2, b = 6):
//   head_dim  64, k 800: PQ 0.871  WINDOW 0.199  random 0.200  EXACT-vs-test 1.000
//   head_dim  64, k 400: PQ 0.848  WINDOW 0.102  random 0.100  EXACT-vs-test 1.000
//   head_dim 128, k 800: PQ 0.858  WINDOW 0.201  random 0.200  EXACT-vs-test 1.000
//   head_dim 128, k 400: PQ 0.825  WINDOW 0.104  random 0.100  EXACT-vs-test 1.000
// The thresholds (PQ >= 0.75, PQ - WINDOW >= 0.5, PQ - k/middle >= 0.5) leave
// a margin of >= 0.075 below the measured values.
TEST(ApiSelection, RecallOnClusteredKeys) {
  struct Case {
    int32_t hd;
    int32_t k;
  } cases[] = {{64, 800}, {64, 400}, {128, 800}, {128, 400}};
  for (const Case& cs : cases) {
    SCOPED_TRACE("head_dim " + std::to_string(cs.hd) + " k " + std::to_string(cs.k));
    RecallResult r = measure_recall(cs.hd, cs.k, 7);
    std::printf("[recall] head_dim %d k %d/4000: PQ %.3f WINDOW %.3f random %.3f EXACT-vs-test %.3f\n",
                cs.hd, cs.k, r.pq, r.window, r.random, r.exact_vs_test);
    EXPECT_GE(r.exact_vs_test, 0.98) << "EXACT top-k disagrees with the test's own top-k";
    EXPECT_GE(r.pq, 0.75);
    EXPECT_GE(r.pq - r.window, 0.5);
    EXPECT_GE(r.pq, r.random + 0.5);
  }
}

// ---------------------------------------------------------------------------
// Bookkeeping
// ---------------------------------------------------------------------------

void bookkeeping_case(int32_t selector, int32_t topk_tokens, float fraction) {
  const int32_t kvh = 2, qh = 4, hd = 16;
  pq_config c = make_config(1, qh, kvh, hd, PQ_DTYPE_F32);
  c.pq_bits = 4;
  c.sink_tokens = 4;
  c.local_tokens = 16;
  c.topk_tokens = topk_tokens;
  c.topk_fraction = fraction;
  c.selector = selector;
  c.kmeans_iterations = 5;
  c.worker_threads = 2;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  std::vector<float> q = random_normal(static_cast<size_t>(qh * hd), 99);
  for (int64_t n : {1, 3, 4, 5, 12, 20, 21, 24, 30, 31, 50, 100, 333}) {
    SCOPED_TRACE("n " + std::to_string(n));
    uint64_t seq = static_cast<uint64_t>(n);
    PQ_ASSERT_OK(pq_sequence_add(ctx, seq));
    std::vector<float> k = random_normal(static_cast<size_t>(n * kvh * hd), 1000 + n);
    prefill(ctx, seq, 0, k.data(), k.data(), n, kvh, hd);
    Regions r = regions(n, c);
    EXPECT_EQ(r.count(), std::min<int64_t>(n, c.sink_tokens + r.k + c.local_tokens));
    EXPECT_EQ(selection_capacity(ctx, seq, 0), r.count());
    Sel s = select(ctx, seq, 0, q, qh, kvh, hd);
    for (int32_t h = 0; h < kvh; ++h) {
      EXPECT_EQ(s.counts[static_cast<size_t>(h)], r.count());
      check_bookkeeping(s.row(h), r, "head " + std::to_string(h));
      if (selector == PQ_SELECTOR_WINDOW) {
        std::vector<int32_t> want;
        for (int64_t p = 0; p < r.sink_end; ++p) want.push_back(static_cast<int32_t>(p));
        for (int64_t p = std::max<int64_t>(r.sink_end, n - r.k - c.local_tokens); p < n; ++p)
          want.push_back(static_cast<int32_t>(p));
        EXPECT_EQ(s.row(h), want) << "WINDOW must pick the most recent middle tokens";
      }
    }
    pq_layer_info info = layer_info(ctx, seq, 0);
    EXPECT_EQ(info.tokens, n);
    EXPECT_EQ(info.prefill_tokens, n);
    EXPECT_EQ(info.middle_tokens, r.middle);
    if (selector == PQ_SELECTOR_PQ) {
      // The PQ selector needs the index, so its select waited for the build.
      // (EXACT and WINDOW do not read the index; the library lets them run
      // while the build is still pending.)
      EXPECT_EQ(info.index_ready, 1);
      EXPECT_EQ(info.build_pending, 0);
    }
  }

  // Decode appends grow the sequence and the capacity; appended tokens are
  // local tokens.
  const uint64_t seq = 100;
  for (int i = 1; i <= 20; ++i) {
    std::vector<float> k = random_normal(static_cast<size_t>(kvh * hd), 5000 + i);
    append(ctx, seq, 0, k.data(), k.data(), 1, kvh, hd);
    Regions r = regions(100 + i, c);
    EXPECT_EQ(selection_capacity(ctx, seq, 0), r.count());
    Sel s = select(ctx, seq, 0, q, qh, kvh, hd);
    for (int32_t h = 0; h < kvh; ++h)
      check_bookkeeping(s.row(h), r, "after append " + std::to_string(i) + " head " + std::to_string(h));
    int64_t len = -1;
    PQ_ASSERT_OK(pq_sequence_length(ctx, seq, 0, &len));
    EXPECT_EQ(len, 100 + i);
  }
  pq_layer_info info = layer_info(ctx, seq, 0);
  EXPECT_EQ(info.tokens, 120);
  EXPECT_EQ(info.prefill_tokens, 100);
  EXPECT_EQ(info.middle_tokens, 120 - 4 - 16);
}

TEST(ApiSelection, BookkeepingCountModePq) { bookkeeping_case(PQ_SELECTOR_PQ, 10, 0.2f); }
TEST(ApiSelection, BookkeepingFractionModePq) { bookkeeping_case(PQ_SELECTOR_PQ, 0, 0.25f); }
TEST(ApiSelection, BookkeepingCountModeExact) { bookkeeping_case(PQ_SELECTOR_EXACT, 10, 0.2f); }
TEST(ApiSelection, BookkeepingFractionModeExact) { bookkeeping_case(PQ_SELECTOR_EXACT, 0, 0.5f); }
TEST(ApiSelection, BookkeepingCountModeWindow) { bookkeeping_case(PQ_SELECTOR_WINDOW, 10, 0.2f); }
TEST(ApiSelection, BookkeepingFractionModeWindow) { bookkeeping_case(PQ_SELECTOR_WINDOW, 0, 0.25f); }

TEST(ApiSelection, DefaultFractionRoundsUp) {
  // Default fraction 0.2 with 1003 middle tokens: ceil(200.6) = 201.
  const int32_t kvh = 1, qh = 1, hd = 8;
  pq_config c = make_config(1, qh, kvh, hd, PQ_DTYPE_F32);
  c.pq_bits = 3;
  c.worker_threads = 2;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  const int64_t n = 4 + 1003 + 128;
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  std::vector<float> k = random_normal(static_cast<size_t>(n * kvh * hd), 3);
  prefill(ctx, 1, 0, k.data(), k.data(), n, kvh, hd);
  EXPECT_EQ(selection_capacity(ctx, 1, 0), 4 + 201 + 128);
  Sel s = select(ctx, 1, 0, random_normal(hd, 4), qh, kvh, hd);
  EXPECT_EQ(s.counts[0], 4 + 201 + 128);
}

TEST(ApiSelection, TopkLargerThanMiddleIsClipped) {
  const int32_t kvh = 2, qh = 2, hd = 8;
  pq_config c = make_config(1, qh, kvh, hd, PQ_DTYPE_F32);
  c.pq_bits = 3;
  c.sink_tokens = 2;
  c.local_tokens = 5;
  c.topk_tokens = 1000;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  std::vector<float> k = random_normal(static_cast<size_t>(60 * kvh * hd), 5);
  prefill(ctx, 1, 0, k.data(), k.data(), 60, kvh, hd);
  EXPECT_EQ(selection_capacity(ctx, 1, 0), 60);
  Sel s = select(ctx, 1, 0, random_normal(qh * hd, 6), qh, kvh, hd);
  for (int32_t h = 0; h < kvh; ++h) {
    std::vector<int32_t> all(60);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(s.row(h), all);
  }
}

TEST(ApiSelection, SelectIsRepeatableAndLargerCapacityIsFine) {
  const int32_t kvh = 2, qh = 6, hd = 16;
  pq_config c = make_config(1, qh, kvh, hd, PQ_DTYPE_F32);
  c.pq_bits = 4;
  c.local_tokens = 8;
  c.topk_tokens = 12;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  std::vector<float> k = random_normal(static_cast<size_t>(500 * kvh * hd), 7);
  prefill(ctx, 1, 0, k.data(), k.data(), 500, kvh, hd);
  std::vector<float> q = random_normal(qh * hd, 8);
  Sel a = select(ctx, 1, 0, q, qh, kvh, hd);
  Sel b(kvh, 100);  // capacity larger than needed
  HostTensor Q = make_tensor(q, 1, qh, hd, PQ_DTYPE_F32);
  PQ_ASSERT_OK(pq_decode_select(ctx, 1, 0, Q.get(), b.get()));
  for (int32_t h = 0; h < kvh; ++h) EXPECT_EQ(a.row(h), b.row(h));
  // A head-major query with padding selects the same.
  HostTensor Qh = make_tensor(q, 1, qh, hd, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, 3, 5);
  Sel c2(kvh, 100);
  PQ_ASSERT_OK(pq_decode_select(ctx, 1, 0, Qh.get(), c2.get()));
  for (int32_t h = 0; h < kvh; ++h) EXPECT_EQ(a.row(h), c2.row(h));
}

// ---------------------------------------------------------------------------
// Eviction coding of decode tokens
// ---------------------------------------------------------------------------

// Nearest centroid by squared L2 with ties to the lowest index; returns the
// index and reports the best distance.
int32_t nearest(const float* cents, int32_t K, int32_t sub, const float* x, double* best_out,
                std::vector<double>* all = nullptr) {
  int32_t best = 0;
  double bd = INFINITY;
  if (all) all->assign(static_cast<size_t>(K), 0);
  for (int32_t j = 0; j < K; ++j) {
    double d = 0;
    for (int32_t e = 0; e < sub; ++e) {
      double t = static_cast<double>(x[e]) - cents[j * sub + e];
      d += t * t;
    }
    if (all) (*all)[static_cast<size_t>(j)] = d;
    if (d < bd) {
      bd = d;
      best = j;
    }
  }
  *best_out = bd;
  return best;
}

// The library's code must be the nearest centroid; near-ties (within float
// rounding) may go either way.
void expect_nearest_codes(const std::vector<float>& cent, const std::vector<uint8_t>& cd,
                          const float* key_of_token0, int64_t token_stride, int64_t count,
                          int32_t m, int32_t K, int32_t sub, const std::string& what) {
  int64_t wrong = 0;
  for (int64_t t = 0; t < count; ++t)
    for (int32_t s = 0; s < m; ++s) {
      const float* x = key_of_token0 + t * token_stride + s * sub;
      double bd;
      std::vector<double> all;
      int32_t want = nearest(cent.data() + static_cast<size_t>(s * K * sub), K, sub, x, &bd, &all);
      int32_t got = cd[static_cast<size_t>(t * m + s)];
      if (got == want) continue;
      if (got >= K || all[static_cast<size_t>(got)] > bd * (1 + 1e-5) + 1e-9) {
        if (++wrong <= 5)
          ADD_FAILURE() << what << ": token " << t << " subspace " << s << " code " << got
                        << " but nearest is " << want << " (dist " << (got < K ? all[static_cast<size_t>(got)] : -1.0)
                        << " vs " << bd << ")";
      }
    }
  EXPECT_EQ(wrong, 0) << what;
}

TEST(ApiSelection, EvictedDecodeTokensGetNearestCentroidCodes) {
  const int32_t kvh = 2, qh = 2, hd = 16, m = 2, bits = 4, K = 1 << bits, sub = hd / m;
  pq_config c = make_config(1, qh, kvh, hd, PQ_DTYPE_F32);
  c.pq_subspaces = m;
  c.pq_bits = bits;
  c.sink_tokens = 4;
  c.local_tokens = 16;
  c.topk_tokens = 8;
  c.kmeans_iterations = 10;
  c.worker_threads = 2;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(ctx, 3));
  const int64_t n0 = 300, extra = 40;
  std::vector<float> k0 = random_normal(static_cast<size_t>(n0 * kvh * hd), 21);
  prefill(ctx, 3, 0, k0.data(), k0.data(), n0, kvh, hd);
  // Decode keys come from a shifted distribution so that the codes vary.
  std::vector<float> k1 = random_normal(static_cast<size_t>(extra * kvh * hd), 22, 1.5f, 0.3f);
  std::vector<float> q = random_normal(qh * hd, 23);
  for (int64_t i = 0; i < extra; ++i) {
    append(ctx, 3, 0, k1.data() + i * kvh * hd, k1.data() + i * kvh * hd, 1, kvh, hd);
    if (i % 10 == 9) select(ctx, 3, 0, q, qh, kvh, hd);  // codes evicted tokens
  }
  select(ctx, 3, 0, q, qh, kvh, hd);
  const int64_t n = n0 + extra, local_begin = n - c.local_tokens;
  pq_layer_info info = layer_info(ctx, 3, 0);
  EXPECT_EQ(info.tokens, n);
  EXPECT_EQ(info.prefill_tokens, n0);
  EXPECT_EQ(info.coded_tokens, local_begin) << "prefill tokens + the appended tokens that left the window";

  for (int32_t h = 0; h < kvh; ++h) {
    std::vector<float> cent = centroids(ctx, 3, 0, h, c);
    // Appended tokens that left the local window.
    std::vector<uint8_t> cd = codes(ctx, 3, 0, h, n0, local_begin - n0, c);
    expect_nearest_codes(cent, cd, k1.data() + h * hd, kvh * hd, local_begin - n0, m, K, sub,
                         "appended tokens, head " + std::to_string(h));
    // Prefill tokens are encoded with the final centroids too.
    std::vector<uint8_t> cp = codes(ctx, 3, 0, h, 0, n0, c);
    expect_nearest_codes(cent, cp, k0.data() + h * hd, kvh * hd, n0, m, K, sub,
                         "prefill tokens, head " + std::to_string(h));
    // The ones still in the window are not coded yet.
    uint8_t tmp[4];
    PQ_EXPECT_ERR(pq_index_codes(ctx, 3, 0, h, local_begin, 1, tmp), PQ_ERR_INVALID_ARGUMENT,
                  "first", "count", "token", "coded", "local");
  }
}

// ---------------------------------------------------------------------------
// Chunked and out-of-order prefill
// ---------------------------------------------------------------------------

pq_config index_config(int32_t layers) {
  pq_config c = make_config(layers, 4, 2, 32, PQ_DTYPE_F32);
  c.pq_bits = 4;
  c.sink_tokens = 4;
  c.local_tokens = 32;
  c.topk_tokens = 50;
  c.kmeans_iterations = 8;
  c.worker_threads = 2;
  return c;
}

void expect_same_layer(pq_context* a, pq_context* b, uint64_t seq, int32_t layer, int64_t n,
                       const pq_config& c, const std::vector<float>& q) {
  SCOPED_TRACE("layer " + std::to_string(layer));
  for (int32_t h = 0; h < c.num_kv_heads; ++h) {
    std::vector<float> ca = centroids(a, seq, layer, h, c), cb = centroids(b, seq, layer, h, c);
    EXPECT_EQ(0, std::memcmp(ca.data(), cb.data(), ca.size() * sizeof(float))) << "centroids, head " << h;
    EXPECT_EQ(codes(a, seq, layer, h, 0, n, c), codes(b, seq, layer, h, 0, n, c)) << "codes, head " << h;
  }
  Sel sa = select(a, seq, layer, q, c.num_q_heads, c.num_kv_heads, c.head_dim);
  Sel sb = select(b, seq, layer, q, c.num_q_heads, c.num_kv_heads, c.head_dim);
  for (int32_t h = 0; h < c.num_kv_heads; ++h) EXPECT_EQ(sa.row(h), sb.row(h)) << "selection, head " << h;
}

TEST(ApiSelection, ChunkedPrefillEqualsOneShot) {
  pq_config c = index_config(1);
  const int32_t kvh = c.num_kv_heads, hd = c.head_dim;
  const int64_t n = 900;
  std::vector<float> k = random_normal(static_cast<size_t>(n * kvh * hd), 31);
  std::vector<float> v = random_normal(static_cast<size_t>(n * kvh * hd), 32);
  Ctx one(c), chunked(c);
  ASSERT_TRUE(one.ok());
  ASSERT_TRUE(chunked.ok());
  PQ_ASSERT_OK(pq_sequence_add(one, 1));
  PQ_ASSERT_OK(pq_sequence_add(chunked, 1));
  prefill(one, 1, 0, k.data(), v.data(), n, kvh, hd);
  const int64_t chunks[3] = {300, 250, 350};
  int64_t off = 0;
  for (int64_t len : chunks) {
    prefill(chunked, 1, 0, k.data() + off * kvh * hd, v.data() + off * kvh * hd, len, kvh, hd);
    off += len;
  }
  pq_layer_info info = layer_info(chunked, 1, 0);
  EXPECT_EQ(info.tokens, n);
  EXPECT_EQ(info.prefill_tokens, n);
  expect_same_layer(one, chunked, 1, 0, n, c, random_normal(c.num_q_heads * hd, 33));
  info = layer_info(chunked, 1, 0);
  EXPECT_EQ(info.coded_tokens, n);
  EXPECT_EQ(info.index_ready, 1);
  EXPECT_EQ(info.kmeans_iterations, layer_info(one, 1, 0).kmeans_iterations);

  // Also after the builds settled: a prefill after pq_wait_builds appends and
  // rebuilds the same way.
  Ctx settled(c);
  ASSERT_TRUE(settled.ok());
  PQ_ASSERT_OK(pq_sequence_add(settled, 1));
  off = 0;
  for (int64_t len : chunks) {
    prefill(settled, 1, 0, k.data() + off * kvh * hd, v.data() + off * kvh * hd, len, kvh, hd);
    PQ_ASSERT_OK(pq_wait_builds(settled));
    off += len;
  }
  expect_same_layer(one, settled, 1, 0, n, c, random_normal(c.num_q_heads * hd, 34));
}

TEST(ApiSelection, OutOfOrderLayersEqualInOrder) {
  pq_config c = index_config(4);
  const int32_t kvh = c.num_kv_heads, hd = c.head_dim;
  const int64_t n = 400;
  std::vector<std::vector<float>> ks, vs;
  for (int32_t l = 0; l < 4; ++l) {
    ks.push_back(random_normal(static_cast<size_t>(n * kvh * hd), 40 + l));
    vs.push_back(random_normal(static_cast<size_t>(n * kvh * hd), 50 + l));
  }
  Ctx in_order(c), shuffled(c);
  ASSERT_TRUE(in_order.ok());
  ASSERT_TRUE(shuffled.ok());
  PQ_ASSERT_OK(pq_sequence_add(in_order, 9));
  PQ_ASSERT_OK(pq_sequence_add(shuffled, 9));
  for (int32_t l : {0, 1, 2, 3}) prefill(in_order, 9, l, ks[l].data(), vs[l].data(), n, kvh, hd);
  for (int32_t l : {3, 0, 2, 1}) prefill(shuffled, 9, l, ks[l].data(), vs[l].data(), n, kvh, hd);
  std::vector<float> q = random_normal(c.num_q_heads * hd, 60);
  for (int32_t l = 0; l < 4; ++l) expect_same_layer(in_order, shuffled, 9, l, n, c, q);
  // Different layers with the same data still use their own seeds: not a
  // requirement of the header, so only the per-layer equality is checked.
}

}  // namespace
