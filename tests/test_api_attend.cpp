// pq_decode_attend: the attention over a selection, read from the store,
// against the gathered K/V of pq_fetch_kv and an attention computed here in
// double; the log-sum-exp merges disjoint parts; errors change nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "api_test_util.h"

namespace {

using namespace pqt;

constexpr int32_t kQHeads = 8, kKvHeads = 2, kDim = 24, kGroup = kQHeads / kKvHeads;

// Attention of `query` (floats [q][d]) over rows 0..count-1 of the fetched
// tensors, in double: out[q][d] and lse[q].
void reference(const std::vector<float>& query, const HostTensor& k, const HostTensor& v,
               const Sel& sel, double scale, std::vector<double>* out, std::vector<double>* lse) {
  out->assign(kQHeads * kDim, 0.0);
  lse->assign(kQHeads, -std::numeric_limits<double>::infinity());
  const int32_t dtype = k.t.dtype;
  auto value = [&](const HostTensor& t, int64_t row, int32_t h, int32_t d) {
    const unsigned char* p = t.row(row, h) + static_cast<size_t>(d) * elem_size(dtype);
    if (dtype == PQ_DTYPE_F32) {
      float f;
      std::memcpy(&f, p, 4);
      return static_cast<double>(f);
    }
    uint16_t u;
    std::memcpy(&u, p, 2);
    return static_cast<double>(dtype == PQ_DTYPE_F16 ? half_to_float(u) : bf16_to_float(u));
  };
  for (int32_t q = 0; q < kQHeads; ++q) {
    const int32_t h = q / kGroup;
    const int32_t n = sel.counts[h];
    if (n == 0) continue;
    std::vector<double> logits(n);
    double max = -std::numeric_limits<double>::infinity();
    for (int32_t i = 0; i < n; ++i) {
      double s = 0;
      for (int32_t d = 0; d < kDim; ++d) s += query[q * kDim + d] * value(k, i, h, d);
      logits[i] = s * scale;
      max = std::max(max, logits[i]);
    }
    double sum = 0;
    for (double& l : logits) sum += (l = std::exp(l - max));
    for (int32_t i = 0; i < n; ++i)
      for (int32_t d = 0; d < kDim; ++d)
        (*out)[q * kDim + d] += logits[i] / sum * value(v, i, h, d);
    (*lse)[q] = max + std::log(sum);
  }
}

class ApiAttend : public ::testing::TestWithParam<int32_t> {
 protected:
  void SetUp() override {
    dtype_ = GetParam();
    pq_config c = make_config(1, kQHeads, kKvHeads, kDim, dtype_);
    c.selector = PQ_SELECTOR_EXACT;
    c.sink_tokens = 4;
    c.local_tokens = 16;
    c.topk_fraction = 0.2f;
    ctx_ = Ctx(c);
    ASSERT_TRUE(ctx_.ok()) << pq_last_error();
    PQ_ASSERT_OK(pq_sequence_add(ctx_, 1));
    keys_ = make_tensor(random_normal(kTokens * kKvHeads * kDim, 1, 2.f), kTokens, kKvHeads, kDim,
                        dtype_);
    values_ = make_tensor(random_normal(kTokens * kKvHeads * kDim, 2), kTokens, kKvHeads, kDim,
                          dtype_);
    PQ_ASSERT_OK(pq_prefill_layer(ctx_, 1, 0, keys_.get(), values_.get()));
    query_f_ = random_normal(kQHeads * kDim, 3, 0.5f);
    for (float& f : query_f_) f = round_to_dtype(f, dtype_);
    query_ = make_tensor(query_f_, 1, kQHeads, kDim, dtype_);
  }

