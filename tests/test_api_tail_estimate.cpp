// pq_decode_attend with config.tail_estimate PQ_TAIL_CODE_MEANS (issue 44):
// against a brute-force estimate computed here in double from the index's
// own codes and centroids (pq_index_codes, pq_index_centroids); nothing to
// estimate gives the attention without the estimate; truncate, fork and
// restore give what a sequence that was never changed gives; bad settings
// are named errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "api_test_util.h"

namespace {

using namespace pqt;

constexpr int32_t kDim = 32, kBits = 4, kSink = 4, kLocal = 16;

pq_config tail_config(int32_t q_heads, int32_t kv_heads, float fraction, int32_t subspaces = 2) {
  pq_config c = make_config(1, q_heads, kv_heads, kDim, PQ_DTYPE_F32);
  c.pq_subspaces = subspaces;
  c.pq_bits = kBits;
  c.sink_tokens = kSink;
  c.local_tokens = kLocal;
  c.topk_fraction = fraction;
  c.tail_estimate = PQ_TAIL_CODE_MEANS;
  return c;
}

struct Attended {
  std::vector<float> out, lse;
};

Attended attend(pq_context* ctx, uint64_t seq, HostTensor& query, Sel& sel, int32_t q_heads) {
  Attended a{std::vector<float>(static_cast<size_t>(q_heads) * kDim, -7.f),
             std::vector<float>(static_cast<size_t>(q_heads), -7.f)};
  EXPECT_EQ(pq_decode_attend(ctx, seq, 0, query.get(), sel.get(), 0.f, a.out.data(), a.lse.data()),
            PQ_OK)
      << pq_last_error();
  return a;
}

// The estimate as pq_tail_estimate defines it, in double: the selected rows
// exactly, every coded middle token the selection leaves out with logit
// scale x q . its centroids and the mean value of its first code.
Attended brute_force(pq_context* ctx, int32_t q_heads, int32_t kv_heads, int32_t kSubspaces,
                     int64_t n, const std::vector<float>& keys, const std::vector<float>& values,
                     const std::vector<float>& query, const Sel& sel) {
  const int32_t group = q_heads / kv_heads, sub = kDim / kSubspaces, k = 1 << kBits;
  const int64_t mid_end = n - kLocal, middle = mid_end - kSink;
  const double scale = 1.0 / std::sqrt(double{kDim});
  Attended want{std::vector<float>(static_cast<size_t>(q_heads) * kDim),
                std::vector<float>(static_cast<size_t>(q_heads))};
  auto at = [&](const std::vector<float>& t, int64_t token, int32_t h, int32_t d) {
    return static_cast<double>(t[(static_cast<size_t>(token) * kv_heads + h) * kDim + d]);
  };
  for (int32_t h = 0; h < kv_heads; ++h) {
    std::vector<uint8_t> codes(static_cast<size_t>(middle) * kSubspaces);
    EXPECT_EQ(pq_index_codes(ctx, 1, 0, h, kSink, middle, codes.data()), PQ_OK) << pq_last_error();
    std::vector<float> cent(static_cast<size_t>(kSubspaces) * k * sub);
    EXPECT_EQ(pq_index_centroids(ctx, 1, 0, h, cent.data(), static_cast<int64_t>(cent.size())), PQ_OK);
    std::vector<double> mean(static_cast<size_t>(k) * kDim, 0.0);
    std::vector<int64_t> count(static_cast<size_t>(k), 0);
    for (int64_t t = 0; t < middle; ++t) {
      const uint8_t c = codes[static_cast<size_t>(t) * kSubspaces];
      ++count[c];
      for (int32_t d = 0; d < kDim; ++d) mean[c * kDim + d] += at(values, kSink + t, h, d);
    }
    for (int32_t c = 0; c < k; ++c)
      for (int32_t d = 0; d < kDim; ++d) mean[c * kDim + d] /= std::max<int64_t>(count[c], 1);
    std::vector<bool> chosen(static_cast<size_t>(middle), false);
    const std::vector<int32_t> row = sel.row(h);
    for (int32_t p : row)
      if (p >= kSink && p < mid_end) chosen[static_cast<size_t>(p - kSink)] = true;
    for (int32_t g = 0; g < group; ++g) {
      const int32_t q = h * group + g;
      const float* qv = query.data() + static_cast<size_t>(q) * kDim;
      std::vector<double> logits;
      std::vector<const double*> means;  // null: the row's own value
      std::vector<int64_t> tokens;
      for (int32_t p : row) {
        double s = 0;
        for (int32_t d = 0; d < kDim; ++d) s += qv[d] * at(keys, p, h, d);
        logits.push_back(s * scale), means.push_back(nullptr), tokens.push_back(p);
      }
      for (int64_t t = 0; t < middle; ++t) {
        if (chosen[static_cast<size_t>(t)]) continue;
        double s = 0;
        for (int32_t j = 0; j < kSubspaces; ++j) {
          const float* c = cent.data() +
                           (static_cast<size_t>(j) * k + codes[static_cast<size_t>(t) * kSubspaces + j]) * sub;
          for (int32_t d = 0; d < sub; ++d) s += qv[j * sub + d] * c[d];
        }
        logits.push_back(s * scale);
        means.push_back(mean.data() + codes[static_cast<size_t>(t) * kSubspaces] * kDim);
        tokens.push_back(kSink + t);
      }
      double max = -std::numeric_limits<double>::infinity(), sum = 0;
      for (double l : logits) max = std::max(max, l);
      std::vector<double> out(kDim, 0.0);
      for (size_t i = 0; i < logits.size(); ++i) {
        const double w = std::exp(logits[i] - max);
        sum += w;
        for (int32_t d = 0; d < kDim; ++d)
          out[d] += w * (means[i] ? means[i][d] : at(values, tokens[i], h, d));
      }
      for (int32_t d = 0; d < kDim; ++d)
        want.out[static_cast<size_t>(q) * kDim + d] = static_cast<float>(out[d] / sum);
      want.lse[static_cast<size_t>(q)] = static_cast<float>(max + std::log(sum));
    }
  }
  return want;
}

// The largest relative L2 error of a query head's output.
double max_relative_error(const Attended& got, const Attended& want, int32_t q_heads) {
  double worst = 0;
  for (int32_t q = 0; q < q_heads; ++q) {
    double diff = 0, norm = 0;
    for (int32_t d = 0; d < kDim; ++d) {
      const size_t i = static_cast<size_t>(q) * kDim + d;
      diff += std::pow(double{got.out[i]} - want.out[i], 2);
      norm += std::pow(double{want.out[i]}, 2);
    }
    worst = std::max(worst, std::sqrt(diff / std::max(norm, 1e-30)));
  }
  return worst;
}

// Keys spread wider than the queries (stddev 1.5): attention with a tail.
struct Model : RandomLayer {
  Model(int64_t tokens, int32_t qh, int32_t kvh, uint64_t seed)
      : RandomLayer(tokens, qh, kvh, kDim, seed, 1.5f) {
    make_tensors();
  }
};

// Two contexts holding m's tokens, with the estimate (on) and without (off).
struct OnAndOff {
  Ctx on_ctx, off_ctx;
  pq_context *on = nullptr, *off = nullptr;
  OnAndOff(Model& m, float fraction, int32_t subspaces) {
    pq_config c = tail_config(m.q_heads, m.kv_heads, fraction, subspaces);
    on_ctx = Ctx(c);
    c.tail_estimate = PQ_TAIL_NONE;
    off_ctx = Ctx(c);
    on = on_ctx.get(), off = off_ctx.get();
    for (pq_context* ctx : {on, off}) {
      EXPECT_EQ(pq_sequence_add(ctx, 1), PQ_OK) << pq_last_error();
      EXPECT_EQ(pq_prefill_layer(ctx, 1, 0, m.k.get(), m.v.get()), PQ_OK) << pq_last_error();
    }
  }
};

// (group, subspaces): one block of four query heads with 2 and 4 subspaces
// (the scans written for them), a padded block (3) and two blocks (8).
class TailEstimate : public ::testing::TestWithParam<std::pair<int32_t, int32_t>> {};

TEST_P(TailEstimate, EqualsTheBruteForceEstimate) {
  const int32_t group = GetParam().first, subspaces = GetParam().second, kv_heads = 2,
                q_heads = group * kv_heads;
  Model m(700, q_heads, kv_heads, 11);
  Ctx ctx(tail_config(q_heads, kv_heads, 0.1f, subspaces));
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, m.k.get(), m.v.get()));
  Sel sel(kv_heads, selection_capacity(ctx, 1, 0));
  PQ_ASSERT_OK(pq_decode_select(ctx, 1, 0, m.q.get(), sel.get()));
  const Attended got = attend(ctx, 1, m.q, sel, q_heads);
  const Attended want =
      brute_force(ctx, q_heads, kv_heads, subspaces, m.n, m.keys, m.values, m.query, sel);
  const double err = max_relative_error(got, want, q_heads);
  EXPECT_LT(err, 2e-5);
  for (int32_t q = 0; q < q_heads; ++q)
    EXPECT_NEAR(got.lse[q], want.lse[q], 2e-5 * std::max(1.f, std::abs(want.lse[q])));
  RecordProperty("max_relative_error", std::to_string(err));

  // Without the estimate the same selection attends to its rows alone: a
  // different output (the tail holds 90% of the middle).
  pq_config off = tail_config(q_heads, kv_heads, 0.1f, subspaces);
  off.tail_estimate = PQ_TAIL_NONE;
  Ctx plain(off);
  PQ_ASSERT_OK(pq_sequence_add(plain, 1));
  PQ_ASSERT_OK(pq_prefill_layer(plain, 1, 0, m.k.get(), m.v.get()));
  const Attended rows_only = attend(plain, 1, m.q, sel, q_heads);
  EXPECT_GT(max_relative_error(rows_only, want, q_heads), 100 * err + 1e-4);
}

