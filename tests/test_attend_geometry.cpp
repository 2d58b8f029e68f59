// pq_decode_attend across the shapes its kernels take different paths for:
// the AVX2 kernel (head_dim a multiple of 8, groups 1-8; two rows or one
// per step, strips of 16 or 8 values), the portable kernel (other head
// dims, groups above 8), selections large enough to run on the pool, a
// kv head cut into parts merged through the log-sum-exp (one kv head, more
// threads), positions unsorted and repeated. Each against an attention in
// double over the caller's own K/V.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "api_test_util.h"

namespace {

using namespace pqt;

struct Geometry {
  const char* name;
  int32_t q_heads, kv_heads, head_dim, dtype, worker_threads;
  int64_t tokens, selected;  // selected rows per kv head
  bool unsorted_with_repeats;
};

void PrintTo(const Geometry& g, std::ostream* os) { *os << g.name; }

class AttendGeometry : public ::testing::TestWithParam<Geometry> {};

TEST_P(AttendGeometry, MatchesAttentionInDouble) {
  const Geometry g = GetParam();
  const int32_t group = g.q_heads / g.kv_heads, d = g.head_dim;
  pq_config c = make_config(1, g.q_heads, g.kv_heads, d, g.dtype);
  c.selector = PQ_SELECTOR_WINDOW;  // no index: the test chooses the rows
  c.worker_threads = g.worker_threads;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  const size_t n = static_cast<size_t>(g.tokens) * g.kv_heads * d;
  std::vector<float> keys = random_normal(n, 11, 1.5f), values = random_normal(n, 12);
  for (float& f : keys) f = round_to_dtype(f, g.dtype);
  for (float& f : values) f = round_to_dtype(f, g.dtype);
  HostTensor k = make_tensor(keys, g.tokens, g.kv_heads, d, g.dtype);
  HostTensor v = make_tensor(values, g.tokens, g.kv_heads, d, g.dtype);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, k.get(), v.get()));
  std::vector<float> query = random_normal(static_cast<size_t>(g.q_heads) * d, 13, 0.4f);
  for (float& f : query) f = round_to_dtype(f, g.dtype);
  HostTensor q = make_tensor(query, 1, g.q_heads, d, g.dtype);

  Sel sel(g.kv_heads, g.selected);
  std::mt19937 rng(17);
  for (int32_t h = 0; h < g.kv_heads; ++h) {
    // Ascending and spread over the whole store, as selectors return them;
    // or shuffled with repeats, which the API accepts as well.
    sel.counts[h] = static_cast<int32_t>(g.selected - h);  // heads differ in length
    for (int64_t i = 0; i < sel.counts[h]; ++i)
      sel.positions[h * g.selected + i] = static_cast<int32_t>(i * g.tokens / g.selected);
    if (g.unsorted_with_repeats) {
      int32_t* row = &sel.positions[h * g.selected];
      std::shuffle(row, row + sel.counts[h], rng);
      for (int64_t i = 0; i + 7 < sel.counts[h]; i += 7) row[i] = row[i + 3];
    }
  }
  std::vector<float> out(static_cast<size_t>(g.q_heads) * d, -3.f), lse(g.q_heads, -3.f);
  PQ_ASSERT_OK(pq_decode_attend(ctx, 1, 0, q.get(), sel.get(), 0.f, out.data(), lse.data()));

  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  double max_rel = 0;
  for (int32_t qh = 0; qh < g.q_heads; ++qh) {
    const int32_t h = qh / group, count = sel.counts[h];
    std::vector<double> logits(static_cast<size_t>(count));
    double max = -std::numeric_limits<double>::infinity();
    for (int32_t i = 0; i < count; ++i) {
      const size_t row = (static_cast<size_t>(sel.positions[h * g.selected + i]) * g.kv_heads + h) * d;
      double s = 0;
      for (int32_t x = 0; x < d; ++x) s += static_cast<double>(query[qh * d + x]) * keys[row + x];
      logits[i] = s * scale;
      max = std::max(max, logits[i]);
    }
    double sum = 0;
    for (double& l : logits) sum += (l = std::exp(l - max));
    std::vector<double> want(static_cast<size_t>(d), 0.0);
    for (int32_t i = 0; i < count; ++i) {
      const size_t row = (static_cast<size_t>(sel.positions[h * g.selected + i]) * g.kv_heads + h) * d;
      for (int32_t x = 0; x < d; ++x) want[x] += logits[i] / sum * values[row + x];
    }
    // What pq_decode_attend documents for bf16 and fp8 K/V: the weights may
    // be rounded to bf16 in the value sum, moving each element by at most
    // 2^-8 x sum_i softmax_i |V_i[x]|; the excess over that is checked.
    const bool rounded = g.dtype == PQ_DTYPE_BF16 || g.dtype == PQ_DTYPE_FP8_E4M3 ||
                         g.dtype == PQ_DTYPE_FP8_E5M2;
    std::vector<double> spread(static_cast<size_t>(d), 0.0);
    for (int32_t i = 0; rounded && i < count; ++i) {
      const size_t row = (static_cast<size_t>(sel.positions[h * g.selected + i]) * g.kv_heads + h) * d;
      for (int32_t x = 0; x < d; ++x) spread[x] += logits[i] / sum * std::abs(values[row + x]);
    }
    double diff = 0, norm = 0;
    for (int32_t x = 0; x < d; ++x) {
      diff += std::pow(std::max(0.0, std::abs(out[qh * d + x] - want[x]) - std::ldexp(spread[x], -8)), 2);
      norm += want[x] * want[x];
    }
    max_rel = std::max(max_rel, std::sqrt(diff / norm));
    const double want_lse = max + std::log(sum);
    EXPECT_NEAR(lse[qh], want_lse, 1e-5 * std::max(1.0, std::abs(want_lse))) << "query head " << qh;
  }
  EXPECT_LT(max_rel, 1e-5);
  RecordProperty("max_relative_error", std::to_string(max_rel));
}

