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
#include "base/weighted_rows.h"

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

// The sample's keys are bucketed by their top 11 bits.
constexpr int kSampleBucketShift = 21;
constexpr size_t kSampleBuckets = size_t{1} << (32 - kSampleBucketShift);

// The key of descending rank `rank` (0: the largest) among keys whose
// buckets have the histogram `histogram`: only that rank's bucket is
// partially sorted (std::nth_element over the whole sample, twice, was 3-4%
// of a 128K select).
uint32_t key_at_rank(const std::vector<uint32_t>& keys, const std::vector<uint32_t>& histogram,
                     int64_t rank, std::vector<uint32_t>& bucket_keys) {
  int64_t above = 0;
  uint32_t bucket = static_cast<uint32_t>(histogram.size()) - 1;
  while (above + static_cast<int64_t>(histogram[bucket]) <= rank) above += histogram[bucket--];
  bucket_keys.resize(keys.size());
  size_t w = 0;
  for (uint32_t key : keys) {  // branch-free: which bucket a key is in is data
    bucket_keys[w] = key;
    w += (key >> kSampleBucketShift) == bucket;
  }
  const auto nth = bucket_keys.begin() + (rank - above);
  std::nth_element(bucket_keys.begin(), nth, bucket_keys.begin() + static_cast<ptrdiff_t>(w),
                   std::greater<uint32_t>());
  return *nth;
}

template <typename Source>
SampledBand sampled_band(const Source& source, int64_t n, int64_t k, SelectScratch& scratch) {
  const auto [size, stride] = top_k_sample(n);
  std::vector<uint32_t>& sample = scratch.keys;
  sample.resize(static_cast<size_t>(size));
  for (int64_t s = 0; s < size; ++s) sample[static_cast<size_t>(s)] = ordered_score_key(source.sampled(s, stride));
  const double p = static_cast<double>(k) / static_cast<double>(n);
  const double mean = p * static_cast<double>(size);
  const double spread = 4.0 * std::sqrt(mean * (1.0 - p)) + 8.0;
  const int64_t low_rank = std::min<int64_t>(size - 1, static_cast<int64_t>(mean + spread));
  const int64_t high_rank = std::max<int64_t>(0, static_cast<int64_t>(mean - spread));
  std::vector<uint32_t>& histogram = scratch.histogram;
  histogram.assign(kSampleBuckets, 0);
  for (uint32_t key : sample) ++histogram[key >> kSampleBucketShift];
  const uint32_t low = key_at_rank(sample, histogram, low_rank, scratch.sample_bucket);
  const uint32_t high =
      high_rank < low_rank ? key_at_rank(sample, histogram, high_rank, scratch.sample_bucket) : ~0u;
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

// What a keep pass leaves: the keys >= band.low and their indices, in index
// order (kept of them); of those, the keys below band.high (inside of them,
// in index order) and how many are not (above).
struct KeptBand {
  int64_t kept = 0, inside = 0, above = 0;
};

// The keep pass at the portable level. Branch-free: every entry is
// written, and a count moves on only for those kept.
KeptBand keep_band_portable(const float* scores, int64_t n, const SampledBand& band, uint32_t* keys,
                            int32_t* positions, uint32_t* between) {
  KeptBand r;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t key = ordered_score_key(scores[i]);
    keys[r.kept] = key;
    positions[r.kept] = static_cast<int32_t>(i);
    between[r.inside] = key;
    const bool kept = key >= band.low;
    r.kept += kept;
    r.inside += kept & (key < band.high);
  }
  r.above = r.kept - r.inside;
  return r;
}

// Writes first + positions[j] for the kept keys above kth and, of those
// equal to it, all but the first `skip`, in index order: the k positions the
// top k takes, into out[0..k) and nowhere past it. Branch-free, through
// `spare` (the last write may go one slot past the k-th).
void emit_portable(const uint32_t* keys, const int32_t* positions, int64_t kept, uint32_t kth,
                   int64_t skip, int32_t first, int64_t k, int32_t* out,
                   std::vector<int32_t>& spare) {
  spare.resize(static_cast<size_t>(kept) + 1);
  int64_t w = 0, equal_seen = 0;
  for (int64_t j = 0; j < kept; ++j) {
    const uint32_t key = keys[j];
    const bool equal = key == kth;
    spare[static_cast<size_t>(w)] = first + positions[j];
    w += (key > kth) | (equal & (equal_seen >= skip));
    equal_seen += equal;
  }
  std::memcpy(out, spare.data(), static_cast<size_t>(k) * sizeof(int32_t));
}

