// select_top_k (topk.h): an MSD radix select over order-preserving keys. A
// first pass keeps only the scores at or above a threshold estimated from a
// sample (at the AVX-512 level compressed 16 at a time), and the radix
// select runs on those survivors; the result is the same set: the k highest
// (score, position) pairs, ties to the larger position.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "base/cpu_dispatch.h"
#include "base/topk.h"

#include "base/x86_intrinsics.h"

namespace pq {

namespace {

// Marks chosen[i] = 1 for the k (0 < k < n) largest keys[i], ties to the
// larger i. Each pass histograms the remaining candidates' byte digit, marks
// every candidate above the bucket that holds the k-th largest, and keeps
// only that bucket. Candidates left after the last digit have equal keys;
// the larger indices win.
void radix_mark(const uint32_t* keys, int64_t n, int64_t k, std::vector<uint8_t>& chosen,
                SelectScratch& scratch) {
  chosen.assign(static_cast<size_t>(n), 0);
  std::vector<int32_t>& candidates = scratch.tied;
  std::vector<int32_t>& next = scratch.next;
  std::vector<uint32_t>& histogram = scratch.histogram;

  // Byte digits: the per-pass fixed cost (clearing and merging histograms)
  // stays small next to n at decode sizes (8K tokens and up).
  constexpr int kPasses = 4;
  constexpr int kShift[kPasses] = {24, 16, 8, 0};
  constexpr uint32_t kBins = 256;
  constexpr int kCopies = 4;  // interleaved histograms: equal digits in a row
                              // would otherwise wait on each other's stores
  // A digit every key shares puts them all in one bucket: its pass would
  // only copy the candidates. Survivors of a sampled threshold share their
  // top byte or two (sign and exponent), so those passes are skipped.
  uint32_t all_or = 0, all_and = ~0u;
  for (int64_t i = 0; i < n; ++i) {
    all_or |= keys[i];
    all_and &= keys[i];
  }
  const uint32_t varying = all_or ^ all_and;
  int64_t need = k;
  bool all = true;  // the candidates are every index (not materialised)
  candidates.clear();
  for (int pass = 0; pass < kPasses && need > 0; ++pass) {
    const int shift = kShift[pass];
    if (((varying >> shift) & (kBins - 1)) == 0) continue;
    auto digit = [&](int64_t i) { return (keys[i] >> shift) & (kBins - 1); };
    histogram.assign(static_cast<size_t>(kCopies) * kBins, 0);
    if (all) {
      for (int64_t i = 0; i < n; ++i) ++histogram[(i & (kCopies - 1)) * kBins + digit(i)];
    } else {
      for (size_t j = 0; j < candidates.size(); ++j)
        ++histogram[(j & (kCopies - 1)) * kBins + digit(candidates[j])];
    }
    for (int c = 1; c < kCopies; ++c)
      for (uint32_t b = 0; b < kBins; ++b) histogram[b] += histogram[c * kBins + b];
    int64_t above = 0;
    uint32_t bucket = kBins - 1;
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
  // Equal keys: candidates are in ascending order; the last win. (All keys
  // equal: every pass was skipped, and the candidates are every index.)
  if (all) {
    for (int64_t i = n - need; i < n; ++i) chosen[static_cast<size_t>(i)] = 1;
    return;
  }
  for (size_t j = candidates.size() - static_cast<size_t>(need); need > 0 && j < candidates.size(); ++j)
    chosen[static_cast<size_t>(candidates[j])] = 1;
}

// Writes (position of i) for the marked i, ascending, exactly k of them.
// Branch-free compaction into scratch (it may write one slot past k).
template <typename Position>
void emit_marked(const std::vector<uint8_t>& chosen, int64_t n, int64_t k, Position position,
                 int32_t* out, std::vector<int32_t>& picked) {
  picked.resize(static_cast<size_t>(n) + 1);
  size_t w = 0;
  for (int64_t i = 0; i < n; ++i) {
    picked[w] = position(i);
    w += chosen[static_cast<size_t>(i)];
  }
  std::memcpy(out, picked.data(), static_cast<size_t>(k) * sizeof(int32_t));
}

void select_top_k_all(const float* scores, int64_t n, int64_t k, int64_t first, int32_t* out,
                      SelectScratch& scratch) {
  std::vector<uint32_t>& keys = scratch.keys;
  keys.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) keys[static_cast<size_t>(i)] = ordered_score_key(scores[i]);
  radix_mark(keys.data(), n, k, scratch.chosen, scratch);
  emit_marked(scratch.chosen, n, k, [&](int64_t i) { return static_cast<int32_t>(first + i); },
              out, scratch.next);
}

// Two keys from an even sample, a few standard deviations either side of
// k's rank: very likely at least k keys are >= low (but not many more), and
// fewer than k are >= high, so the k-th largest lies in [low, high). If
// either guess fails, the caller falls back to a wider select.
struct SampledBand {
  uint32_t low, high;
};

SampledBand sampled_band(const float* scores, int64_t n, int64_t k, std::vector<uint32_t>& sample) {
  const int64_t size = std::min<int64_t>(4096, n / 8);
  const int64_t stride = n / size;
  sample.resize(static_cast<size_t>(size));
  for (int64_t s = 0; s < size; ++s) sample[static_cast<size_t>(s)] = ordered_score_key(scores[s * stride]);
  const double p = static_cast<double>(k) / static_cast<double>(n);
  const double mean = p * static_cast<double>(size);
  const double spread = 4.0 * std::sqrt(mean * (1.0 - p)) + 8.0;
  const int64_t low_rank = std::min<int64_t>(size - 1, static_cast<int64_t>(mean + spread));
  const int64_t high_rank = std::max<int64_t>(0, static_cast<int64_t>(mean - spread));
  // The rank-th largest: descending order's element `rank`; the high one
  // among the part before it.
  std::nth_element(sample.begin(), sample.begin() + low_rank, sample.end(), std::greater<uint32_t>());
  const uint32_t low = sample[static_cast<size_t>(low_rank)];
  std::nth_element(sample.begin(), sample.begin() + high_rank, sample.begin() + low_rank,
                   std::greater<uint32_t>());
  const uint32_t high = high_rank < low_rank ? sample[static_cast<size_t>(high_rank)] : ~0u;
  return {low, high};
}

// The k-th largest (0 < k <= n) of keys[0..n) and how many keys equal to it
// the top k take (the rest of the top k are the keys above it): byte-digit
// radix passes over the keys themselves, each keeping only the bucket that
// holds the k-th; a digit every key shares is skipped.
struct KthKey {
  uint32_t key;
  int64_t equal_taken, equal_total;
};

KthKey kth_largest_key(const uint32_t* keys, int64_t n, int64_t k, SelectScratch& scratch) {
  constexpr uint32_t kBins = 256;
  std::vector<uint32_t>& histogram = scratch.histogram;
  std::vector<uint32_t>& kept = scratch.keys;  // sampled_band's sample is done with
  uint32_t all_or = 0, all_and = ~0u;
  for (int64_t i = 0; i < n; ++i) {
    all_or |= keys[i];
    all_and &= keys[i];
  }
  const uint32_t varying = all_or ^ all_and;
  const uint32_t* candidates = keys;
  int64_t count = n, need = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (((varying >> shift) & (kBins - 1)) == 0) continue;
    histogram.assign(kBins, 0);
    for (int64_t i = 0; i < count; ++i) ++histogram[(candidates[i] >> shift) & (kBins - 1)];
    uint32_t bucket = kBins - 1;
    while (histogram[bucket] < static_cast<uint32_t>(need)) need -= histogram[bucket--];
    kept.resize(static_cast<size_t>(count));
    int64_t w = 0;
    for (int64_t i = 0; i < count; ++i) {  // in place after the first pass
      const uint32_t key = candidates[i];
      kept[static_cast<size_t>(w)] = key;
      w += ((key >> shift) & (kBins - 1)) == bucket;
    }
    candidates = kept.data();
    count = w;
  }
  // Every candidate left holds the same key: the k-th largest.
  return {candidates[0], need, count};
}

// The keys >= threshold and their indices, in index order; returns how
// many. Branch-free: every entry is written, and the count moves on only
// for those kept.
int64_t keep_at_or_above_portable(const float* scores, int64_t n, uint32_t threshold,
                                  uint32_t* keys, int32_t* positions) {
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t key = ordered_score_key(scores[i]);
    keys[kept] = key;
    positions[kept] = static_cast<int32_t>(i);
    kept += key >= threshold;
  }
  return kept;
}

