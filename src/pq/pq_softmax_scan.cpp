// pq_softmax_shares and pq_scan_sum_softmax (pq_softmax_scan.h): the
// numerators and the lanes of their normalisers straight from the codes
// through a table of exps (PqCodebook::pq_products_summed, per kernel
// level); then, for the second, the combined scores.
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

// The largest of l[0..count): eight running maxima, which the compiler
// keeps in one vector (std::max_element's single chain waited on each
// comparison: a quarter of this file's time at 128K). A maximum is exact,
// so the grouping does not change it.
float largest(const float* l, int32_t count) {
  constexpr int kLanes = 8;
  float lanes[kLanes];
  for (int i = 0; i < kLanes; ++i) lanes[i] = l[0];
  int32_t c = 0;
  for (; c + kLanes <= count; c += kLanes)
    for (int i = 0; i < kLanes; ++i) lanes[i] = std::max(lanes[i], l[c + i]);
  for (; c < count; ++c) lanes[0] = std::max(lanes[0], l[c]);
  return *std::max_element(lanes, lanes + kLanes);
}

}  // namespace

bool pq_softmax_shares(const PqCodebook& codebook, const float* lut, int32_t group,
                       const CodeColumn& codes, int64_t begin, int64_t end, float scale,
                       WeightedRows* shares, SelectScratch& scratch, double* log_normalisers) {
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
    const float shift = largest(l, centroids) * scale;
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
  *shares = WeightedRows{e.data(), group, n, inv};
  return true;
}

bool pq_scan_sum_softmax(const PqCodebook& codebook, const float* lut, int32_t group,
                         const CodeColumn& codes, int64_t begin, int64_t end, float scale,
                         float* combined, SelectScratch& scratch, double* log_normalisers) {
  WeightedRows shares{};
  if (!pq_softmax_shares(codebook, lut, group, codes, begin, end, scale, &shares, scratch,
                         log_normalisers))
    return false;
  weighted_rows_sum(shares, combined);
  return true;
}

}  // namespace pq
