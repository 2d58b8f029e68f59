// The AVX-512 kernel of attend_rows (attention.h), chosen at the avx512
// level (cpu_dispatch.h): the AVX2 kernel's blocks with 16 floats a
// register and 32 registers, so more rows and query heads are in flight;
// masked loads take any head_dim (no scalar tail); the block's softmax
// (max, exps, sum) is vectorised too. Rows ahead are prefetched K and V interleaved, a row at
// a time between the logits (see kPrefetchRows).
#include "backend/attention.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>

// GCC 12 warns of the _mm512_undefined_* operands inside its own unpack,
// conversion and reduction intrinsics (a false positive, fixed in GCC 13).
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <algorithm>
#include <cstring>

#include "backend/attention_amx.h"
#include "backend/attention_simd.h"
#include "backend/attention_value_pairs.h"
#include "base/cpu_dispatch.h"
#include "base/fast_exp.h"
#include "pqcache.h"


namespace pq {

namespace {

constexpr int64_t kB = kAttentionBlockRows;
// Rows prefetched ahead of the one being computed (its K and V lines
// interleaved, a row at a time between the logits).
constexpr int64_t kPrefetchRows = 64;

// f16 rows converted by VCVTPH2PSX (AVX512_FP16) rather than VCVTPH2PS
// (AVX512F): a dtype code of these templates alone, for the variant
// bench_attend_kernels measures (F16Conversion::kAvx512Fp16).
constexpr int kF16ByAvx512Fp16 = 1000 + PQ_DTYPE_F16;

// Sixteen elements of a row as floats (times 1 / kLoadScale), lanes
// outside `m` zero.
template <int Dtype>
PQ_KERNEL __m512 load16(const uint8_t* p, __mmask16 m) {
  if constexpr (Dtype == kF16ByAvx512Fp16) {
    // Inline assembly: a target("avx512fp16") attribute on the kernel
    // templates would let GCC use AVX512_FP16 in every dtype's code.
    __m512 f;
    __asm__("vcvtph2psx %1, %0" : "=v"(f) : "v"(_mm256_maskz_loadu_epi16(m, p)));
    return f;
  } else if constexpr (Dtype == PQ_DTYPE_FP8_E5M2 || Dtype == PQ_DTYPE_FP8_E4M3) {
    const __m128i bytes = _mm_maskz_loadu_epi8(m, p);
    if constexpr (Dtype == PQ_DTYPE_FP8_E4M3) {
      // Sign-extended, the sign fills bits 8..15: shifted by 7 it lands in
      // bit 15 and the rest in bits 7..13; bit 14 (a copy of the sign) is
      // masked off.
      const __m256i w = _mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7);
      return _mm512_cvtph_ps(_mm256_and_si256(w, _mm256_set1_epi16(static_cast<short>(0xBF80))));
    }
    return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(bytes), 8));
  } else if constexpr (Dtype == PQ_DTYPE_F16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  } else if constexpr (Dtype == PQ_DTYPE_BF16) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  } else {
    return _mm512_maskz_loadu_ps(m, p);
  }
}

PQ_KERNEL __mmask16 lanes(int32_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// Thirty-two fp8 elements of a row as floats (times 1 / kLoadScale), in two
// registers, lanes outside `m` zero: widened to binary16 patterns 32 at a
// time, so the integer steps run once per 32 elements.
template <int Dtype>
PQ_KERNEL void load32_fp8(const uint8_t* p, __mmask32 m, __m512& lo, __m512& hi) {
  const __m256i bytes = _mm256_maskz_loadu_epi8(m, p);
  __m512i w;
  if constexpr (Dtype == PQ_DTYPE_FP8_E4M3)
    w = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(bytes), 7),
                         _mm512_set1_epi16(static_cast<short>(0xBF80)));
  else
    w = _mm512_slli_epi16(_mm512_cvtepu8_epi16(bytes), 8);
  lo = _mm512_cvtph_ps(_mm512_castsi512_si256(w));
  hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(w, 1));
}

PQ_KERNEL __mmask32 lanes32(int32_t left) {
  return left >= 32 ? __mmask32(0xFFFFFFFFu) : static_cast<__mmask32>((1u << left) - 1);
}

PQ_KERNEL __mmask16 lanes_from(int32_t left) { return left <= 0 ? __mmask16(0) : lanes(left); }