#if PQ_X86_KERNELS

// The keep pass over 16 scores (the valid lanes of f, indices i + lane):
// appends the kept keys and indices at r.kept, the inside keys at r.inside.
// Compressed in registers, then a full store: the memory form of vpcompressd
// is microcoded and slow on some cores (Zen 4). The stores reach 16 entries
// past the counts.
PQ_TARGET_AVX512 PQ_ALWAYS_INLINE void keep_lanes_avx512(__m512 f, __mmask16 valid, __m512i low,
                                                      __m512i high, int64_t i, uint32_t* keys,
                                                      int32_t* positions, uint32_t* between,
                                                      KeptBand& r) {
  const __m512i sign = _mm512_set1_epi32(static_cast<int32_t>(0x80000000u));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  // ordered_score_key, 16 at a time: -0 to +0, then flip.
  const __m512i u = _mm512_castps_si512(_mm512_add_ps(f, _mm512_setzero_ps()));
  const __mmask16 negative = _mm512_movepi32_mask(u);
  const __m512i key = _mm512_mask_xor_epi32(_mm512_or_si512(u, sign), negative, u,
                                            _mm512_set1_epi32(-1));
  const __mmask16 keep = _mm512_cmpge_epu32_mask(key, low) & valid;
  const __mmask16 inside = _mm512_cmplt_epu32_mask(key, high) & keep;
  _mm512_storeu_si512(keys + r.kept, _mm512_maskz_compress_epi32(keep, key));
  _mm512_storeu_si512(positions + r.kept,
                      _mm512_maskz_compress_epi32(
                          keep, _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int32_t>(i)))));
  _mm512_storeu_si512(between + r.inside, _mm512_maskz_compress_epi32(inside, key));
  r.kept += __builtin_popcount(keep);
  r.inside += __builtin_popcount(inside);
}

PQ_TARGET_AVX512 PQ_ALWAYS_INLINE __mmask16 lanes_left(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
}

PQ_TARGET_AVX512 KeptBand keep_band_avx512(const float* scores, int64_t n, const SampledBand& band,
                                           uint32_t* keys, int32_t* positions, uint32_t* between) {
  const __m512i low = _mm512_set1_epi32(static_cast<int32_t>(band.low));
  const __m512i high = _mm512_set1_epi32(static_cast<int32_t>(band.high));
  KeptBand r;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 valid = lanes_left(n - i);
    keep_lanes_avx512(_mm512_maskz_loadu_ps(valid, scores + i), valid, low, high, i, keys,
                      positions, between, r);
  }
  r.above = r.kept - r.inside;
  return r;
}

// The same over weighted rows, each sum formed in registers as
// weighted_rows_at forms it (a product and an add per row, left to right):
// the sums are never written.
PQ_TARGET_AVX512 KeptBand keep_weighted_band_avx512(const WeightedRows& w, const SampledBand& band,
                                                    uint32_t* keys, int32_t* positions,
                                                    uint32_t* between) {
  const __m512i low = _mm512_set1_epi32(static_cast<int32_t>(band.low));
  const __m512i high = _mm512_set1_epi32(static_cast<int32_t>(band.high));
  const __m512 w0 = _mm512_set1_ps(w.weights[0]);
  KeptBand r;
  for (int64_t i = 0; i < w.n; i += 16) {
    const __mmask16 valid = lanes_left(w.n - i);
    __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(valid, w.rows + i), w0);
    for (int32_t row = 1; row < w.count; ++row)
      s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_maskz_loadu_ps(valid, w.rows + row * w.n + i),
                                         _mm512_set1_ps(w.weights[row])));
    keep_lanes_avx512(s, valid, low, high, i, keys, positions, between, r);
  }
  r.above = r.kept - r.inside;
  return r;
}

