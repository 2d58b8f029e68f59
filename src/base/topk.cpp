#include "base/topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/cpu_dispatch.h"
#include "base/fast_exp.h"
#include "pqcache.h"

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

void accumulate_softmax(const float* raw, int64_t n, float scale, float* tmp, float* out) {
  static const auto impl = cpu_has_avx2() ? accumulate_softmax_avx2 : accumulate_softmax_portable;
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
void accumulate_softmax_weighted_portable(const float* __restrict raw,
                                          const uint32_t* __restrict counts, int64_t n,
                                          float scale, float* __restrict tmp,
                                          float* __restrict out) {
  accumulate_softmax_weighted_body(raw, counts, n, scale, tmp, out);
}

// Maps a float to a uint32 whose unsigned order is the float's order.
inline uint32_t ordered_key(float f) {
  f += 0.0f;  // -0 becomes +0: equal scores must share a bucket
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace

uint32_t ordered_score_key(float f) { return ordered_key(f); }

void combine_softmax_weighted(const float* raw, const uint32_t* counts, int32_t group_size,
                              int64_t n, float scale, float* out, SelectScratch& scratch) {
  std::fill(out, out + n, 0.f);
  std::vector<float>& tmp = scratch.exp_tmp;
  tmp.resize(static_cast<size_t>(n));
  static const auto impl =
      cpu_has_avx2() ? accumulate_softmax_weighted_avx2 : accumulate_softmax_weighted_portable;
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

void select_top_k(const float* scores, int64_t n, int64_t k, int64_t first, int32_t* out,
                  SelectScratch& scratch) {
  if (k <= 0) return;
  if (k >= n) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(first + i);
    return;
  }
  // MSD radix select over an order-preserving 32-bit key, a byte per pass.
  // Each pass histograms the remaining candidates' digit, marks every
  // candidate above the bucket that holds the k-th largest, and keeps only
  // that bucket. Candidates left after the last digit have equal scores; the
  // larger positions win, the same strict order (score, then position) the
  // whole library uses. A final scan of the marks gives ascending output.
  std::vector<uint32_t>& keys = scratch.keys;
  keys.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) keys[static_cast<size_t>(i)] = ordered_key(scores[i]);
  std::vector<uint8_t>& chosen = scratch.chosen;
  chosen.assign(static_cast<size_t>(n), 0);
  std::vector<int32_t>& candidates = scratch.tied;
  std::vector<int32_t>& next = scratch.next;
  std::vector<uint32_t>& histogram = scratch.histogram;

  // Byte digits: the per-pass fixed cost (clearing and merging histograms)
  // stays small next to n at decode sizes (8K tokens and up).
  constexpr int kPasses = 4;
  constexpr int kShift[kPasses] = {24, 16, 8, 0};
  constexpr uint32_t kBins[kPasses] = {256, 256, 256, 256};
  constexpr int kCopies = 4;  // interleaved histograms: equal digits in a row
                              // would otherwise wait on each other's stores
  int64_t need = k;
  bool all = true;  // the candidates are every index (not materialised)
  for (int pass = 0; pass < kPasses && need > 0; ++pass) {
    const int shift = kShift[pass];
    const uint32_t bins = kBins[pass];
    auto digit = [&](int64_t i) { return (keys[static_cast<size_t>(i)] >> shift) & (bins - 1); };
    histogram.assign(static_cast<size_t>(kCopies) * bins, 0);
    if (all) {
      for (int64_t i = 0; i < n; ++i) ++histogram[(i & (kCopies - 1)) * bins + digit(i)];
    } else {
      for (size_t j = 0; j < candidates.size(); ++j)
        ++histogram[(j & (kCopies - 1)) * bins + digit(candidates[j])];
    }
    for (int c = 1; c < kCopies; ++c)
      for (uint32_t b = 0; b < bins; ++b) histogram[b] += histogram[c * bins + b];
    int64_t above = 0;
    uint32_t bucket = bins - 1;
    while (above + histogram[bucket] < need) above += histogram[bucket--];
    // Branch-free: which side a score falls on is data, not control flow.
    next.resize(all ? static_cast<size_t>(n) : candidates.size());
    size_t kept = 0;
    auto visit = [&](int64_t i) {
      uint32_t d = digit(i);
      chosen[static_cast<size_t>(i)] |= static_cast<uint8_t>(d > bucket);
      next[kept] = static_cast<int32_t>(i);
      kept += d == bucket;
    };
    if (all) {
      for (int64_t i = 0; i < n; ++i) visit(i);
    } else {
      for (int32_t i : candidates) visit(i);
    }
    next.resize(kept);
    need -= above;
    candidates.swap(next);
    all = false;
    if (need == static_cast<int64_t>(candidates.size())) {
      for (int32_t i : candidates) chosen[static_cast<size_t>(i)] = 1;
      need = 0;
    }
  }
  // Equal keys: candidates are in ascending position order; the last win.
  for (size_t j = candidates.size() - static_cast<size_t>(need); need > 0 && j < candidates.size(); ++j)
    chosen[static_cast<size_t>(candidates[j])] = 1;

  // Branch-free compaction into scratch (it may write one slot past k), then
  // exactly k entries to the caller.
  std::vector<int32_t>& picked = next;
  picked.resize(static_cast<size_t>(n) + 1);
  size_t w = 0;
  for (int64_t i = 0; i < n; ++i) {
    picked[w] = static_cast<int32_t>(first + i);
    w += chosen[static_cast<size_t>(i)];
  }
  std::memcpy(out, picked.data(), static_cast<size_t>(k) * sizeof(int32_t));
}

}  // namespace pq
