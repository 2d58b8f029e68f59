// config.pq_outliers (issue 44): PQ scores the keys its codebook represents
// worst by their exact q.k. A key pushed toward the query, which its codes
// hide, is selected with outliers and not without; the selection equals a
// brute-force one computed here in double from the index's own codes and
// centroids (pq_index_codes, pq_index_centroids) and the keys, for the
// fused softmax scan (a group), the single-head path and PQ_GQA_MAX;
// truncate, fork and restore select what a never-changed sequence selects;
// bad settings are named errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "api_test_util.h"

namespace {

using namespace pqt;

constexpr int32_t kDim = 32, kBits = 4, kSink = 4, kLocal = 16, kSubspaces = 2;

pq_config outlier_config(int32_t q_heads, int32_t kv_heads, float fraction, float share) {
  pq_config c = make_config(1, q_heads, kv_heads, kDim, PQ_DTYPE_F32);
  c.pq_subspaces = kSubspaces;
  c.pq_bits = kBits;
  c.sink_tokens = kSink;
  c.local_tokens = kLocal;
  c.topk_fraction = fraction;
  c.pq_outliers = share;
  return c;
}

// Queries wider than the keys (stddev 1.5): peaked attention. Tensors are
// made after a test edits the keys.
struct Model : RandomLayer {
  Model(int64_t tokens, int32_t qh, int32_t kvh, uint64_t seed)
      : RandomLayer(tokens, qh, kvh, kDim, seed, 1.0f, 1.5f) {}
};

std::vector<int32_t> select_row(pq_context* ctx, uint64_t seq, HostTensor& q, int32_t kv_heads,
                                int32_t head) {
  Sel sel(kv_heads, selection_capacity(ctx, seq, 0));
  EXPECT_EQ(pq_decode_select(ctx, seq, 0, q.get(), sel.get()), PQ_OK) << pq_last_error();
  return sel.row(head);
}

bool holds(const std::vector<int32_t>& row, int32_t token) {
  return std::find(row.begin(), row.end(), token) != row.end();
}

// Squared residuals |k - centroids(codes)|^2 of kv head h's coded tokens
// past the sinks, in double from pq_index_codes and pq_index_centroids.
struct Residuals {
  std::vector<uint8_t> codes;  // [coded - kSink][kSubspaces]
  std::vector<float> cent;     // [kSubspaces][2^kBits][sub]
  std::vector<double> of;      // [coded - kSink]
};
Residuals residuals(pq_context* ctx, const Model& m, int32_t h, int64_t coded = -1) {
  if (coded < 0) coded = m.n;
  const int32_t sub = kDim / kSubspaces, cents = 1 << kBits;
  Residuals r;
  r.codes.resize(static_cast<size_t>(coded - kSink) * kSubspaces);
  EXPECT_EQ(pq_index_codes(ctx, 1, 0, h, kSink, coded - kSink, r.codes.data()), PQ_OK) << pq_last_error();
  r.cent.resize(static_cast<size_t>(kSubspaces) * cents * sub);
  EXPECT_EQ(pq_index_centroids(ctx, 1, 0, h, r.cent.data(), static_cast<int64_t>(r.cent.size())), PQ_OK);
  for (int64_t t = kSink; t < coded; ++t) {
    double e = 0;
    for (int32_t j = 0; j < kSubspaces; ++j) {
      const float* c = r.cent.data() +
                       (static_cast<size_t>(j) * cents + r.codes[static_cast<size_t>(t - kSink) * kSubspaces + j]) * sub;
      for (int32_t d = 0; d < sub; ++d)
        e += std::pow(double{m.keys[(static_cast<size_t>(t) * m.kv_heads + h) * kDim + j * sub + d]} - c[d], 2);
    }
    r.of.push_back(e);
  }
  return r;
}

// A key far from every centroid in the query's direction: its codes score
// it like its neighbours, its exact q.k puts it first. The other keys sit in
// 16 tight clusters per subspace (one per centroid, so none is spare for the
// needle) whose centres span half of the subspace's dimensions; the needle
// is the centre its group scores lowest plus 8 x the group's mean query
// direction in the other half, which no centroid reaches: its nearest
// centroid stays its own centre's and its residual is the largest. One
// needle is in the prompt (found by the build), one comes by decode (coded
// against the build's threshold).
TEST(PqOutliers, FindsAKeyItsCodesHide) {
  const int32_t kv_heads = 2, q_heads = 8, group = 4, sub = kDim / kSubspaces, prompt = 600;
  Model m(700, q_heads, kv_heads, 5);
  auto spanned = [&](int32_t d) { return d % sub < sub / 2; };
  std::vector<float> centers = random_normal(static_cast<size_t>(kSubspaces) * 16 * sub, 6);
  for (size_t i = 0; i < centers.size(); ++i)
    if (!spanned(static_cast<int32_t>(i % sub))) centers[i] = 0.f;
  const std::vector<float> noise = random_normal(m.keys.size(), 7, 0.1f);
  const std::vector<float> picks = random_ints(m.keys.size() / sub, 8, 0, 15);
  auto center = [&](int32_t j, int32_t a) { return centers.data() + (j * 16 + a) * sub; };
  for (size_t i = 0; i < m.keys.size(); ++i) {
    const int32_t j = static_cast<int32_t>((i % kDim) / sub);
    m.keys[i] = center(j, static_cast<int32_t>(picks[i / sub]))[i % sub] + noise[i];
  }
  for (int32_t h = 0; h < kv_heads; ++h) {
    std::vector<double> dir(kDim, 0.0);
    for (int32_t g = 0; g < group; ++g)
      for (int32_t d = 0; d < kDim; ++d) dir[d] += m.query[(h * group + g) * kDim + d];
    std::vector<double> away(kDim, 0.0);  // dir in the dimensions no centre spans
    for (int32_t d = 0; d < kDim; ++d) away[d] = spanned(d) ? 0.0 : dir[d];
    const double norm = std::sqrt(std::inner_product(away.begin(), away.end(), away.begin(), 0.0));
    for (int32_t needle : {300, 650}) {
    float* key = m.key(needle, h);
    for (int32_t j = 0; j < kSubspaces; ++j) {
      int32_t lowest = 0;
      double low = 1e300;
      for (int32_t a = 0; a < 16; ++a) {
        double s = 0;
        for (int32_t d = 0; d < sub; ++d) s += dir[j * sub + d] * center(j, a)[d];
        if (s < low) low = s, lowest = a;
      }
      for (int32_t d = 0; d < sub; ++d) key[j * sub + d] = center(j, lowest)[d];
    }
    for (int32_t d = 0; d < kDim; ++d) key[d] += static_cast<float>(8.0 * away[d] / norm);
    }
  }
  m.make_tensors();
  auto rows = [&](const std::vector<float>& from, int64_t first, int64_t count) {
    return token_slice(from, first, count, kv_heads, kDim);
  };

  HostTensor pk = rows(m.keys, 0, prompt), pv = rows(m.values, 0, prompt);
  Ctx plain(outlier_config(q_heads, kv_heads, 0.05f, 0.f)),
      with(outlier_config(q_heads, kv_heads, 0.05f, 0.01f));
  for (pq_context* ctx : {plain.get(), with.get()}) {
    PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
    PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, pk.get(), pv.get()));
    for (int64_t t = prompt; t < m.n; ++t) {
      HostTensor k = rows(m.keys, t, 1), v = rows(m.values, t, 1);
      PQ_ASSERT_OK(pq_decode_append(ctx, 1, 0, k.get(), v.get()));
    }
  }
  for (int32_t h = 0; h < kv_heads; ++h) {
    const std::vector<int32_t> without = select_row(plain, 1, m.q, kv_heads, h),
                               found = select_row(with, 1, m.q, kv_heads, h);
    // The needles are among the 1% largest residuals (7 of the 680 tokens
    // coded past the sinks: the local window's are not).
    const std::vector<double> r = residuals(with, m, h, m.n - kLocal).of;
    for (int32_t needle : {300, 650}) {
      const double mine = r[static_cast<size_t>(needle - kSink)];
      EXPECT_LT(std::count_if(r.begin(), r.end(), [&](double x) { return x > mine; }), 7)
          << "kv head " << h << ", token " << needle;
      EXPECT_FALSE(holds(without, needle)) << "kv head " << h << ", token " << needle;
      EXPECT_TRUE(holds(found, needle)) << "kv head " << h << ", token " << needle;
    }
  }
}