// The lines of a row's K and V, interleaved, into L2 (see kPrefetchRows).
PQ_KERNEL void prefetch_row(const KvStore::RowTable& t, int32_t kv_head, int32_t pos) {
  const char* k = reinterpret_cast<const char*>(t.key_row(pos, kv_head));
  const char* v = reinterpret_cast<const char*>(t.value_row(pos, kv_head));
  for (size_t b = 0; b < t.row_bytes; b += 64) {
    _mm_prefetch(k + b, _MM_HINT_T1);
    _mm_prefetch(v + b, _MM_HINT_T1);
  }
}

// hsum of each of four registers, in lanes 0..3 of the result.
PQ_KERNEL __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Pairwise: halves added, then interleaved so each step halves the work.
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  // ab lanes: a0+a2 b0+b2 a1+a3 b1+b3 per 128-bit lane (pairs of a and b)
  const __m512 abcd = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
                                    _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  // abcd: per 128-bit lane, [a b c d] partial sums; add the four lanes.
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(abcd),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Stores scale * hsum(acc[n]) to out[n * stride] for N registers.
template <int N>
PQ_KERNEL void store_sums(const __m512* acc, float scale, float* out, int64_t stride) {
  int n = 0;
  for (; n + 4 <= N; n += 4) {
    alignas(16) float s[4];
    _mm_store_ps(s, _mm_mul_ps(hsum4(acc[n], acc[n + 1], acc[n + 2], acc[n + 3]), _mm_set1_ps(scale)));
    for (int j = 0; j < 4; ++j) out[(n + j) * stride] = s[j];
  }
  for (; n < N; ++n) out[n * stride] = _mm512_reduce_add_ps(acc[n]) * scale;
}

// logits[g * kB + i + r] for R rows from i: each 16 key elements loaded once
// for the group, R x G accumulators. fp8 keys are widened 32 at a time
// (load32_fp8), so two query registers a step.
template <int Dtype, int G, int R>
PQ_KERNEL void logits_rows(const uint8_t* const* keys, const float* q, int32_t d, float scale,
                           float* logits, int64_t i) {
  __m512 acc[G][R];
  PQ_UNROLL for (int g = 0; g < G; ++g) PQ_UNROLL for (int r = 0; r < R; ++r) acc[g][r] =
      _mm512_setzero_ps();
  if constexpr (kElem<Dtype> == 1) {
    for (int32_t k = 0; k < d; k += 32) {
      const __mmask16 m0 = lanes_from(d - k), m1 = lanes_from(d - k - 16);
      __m512 key0[R], key1[R];
      PQ_UNROLL for (int r = 0; r < R; ++r)
          load32_fp8<Dtype>(keys[i + r] + k, lanes32(d - k), key0[r], key1[r]);
      PQ_UNROLL for (int g = 0; g < G; ++g) {
        const float* qg = q + static_cast<size_t>(g) * d + k;
        const __m512 q0 = _mm512_maskz_loadu_ps(m0, qg), q1 = _mm512_maskz_loadu_ps(m1, qg + 16);
        PQ_UNROLL for (int r = 0; r < R; ++r) {
          acc[g][r] = _mm512_fmadd_ps(q0, key0[r], acc[g][r]);
          acc[g][r] = _mm512_fmadd_ps(q1, key1[r], acc[g][r]);
        }
      }
    }
  } else {
    for (int32_t k = 0; k < d; k += 16) {
      const __mmask16 m = lanes(d - k);
      __m512 key[R];
      PQ_UNROLL for (int r = 0; r < R; ++r) key[r] = load16<Dtype>(keys[i + r] + k * kElem<Dtype>, m);
      PQ_UNROLL for (int g = 0; g < G; ++g) {
        const __m512 qg = _mm512_maskz_loadu_ps(m, q + static_cast<size_t>(g) * d + k);
        PQ_UNROLL for (int r = 0; r < R; ++r) acc[g][r] = _mm512_fmadd_ps(qg, key[r], acc[g][r]);
      }
    }
  }
  PQ_UNROLL for (int g = 0; g < G; ++g) store_sums<R>(acc[g], scale, logits + g * kB + i, 1);
}