// A selection that holds the whole middle leaves no tail: the same bits as
// the attention without the estimate.
TEST_P(TailEstimate, NothingLeftOutIsTheAttentionWithoutIt) {
  const int32_t group = GetParam().first, kv_heads = 2, q_heads = group * kv_heads;
  Model m(400, q_heads, kv_heads, 21);
  OnAndOff both(m, 1.f, GetParam().second);
  pq_context *on = both.on, *off = both.off;
  Sel sel(kv_heads, selection_capacity(on, 1, 0));
  PQ_ASSERT_OK(pq_decode_select(on, 1, 0, m.q.get(), sel.get()));
  ASSERT_EQ(sel.counts[0], m.n);
  const Attended a = attend(on, 1, m.q, sel, q_heads), b = attend(off, 1, m.q, sel, q_heads);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
}

// pq_decode_tail: the tail alone, merged by the caller with its own
// attention over the selected rows (as pq_decode_tail documents), gives
// pq_decode_attend's result.
TEST_P(TailEstimate, TheTailAloneMergesIntoTheAttend) {
  const int32_t group = GetParam().first, kv_heads = 2, q_heads = group * kv_heads;
  Model m(700, q_heads, kv_heads, 61);
  OnAndOff both(m, 0.05f, GetParam().second);
  pq_context *on = both.on, *off = both.off;
  Sel sel(kv_heads, selection_capacity(on, 1, 0));
  PQ_ASSERT_OK(pq_decode_select(on, 1, 0, m.q.get(), sel.get()));
  const Attended whole = attend(on, 1, m.q, sel, q_heads);
  const Attended rows = attend(off, 1, m.q, sel, q_heads);  // the caller's own attention
  Attended tail{std::vector<float>(whole.out.size()), std::vector<float>(whole.lse.size())};
  PQ_ASSERT_OK(pq_decode_tail(on, 1, 0, m.q.get(), sel.get(), 0.f, tail.out.data(),
                              tail.lse.data()));
  Attended merged = whole;
  for (int32_t q = 0; q < q_heads; ++q) {
    const double mx = std::max(rows.lse[q], tail.lse[q]);
    const double wa = std::exp(rows.lse[q] - mx), wt = std::exp(tail.lse[q] - mx);
    for (int32_t d = 0; d < kDim; ++d) {
      const size_t i = static_cast<size_t>(q) * kDim + d;
      merged.out[i] = static_cast<float>((wa * rows.out[i] + wt * tail.out[i]) / (wa + wt));
    }
    merged.lse[q] = static_cast<float>(mx + std::log(wa + wt));
    EXPECT_NEAR(merged.lse[q], whole.lse[q], 1e-5 * std::max(1.f, std::abs(whole.lse[q])));
    EXPECT_LT(tail.lse[q], whole.lse[q]);  // a part of the whole's mass
  }
  EXPECT_LT(max_relative_error(merged, whole, q_heads), 1e-5);

  // A selection of the whole middle leaves no tail: zeros and -inf.
  Sel all(kv_heads, m.n);
  for (int32_t h = 0; h < kv_heads; ++h) {
    all.counts[h] = static_cast<int32_t>(m.n);
    for (int32_t i = 0; i < m.n; ++i) all.positions[static_cast<size_t>(h) * m.n + i] = i;
  }
  PQ_ASSERT_OK(pq_decode_tail(on, 1, 0, m.q.get(), all.get(), 0.f, tail.out.data(),
                              tail.lse.data()));
  for (float x : tail.out) EXPECT_EQ(x, 0.f);
  for (float l : tail.lse) EXPECT_EQ(l, -std::numeric_limits<float>::infinity());

  // Named errors, nothing written.
  std::vector<float> untouched(tail.out.size(), 5.f), lse(tail.lse.size(), 5.f);
  EXPECT_TRUE(IsError(pq_decode_tail(off, 1, 0, m.q.get(), sel.get(), 0.f, untouched.data(),
                                     lse.data()),
                      PQ_ERR_BAD_STATE, {"tail_estimate"}));
  EXPECT_TRUE(IsError(pq_decode_tail(on, 1, 0, m.q.get(), sel.get(), 0.f, untouched.data(),
                                     nullptr),
                      PQ_ERR_INVALID_ARGUMENT, {"out_lse"}));
  EXPECT_TRUE(contains_ci(pq_last_error(), "pq_decode_tail"));
  for (float x : untouched) EXPECT_EQ(x, 5.f);
  for (float l : lse) EXPECT_EQ(l, 5.f);
}