// The selection as pq_outliers defines it, in double: every middle token's
// code logits; the outliers (residual at or above the ceil(share x n)-th
// largest of the coded tokens past the sinks) take their exact logits; the
// combine (SUM_SOFTMAX against the code logits' normaliser, or MAX); the
// top k. Returns the combined scores of the middle.
std::vector<double> brute_force(pq_context* ctx, const Model& m, float share, int32_t combine,
                                int32_t h, int64_t* outliers_in_middle) {
  const int32_t group = m.q_heads / m.kv_heads, sub = kDim / kSubspaces, cents = 1 << kBits;
  const int64_t mid_end = m.n - kLocal, middle = mid_end - kSink;
  const double scale = 1.0 / std::sqrt(double{kDim});
  const Residuals res = residuals(ctx, m, h);
  const std::vector<double>& residual = res.of;
  auto key = [&](int64_t t, int32_t d) {
    return static_cast<double>(m.keys[(static_cast<size_t>(t) * m.kv_heads + h) * kDim + d]);
  };
  auto centroid = [&](int64_t t, int32_t j) {
    return res.cent.data() +
           (static_cast<size_t>(j) * cents + res.codes[static_cast<size_t>(t - kSink) * kSubspaces + j]) * sub;
  };
  std::vector<double> sorted = residual;
  std::sort(sorted.rbegin(), sorted.rend());
  const double threshold = sorted[static_cast<size_t>(std::ceil(share * sorted.size())) - 1];
  std::vector<std::vector<double>> code_logit(group, std::vector<double>(middle)),
      exact_logit = code_logit;
  for (int32_t g = 0; g < group; ++g) {
    const float* q = m.query.data() + static_cast<size_t>(h * group + g) * kDim;
    for (int64_t i = 0; i < middle; ++i) {
      double s = 0, x = 0;
      for (int32_t j = 0; j < kSubspaces; ++j)
        for (int32_t d = 0; d < sub; ++d) s += q[j * sub + d] * centroid(kSink + i, j)[d];
      for (int32_t d = 0; d < kDim; ++d) x += q[d] * key(kSink + i, d);
      code_logit[g][i] = s * scale, exact_logit[g][i] = x * scale;
    }
  }
  std::vector<double> norm(group);
  for (int32_t g = 0; g < group; ++g) {
    const double top = *std::max_element(code_logit[g].begin(), code_logit[g].end());
    double sum = 0;
    for (double l : code_logit[g]) sum += std::exp(l - top);
    norm[g] = top + std::log(sum);
  }
  std::vector<double> combined(middle);
  *outliers_in_middle = 0;
  for (int64_t i = 0; i < middle; ++i) {
    const bool outlier = residual[static_cast<size_t>(i)] >= threshold;
    *outliers_in_middle += outlier;
    const auto& logit = outlier ? exact_logit : code_logit;
    double v = combine == PQ_GQA_MAX ? -1e300 : 0.0;
    for (int32_t g = 0; g < group; ++g) {
      if (combine == PQ_GQA_MAX) v = std::max(v, logit[g][i]);
      else if (group > 1) v += std::exp(logit[g][i] - norm[g]);
      else v = logit[g][i];
    }
    combined[static_cast<size_t>(i)] = v;
  }
  return combined;
}