// The same with VDPBF16PS: bf16 keys against the queries as bf16 pairs
// (qb, exact: the caller checked each query float is a bf16), 32 elements
// an instruction and no conversion of the keys. Kept because it measured
// faster where the rows are in cache: 4K tokens bf16 (925 rows a kv head,
// L3-resident), 0.26-0.27 ms against 0.30 ms with the FMA logits (median
// of 41-61 interleaved rounds); at 128K tokens, memory-bound, the two
// measured alike (20.0 and 20.4 ms).
template <int G, int R>
PQ_ALWAYS_INLINE PQ_ATTEND_TARGET_BF16 void logits_rows_dp(const uint8_t* const* keys,
                                                           const uint16_t* qb, int32_t d,
                                                           float scale, float* logits, int64_t i) {
  __m512 acc[G][R];
  PQ_UNROLL for (int g = 0; g < G; ++g) PQ_UNROLL for (int r = 0; r < R; ++r) acc[g][r] =
      _mm512_setzero_ps();
  for (int32_t k = 0; k < d; k += 32) {
    const __mmask32 m = d - k >= 32 ? __mmask32(0xFFFFFFFFu) : static_cast<__mmask32>((1u << (d - k)) - 1);
    __m512bh key[R];
    PQ_UNROLL for (int r = 0; r < R; ++r) key[r] =
        (__m512bh)_mm512_maskz_loadu_epi16(m, keys[i + r] + 2 * k);
    PQ_UNROLL for (int g = 0; g < G; ++g) {
      const __m512bh qg = (__m512bh)_mm512_maskz_loadu_epi16(m, qb + static_cast<size_t>(g) * d + k);
      PQ_UNROLL for (int r = 0; r < R; ++r) acc[g][r] = _mm512_dpbf16_ps(acc[g][r], qg, key[r]);
    }
  }
  PQ_UNROLL for (int g = 0; g < G; ++g) store_sums<R>(acc[g], scale, logits + g * kB + i, 1);
}

// acc[g][k..k + 16W) += sum_i w[g][i] * V_i[k..k + 16W) over the block, the
// strip of every query head in registers.
template <int Dtype, int G, int W>
PQ_KERNEL void add_values(const uint8_t* const* values, const float* w, int64_t rows, int32_t d,
                          int32_t k, float* acc) {
  __m512 o[G][W];
  __mmask16 m[W];
  PQ_UNROLL for (int s = 0; s < W; ++s) m[s] = lanes(d - k - 16 * s);
  PQ_UNROLL for (int g = 0; g < G; ++g) PQ_UNROLL for (int s = 0; s < W; ++s) o[g][s] =
      _mm512_maskz_loadu_ps(m[s], acc + static_cast<size_t>(g) * d + k + 16 * s);
  for (int64_t i = 0; i < rows; ++i) {
    __m512 v[W];
    if constexpr (kElem<Dtype> == 1 && W % 2 == 0) {
      PQ_UNROLL for (int s = 0; s < W; s += 2)
          load32_fp8<Dtype>(values[i] + k + 16 * s, lanes32(d - k - 16 * s), v[s], v[s + 1]);
    } else {
      PQ_UNROLL for (int s = 0; s < W; ++s)
          v[s] = load16<Dtype>(values[i] + (k + 16 * s) * kElem<Dtype>, m[s]);
    }
    PQ_UNROLL for (int g = 0; g < G; ++g) {
      const __m512 wg = _mm512_set1_ps(w[g * kB + i]);
      PQ_UNROLL for (int s = 0; s < W; ++s) o[g][s] = _mm512_fmadd_ps(wg, v[s], o[g][s]);
    }
  }
  PQ_UNROLL for (int g = 0; g < G; ++g) PQ_UNROLL for (int s = 0; s < W; ++s)
      _mm512_mask_storeu_ps(acc + static_cast<size_t>(g) * d + k + 16 * s, m[s], o[g][s]);
}

