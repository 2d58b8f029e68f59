// pq_scan_sum_softmax (pq_softmax_scan.h): the numerators straight from
// the codes through a table of exps (PqCodebook::pq_products, per kernel
// level), then each head's normaliser in sixteen lanes, then the combined
// scores.
#include "pq/pq_softmax_scan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/cpu_dispatch.h"
#include "base/fast_exp.h"

#include "base/x86_intrinsics.h"

namespace pq {

namespace {

constexpr int kSumLanes = 16;
// Tokens added per block in the last pass.
constexpr int64_t kBlockTokens = 4096;

// lanes[l] = sum of e[i] over i < whole16 with i mod 16 == l, in order of
// i; *top = the largest e[i] there (0 if none).
PQ_ALWAYS_INLINE void lane_sums_body(const float* __restrict e, int64_t whole16,
                                     float* __restrict lanes, float* __restrict top) {
  float sum[kSumLanes] = {}, best[kSumLanes] = {};
  for (int64_t i = 0; i < whole16; i += kSumLanes)
    for (int l = 0; l < kSumLanes; ++l) {
      sum[l] += e[i + l];
      best[l] = best[l] > e[i + l] ? best[l] : e[i + l];
    }
  float t = 0.f;
  for (int l = 0; l < kSumLanes; ++l) {
    lanes[l] = sum[l];
    t = t > best[l] ? t : best[l];
  }
  *top = t;
}

void lane_sums_portable(const float* e, int64_t whole16, float* lanes, float* top) {
  lane_sums_body(e, whole16, lanes, top);
}
#if PQ_X86_KERNELS
// The same sums by hand: the compiler leaves the loop above scalar. One
// vector add is one round of the sixteen lanes; the max is exact in any order.
PQ_TARGET_AVX2 void lane_sums_avx2(const float* e, int64_t whole16, float* lanes, float* top) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  __m256 best = _mm256_setzero_ps();
  for (int64_t i = 0; i < whole16; i += kSumLanes) {
    const __m256 a = _mm256_loadu_ps(e + i), b = _mm256_loadu_ps(e + i + 8);
    lo = _mm256_add_ps(lo, a);
    hi = _mm256_add_ps(hi, b);
    best = _mm256_max_ps(best, _mm256_max_ps(a, b));
  }
  _mm256_storeu_ps(lanes, lo);
  _mm256_storeu_ps(lanes + 8, hi);
  float b8[8];
  _mm256_storeu_ps(b8, best);
  *top = *std::max_element(b8, b8 + 8);
}
PQ_TARGET_AVX512 void lane_sums_avx512(const float* e, int64_t whole16, float* lanes, float* top) {
  __m512 sum = _mm512_setzero_ps(), best = _mm512_setzero_ps();
  for (int64_t i = 0; i < whole16; i += kSumLanes) {
    const __m512 v = _mm512_loadu_ps(e + i);
    sum = _mm512_add_ps(sum, v);
    best = _mm512_max_ps(best, v);
  }
  _mm512_storeu_ps(lanes, sum);
  *top = _mm512_reduce_max_ps(best);
}
#endif

void lane_sums(const float* e, int64_t whole16, float* lanes, float* top) {
#if PQ_X86_KERNELS
  static const auto fn = cpu_level() >= CpuLevel::kAvx512 ? lane_sums_avx512
                         : cpu_level() >= CpuLevel::kAvx2 ? lane_sums_avx2
                                                          : lane_sums_portable;
#else
  static const auto fn = lane_sums_portable;
#endif
  fn(e, whole16, lanes, top);
}

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

// Products too small for a normal float become zero, not subnormals (which
// cost a microcode assist per multiply on some cores), at every kernel
// level alike: MXCSR's flush-to-zero and denormals-are-zero for the scope.
class FlushSubnormals {
 public:
#if PQ_X86_KERNELS
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushSubnormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

}  // namespace

bool pq_scan_sum_softmax(const PqCodebook& codebook, const float* lut, int32_t group,
                         const CodeColumn& codes, int64_t begin, int64_t end, float scale,
                         float* combined, SelectScratch& scratch) {
  PQ_FP_CONTRACT_OFF
  const int64_t n = end - begin;
  if (n <= 0) return false;
  const int32_t m = codebook.subspaces, centroids = codebook.centroids;
  const int64_t whole16 = n - n % kSumLanes;
  const size_t per_query = static_cast<size_t>(m) * centroids;

  // table[g][j][c] = exp(lut[g][j][c] x scale - top x scale), top the row's
  // largest entry: every factor in (0, 1].
  std::vector<float>& table = scratch.exp_tmp;
  table.resize(per_query * group);
  for (size_t row = 0; row < per_query * group / centroids; ++row) {
    const float* l = lut + row * centroids;
    exp_row(l, centroids, scale, *std::max_element(l, l + centroids) * scale,
            table.data() + row * centroids);
  }

  std::vector<float>& e = scratch.raw;  // [group][n] numerators
  e.resize(static_cast<size_t>(group) * n);
  {
    FlushSubnormals flush;
    codes.for_each_run(begin, end, [&](int64_t first, int64_t count, const uint8_t* p) {
      PqCodebook::pq_products(table.data(), group, m, centroids, p, count, e.data() + (first - begin),
                              n);
    });
  }

  const float min_top = std::exp(-kMaxShiftSlack);
  std::vector<float> inv(static_cast<size_t>(group));
  for (int32_t g = 0; g < group; ++g) {
    const float* eg = e.data() + g * n;
    float lanes[kSumLanes], top;
    lane_sums(eg, whole16, lanes, &top);
    for (int64_t i = whole16; i < n; ++i) top = std::max(top, eg[i]);
    if (!(top >= min_top)) return false;  // the shift too far above the top logit
    float sum = 0.f;
    for (int l = 0; l < kSumLanes; ++l) sum += lanes[l];
    for (int64_t i = whole16; i < n; ++i) sum += eg[i];
    if (!std::isfinite(sum)) return false;
    inv[g] = 1.0f / sum;
  }
  // Head 0's share (0 + x is x: the numerators are not negative), then the
  // others in order, a block of tokens at a time.
  for (int64_t at = 0; at < n; at += kBlockTokens) {
    const int64_t b = std::min(kBlockTokens, n - at);
    float* out = combined + at;
    const float* e0 = e.data() + at;
    for (int64_t i = 0; i < b; ++i) out[i] = e0[i] * inv[0];
    for (int32_t g = 1; g < group; ++g) {
      const float* eg = e.data() + g * n + at;
      const float w = inv[g];
      for (int64_t i = 0; i < b; ++i) out[i] += eg[i] * w;
    }
  }
  return true;
}

}  // namespace pq
