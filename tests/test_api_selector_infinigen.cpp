// InfiniGen (infinigen_selector.cpp) and pq_decode_speculate. Public API
// only. The window queries live in a known two-dimensional subspace (a
// rotation R of the first two axes), so the skew's two kept columns span
// exactly it, whatever signs or order the eigen solver gives them: a
// partial score is then q_R . k, q_R the query's projection on the
// subspace, which the test computes from R alone.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "api_test_util.h"

namespace {

using pqt::Ctx;
using pqt::Sel;

constexpr uint64_t kSeq = 2;
constexpr int32_t kQHeads = 4, kKvHeads = 2, kDim = 8, kGroup = 2;
constexpr int64_t kPrompt = 120, kWindow = 6;

pq_config infinigen_config(float alpha) {
  pq_config c = pqt::make_config(2, kQHeads, kKvHeads, kDim, PQ_DTYPE_F32);
  c.selector = PQ_SELECTOR_INFINIGEN;
  c.sink_tokens = 4;
  c.local_tokens = 16;
  c.topk_tokens = 24;
  c.observation_window = kWindow;
  c.infinigen_partial_ratio = 0.25f;  // 2 of 8 columns
  c.infinigen_alpha = alpha;
  c.worker_threads = 1;
  return c;
}

// A random rotation of R^8 (Gram-Schmidt of normal vectors): R[i][j] is
// component i of basis vector j.
std::vector<double> rotation(uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<double> normal;
  std::vector<double> r(kDim * kDim);
  for (int j = 0; j < kDim; ++j) {
    std::vector<double> v(kDim);
    for (double& x : v) x = normal(rng);
    for (int b = 0; b < j; ++b) {
      double dot = 0;
      for (int i = 0; i < kDim; ++i) dot += v[i] * r[i * kDim + b];
      for (int i = 0; i < kDim; ++i) v[i] -= dot * r[i * kDim + b];
    }
    double norm = 0;
    for (double x : v) norm += x * x;
    for (int i = 0; i < kDim; ++i) r[i * kDim + j] = v[i] / std::sqrt(norm);
  }
  return r;
}

struct Data {
  std::vector<double> rot;       // per kv head a rotation, [head][8][8]
  std::vector<float> keys;       // [token][kv][8]
  std::vector<float> window;     // [w][q][8]: in span(R_0, R_1) of the head
};

Data make_data(int64_t tokens) {
  Data d;
  for (int h = 0; h < kKvHeads; ++h) {
    std::vector<double> r = rotation(10 + h);
    d.rot.insert(d.rot.end(), r.begin(), r.end());
  }
  d.keys = pqt::random_normal(static_cast<size_t>(tokens) * kKvHeads * kDim, 5);
  std::mt19937 rng(6);
  std::normal_distribution<double> normal;
  d.window.assign(kWindow * kQHeads * kDim, 0.f);
  for (int64_t i = 0; i < kWindow; ++i)
    for (int q = 0; q < kQHeads; ++q) {
      const int h = q / kGroup;
      // Unequal spreads: the two kept directions are distinct eigenvectors.
      const double a = 3.0 * normal(rng), b = 1.5 * normal(rng);
      for (int e = 0; e < kDim; ++e)
        d.window[(i * kQHeads + q) * kDim + e] = static_cast<float>(
            a * d.rot[h * 64 + e * kDim + 0] + b * d.rot[h * 64 + e * kDim + 1]);
    }
  return d;
}

// The rule: per kv head the group-mean projected score over the middle; n
// = floor(mean over heads of #{s > max - alpha}), at most k; top n each.
std::vector<std::vector<int32_t>> expected(const Data& d, const std::vector<float>& q,
                                           const pqt::Regions& r, float alpha) {
  std::vector<std::vector<double>> s(kKvHeads);
  int64_t within = 0;
  for (int h = 0; h < kKvHeads; ++h) {
    for (int64_t t = r.sink_end; t < r.local_begin; ++t) {
      double mean = 0;
      for (int g = 0; g < kGroup; ++g) {
        const float* qh = q.data() + (h * kGroup + g) * kDim;
        double score = 0;
        for (int j = 0; j < 2; ++j) {  // (q . R_j)(k . R_j): the projection's dot
          double qa = 0, ka = 0;
          for (int e = 0; e < kDim; ++e) {
            qa += qh[e] * d.rot[h * 64 + e * kDim + j];
            ka += d.keys[(t * kKvHeads + h) * kDim + e] * d.rot[h * 64 + e * kDim + j];
          }
          score += qa * ka;
        }
        mean += score / std::sqrt(double(kDim)) / kGroup;
      }
      s[h].push_back(mean);
    }
    const double best = *std::max_element(s[h].begin(), s[h].end());
    within += std::count_if(s[h].begin(), s[h].end(), [&](double v) { return v > best - alpha; });
  }
  const int64_t n = std::min<int64_t>(within / kKvHeads, r.k);
  std::vector<std::vector<int32_t>> out;
  for (int h = 0; h < kKvHeads; ++h) out.push_back(pqt::topk_positions(s[h], r.sink_end, n));
  return out;
}

void prefill(pq_context* ctx, const pq_config& c, const Data& d) {
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  pqt::HostTensor k = pqt::make_tensor(d.keys.data(), kPrompt, kKvHeads, kDim, c.dtype);
  pqt::HostTensor w = pqt::make_tensor(d.window, kWindow, kQHeads, kDim, c.dtype);
  for (int32_t l = 0; l < 2; ++l) {
    PQ_ASSERT_OK(pq_prefill_layer(ctx, kSeq, l, k.get(), k.get()));
    PQ_ASSERT_OK(pq_prefill_queries(ctx, kSeq, l, w.get()));
  }
}

std::vector<int32_t> middle(const Sel& sel, int32_t h, const pqt::Regions& r) {
  std::vector<int32_t> row = sel.row(h), out;
  for (int32_t p : row)
    if (p >= r.sink_end && p < r.local_begin) out.push_back(p);
  return out;
}

TEST(InfiniGen, SelectsByThePartialSkewedScoresWithinAlpha) {
  const int64_t steps = 12;
  const Data d = make_data(kPrompt + steps);
  for (float alpha : {0.3f, 0.6f, 1e6f}) {
    SCOPED_TRACE("alpha " + std::to_string(alpha));
    const pq_config c = infinigen_config(alpha);
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok()) << pq_last_error();
    prefill(ctx, c, d);
    std::vector<int64_t> counts;
    for (int64_t s = 0; s <= steps; ++s) {
      const int64_t n = kPrompt + s;
      if (s > 0) {
        pqt::HostTensor kv = pqt::make_tensor(d.keys.data() + (n - 1) * kKvHeads * kDim, 1,
                                              kKvHeads, kDim, c.dtype);
        PQ_ASSERT_OK(pq_decode_append(ctx, kSeq, 1, kv.get(), kv.get()));
      }
      // Queries off the subspace too: their other components must not count.
      std::vector<float> q = pqt::random_normal(kQHeads * kDim, 50 + s, 2.f);
      pqt::HostTensor qt = pqt::make_tensor(q, 1, kQHeads, kDim, c.dtype);
      const pqt::Regions r = pqt::regions(n, c);
      Sel sel(kKvHeads, pqt::selection_capacity(ctx, kSeq, 1));
      PQ_ASSERT_OK(pq_decode_select(ctx, kSeq, 1, qt.get(), sel.get()));
      const auto want = expected(d, q, r, alpha);
      for (int32_t h = 0; h < kKvHeads; ++h)
        EXPECT_EQ(middle(sel, h, r), want[h]) << "step " << s << ", kv head " << h;
      counts.push_back(static_cast<int64_t>(want[0].size()));
    }
    const auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
    if (alpha == 1e6f) {
      EXPECT_EQ(*lo, 24) << "every token within alpha: n is k";
    } else {
      EXPECT_LT(*lo, 24) << "alpha never limits n here";
      EXPECT_GE(*lo, 1);
    }
    (void)hi;
  }
}