#if PQ_X86_KERNELS

// The keys >= threshold and their indices, in index order; returns how many.
PQ_TARGET_AVX512 int64_t keep_at_or_above_avx512(const float* scores, int64_t n, uint32_t threshold,
                                          uint32_t* keys, int32_t* positions) {
  const __m512i t = _mm512_set1_epi32(static_cast<int32_t>(threshold));
  const __m512i sign = _mm512_set1_epi32(static_cast<int32_t>(0x80000000u));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t left = n - i;
    const __mmask16 valid = left >= 16 ? static_cast<__mmask16>(0xffff)
                                       : static_cast<__mmask16>((1u << left) - 1);
    // ordered_score_key, 16 at a time: -0 to +0, then flip.
    const __m512 f = _mm512_add_ps(_mm512_maskz_loadu_ps(valid, scores + i), _mm512_setzero_ps());
    const __m512i u = _mm512_castps_si512(f);
    const __mmask16 negative = _mm512_movepi32_mask(u);
    const __m512i key = _mm512_mask_xor_epi32(_mm512_or_si512(u, sign), negative, u,
                                              _mm512_set1_epi32(-1));
    const __mmask16 keep = _mm512_cmpge_epu32_mask(key, t) & valid;
    // Compress in registers, then a full store: the memory form of
    // vpcompressd is microcoded and slow on some cores (Zen 4).
    _mm512_storeu_si512(keys + kept, _mm512_maskz_compress_epi32(keep, key));
    _mm512_storeu_si512(positions + kept,
                        _mm512_maskz_compress_epi32(
                            keep, _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int32_t>(i)))));
    kept += __builtin_popcount(keep);
  }
  return kept;
}