INSTANTIATE_TEST_SUITE_P(GroupsAndSubspaces, TailEstimate,
                         ::testing::Values(std::make_pair(4, 2), std::make_pair(4, 4),
                                           std::make_pair(3, 2), std::make_pair(8, 2)));

// A middle of more than 4,096 tokens: the kv heads' tails run on the pool
// beside the row tasks (the ThreadSanitizer build runs this too).
TEST(TailEstimatePool, EqualsTheBruteForceEstimateOnThePool) {
  const int32_t kv_heads = 2, q_heads = 8;
  Model m(5000, q_heads, kv_heads, 71);
  pq_config c = tail_config(q_heads, kv_heads, 0.1f, 4);
  c.worker_threads = 2;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, m.k.get(), m.v.get()));
  Sel sel(kv_heads, selection_capacity(ctx, 1, 0));
  PQ_ASSERT_OK(pq_decode_select(ctx, 1, 0, m.q.get(), sel.get()));
  const Attended got = attend(ctx, 1, m.q, sel, q_heads);
  const Attended want = brute_force(ctx, q_heads, kv_heads, 4, m.n, m.keys, m.values, m.query, sel);
  EXPECT_LT(max_relative_error(got, want, q_heads), 2e-5);
}

// The value means follow the sequence: after a truncate and other tokens
// appended to the same length, after a fork and after a save and restore,
// the estimate is what a context that prefilled the same tokens gives.
TEST(TailEstimateState, TruncateForkAndRestoreGiveTheSequencesOwnEstimate) {
  const int32_t kv_heads = 2, q_heads = 8, prompt = 600, more = 40;
  Model m(prompt + more, q_heads, kv_heads, 31);
  Model other(more, q_heads, kv_heads, 41);  // the tokens appended after the truncate
  const pq_config c = tail_config(q_heads, kv_heads, 0.1f);
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

  // Changed: the prompt, 40 tokens, an attend (the means made), a truncate
  // back to the prompt, 40 other tokens.
  Ctx changed(c);
  ASSERT_TRUE(changed.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(changed, 1));
  PQ_ASSERT_OK(pq_prefill_layer(changed, 1, 0, pk.get(), pv.get()));
  append(changed, 1, m, prompt, more);
  Sel sel(kv_heads, selection_capacity(changed, 1, 0));
  PQ_ASSERT_OK(pq_decode_select(changed, 1, 0, m.q.get(), sel.get()));
  (void)attend(changed, 1, m.q, sel, q_heads);
  PQ_ASSERT_OK(pq_sequence_truncate(changed, 1, prompt));
  append(changed, 1, other, 0, more);

  // Never changed: the prompt and the other 40 tokens.
  Ctx fresh(c);
  PQ_ASSERT_OK(pq_sequence_add(fresh, 1));
  PQ_ASSERT_OK(pq_prefill_layer(fresh, 1, 0, pk.get(), pv.get()));
  append(fresh, 1, other, 0, more);

  PQ_ASSERT_OK(pq_decode_select(fresh, 1, 0, m.q.get(), sel.get()));
  const Attended want = attend(fresh, 1, m.q, sel, q_heads);
  EXPECT_LT(max_relative_error(attend(changed, 1, m.q, sel, q_heads), want, q_heads), 1e-6);

  PQ_ASSERT_OK(pq_sequence_fork(changed, 1, 2));
  EXPECT_LT(max_relative_error(attend(changed, 2, m.q, sel, q_heads), want, q_heads), 1e-6);

  const std::vector<uint8_t> saved = saved_sequence(changed, 1);
  Ctx restored(c);
  PQ_ASSERT_OK(pq_sequence_restore(restored, 7, saved.data(), saved.size()));
  EXPECT_LT(max_relative_error(attend(restored, 7, m.q, sel, q_heads), want, q_heads), 1e-6);
}

TEST(TailEstimateConfig, NamedErrors) {
  pq_config c = tail_config(8, 2, 0.1f);
  c.selector = PQ_SELECTOR_EXACT;
  pq_context* ctx = nullptr;
  EXPECT_TRUE(IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"tail_estimate"}));
  EXPECT_TRUE(contains_ci(pq_last_error(), "PQ_SELECTOR_PQ"));
  EXPECT_EQ(ctx, nullptr);
  c = tail_config(8, 2, 0.1f);
  c.tail_estimate = 2;
  EXPECT_TRUE(IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"tail_estimate"}));
  c = tail_config(8, 2, 0.1f);
  c.kv_tier = PQ_KV_TIER_CALLER;
  EXPECT_TRUE(IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"tail_estimate"}));
  EXPECT_TRUE(contains_ci(pq_last_error(), "PQ_KV_TIER_CALLER"));
  EXPECT_EQ(ctx, nullptr);
  pq_config d;
  pq_config_default(&d);
  EXPECT_EQ(d.tail_estimate, PQ_TAIL_NONE);
}

}  // namespace