  static constexpr int64_t kTokens = 5000;
  int32_t dtype_ = PQ_DTYPE_F32;
  Ctx ctx_;
  HostTensor keys_, values_, query_;
  std::vector<float> query_f_;
};

TEST_P(ApiAttend, MatchesGatherThenAttentionInDouble) {
  const int64_t cap = selection_capacity(ctx_, 1, 0);
  Sel sel(kKvHeads, cap);
  PQ_ASSERT_OK(pq_decode_select(ctx_, 1, 0, query_.get(), sel.get()));
  HostTensor k = make_tensor(nullptr, cap, kKvHeads, kDim, dtype_);
  HostTensor v = make_tensor(nullptr, cap, kKvHeads, kDim, dtype_);
  PQ_ASSERT_OK(pq_fetch_kv(ctx_, 1, 0, sel.get(), k.get(), v.get()));
  for (float scale : {0.f, 0.05f}) {
    std::vector<float> out(kQHeads * kDim, -1.f), lse(kQHeads, -1.f);
    PQ_ASSERT_OK(pq_decode_attend(ctx_, 1, 0, query_.get(), sel.get(), scale, out.data(),
                                  lse.data()));
    std::vector<double> want, want_lse;
    reference(query_f_, k, v, sel, scale == 0.f ? 1.0 / std::sqrt(double{kDim}) : scale, &want,
              &want_lse);
    // Relative to each query head's output vector (elementwise relative
    // error is meaningless where a weighted mean cancels to near zero).
    double max_rel = 0;
    for (int32_t q = 0; q < kQHeads; ++q) {
      double diff = 0, norm = 0;
      for (int32_t d = 0; d < kDim; ++d) {
        diff += std::pow(out[q * kDim + d] - want[q * kDim + d], 2);
        norm += std::pow(want[q * kDim + d], 2);
      }
      max_rel = std::max(max_rel, std::sqrt(diff / norm));
    }
    EXPECT_LT(max_rel, 1e-5) << "scale " << scale;
    RecordProperty("max_relative_error", std::to_string(max_rel));
    for (int32_t q = 0; q < kQHeads; ++q)
      EXPECT_NEAR(lse[q], want_lse[q], 1e-5 * std::max(1.0, std::abs(want_lse[q])));
  }
}

// Attention over a set split in two parts, merged with the log-sum-exp,
// equals the attention over the whole set; a kv head with nothing selected
// gives zeros and -inf; NULL out_lse is fine.
TEST_P(ApiAttend, PartsMergeThroughTheLogSumExp) {
  Sel all(kKvHeads, 300), first(kKvHeads, 300), second(kKvHeads, 300);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    all.counts[h] = 300;
    first.counts[h] = 120;
    second.counts[h] = 180;
    for (int32_t i = 0; i < 300; ++i) {
      const int32_t p = (i * 17 + h * 5) % kTokens;
      all.positions[h * 300 + i] = p;
      (i < 120 ? first.positions[h * 300 + i] : second.positions[h * 300 + i - 120]) = p;
    }
  }
  std::vector<float> o_all(kQHeads * kDim), o1(o_all.size()), o2(o_all.size());
  std::vector<float> l_all(kQHeads), l1(kQHeads), l2(kQHeads);
  PQ_ASSERT_OK(pq_decode_attend(ctx_, 1, 0, query_.get(), all.get(), 0.f, o_all.data(), l_all.data()));
  PQ_ASSERT_OK(pq_decode_attend(ctx_, 1, 0, query_.get(), first.get(), 0.f, o1.data(), l1.data()));
  PQ_ASSERT_OK(pq_decode_attend(ctx_, 1, 0, query_.get(), second.get(), 0.f, o2.data(), l2.data()));
  for (int32_t q = 0; q < kQHeads; ++q) {
    const double m = std::max(l1[q], l2[q]);
    const double w1 = std::exp(l1[q] - m), w2 = std::exp(l2[q] - m);
    EXPECT_NEAR(m + std::log(w1 + w2), l_all[q], 1e-4);
    for (int32_t d = 0; d < kDim; ++d)
      EXPECT_NEAR((w1 * o1[q * kDim + d] + w2 * o2[q * kDim + d]) / (w1 + w2), o_all[q * kDim + d],
                  1e-5);
  }
  Sel none(kKvHeads, 4);
  none.counts[0] = 0;
  none.counts[1] = 1;
  none.positions[4] = 7;
  std::vector<float> out(kQHeads * kDim, 5.f), lse(kQHeads, 5.f);
  PQ_ASSERT_OK(pq_decode_attend(ctx_, 1, 0, query_.get(), none.get(), 0.f, out.data(), lse.data()));
  for (int32_t q = 0; q < kGroup; ++q) {
    EXPECT_EQ(lse[q], -std::numeric_limits<float>::infinity());
    for (int32_t d = 0; d < kDim; ++d) EXPECT_EQ(out[q * kDim + d], 0.f);
  }
  // One token: the output is its value row, the lse its logit.
  EXPECT_TRUE(std::isfinite(lse[kGroup]));
  PQ_EXPECT_OK(pq_decode_attend(ctx_, 1, 0, query_.get(), none.get(), 0.f, out.data(), nullptr));
}

