// pq_scan_sum_softmax (pq_softmax_scan.h): the numerators and the lanes of
// their normalisers straight from the codes through a table of exps
// (PqCodebook::pq_products_summed, per kernel level), then the combined
// scores.
#include "pq/pq_softmax_scan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/cpu_dispatch.h"
#include "base/fast_exp.h"
#include "base/flush_subnormals.h"

#include "base/x86_intrinsics.h"

namespace pq {

namespace {

// Tokens added per block in the last pass.
constexpr int64_t kBlockTokens = 4096;

// out[c] = exp(l[c] x scale - top) for one row of the table of exps; the
// loop the compiler vectorises at each level (the same operations, so the
// same bits).
PQ_ALWAYS_INLINE void exp_row_body(const float* __restrict l, int32_t count, float scale,
                                   float top, float* __restrict out) {
  PQ_FP_CONTRACT_OFF
  for (int32_t c = 0; c < count; ++c) out[c] = exp_nonpositive(l[c] * scale - top);
}
void exp_row_portable(const float* l, int32_t count, float scale, float top, float* out) {
  exp_row_body(l, count, scale, top, out);
}
#if PQ_X86_KERNELS
PQ_TARGET_AVX2 void exp_row_avx2(const float* l, int32_t count, float scale, float top,
                                 float* out) {
  exp_row_body(l, count, scale, top, out);
}
PQ_TARGET_AVX512 void exp_row_avx512(const float* l, int32_t count, float scale, float top,
                                     float* out) {
  exp_row_body(l, count, scale, top, out);
}
#endif

void exp_row(const float* l, int32_t count, float scale, float top, float* out) {
#if PQ_X86_KERNELS
  static const auto fn = cpu_level() >= CpuLevel::kAvx512 ? exp_row_avx512
                         : cpu_level() >= CpuLevel::kAvx2 ? exp_row_avx2
                                                          : exp_row_portable;
#else
  static const auto fn = exp_row_portable;
#endif
  fn(l, count, scale, top, out);
}

// combined[i] = e_0[i] x inv[0] + e_1[i] x inv[1] + ..., left to right (the
// first term alone: the numerators are not negative, so 0 + x is x), a
// block of tokens at a time; compiled per level like exp_row (one product
// and one sum per element, so the same bits).
PQ_ALWAYS_INLINE void add_shares_body(const float* __restrict e, int64_t n, int32_t group,
                                      const float* __restrict inv, float* __restrict combined) {
  PQ_FP_CONTRACT_OFF
  for (int64_t at = 0; at < n; at += kBlockTokens) {
    const int64_t b = std::min(kBlockTokens, n - at);
    float* __restrict out = combined + at;
    const float* __restrict e0 = e + at;
    const float w0 = inv[0];
    for (int64_t i = 0; i < b; ++i) out[i] = e0[i] * w0;
    for (int32_t g = 1; g < group; ++g) {
      const float* __restrict eg = e + g * n + at;
      const float w = inv[g];
      for (int64_t i = 0; i < b; ++i) out[i] += eg[i] * w;
    }
  }
}
void add_shares_portable(const float* e, int64_t n, int32_t group, const float* inv,
                         float* combined) {
  add_shares_body(e, n, group, inv, combined);
}
#if PQ_X86_KERNELS
PQ_TARGET_AVX2 void add_shares_avx2(const float* e, int64_t n, int32_t group, const float* inv,
                                    float* combined) {
  add_shares_body(e, n, group, inv, combined);
}
PQ_TARGET_AVX512 void add_shares_avx512(const float* e, int64_t n, int32_t group,
                                        const float* inv, float* combined) {
  add_shares_body(e, n, group, inv, combined);
}
#endif

void add_shares(const float* e, int64_t n, int32_t group, const float* inv, float* combined) {
#if PQ_X86_KERNELS
  static const auto fn = cpu_level() >= CpuLevel::kAvx512 ? add_shares_avx512
                         : cpu_level() >= CpuLevel::kAvx2 ? add_shares_avx2
                                                          : add_shares_portable;
#else
  static const auto fn = add_shares_portable;
#endif
  fn(e, n, group, inv, combined);
}

}  // namespace

bool pq_scan_sum_softmax(const PqCodebook& codebook, const float* lut, int32_t group,
                         const CodeColumn& codes, int64_t begin, int64_t end, float scale,
                         float* combined, SelectScratch& scratch, double* log_normalisers) {
  PQ_FP_CONTRACT_OFF
  const int64_t n = end - begin;
  if (n <= 0) return false;
  const int32_t m = codebook.subspaces, centroids = codebook.centroids;
  const int64_t whole = n - n % kProductLanes;
  const size_t per_query = static_cast<size_t>(m) * centroids;

  // table[g][j][c] = exp(lut[g][j][c] x scale - top x scale), top the row's
  // largest entry: every factor in (0, 1].
  std::vector<float>& table = scratch.exp_tmp;
  table.resize(per_query * group);
  for (size_t row = 0; row < per_query * group / centroids; ++row) {
    const float* l = lut + row * centroids;
    const float shift = *std::max_element(l, l + centroids) * scale;
    exp_row(l, centroids, scale, shift, table.data() + row * centroids);
    // A head's shift is the sum of its rows' (log_normalisers' first term).
    if (log_normalisers != nullptr) {
      const size_t g = row / static_cast<size_t>(m);
      log_normalisers[g] = (row % static_cast<size_t>(m) == 0 ? 0.0 : log_normalisers[g]) + shift;
    }
  }

  std::vector<float>& e = scratch.raw;  // [group][n] numerators
  e.resize(static_cast<size_t>(group) * n);
  // Per query head: kProductLanes lanes, the largest numerator, 1 / sum.
  std::vector<float>& sums = scratch.head_sums;
  sums.assign(static_cast<size_t>(group) * (kProductLanes + 2), 0.f);
  float* lanes = sums.data();
  float* tops = lanes + group * kProductLanes;
  float* inv = tops + group;
  {
    FlushSubnormals flush;
    codes.for_each_run(begin, end, [&](int64_t first, int64_t count, const uint8_t* p) {
      PqCodebook::pq_products_summed(table.data(), group, m, centroids, p, count,
                                     e.data() + (first - begin), n,
                                     {first - begin, whole, lanes, tops});
    });
  }

  const float min_top = std::exp(-kMaxShiftSlack);
  for (int32_t g = 0; g < group; ++g) {
    if (!(tops[g] >= min_top)) return false;  // the shift too far above the top logit
    const float* eg = e.data() + g * n;
    float sum = 0.f;
    for (int l = 0; l < kProductLanes; ++l) sum += lanes[g * kProductLanes + l];
    for (int64_t i = whole; i < n; ++i) sum += eg[i];
    if (!std::isfinite(sum)) return false;
    inv[g] = 1.0f / sum;
    if (log_normalisers != nullptr) log_normalisers[g] += std::log(static_cast<double>(sum));
  }
  add_shares(e.data(), n, group, inv, combined);
  return true;
}

}  // namespace pq