// Llama-3-8B's heads (group 4, head_dim 128) on the pool; one kv head of 64
// cut into parts (group 8); group 1, 2, 3, 5 and 7 with strips of 16 and 8;
// head_dim 20 and a group of 9 on the portable kernel.
INSTANTIATE_TEST_SUITE_P(
    Shapes, AttendGeometry,
    ::testing::Values(Geometry{"llama_f16", 32, 8, 128, PQ_DTYPE_F16, 2, 6000, 1200, false},
                      Geometry{"llama_bf16", 32, 8, 128, PQ_DTYPE_BF16, 2, 6000, 1200, false},
                      Geometry{"llama_f32_repeats", 32, 8, 128, PQ_DTYPE_F32, 2, 3000, 700, true},
                      Geometry{"mqa_parts_f16", 8, 1, 64, PQ_DTYPE_F16, 3, 12000, 9000, false},
                      Geometry{"mqa_parts_repeats", 8, 1, 64, PQ_DTYPE_F32, 3, 12000, 9000, true},
                      Geometry{"group1_d24", 4, 4, 24, PQ_DTYPE_F16, 1, 700, 333, false},
                      Geometry{"group2_d40", 6, 3, 40, PQ_DTYPE_BF16, 1, 700, 333, true},
                      Geometry{"group3_d8", 6, 2, 8, PQ_DTYPE_F32, 1, 700, 333, false},
                      Geometry{"group5_d48", 10, 2, 48, PQ_DTYPE_F16, 1, 700, 333, false},
                      Geometry{"group7_d16", 14, 2, 16, PQ_DTYPE_F16, 1, 700, 65, true},
                      Geometry{"portable_d20", 12, 2, 20, PQ_DTYPE_F16, 1, 700, 333, true},
                      Geometry{"portable_group9", 18, 2, 16, PQ_DTYPE_BF16, 1, 700, 333, false}),
    [](const ::testing::TestParamInfo<Geometry>& p) { return std::string(p.param.name); });

}  // namespace