TEST(InfiniGen, SettingsAndMissingQueriesAreNamed) {
  struct Bad {
    float ratio, alpha;
    const char* field;
  };
  for (Bad b : {Bad{0.f, 4.f, "infinigen_partial_ratio"}, Bad{1.5f, 4.f, "infinigen_partial_ratio"},
                Bad{NAN, 4.f, "infinigen_partial_ratio"}, Bad{0.2f, 0.f, "infinigen_alpha"},
                Bad{0.2f, -1.f, "infinigen_alpha"}, Bad{0.2f, NAN, "infinigen_alpha"}}) {
    pq_config c = infinigen_config(b.alpha);
    c.infinigen_partial_ratio = b.ratio;
    pq_context* ctx = nullptr;
    EXPECT_TRUE(pqt::IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {b.field}))
        << b.ratio << " " << b.alpha;
    EXPECT_EQ(ctx, nullptr);
  }
  const pq_config c = infinigen_config(4.f);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  const Data d = make_data(kPrompt);
  PQ_ASSERT_OK(pq_sequence_add(ctx, kSeq));
  pqt::HostTensor k = pqt::make_tensor(d.keys.data(), kPrompt, kKvHeads, kDim, c.dtype);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, kSeq, 0, k.get(), k.get()));
  std::vector<float> q(kQHeads * kDim, 1.f);
  pqt::HostTensor qt = pqt::make_tensor(q, 1, kQHeads, kDim, c.dtype);
  Sel sel(kKvHeads, pqt::selection_capacity(ctx, kSeq, 0));
  EXPECT_TRUE(pqt::IsError(pq_decode_select(ctx, kSeq, 0, qt.get(), sel.get()), PQ_ERR_BAD_STATE,
                           {"infinigen", "pq_prefill_queries"}));
  EXPECT_TRUE(pqt::IsError(pq_decode_speculate(ctx, kSeq, 0, qt.get(), sel.get()),
                           PQ_ERR_BAD_STATE, {"infinigen", "pq_prefill_queries"}));
}

