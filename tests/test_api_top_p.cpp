// config.top_p (issue 44): each kv head keeps the fewest of its k best
// middle tokens whose estimated attention mass reaches p of the middle's.
// Checked against masses computed here in double (the exact keys for
// PQ_SELECTOR_EXACT; the index's own codes and centroids, pq_index_codes
// and pq_index_centroids, for PQ): each row is a top set by those masses,
// holds p of the mass, and would not without its last token, between the
// floor and k. With 4-bit codes, which PQ would otherwise score by code
// tuples, a single query head and a middle selected on the pool. Then the
// bounds (p = 1 is the fixed budget; a tiny p keeps the floor; k = the whole
// middle still prunes), the batch and speculation, fork and restore, an
// attend with the tail estimate, SparQ, and the named errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "api_test_util.h"

namespace {

using namespace pqt;

constexpr int32_t kDim = 32, kSink = 4, kLocal = 16;

struct Setting {
  int32_t selector;
  int32_t group;
  int32_t bits;
  float p;
  int64_t tokens;
  int32_t threads;
};

std::string describe(const Setting& s) {
  return "selector " + std::to_string(s.selector) + " group " + std::to_string(s.group) +
         " bits " + std::to_string(s.bits) + " p " + std::to_string(s.p) + " tokens " +
         std::to_string(s.tokens);
}

void PrintTo(const Setting& s, std::ostream* os) { *os << describe(s); }

pq_config top_p_config(int32_t q_heads, int32_t kv_heads, float p, float floor = 0.02f) {
  pq_config c = make_config(1, q_heads, kv_heads, kDim, PQ_DTYPE_F32);
  c.pq_subspaces = 2;
  c.pq_bits = 6;
  c.sink_tokens = kSink;
  c.local_tokens = kLocal;
  c.topk_fraction = 0.25f;
  c.top_p = p;
  c.top_p_floor = floor;
  return c;
}

// Queries wider than the keys (stddev 2): attention peaked enough that a
// share of the mass sits in few tokens.
struct Model : RandomLayer {
  Model(int64_t tokens, int32_t qh, int32_t kvh, uint64_t seed)
      : RandomLayer(tokens, qh, kvh, kDim, seed, 1.0f, 2.0f) {
    make_tensors();
  }
};

Ctx prefilled(const pq_config& c, Model& m, uint64_t seq = 1) {
  Ctx ctx(c);
  EXPECT_TRUE(ctx.ok()) << pq_last_error();
  if (!ctx.ok()) return ctx;
  EXPECT_EQ(pq_sequence_add(ctx, seq), PQ_OK) << pq_last_error();
  EXPECT_EQ(pq_prefill_layer(ctx, seq, 0, m.k.get(), m.v.get()), PQ_OK) << pq_last_error();
  return ctx;
}

Sel select_all(pq_context* ctx, uint64_t seq, HostTensor& q, int32_t kv_heads) {
  Sel sel(kv_heads, selection_capacity(ctx, seq, 0));
  EXPECT_EQ(pq_decode_select(ctx, seq, 0, q.get(), sel.get()), PQ_OK) << pq_last_error();
  return sel;
}

// Each middle token's estimated mass, in double: the softmax over the middle
// of each query head's scores (exact q.k, or the codes' centroids), averaged
// over the kv head's group. Sums to 1.
std::vector<double> masses(pq_context* ctx, const Model& m, int32_t selector, int32_t bits,
                           int32_t h) {
  const int32_t group = m.q_heads / m.kv_heads, sub = kDim / 2, cents = 1 << bits;
  const int64_t mid_end = m.n - kLocal, middle = mid_end - kSink;
  std::vector<uint8_t> codes;
  std::vector<float> cent;
  if (selector == PQ_SELECTOR_PQ) {
    codes.resize(static_cast<size_t>(middle) * 2);
    EXPECT_EQ(pq_index_codes(ctx, 1, 0, h, kSink, middle, codes.data()), PQ_OK) << pq_last_error();
    cent.resize(static_cast<size_t>(2) * cents * sub);
    EXPECT_EQ(pq_index_centroids(ctx, 1, 0, h, cent.data(), static_cast<int64_t>(cent.size())),
              PQ_OK);
  }
  auto key = [&](int64_t i, int32_t d) -> double {
    if (selector != PQ_SELECTOR_PQ)
      return m.keys[(static_cast<size_t>(kSink + i) * m.kv_heads + h) * kDim + d];
    const int32_t j = d / sub;
    return cent[(static_cast<size_t>(j) * cents + codes[static_cast<size_t>(i) * 2 + j]) * sub +
                d % sub];
  };
  const double scale = 1.0 / std::sqrt(double{kDim});
  std::vector<double> out(static_cast<size_t>(middle), 0.0), logit(out.size());
  for (int32_t g = 0; g < group; ++g) {
    const float* q = m.query.data() + static_cast<size_t>(h * group + g) * kDim;
    for (int64_t i = 0; i < middle; ++i) {
      double s = 0;
      for (int32_t d = 0; d < kDim; ++d) s += q[d] * key(i, d);
      logit[static_cast<size_t>(i)] = s * scale;
    }
    const double top = *std::max_element(logit.begin(), logit.end());
    double sum = 0;
    for (double l : logit) sum += std::exp(l - top);
    for (size_t i = 0; i < out.size(); ++i) out[i] += std::exp(logit[i] - top) / sum / group;
  }
  return out;
}

// A row's middle against the masses: a top set by mass (up to rounding),
// holding p of the mass unless it is all k, and not holding it without its
// last token unless it is at the floor. Returns the middle's count.
int64_t expect_top_p_row(const std::vector<int32_t>& middle_row, const std::vector<double>& mass,
                         int64_t k, double p, int64_t floor) {
  constexpr double kTol = 1e-5;  // the library sums float softmaxes
  std::vector<double> sorted = mass;
  std::sort(sorted.rbegin(), sorted.rend());
  const auto c = static_cast<int64_t>(middle_row.size());
  EXPECT_LE(c, k);
  EXPECT_GE(c, std::min(floor, k));
  if (c == 0) return 0;
  double held = 0;
  for (int32_t pos : middle_row) {
    const double v = mass[static_cast<size_t>(pos - kSink)];
    held += v;
    EXPECT_GE(v, sorted[static_cast<size_t>(c - 1)] - kTol) << "token " << pos;
  }
  if (c < k) EXPECT_GE(held, p - kTol) << "the row holds too little mass";
  if (c > std::max<int64_t>(floor, 1)) {
    double smallest = 1e300;
    for (int32_t pos : middle_row) smallest = std::min(smallest, mass[static_cast<size_t>(pos - kSink)]);
    EXPECT_LT(held - smallest, p + kTol) << "the row holds p without its last token";
  }
  return c;
}

class TopPSelection : public ::testing::TestWithParam<Setting> {};

TEST_P(TopPSelection, EachRowIsTheFewestTopTokensHoldingP) {
  const Setting s = GetParam();
  SCOPED_TRACE(describe(s));
  const int32_t kv_heads = 2, q_heads = s.group * kv_heads;
  Model m(s.tokens, q_heads, kv_heads, 23);
  pq_config c = top_p_config(q_heads, kv_heads, s.p);
  c.selector = s.selector;
  c.pq_bits = s.bits;
  c.worker_threads = s.threads;
  Ctx ctx = prefilled(c, m);
  ASSERT_TRUE(ctx.ok());
  const Sel sel = select_all(ctx, 1, m.q, kv_heads);
  const Regions r = regions(m.n, c);
  const auto floor = static_cast<int64_t>(std::ceil(0.02 * static_cast<double>(r.middle)));
  bool inside = false;  // some head strictly between the floor and k: both bounds tested
  for (int32_t h = 0; h < kv_heads; ++h) {
    SCOPED_TRACE("kv head " + std::to_string(h));
    const std::vector<int32_t> row = sel.row(h);
    const std::vector<int32_t> middle = middle_of(row, r);
    // Sinks and the local window are kept whatever the budget.
    EXPECT_EQ(static_cast<int64_t>(row.size()), kSink + kLocal + static_cast<int64_t>(middle.size()));
    const int64_t n = expect_top_p_row(middle, masses(ctx, m, s.selector, s.bits, h), r.k, s.p, floor);
    inside = inside || (n > floor && n < r.k);
  }
  EXPECT_TRUE(inside) << "no head's count fell between the floor and k; the setting tests neither";
}

INSTANTIATE_TEST_SUITE_P(
    Settings, TopPSelection,
    ::testing::Values(Setting{PQ_SELECTOR_EXACT, 4, 6, 0.5f, 800, 1},
                      Setting{PQ_SELECTOR_EXACT, 1, 6, 0.7f, 800, 1},
                      Setting{PQ_SELECTOR_PQ, 4, 6, 0.5f, 800, 1},   // the fused softmax scan
                      Setting{PQ_SELECTOR_PQ, 1, 6, 0.6f, 800, 1},   // one head: logits
                      Setting{PQ_SELECTOR_PQ, 4, 4, 0.5f, 2300, 1},  // code tuples otherwise
                      Setting{PQ_SELECTOR_PQ, 4, 6, 0.4f, 5000, 2}), // heads on the pool
    [](const ::testing::TestParamInfo<Setting>& info) { return "case" + std::to_string(info.index); });

std::vector<std::vector<int32_t>> rows_of(const Sel& sel, int32_t kv_heads) {
  std::vector<std::vector<int32_t>> out;
  for (int32_t h = 0; h < kv_heads; ++h) out.push_back(sel.row(h));
  return out;
}

// p = 1 keeps all k: the fixed budget's rows. A tiny p keeps the floor (one
// token with floor 0). A k of the whole middle is a ceiling: still pruned.
TEST(TopPBounds, OneIsTheFixedBudgetATinyPTheFloorAndAWholeMiddleIsACeiling) {
  const int32_t kv_heads = 2, q_heads = 8;
  Model m(700, q_heads, kv_heads, 5);
  const Regions r = regions(m.n, top_p_config(q_heads, kv_heads, 0.f));
  for (int32_t selector : {PQ_SELECTOR_PQ, PQ_SELECTOR_EXACT, PQ_SELECTOR_SPARQ}) {
    SCOPED_TRACE("selector " + std::to_string(selector));
    auto rows = [&](float p, float floor, float fraction) {
      pq_config c = top_p_config(q_heads, kv_heads, p, floor);
      c.selector = selector;
      c.topk_fraction = fraction;
      // SparQ's default reads one dimension of each key (head_dim / 128):
      // scores that flat spread the mass past any k.
      c.sparq_dims = 16;
      Ctx ctx = prefilled(c, m);
      return rows_of(select_all(ctx, 1, m.q, kv_heads), kv_heads);
    };
    const auto fixed = rows(0.f, 0.02f, 0.25f);
    EXPECT_EQ(rows(1.f, 0.02f, 0.25f), fixed);
    const auto half = rows(0.5f, 0.02f, 0.25f);
    EXPECT_NE(half, fixed) << "p = 0.5 kept every k";
    for (int32_t h = 0; h < kv_heads; ++h) {
      EXPECT_EQ(middle_of(rows(1e-6f, 0.f, 0.25f)[h], r).size(), 1u);
      EXPECT_EQ(static_cast<double>(middle_of(rows(1e-6f, 0.05f, 0.25f)[h], r).size()),
                std::ceil(static_cast<double>(0.05f) * static_cast<double>(r.middle)));
      // A floor above k: k.
      EXPECT_EQ(static_cast<int64_t>(middle_of(rows(1e-6f, 0.5f, 0.25f)[h], r).size()), r.k);
      const auto whole = middle_of(rows(0.5f, 0.02f, 1.f)[h], r);
      EXPECT_LT(static_cast<int64_t>(whole.size()), r.middle);
      // The same p under a wider ceiling takes at least as many.
      EXPECT_GE(whole.size(), middle_of(half[h], r).size());
    }
  }
}

// The other selections of the same choice: the batch, a speculation (and
// its hint), a fork and a restore select what one pq_decode_select does.
TEST(TopPState, BatchSpeculationForkAndRestoreSelectTheSame) {
  const int32_t kv_heads = 2, q_heads = 8;
  Model m(700, q_heads, kv_heads, 9);
  const pq_config c = top_p_config(q_heads, kv_heads, 0.5f);
  Ctx ctx = prefilled(c, m);
  ASSERT_TRUE(ctx.ok());
  const auto want = rows_of(select_all(ctx, 1, m.q, kv_heads), kv_heads);

  PQ_ASSERT_OK(pq_sequence_fork(ctx, 1, 2));
  EXPECT_EQ(rows_of(select_all(ctx, 2, m.q, kv_heads), kv_heads), want);

  const int64_t cap = selection_capacity(ctx, 1, 0);
  Sel a(kv_heads, cap), b(kv_heads, cap);
  pq_select_item items[2] = {{1, *m.q.get(), *a.get(), PQ_ERR_INTERNAL},
                             {2, *m.q.get(), *b.get(), PQ_ERR_INTERNAL}};
  PQ_ASSERT_OK(pq_decode_select_batch(ctx, 0, items, 2));
  EXPECT_EQ(items[0].status, PQ_OK);
  EXPECT_EQ(rows_of(a, kv_heads), want);
  EXPECT_EQ(rows_of(b, kv_heads), want);

  Sel spec(kv_heads, cap);
  PQ_ASSERT_OK(pq_decode_speculate(ctx, 1, 0, m.q.get(), spec.get()));
  EXPECT_EQ(rows_of(spec, kv_heads), want);
  EXPECT_EQ(rows_of(select_all(ctx, 1, m.q, kv_heads), kv_heads), want);

  const std::vector<uint8_t> saved = saved_sequence(ctx, 1);
  Ctx restored(c);
  PQ_ASSERT_OK(pq_sequence_restore(restored, 7, saved.data(), saved.size()));
  EXPECT_EQ(rows_of(select_all(restored, 7, m.q, kv_heads), kv_heads), want);
}

// The tail estimate covers what top-p leaves: an attend over a top-p
// selection with the estimate is pq_decode_tail merged by log-sum-exp with
// exact attention over the selected rows (pq_decode_attend without it).
TEST(TopPTail, AttendWithTheEstimateMergesTheTailOfATopPSelection) {
  const int32_t kv_heads = 2, q_heads = 8;
  Model m(700, q_heads, kv_heads, 13);
  pq_config c = top_p_config(q_heads, kv_heads, 0.5f);
  c.tail_estimate = PQ_TAIL_CODE_MEANS;
  pq_config plain_config = c;
  plain_config.tail_estimate = PQ_TAIL_NONE;
  Ctx ctx = prefilled(c, m), plain = prefilled(plain_config, m);
  ASSERT_TRUE(ctx.ok() && plain.ok());
  Sel sel = select_all(ctx, 1, m.q, kv_heads);
  EXPECT_EQ(rows_of(sel, kv_heads), rows_of(select_all(plain, 1, m.q, kv_heads), kv_heads));
  const size_t out_n = static_cast<size_t>(q_heads) * kDim;
  std::vector<float> got(out_n), exact(out_n), tail(out_n), lse_got(q_heads), lse_exact(q_heads),
      lse_tail(q_heads);
  PQ_ASSERT_OK(pq_decode_attend(ctx, 1, 0, m.q.get(), sel.get(), 0.f, got.data(), lse_got.data()));
  PQ_ASSERT_OK(
      pq_decode_attend(plain, 1, 0, m.q.get(), sel.get(), 0.f, exact.data(), lse_exact.data()));
  PQ_ASSERT_OK(pq_decode_tail(ctx, 1, 0, m.q.get(), sel.get(), 0.f, tail.data(), lse_tail.data()));
  for (int32_t g = 0; g < q_heads; ++g) {
    // The tail is not empty: top-p left out most of the middle.
    ASSERT_TRUE(std::isfinite(lse_tail[g])) << "query head " << g;
    const double top = std::max(lse_exact[g], lse_tail[g]);
    const double wa = std::exp(lse_exact[g] - top), wt = std::exp(lse_tail[g] - top);
    EXPECT_NEAR(lse_got[g], top + std::log(wa + wt), 1e-4) << "query head " << g;
    for (int32_t d = 0; d < kDim; ++d) {
      const size_t i = static_cast<size_t>(g) * kDim + d;
      EXPECT_NEAR(got[i], (wa * exact[i] + wt * tail[i]) / (wa + wt), 1e-4) << "query head " << g;
    }
  }
}

TEST(TopPConfig, NamedErrors) {
  pq_context* ctx = nullptr;
  auto expect_invalid = [&](const pq_config& c, const char* also) {
    EXPECT_TRUE(IsError(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, {"top_p"})) << also;
    EXPECT_TRUE(contains_ci(pq_last_error(), also)) << pq_last_error();
  };
  pq_config c = top_p_config(8, 2, 0.5f);
  c.selector = PQ_SELECTOR_H2O;
  expect_invalid(c, "PQ_SELECTOR_H2O");
  c = top_p_config(8, 2, 0.5f);
  c.gqa_combine = PQ_GQA_MAX;
  expect_invalid(c, "PQ_GQA_MAX");
  c = top_p_config(8, 2, 0.5f);
  c.pq_rerank = 1.f;
  expect_invalid(c, "pq_rerank");
  for (float bad : {1.5f, -0.1f, std::nanf("")}) {
    c = top_p_config(8, 2, bad);
    expect_invalid(c, "top_p");
  }
  for (float bad : {1.5f, -0.1f, std::nanf("")}) {
    c = top_p_config(8, 2, 0.5f, bad);
    expect_invalid(c, "top_p_floor");
  }
  EXPECT_EQ(ctx, nullptr);
  // Off, the other fields are not read together with it.
  c = top_p_config(8, 2, 0.f);
  c.selector = PQ_SELECTOR_H2O;
  Ctx off(c);
  EXPECT_TRUE(off.ok()) << pq_last_error();
  pq_config d;
  pq_config_default(&d);
  EXPECT_EQ(d.top_p, 0.f);
  EXPECT_EQ(d.top_p_floor, 0.02f);
}

}  // namespace