#endif  // PQ_X86_KERNELS

using KeepFn = int64_t (*)(const float*, int64_t, uint32_t, uint32_t*, int32_t*);

// The top k among the scores at or above a sampled low key (all scores if
// fewer than k are). The survivors at or above the sampled high key are all
// taken when fewer than k: only those between the two keys (about a quarter
// of the survivors at k = n / 5) go through the radix passes, which find the
// k-th largest key; one pass in index order then emits the survivors above
// it and the last of those equal to it. Below 16K scores the sample costs
// more than it saves.
void select_top_k_sampled(KeepFn keep, const float* scores, int64_t n, int64_t k, int64_t first,
                          int32_t* out, SelectScratch& scratch) {
  if (n < (int64_t{1} << 14)) return select_top_k_all(scores, n, k, first, out, scratch);
  const SampledBand band = sampled_band(scores, n, k, scratch.keys);
  std::vector<uint32_t>& keys = scratch.survivor_keys;
  std::vector<int32_t>& positions = scratch.survivors;
  keys.resize(static_cast<size_t>(n) + 16);  // a full vector may be stored at the end
  positions.resize(static_cast<size_t>(n) + 16);
  const int64_t kept = keep(scores, n, band.low, keys.data(), positions.data());
  if (kept < k) return select_top_k_all(scores, n, k, first, out, scratch);
  if (kept == k) {
    for (int64_t i = 0; i < k; ++i) out[i] = static_cast<int32_t>(first + positions[static_cast<size_t>(i)]);
    return;
  }
  // The keys between the two, and how many survivors lie above them.
  std::vector<int32_t>& between_bits = scratch.next;  // reused as uint32_t keys
  between_bits.resize(static_cast<size_t>(kept));
  uint32_t* between = reinterpret_cast<uint32_t*>(between_bits.data());
  int64_t above = 0, inside = 0;
  for (int64_t j = 0; j < kept; ++j) {
    const uint32_t key = keys[static_cast<size_t>(j)];
    between[inside] = key;
    inside += key < band.high;
    above += key >= band.high;
  }
  if (above >= k) {  // the high guess failed: every survivor goes through the radix
    radix_mark(keys.data(), kept, k, scratch.chosen, scratch);
    emit_marked(scratch.chosen, kept, k,
                [&](int64_t i) { return static_cast<int32_t>(first + positions[static_cast<size_t>(i)]); },
                out, scratch.next);
    return;
  }
  const KthKey kth = kth_largest_key(between, inside, k - above, scratch);
  // Branch-free emission in index order: keys above the k-th, and of those
  // equal to it the last equal_taken (ties go to the larger position).
  std::vector<int32_t>& picked = scratch.tied;
  picked.resize(static_cast<size_t>(kept) + 1);
  const int64_t skip = kth.equal_total - kth.equal_taken;
  int64_t w = 0, equal_seen = 0;
  for (int64_t j = 0; j < kept; ++j) {
    const uint32_t key = keys[static_cast<size_t>(j)];
    const bool equal = key == kth.key;
    picked[static_cast<size_t>(w)] = static_cast<int32_t>(first + positions[static_cast<size_t>(j)]);
    w += (key > kth.key) | (equal & (equal_seen >= skip));
    equal_seen += equal;
  }
  std::memcpy(out, picked.data(), static_cast<size_t>(k) * sizeof(int32_t));
}

}  // namespace

void select_top_k(const float* scores, int64_t n, int64_t k, int64_t first, int32_t* out,
                  SelectScratch& scratch) {
  if (k <= 0) return;
  if (k >= n) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(first + i);
    return;
  }
#if PQ_X86_KERNELS
  static const KeepFn keep =
      cpu_level() >= CpuLevel::kAvx512 ? keep_at_or_above_avx512 : keep_at_or_above_portable;
#else
  static const KeepFn keep = keep_at_or_above_portable;
#endif
  select_top_k_sampled(keep, scores, n, k, first, out, scratch);
}

}  // namespace pq
