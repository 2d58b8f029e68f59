#include "base/topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/cpu_dispatch.h"
#include "base/fast_exp.h"
#include "pqcache.h"

#include "base/x86_intrinsics.h"

namespace pq {

namespace {

// Float reductions do not vectorise without -ffast-math (the order of the
// additions would change), so they are written with eight explicit lanes.
constexpr int kLanes = 8;

// The largest of raw[0, n), in eight lanes.
PQ_ALWAYS_INLINE float max_of(const float* __restrict raw, int64_t n) {
  const int64_t whole = n - n % kLanes;
  float lane_max[kLanes];
  for (int l = 0; l < kLanes; ++l) lane_max[l] = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane_max[l] = std::max(lane_max[l], raw[i + l]);
  float max_raw = -std::numeric_limits<float>::infinity();
  for (int l = 0; l < kLanes; ++l) max_raw = std::max(max_raw, lane_max[l]);
  for (int64_t i = whole; i < n; ++i) max_raw = std::max(max_raw, raw[i]);
  return max_raw;
}

// out[i] += exp(logit[i] * scale - max) / sum, for one query head.
PQ_ALWAYS_INLINE void accumulate_softmax_body(const float* __restrict raw, int64_t n, float scale,
                                             float* __restrict tmp, float* __restrict out) {
  PQ_FP_CONTRACT_OFF
  const int64_t whole = n - n % kLanes;
  const float max_raw = max_of(raw, n);
  const float max_logit = max_raw * scale;  // scale > 0 keeps the argmax

  // Fixed eight-lane blocks: the form GCC vectorises reliably here.
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int l = 0; l < kLanes; ++l) tmp[i + l] = exp_nonpositive(raw[i + l] * scale - max_logit);
  for (int64_t i = whole; i < n; ++i) tmp[i] = exp_nonpositive(raw[i] * scale - max_logit);

  float lane_sum[kLanes] = {};
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane_sum[l] += tmp[i + l];
  float sum = 0.f;
  for (int l = 0; l < kLanes; ++l) sum += lane_sum[l];
  for (int64_t i = whole; i < n; ++i) sum += tmp[i];

  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) out[i] += tmp[i] * inv;
}

PQ_TARGET_AVX2 void accumulate_softmax_avx2(const float* __restrict raw, int64_t n, float scale,
                                            float* __restrict tmp, float* __restrict out) {
  accumulate_softmax_body(raw, n, scale, tmp, out);
}
void accumulate_softmax_portable(const float* __restrict raw, int64_t n, float scale,
                                 float* __restrict tmp, float* __restrict out) {
  accumulate_softmax_body(raw, n, scale, tmp, out);
}

#if PQ_X86_KERNELS
// The AVX-512 level: the body above by hand at sixteen lanes. The max is
// exact in any order (max_ps(raw, lane) keeps the lane on a NaN, as
// std::max(lane, raw) does); the numerators go to the same eight lane sums
// in the same order (a vector's low half is block i, its high half block
// i + 8), so the result has the portable build's bits.
PQ_TARGET_AVX512 void accumulate_softmax_avx512(const float* __restrict raw, int64_t n,
                                                float scale, float* __restrict tmp,
                                                float* __restrict out) {
  const int64_t whole16 = n - n % 16;
  const int64_t whole8 = n - n % kLanes;
  __m512 lane_max = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < whole16; i += 16) lane_max = _mm512_max_ps(_mm512_loadu_ps(raw + i), lane_max);
  float max_raw = _mm512_reduce_max_ps(lane_max);
  for (int64_t i = whole16; i < n; ++i) max_raw = std::max(max_raw, raw[i]);
  const float max_logit = max_raw * scale;
  const __m512 vscale = _mm512_set1_ps(scale), vmax = _mm512_set1_ps(max_logit);
  __m256 lane_sum = _mm256_setzero_ps();
  for (int64_t i = 0; i < whole8; i += 16) {
    const __mmask16 valid = i + 16 <= whole8 ? static_cast<__mmask16>(0xffff) : 0xff;
    const __m512 e = exp_nonpositive16(
        _mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(valid, raw + i), vscale), vmax));
    _mm512_mask_storeu_ps(tmp + i, valid, e);
    lane_sum = _mm256_add_ps(lane_sum, _mm512_castps512_ps256(e));
    if (valid == 0xffff) lane_sum = _mm256_add_ps(lane_sum, _mm512_extractf32x8_ps(e, 1));
  }
  for (int64_t i = whole8; i < n; ++i) tmp[i] = exp_nonpositive(raw[i] * scale - max_logit);
  float lanes[kLanes];
  _mm256_storeu_ps(lanes, lane_sum);
  float sum = 0.f;
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
  for (int64_t i = whole8; i < n; ++i) sum += tmp[i];
  const float inv = 1.0f / sum;
  const __m512 vinv = _mm512_set1_ps(inv);
  for (int64_t i = 0; i < whole16; i += 16)
    _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(out + i),
                                            _mm512_mul_ps(_mm512_loadu_ps(tmp + i), vinv)));
  for (int64_t i = whole16; i < n; ++i) out[i] += tmp[i] * inv;
}
#endif