// emit_portable, 16 at a time, straight into out (full stores while 16
// more fit below k; the last ones through a register-sized buffer). Of the
// keys equal to kth only the block where the count of those seen passes
// `skip` needs a lane-by-lane mask.
PQ_TARGET_AVX512 void emit_avx512(const uint32_t* keys, const int32_t* positions, int64_t kept,
                                  uint32_t kth, int64_t skip, int32_t first, int64_t k,
                                  int32_t* out, std::vector<int32_t>&) {
  const __m512i t = _mm512_set1_epi32(static_cast<int32_t>(kth));
  const __m512i base = _mm512_set1_epi32(first);
  int64_t w = 0, equal_seen = 0;
  for (int64_t j = 0; j < kept && w < k; j += 16) {
    const __mmask16 valid = lanes_left(kept - j);
    const __m512i key = _mm512_maskz_loadu_epi32(valid, keys + j);
    __mmask16 take = _mm512_cmpgt_epu32_mask(key, t) & valid;
    const __mmask16 equal = _mm512_cmpeq_epu32_mask(key, t) & valid;
    if (equal != 0) {
      const int count = __builtin_popcount(equal);
      if (equal_seen >= skip) {
        take |= equal;
      } else if (equal_seen + count > skip) {
        uint32_t m = equal;  // drop the first skip - equal_seen of them
        for (int64_t d = skip - equal_seen; d > 0; --d) m &= m - 1;
        take |= static_cast<__mmask16>(m);
      }
      equal_seen += count;
    }
    const __m512i picked = _mm512_maskz_compress_epi32(
        take, _mm512_add_epi32(_mm512_maskz_loadu_epi32(valid, positions + j), base));
    const int64_t taken = __builtin_popcount(take);
    if (w + 16 <= k) {
      _mm512_storeu_si512(out + w, picked);
    } else {
      alignas(64) int32_t last[16];
      _mm512_store_si512(last, picked);
      std::memcpy(out + w, last, static_cast<size_t>(std::min(taken, k - w)) * sizeof(int32_t));
    }
    w += taken;
  }
}

#endif  // PQ_X86_KERNELS

// Where the scores come from: an array, or weighted rows summed as they
// are read (base/weighted_rows.h). sampled(s, stride) is score s x stride;
// keep(band, ...) the
// keep pass (KeptBand; writing up to 16 entries past the counts); all()
// every score in an array, for the paths that need them all.
using KeepFn = KeptBand (*)(const float*, int64_t, const SampledBand&, uint32_t*, int32_t*,
                            uint32_t*);
using EmitFn = void (*)(const uint32_t*, const int32_t*, int64_t, uint32_t, int64_t, int32_t,
                        int64_t, int32_t*, std::vector<int32_t>&);

struct ArrayScores {
  const float* scores;
  int64_t n;
  KeepFn keep_fn;
  float sampled(int64_t s, int64_t stride) const { return scores[s * stride]; }
  KeptBand keep(const SampledBand& band, uint32_t* keys, int32_t* positions,
                uint32_t* between) const {
    return keep_fn(scores, n, band, keys, positions, between);
  }
  const float* all(SelectScratch&) const { return scores; }
};

#if PQ_X86_KERNELS
struct WeightedScores {
  const WeightedRows& rows;
  float sampled(int64_t s, int64_t stride) const { return weighted_rows_at(rows, s * stride); }
  KeptBand keep(const SampledBand& band, uint32_t* keys, int32_t* positions,
                uint32_t* between) const {
    return keep_weighted_band_avx512(rows, band, keys, positions, between);
  }
  const float* all(SelectScratch& scratch) const {
    scratch.weighted_scores.resize(static_cast<size_t>(rows.n));
    weighted_rows_sum(rows, scratch.weighted_scores.data());
    return scratch.weighted_scores.data();
  }
};
#endif