// (group, combine): the fused scan (4, SUM_SOFTMAX), one query head (1) and
// the max over the group (4, MAX).
class PqOutlierSelection : public ::testing::TestWithParam<std::pair<int32_t, int32_t>> {};

// Each kv head's selection against brute_force, and against the selection
// without outliers (which must differ: the outliers changed something).
void expect_brute_force_selection(int32_t group, int32_t combine, int64_t tokens,
                                  int32_t threads) {
  const int32_t kv_heads = 2, q_heads = group * kv_heads;
  const float share = 0.05f;
  Model m(tokens, q_heads, kv_heads, 17);
  m.make_tensors();
  pq_config c = outlier_config(q_heads, kv_heads, 0.1f, share);
  c.gqa_combine = combine;
  c.worker_threads = threads;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  c.pq_outliers = 0.f;
  Ctx plain(c);
  for (pq_context* x : {ctx.get(), plain.get()}) {
    PQ_ASSERT_OK(pq_sequence_add(x, 1));
    PQ_ASSERT_OK(pq_prefill_layer(x, 1, 0, m.k.get(), m.v.get()));
  }
  for (int32_t h = 0; h < kv_heads; ++h) {
    const std::vector<int32_t> got = select_row(ctx, 1, m.q, kv_heads, h);
    int64_t outliers = 0;
    const std::vector<double> combined = brute_force(ctx, m, share, combine, h, &outliers);
    EXPECT_GE(outliers, tokens / 25);  // 5% of the coded tokens, most of them in the middle
    std::vector<double> sorted = combined;
    std::sort(sorted.rbegin(), sorted.rend());
    const int64_t k = std::count_if(got.begin(), got.end(),
                                    [&](int32_t p) { return p >= kSink && p < m.n - kLocal; });
    ASSERT_GT(k, 0);
    const double kth = sorted[static_cast<size_t>(k - 1)];
    // Every selected middle token is at or above the k-th brute-force score,
    // up to float rounding (the library sums in float).
    for (int32_t p : got) {
      if (p < kSink || p >= m.n - kLocal) continue;
      const double v = combined[static_cast<size_t>(p - kSink)];
      EXPECT_GE(v, kth - 1e-5 * std::max(1.0, std::abs(kth))) << "token " << p << ", kv head " << h;
    }
    EXPECT_EQ(k, static_cast<int64_t>(std::lround(0.1 * static_cast<double>(m.n - kSink - kLocal))));
    // And the outliers changed something: the plain selection differs.
    EXPECT_NE(select_row(plain, 1, m.q, kv_heads, h), got) << "kv head " << h;
  }
}