// pq_decode_speculate writes what pq_decode_select would for the same
// query, changes nothing a select depends on (H2O's drop marks here), is
// not counted as a select, and the next select at the same length counts
// how much of its middle the hint held.
TEST(Speculate, AHintChangesNothingAndItsCoverageIsCounted) {
  for (int32_t selector : {PQ_SELECTOR_INFINIGEN, PQ_SELECTOR_H2O, PQ_SELECTOR_PQ}) {
    SCOPED_TRACE("selector " + std::to_string(selector));
    pq_config c = infinigen_config(2.f);
    c.selector = selector;
    const Data d = make_data(kPrompt + 8);
    Ctx a(c), b(c);
    ASSERT_TRUE(a.ok() && b.ok()) << pq_last_error();
    prefill(a, c, d);
    prefill(b, c, d);
    PQ_ASSERT_OK(pq_wait_builds(a));
    PQ_ASSERT_OK(pq_wait_builds(b));
    const int64_t cap = pqt::selection_capacity(a, kSeq, 1);
    std::vector<float> q1 = pqt::random_normal(kQHeads * kDim, 71, 2.f);
    std::vector<float> q2 = pqt::random_normal(kQHeads * kDim, 72, 2.f);
    pqt::HostTensor t1 = pqt::make_tensor(q1, 1, kQHeads, kDim, c.dtype);
    pqt::HostTensor t2 = pqt::make_tensor(q2, 1, kQHeads, kDim, c.dtype);
    // a: a hint for q1, then a select for q2; b: the select alone.
    Sel hint(kKvHeads, cap), got(kKvHeads, cap), alone(kKvHeads, cap), for_q1(kKvHeads, cap);
    PQ_ASSERT_OK(pq_decode_speculate(a, kSeq, 1, t1.get(), hint.get()));
    EXPECT_EQ(pqt::stats(a).select_calls, 0u);
    PQ_ASSERT_OK(pq_decode_select(a, kSeq, 1, t2.get(), got.get()));
    PQ_ASSERT_OK(pq_decode_select(b, kSeq, 1, t2.get(), alone.get()));
    const pqt::Regions r = pqt::regions(kPrompt, c);
    uint64_t chosen = 0, covered = 0;
    for (int32_t h = 0; h < kKvHeads; ++h) {
      EXPECT_EQ(got.row(h), alone.row(h)) << "the speculation changed the select";
      const std::vector<int32_t> m = middle(got, h, r), g = middle(hint, h, r);
      chosen += m.size();
      std::vector<int32_t> both;
      std::set_intersection(m.begin(), m.end(), g.begin(), g.end(), std::back_inserter(both));
      covered += both.size();
    }
    pq_stats s = pqt::stats(a);
    EXPECT_EQ(s.select_calls, 1u);
    EXPECT_EQ(s.hint_tokens, chosen);
    EXPECT_EQ(s.hint_covered, covered);
    if (selector == PQ_SELECTOR_H2O) {  // its choice does not depend on the query
      EXPECT_EQ(covered, chosen);
    } else {
      EXPECT_LT(covered, chosen) << "two random queries chose the same tokens";
    }
    // A hint for the query the select then uses covers all of it, once.
    PQ_ASSERT_OK(pq_decode_speculate(b, kSeq, 1, t1.get(), hint.get()));
    PQ_ASSERT_OK(pq_decode_select(b, kSeq, 1, t1.get(), for_q1.get()));
    for (int32_t h = 0; h < kKvHeads; ++h) EXPECT_EQ(hint.row(h), for_q1.row(h));
    s = pqt::stats(b);
    EXPECT_EQ(s.hint_covered, s.hint_tokens);
    EXPECT_GT(s.hint_tokens, 0u);
    PQ_ASSERT_OK(pq_decode_select(b, kSeq, 1, t1.get(), for_q1.get()));
    EXPECT_EQ(pqt::stats(b).hint_tokens, s.hint_tokens) << "a hint counted twice";
    // A hint made one token earlier counts (a caller speculates before the
    // step's token is appended); two tokens earlier it is stale.
    for (int64_t appended : {1, 2}) {
      const uint64_t before = pqt::stats(b).hint_tokens;
      PQ_ASSERT_OK(pq_decode_speculate(b, kSeq, 1, t1.get(), hint.get()));
      for (int64_t i = 0; i < appended; ++i) {
        const int64_t at = pqt::layer_info(b, kSeq, 1).tokens;
        pqt::HostTensor kv = pqt::make_tensor(d.keys.data() + at * kKvHeads * kDim, 1, kKvHeads,
                                              kDim, c.dtype);
        PQ_ASSERT_OK(pq_decode_append(b, kSeq, 1, kv.get(), kv.get()));
      }
      Sel later(kKvHeads, pqt::selection_capacity(b, kSeq, 1));
      PQ_ASSERT_OK(pq_decode_select(b, kSeq, 1, t1.get(), later.get()));
      if (appended == 1) {
        EXPECT_GT(pqt::stats(b).hint_tokens, before) << "a hint one token early was not counted";
      } else {
        EXPECT_EQ(pqt::stats(b).hint_tokens, before) << "a stale hint was counted";
      }
    }
    // Its errors are pq_decode_select's.
    Sel small(kKvHeads, 3);
    EXPECT_TRUE(pqt::IsError(pq_decode_speculate(b, kSeq, 1, t1.get(), small.get()),
                             PQ_ERR_BUFFER_TOO_SMALL, {"capacity"}));
    EXPECT_TRUE(pqt::IsError(pq_decode_speculate(b, kSeq + 1, 1, t1.get(), hint.get()),
                             PQ_ERR_NOT_FOUND, {"3"}));
  }
}

}  // namespace