// The top k among the scores at or above a sampled low key (all scores if
// fewer than k are). The survivors at or above the sampled high key are all
// taken when fewer than k: only those between the two keys (about a quarter
// of the survivors at k = n / 5) go through the radix passes, which find the
// k-th largest key; one pass in index order then emits the survivors above
// it and the last of those equal to it. Below 16K scores the sample costs
// more than it saves.
template <typename Source>
void select_top_k_sampled(const Source& source, EmitFn emit, int64_t n, int64_t k, int64_t first,
                          int32_t* out, SelectScratch& scratch) {
  if (n < kTopKSampledFrom) return select_top_k_all(source.all(scratch), n, k, first, out, scratch);
  const SampledBand band = sampled_band(source, n, k, scratch);
  std::vector<uint32_t>& keys = scratch.survivor_keys;
  std::vector<int32_t>& positions = scratch.survivors;
  std::vector<int32_t>& between_bits = scratch.next;  // reused as uint32_t keys
  keys.resize(static_cast<size_t>(n) + 16);  // a full vector may be stored at the end
  positions.resize(static_cast<size_t>(n) + 16);
  between_bits.resize(static_cast<size_t>(n) + 16);
  uint32_t* between = reinterpret_cast<uint32_t*>(between_bits.data());
  const KeptBand kept = source.keep(band, keys.data(), positions.data(), between);
  if (kept.kept < k) return select_top_k_all(source.all(scratch), n, k, first, out, scratch);
  if (kept.kept == k) {
    for (int64_t i = 0; i < k; ++i) out[i] = static_cast<int32_t>(first + positions[static_cast<size_t>(i)]);
    return;
  }
  if (kept.above >= k) {  // the high guess failed: every survivor goes through the radix
    radix_mark(keys.data(), kept.kept, k, scratch.chosen, scratch);
    emit_marked(scratch.chosen, kept.kept, k,
                [&](int64_t i) { return static_cast<int32_t>(first + positions[static_cast<size_t>(i)]); },
                out, scratch.next);
    return;
  }
  const KthKey kth = kth_largest_key(between, kept.inside, k - kept.above, scratch);
  // Emission in index order: keys above the k-th, and of those equal to it
  // the last equal_taken (ties go to the larger position).
  emit(keys.data(), positions.data(), kept.kept, kth.key, kth.equal_total - kth.equal_taken,
       static_cast<int32_t>(first), k, out, scratch.tied);
}

// The keep and emit passes of the process's kernel level.
struct LevelPasses {
  KeepFn keep;
  EmitFn emit;
};
const LevelPasses& level_passes() {
#if PQ_X86_KERNELS
  static const LevelPasses passes = cpu_level() >= CpuLevel::kAvx512
                                        ? LevelPasses{keep_band_avx512, emit_avx512}
                                        : LevelPasses{keep_band_portable, emit_portable};
#else
  static const LevelPasses passes{keep_band_portable, emit_portable};
#endif
  return passes;
}

// No budget (nothing written) or a budget of every score (all of them):
// true where the top k needs no score.
bool no_choice(int64_t n, int64_t k, int64_t first, int32_t* out) {
  if (k >= n)
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(first + i);
  return k <= 0 || k >= n;
}

}  // namespace

void select_top_k(const float* scores, int64_t n, int64_t k, int64_t first, int32_t* out,
                  SelectScratch& scratch) {
  if (no_choice(n, k, first, out)) return;
  const LevelPasses& passes = level_passes();
  select_top_k_sampled(ArrayScores{scores, n, passes.keep}, passes.emit, n, k, first, out, scratch);
}

void select_top_k_weighted(const WeightedRows& rows, int64_t k, int64_t first, int32_t* out,
                           SelectScratch& scratch) {
  const int64_t n = rows.n;
  if (no_choice(n, k, first, out)) return;
#if PQ_X86_KERNELS
  if (cpu_level() >= CpuLevel::kAvx512)
    return select_top_k_sampled(WeightedScores{rows}, emit_avx512, n, k, first, out, scratch);
#endif
  // Below AVX-512 the keep pass has no compress: the sums go to memory
  // first, as they always did there.
  scratch.weighted_scores.resize(static_cast<size_t>(n));
  weighted_rows_sum(rows, scratch.weighted_scores.data());
  select_top_k(scratch.weighted_scores.data(), n, k, first, out, scratch);
}

}  // namespace pq