TEST_P(PqOutlierSelection, EqualsTheBruteForceSelection) {
  expect_brute_force_selection(GetParam().first, GetParam().second, 800, 1);
}

// A middle past 4,096 tokens: the outliers are found on the pool and the
// kv heads select on it (the ThreadSanitizer build runs this too).
TEST(PqOutlierPool, EqualsTheBruteForceSelectionOnThePool) {
  expect_brute_force_selection(4, PQ_GQA_SUM_SOFTMAX, 5000, 2);
}

INSTANTIATE_TEST_SUITE_P(Combines, PqOutlierSelection,
                         ::testing::Values(std::make_pair(4, int32_t{PQ_GQA_SUM_SOFTMAX}),
                                           std::make_pair(1, int32_t{PQ_GQA_SUM_SOFTMAX}),
                                           std::make_pair(4, int32_t{PQ_GQA_MAX})));

// The outliers follow the sequence: after a truncate and other tokens
// appended, a fork, and a save and restore, the selection is a never-changed
// sequence's.
TEST(PqOutliersState, TruncateForkAndRestoreSelectTheSequencesOwn) {
  const int32_t kv_heads = 2, q_heads = 8, prompt = 600, more = 40;
  Model m(prompt + more, q_heads, kv_heads, 31), other(more, q_heads, kv_heads, 41);
  m.make_tensors();
  const pq_config c = outlier_config(q_heads, kv_heads, 0.1f, 0.05f);
  auto slice = [&](const Model& from, int64_t first, int64_t count, bool keys) {
    return token_slice(keys ? from.keys : from.values, first, count, kv_heads, kDim);
  };

  auto append = [&](pq_context* ctx, uint64_t seq, const Model& from, int64_t first, int64_t count) {
    for (int64_t t = first; t < first + count; ++t) {
      HostTensor k = slice(from, t, 1, true), v = slice(from, t, 1, false);
      ASSERT_EQ(pq_decode_append(ctx, seq, 0, k.get(), v.get()), PQ_OK) << pq_last_error();
    }
  };
  HostTensor pk = slice(m, 0, prompt, true), pv = slice(m, 0, prompt, false);
  // The other tokens: some pushed far off, so that they join the outliers.
  for (int64_t t = 0; t < more; t += 5)
    for (int32_t d = 0; d < kDim; ++d) other.keys[static_cast<size_t>(t) * kv_heads * kDim + d] *= 4.f;

  auto all_rows = [&](pq_context* ctx, uint64_t seq) {
    Sel sel(kv_heads, selection_capacity(ctx, seq, 0));
    EXPECT_EQ(pq_decode_select(ctx, seq, 0, m.q.get(), sel.get()), PQ_OK) << pq_last_error();
    return std::make_pair(sel.row(0), sel.row(1));
  };

  Ctx saved_ctx(c);  // the prompt alone, saved before any decode token
  PQ_ASSERT_OK(pq_sequence_add(saved_ctx, 1));
  PQ_ASSERT_OK(pq_prefill_layer(saved_ctx, 1, 0, pk.get(), pv.get()));
  const std::vector<uint8_t> saved = saved_sequence(saved_ctx, 1);

  Ctx changed(c);
  ASSERT_TRUE(changed.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(changed, 1));
  PQ_ASSERT_OK(pq_prefill_layer(changed, 1, 0, pk.get(), pv.get()));
  append(changed, 1, m, prompt, more);
  (void)all_rows(changed, 1);
  PQ_ASSERT_OK(pq_sequence_truncate(changed, 1, prompt));
  append(changed, 1, other, 0, more);

  Ctx fresh(c);
  PQ_ASSERT_OK(pq_sequence_add(fresh, 1));
  PQ_ASSERT_OK(pq_prefill_layer(fresh, 1, 0, pk.get(), pv.get()));
  append(fresh, 1, other, 0, more);
  const auto want = all_rows(fresh, 1);
  EXPECT_EQ(all_rows(changed, 1), want);

  PQ_ASSERT_OK(pq_sequence_fork(changed, 1, 2));
  EXPECT_EQ(all_rows(changed, 2), want);

  Ctx restored(c);
  PQ_ASSERT_OK(pq_sequence_restore(restored, 7, saved.data(), saved.size()));
  append(restored, 7, other, 0, more);
  EXPECT_EQ(all_rows(restored, 7), want);

  // Without outliers the same tokens select otherwise (the test can fail).
  pq_config off = c;
  off.pq_outliers = 0.f;
  Ctx plain(off);
  PQ_ASSERT_OK(pq_sequence_add(plain, 1));
  PQ_ASSERT_OK(pq_prefill_layer(plain, 1, 0, pk.get(), pv.get()));
  append(plain, 1, other, 0, more);
  EXPECT_NE(all_rows(plain, 1), want);
}

TEST(PqOutliersConfig, NamedErrors) {
  pq_context* ctx = nullptr;
  pq_config c = outlier_config(8, 2, 0.1f, 0.01f);
  c.selector = PQ_SELECTOR_H2O;
  EXPECT_TRUE(IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"pq_outliers"}));
  EXPECT_TRUE(contains_ci(pq_last_error(), "PQ_SELECTOR_PQ"));
  c = outlier_config(8, 2, 0.1f, 0.01f);
  c.kv_tier = PQ_KV_TIER_CALLER;
  EXPECT_TRUE(IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"pq_outliers"}));
  EXPECT_TRUE(contains_ci(pq_last_error(), "PQ_KV_TIER_CALLER"));
  for (float bad : {0.3f, -0.01f, std::nanf("")}) {
    c = outlier_config(8, 2, 0.1f, bad);
    EXPECT_TRUE(IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"pq_outliers"})) << bad;
  }
  EXPECT_EQ(ctx, nullptr);
  pq_config d;
  pq_config_default(&d);
  EXPECT_EQ(d.pq_outliers, 0.f);
}

}  // namespace