// softmax_block (attention.cpp) with the block's max, exps and sum 16 rows
// a register (the sum's order differs from the scalar kernel's: the attend
// is checked against a double reference, not for bits). Lanes from `rows`
// on may hold an earlier block's exps: masked out of the max and the sum.
PQ_ATTEND_TARGET void softmax_block16(float* logits, int64_t rows, int32_t group, int32_t d,
                                      AttentionPart part) {
  static_assert(kB == 32, "two registers of logits a query head");
  const __mmask16 m0 = lanes(static_cast<int32_t>(rows));
  const __mmask16 m1 = rows > 16 ? lanes(static_cast<int32_t>(rows - 16)) : __mmask16(0);
  const __m512 none = _mm512_set1_ps(kNoRows);
  for (int32_t g = 0; g < group; ++g) {
    float* l = logits + static_cast<size_t>(g) * kB;
    const __m512 l0 = _mm512_load_ps(l), l1 = _mm512_load_ps(l + 16);
    const float block_max = _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_mask_mov_ps(none, m0, l0), _mm512_mask_mov_ps(none, m1, l1)));
    if (block_max > part.max[g]) {
      const float rescale = part.max[g] == kNoRows ? 0.f : exp_nonpositive(part.max[g] - block_max);
      float* acc = part.acc + static_cast<size_t>(g) * d;
      const __m512 r = _mm512_set1_ps(rescale);
      int32_t k = 0;
      for (; k + 16 <= d; k += 16) _mm512_storeu_ps(acc + k, _mm512_mul_ps(r, _mm512_loadu_ps(acc + k)));
      for (; k < d; ++k) acc[k] *= rescale;
      part.sum[g] *= rescale;
      part.max[g] = block_max;
    }
    const __m512 max = _mm512_set1_ps(part.max[g]);
    const __m512 e0 = _mm512_maskz_mov_ps(m0, exp_nonpositive16(_mm512_sub_ps(l0, max)));
    const __m512 e1 = _mm512_maskz_mov_ps(m1, exp_nonpositive16(_mm512_sub_ps(l1, max)));
    _mm512_store_ps(l, e0);
    _mm512_store_ps(l + 16, e1);
    part.sum[g] += _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
  }
}