void accumulate_softmax(const float* raw, int64_t n, float scale, float* tmp, float* out) {
#if PQ_X86_KERNELS
  static const auto impl = cpu_level() >= CpuLevel::kAvx512 ? accumulate_softmax_avx512
                           : cpu_has_avx2()                  ? accumulate_softmax_avx2
                                                             : accumulate_softmax_portable;
#else
  static const auto impl = accumulate_softmax_portable;
#endif
  impl(raw, n, scale, tmp, out);
}

// accumulate_softmax for the tuple path: entry i stands for counts[i]
// tokens, so the normaliser is sum_i counts[i] * exp(logit[i] - max), summed
// in double in eight lanes (the form that vectorises; it was a scalar loop
// over libm-free exps and took 39% of a selection at 8K tokens).
PQ_ALWAYS_INLINE void accumulate_softmax_weighted_body(const float* __restrict raw,
                                                      const uint32_t* __restrict counts, int64_t n,
                                                      float scale, float* __restrict tmp,
                                                      float* __restrict out) {
  PQ_FP_CONTRACT_OFF
  const int64_t whole = n - n % kLanes;
  const float max_raw = max_of(raw, n);
  const float max_logit = max_raw * scale;

  for (int64_t i = 0; i < whole; i += kLanes)
    for (int l = 0; l < kLanes; ++l) tmp[i + l] = exp_nonpositive(raw[i + l] * scale - max_logit);
  for (int64_t i = whole; i < n; ++i) tmp[i] = exp_nonpositive(raw[i] * scale - max_logit);

  double lane_sum[kLanes] = {};
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int l = 0; l < kLanes; ++l)
      lane_sum[l] += static_cast<double>(counts[i + l]) * static_cast<double>(tmp[i + l]);
  double sum = 0.0;
  for (int l = 0; l < kLanes; ++l) sum += lane_sum[l];
  for (int64_t i = whole; i < n; ++i) sum += static_cast<double>(counts[i]) * tmp[i];

  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) out[i] += tmp[i] * inv;
}

PQ_TARGET_AVX2 void accumulate_softmax_weighted_avx2(const float* __restrict raw,
                                                     const uint32_t* __restrict counts, int64_t n,
                                                     float scale, float* __restrict tmp,
                                                     float* __restrict out) {
  accumulate_softmax_weighted_body(raw, counts, n, scale, tmp, out);
}
PQ_TARGET_AVX512 void accumulate_softmax_weighted_avx512(const float* __restrict raw,
                                                         const uint32_t* __restrict counts,
                                                         int64_t n, float scale,
                                                         float* __restrict tmp,
                                                         float* __restrict out) {
  accumulate_softmax_weighted_body(raw, counts, n, scale, tmp, out);
}
void accumulate_softmax_weighted_portable(const float* __restrict raw,
                                          const uint32_t* __restrict counts, int64_t n,
                                          float scale, float* __restrict tmp,
                                          float* __restrict out) {
  accumulate_softmax_weighted_body(raw, counts, n, scale, tmp, out);
}

}  // namespace

void combine_softmax_weighted(const float* raw, const uint32_t* counts, int32_t group_size,
                              int64_t n, float scale, float* out, SelectScratch& scratch) {
  std::fill(out, out + n, 0.f);
  std::vector<float>& tmp = scratch.exp_tmp;
  tmp.resize(static_cast<size_t>(n));
  static const auto impl = cpu_level() >= CpuLevel::kAvx512 ? accumulate_softmax_weighted_avx512
                           : cpu_has_avx2() ? accumulate_softmax_weighted_avx2
                                            : accumulate_softmax_weighted_portable;
  for (int32_t g = 0; g < group_size; ++g)
    impl(raw + static_cast<size_t>(g) * n, counts, n, scale, tmp.data(), out);
}

void combine_group_scores(const float* raw, int32_t group_size, int64_t n, int32_t mode,
                          float scale, float* out, SelectScratch& scratch) {
  if (mode == PQ_GQA_SUM_SOFTMAX && group_size > 1) {
    std::fill(out, out + n, 0.f);
    scratch.exp_tmp.resize(static_cast<size_t>(n));
    for (int32_t g = 0; g < group_size; ++g)
      accumulate_softmax(raw + static_cast<size_t>(g) * n, n, scale, scratch.exp_tmp.data(), out);
    return;
  }
  if (mode == PQ_GQA_MAX) {
    for (int64_t i = 0; i < n; ++i) out[i] = raw[i] * scale;
    for (int32_t g = 1; g < group_size; ++g) {
      const float* r = raw + static_cast<size_t>(g) * n;
      for (int64_t i = 0; i < n; ++i) out[i] = std::max(out[i], r[i] * scale);
    }
    return;
  }
  // MEAN, and SUM_SOFTMAX of a single head (same order as its logit).
  for (int64_t i = 0; i < n; ++i) out[i] = raw[i];
  for (int32_t g = 1; g < group_size; ++g) {
    const float* r = raw + static_cast<size_t>(g) * n;
    for (int64_t i = 0; i < n; ++i) out[i] += r[i];
  }
  float s = scale / static_cast<float>(group_size);
  for (int64_t i = 0; i < n; ++i) out[i] *= s;
}

}  // namespace pq