TEST_P(ApiAttend, ErrorsNameTheArgumentAndWriteNothing) {
  Sel sel(kKvHeads, 4);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    sel.counts[h] = 2;
    sel.positions[h * 4] = 0;
    sel.positions[h * 4 + 1] = 1;
  }
  std::vector<float> out(kQHeads * kDim, 9.f), lse(kQHeads, 9.f);
  auto untouched = [&] {
    for (float f : out) ASSERT_EQ(f, 9.f);
    for (float f : lse) ASSERT_EQ(f, 9.f);
  };
  PQ_EXPECT_ERR(pq_decode_attend(ctx_, 1, 0, query_.get(), sel.get(), -1.f, out.data(), lse.data()),
                PQ_ERR_INVALID_ARGUMENT, "scale");
  PQ_EXPECT_ERR(pq_decode_attend(ctx_, 1, 0, query_.get(), sel.get(), NAN, out.data(), lse.data()),
                PQ_ERR_INVALID_ARGUMENT, "scale");
  PQ_EXPECT_ERR(pq_decode_attend(ctx_, 1, 0, query_.get(), sel.get(), 0.f, nullptr, lse.data()),
                PQ_ERR_INVALID_ARGUMENT, "out");
  PQ_EXPECT_ERR(pq_decode_attend(ctx_, 1, 0, nullptr, sel.get(), 0.f, out.data(), lse.data()),
                PQ_ERR_INVALID_ARGUMENT, "query");
  PQ_EXPECT_ERR(pq_decode_attend(ctx_, 1, 0, query_.get(), nullptr, 0.f, out.data(), lse.data()),
                PQ_ERR_INVALID_ARGUMENT, "selection");
  PQ_EXPECT_ERR(pq_decode_attend(ctx_, 1, 1, query_.get(), sel.get(), 0.f, out.data(), lse.data()),
                PQ_ERR_INVALID_ARGUMENT, "layer");
  PQ_EXPECT_ERR(pq_decode_attend(ctx_, 9, 0, query_.get(), sel.get(), 0.f, out.data(), lse.data()),
                PQ_ERR_NOT_FOUND, "seq_id");
  sel.positions[1] = static_cast<int32_t>(kTokens);
  PQ_EXPECT_ERR(pq_decode_attend(ctx_, 1, 0, query_.get(), sel.get(), 0.f, out.data(), lse.data()),
                PQ_ERR_INVALID_ARGUMENT, "positions");
  sel.positions[1] = 1;
  std::vector<float> nan_q = query_f_;
  nan_q[5] = NAN;
  HostTensor bad = make_tensor(nan_q, 1, kQHeads, kDim, dtype_);
  PQ_EXPECT_ERR(pq_decode_attend(ctx_, 1, 0, bad.get(), sel.get(), 0.f, out.data(), lse.data()),
                PQ_ERR_INVALID_ARGUMENT, "query");
  PQ_ASSERT_OK(pq_sequence_add(ctx_, 2));
  PQ_EXPECT_ERR(pq_decode_attend(ctx_, 2, 0, query_.get(), sel.get(), 0.f, out.data(), lse.data()),
                PQ_ERR_BAD_STATE, "pq_prefill_layer");
  untouched();
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ApiAttend,
                         ::testing::Values(PQ_DTYPE_F32, PQ_DTYPE_F16, PQ_DTYPE_BF16),
                         [](const ::testing::TestParamInfo<int32_t>& p) {
                           return std::string(p.param == PQ_DTYPE_F32   ? "f32"
                                              : p.param == PQ_DTYPE_F16 ? "f16"
                                                                        : "bf16");
                         });

}  // namespace