// Compiled with avx512bf16 allowed for every dtype (one attribute for a
// template); only the paths chosen where the CPU has it use it: Logits
// kBf16Dot (bf16 rows and queries, logits_rows_dp) or kAmxBf16 (the same
// on AMX tiles, attention_amx.h), DpValues (bf16 rows,
// add_values_pairs_bf16; fp8 rows where the CPU also has VBMI,
// add_values_pairs).
template <int Dtype, int G, AttendLogits Logits, bool DpValues>
PQ_ATTEND_TARGET_BF16 void attend_block_rows(const KvStore::RowTable& t, int32_t kv_head,
                                             const int32_t* pos, int64_t count,
                                             const float* queries, float scale,
                                             AttentionPart part) {
  // Registers: logits hold R x G accumulators, R keys and a query (fp8: 2R
  // and two; at most 26 of 32); values W strips of G and W rows. fp8 takes
  // four strips at G = 4 (21 registers), a whole 64-byte line of each row
  // a pass and half the weight broadcasts: its attend is bound by these
  // instructions, not by memory (see docs/perf.md).
  constexpr int kRows = G <= 4 ? 4 : 2;
  constexpr int kStrips = (G <= 2 || (kElem<Dtype> == 1 && G <= 4)) ? 4 : G <= 4 ? 2 : 1;
  constexpr bool kDpLogits = Logits == AttendLogits::kBf16Dot && Dtype == PQ_DTYPE_BF16;
  constexpr bool kAmxLogits = Logits == AttendLogits::kAmxBf16 && Dtype == PQ_DTYPE_BF16;
  constexpr bool kDpValues = DpValues && (Dtype == PQ_DTYPE_BF16 || kElem<Dtype> == 1);
  const int32_t d = t.head_dim;
  scale *= kLoadScale<Dtype>;  // exact: a power of two
  // Zeroed: softmax_block16 takes the exps of all kB lanes, rows or not.
  alignas(64) float logits[G * kB] = {};
  const uint8_t* keys[kB];
  const uint8_t* values[kB];
  uint16_t qb[kDpLogits || kAmxLogits ? G * 256 : 1];  // the queries as bf16 (head_dim <= 256 here)
  if constexpr (kDpLogits || kAmxLogits)
    for (int32_t j = 0; j < G * d; ++j) {
      uint32_t bits;
      std::memcpy(&bits, queries + j, sizeof bits);
      qb[j] = static_cast<uint16_t>(bits >> 16);
    }
  [[maybe_unused]] AmxLogitsScratch* amx = nullptr;
  if constexpr (kAmxLogits) {
    thread_local AmxLogitsScratch scratch;
    amx = &scratch;
    amx_logits_begin(qb, G, d, scratch);
  }
  for (int64_t i = 0; i < std::min(count, kPrefetchRows); ++i) prefetch_row(t, kv_head, pos[i]);
  for (int64_t b = 0; b < count; b += kB) {
    const int64_t rows = std::min(kB, count - b);
    for (int64_t i = 0; i < rows; ++i) {
      keys[i] = t.key_row(pos[b + i], kv_head);
      values[i] = t.value_row(pos[b + i], kv_head);
    }
    const int64_t ahead = b + kPrefetchRows;
    int64_t i = 0;
    if constexpr (kAmxLogits) {
      for (; i < rows; ++i)
        if (ahead + i < count) prefetch_row(t, kv_head, pos[ahead + i]);
      amx_logits_block(keys, rows, G, d, scale, logits, *amx);
    }
    for (; i + kRows <= rows; i += kRows) {
      for (int r = 0; r < kRows; ++r)
        if (ahead + i + r < count) prefetch_row(t, kv_head, pos[ahead + i + r]);
      if constexpr (kDpLogits)
        logits_rows_dp<G, kRows>(keys, qb, d, scale, logits, i);
      else
        logits_rows<Dtype, G, kRows>(keys, queries, d, scale, logits, i);
    }
    for (; i < rows; ++i) {
      if (ahead + i < count) prefetch_row(t, kv_head, pos[ahead + i]);
      if constexpr (kDpLogits)
        logits_rows_dp<G, 1>(keys, qb, d, scale, logits, i);
      else
        logits_rows<Dtype, G, 1>(keys, queries, d, scale, logits, i);
    }
    softmax_block16(logits, rows, G, d, part);
    int32_t k = 0;
    if constexpr (kDpValues) {
      constexpr int kPairStrips = G <= 4 ? 4 : 2;
      alignas(64) uint16_t wb[G * kB];  // the weights as bf16 (round to nearest even)
      PQ_UNROLL for (int g = 0; g < G; ++g) {
        const float* l = logits + g * kB;
        _mm256_store_si256(reinterpret_cast<__m256i*>(wb + g * kB),
                           (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(l)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(wb + g * kB + 16),
                           (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(l + 16)));
      }
      for (; k + 16 * kPairStrips <= d; k += 16 * kPairStrips)
        if constexpr (Dtype == PQ_DTYPE_BF16)
          add_values_pairs_bf16<G, kPairStrips>(values, wb, rows, d, k, part.acc);
        else
          add_values_pairs<Dtype, G, kPairStrips>(values, wb, rows, d, k, part.acc);
    }
    for (; k + 16 * kStrips <= d; k += 16 * kStrips)
      add_values<Dtype, G, kStrips>(values, logits, rows, d, k, part.acc);
    for (; k < d; k += 16) add_values<Dtype, G, 1>(values, logits, rows, d, k, part.acc);
  }
  if constexpr (kAmxLogits) amx_logits_end();
  if constexpr (kLoadScale<Dtype> != 1.f)
    for (int64_t j = 0; j < int64_t{G} * d; ++j) part.acc[j] *= kLoadScale<Dtype>;
}

template <int Dtype, AttendLogits Logits, bool DpValues>
bool attend_dtype(const KvStore::RowTable& t, int32_t kv_head, const int32_t* pos, int64_t count,
                  const float* q, int32_t group, float scale, AttentionPart part) {
  return with_group(group, [&](auto g) {
    attend_block_rows<Dtype, decltype(g)::value, Logits, DpValues>(t, kv_head, pos, count, q,
                                                                   scale, part);
  });
}

// Whether every query float is a bf16 (its low 16 bits zero): then the
// VDPBF16PS logits are exact products, as the FMA path's.
bool queries_are_bf16(const float* q, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    uint32_t bits;
    std::memcpy(&bits, q + j, sizeof bits);
    if ((bits & 0xFFFFu) != 0) return false;
  }
  return true;
}

}  // namespace

bool attend_rounds_weights_to_bf16(int32_t dtype, int32_t group) {
  if (group < 1 || group > 8 || !cpu_has_avx512_bf16()) return false;
  return dtype == PQ_DTYPE_BF16 || (dtype_is_fp8(dtype) && cpu_has_avx512_vbmi());
}

bool attend_rows_avx512_with(const KvStore::RowTable& t, int32_t kv_head, const int32_t* pos,
                             int64_t count, const float* queries, int32_t group, float scale,
                             AttentionPart part, AttendLogits logits, F16Conversion f16) {
  constexpr auto kFma = AttendLogits::kFma;
  if (f16 == F16Conversion::kAvx512Fp16) {
    if (t.dtype != PQ_DTYPE_F16 || logits != kFma || !cpu_has_avx512_fp16()) return false;
    return attend_dtype<kF16ByAvx512Fp16, kFma, false>(t, kv_head, pos, count, queries, group, scale, part);
  }
  const bool pairs = attend_rounds_weights_to_bf16(t.dtype, group);
  if (logits != kFma) {  // bf16 keys and queries only
    if (t.dtype != PQ_DTYPE_BF16 || !pairs || t.head_dim > 256 ||
        !queries_are_bf16(queries, int64_t{group} * t.head_dim))
      return false;
    if (logits == AttendLogits::kAmxBf16 &&
        !(cpu_has_amx_bf16() && amx_logits_shape_ok(group, t.head_dim)))
      return false;
  }
  switch (t.dtype) {
    case PQ_DTYPE_F16:
      return attend_dtype<PQ_DTYPE_F16, kFma, false>(t, kv_head, pos, count, queries, group, scale, part);
    case PQ_DTYPE_BF16:
      if (!pairs)
        return attend_dtype<PQ_DTYPE_BF16, kFma, false>(t, kv_head, pos, count, queries, group, scale, part);
      if (logits == AttendLogits::kAmxBf16)
        return attend_dtype<PQ_DTYPE_BF16, AttendLogits::kAmxBf16, true>(t, kv_head, pos, count, queries, group, scale, part);
      if (logits == AttendLogits::kBf16Dot)
        return attend_dtype<PQ_DTYPE_BF16, AttendLogits::kBf16Dot, true>(t, kv_head, pos, count, queries, group, scale, part);
      return attend_dtype<PQ_DTYPE_BF16, kFma, true>(t, kv_head, pos, count, queries, group, scale, part);
    case PQ_DTYPE_F32:
      return attend_dtype<PQ_DTYPE_F32, kFma, false>(t, kv_head, pos, count, queries, group, scale, part);
    case PQ_DTYPE_FP8_E4M3:
      return pairs
                 ? attend_dtype<PQ_DTYPE_FP8_E4M3, kFma, true>(t, kv_head, pos, count, queries, group, scale, part)
                 : attend_dtype<PQ_DTYPE_FP8_E4M3, kFma, false>(t, kv_head, pos, count, queries, group, scale, part);
    case PQ_DTYPE_FP8_E5M2:
      return pairs
                 ? attend_dtype<PQ_DTYPE_FP8_E5M2, kFma, true>(t, kv_head, pos, count, queries, group, scale, part)
                 : attend_dtype<PQ_DTYPE_FP8_E5M2, kFma, false>(t, kv_head, pos, count, queries, group, scale, part);
    default: return false;
  }
}

bool attend_rows_avx512(const KvStore::RowTable& t, int32_t kv_head, const int32_t* pos,
                        int64_t count, const float* queries, int32_t group, float scale,
                        AttentionPart part) {
  // bf16 keys and queries: VDPBF16PS, which measured faster than the FMA
  // logits in cache (see logits_rows_dp) and than AMX tiles
  // (attention_amx.h); falls back to the FMA logits where it does not
  // apply.
  return attend_rows_avx512_with(t, kv_head, pos, count, queries, group, scale, part,
                                 AttendLogits::kBf16Dot) ||
         attend_rows_avx512_with(t, kv_head, pos, count, queries, group, scale, part,
                                 AttendLogits::kFma);
}

}  // namespace pq

#else  // not x86-64 with GCC or Clang: the AVX2 and portable kernels alone

namespace pq {
bool attend_rounds_weights_to_bf16(int32_t, int32_t) { return false; }
bool attend_rows_avx512(const KvStore::RowTable&, int32_t, const int32_t*, int64_t, const float*,
                        int32_t, float, AttentionPart) {
  return false;
}
bool attend_rows_avx512_with(const KvStore::RowTable&, int32_t, const int32_t*, int64_t,
                             const float*, int32_t, float, AttentionPart, AttendLogits,
                             F16Conversion) {
  return false;
}
}  // namespace pq

#endif
