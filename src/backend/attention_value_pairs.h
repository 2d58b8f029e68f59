// The value sums of the AVX-512 attend (attention_avx512.cpp) on
// VDPBF16PS, two rows a dot product, for bf16 rows and, where the CPU also
// has AVX512_VBMI, fp8 rows: the one place the attend rounds its softmax
// weights, to bf16 (at most 2^-8 x sum_i softmax_i |V_i| per output
// element, documented at pq_decode_attend). Included by
// attention_avx512.cpp alone; its targets are the macros below.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/attention.h"
#include "backend/attention_simd.h"
#include "base/cpu_dispatch.h"
#include "base/dtype.h"
#include "pqcache.h"

// Not cpu_dispatch.h's PQ_TARGET_AVX512: the attend's logits and sums may
// fuse and reorder (they are checked against a double reference, not for
// bits), so fp-contract stays on here.
#define PQ_ATTEND_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
#define PQ_ATTEND_TARGET_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,avx512bf16")))
#define PQ_KERNEL PQ_ALWAYS_INLINE PQ_ATTEND_TARGET
#define PQ_ATTEND_TARGET_PAIRS \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,avx512bf16,avx512vbmi")))

namespace pq {

// o[g][s] += the pair of rows i, i + 1 (v, interleaved as bf16 pairs) times
// their weights' pair in wb ([G][kAttentionBlockRows] bf16).
template <int G, int W>
PQ_ALWAYS_INLINE PQ_ATTEND_TARGET_BF16 void add_pair(__m512 (&o)[G][W], const __m512bh (&v)[W],
                                                     const uint16_t* wb, int64_t i) {
  PQ_UNROLL for (int g = 0; g < G; ++g) {
    uint32_t pair;
    std::memcpy(&pair, wb + g * kAttentionBlockRows + i, sizeof pair);
    const __m512bh wp = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
    PQ_UNROLL for (int s = 0; s < W; ++s) o[g][s] = _mm512_dpbf16_ps(o[g][s], v[s], wp);
  }
}

// The value pass of fp8 rows with VDPBF16PS (AVX512_BF16) and VPERMT2B
// (AVX512_VBMI): two rows a step. Their bytes are interleaved, each code
// looked up as its bf16 (exact: every e4m3 and e5m2 value is a normal
// bf16), and the pairs (V_r[j], V_r+1[j]) multiplied by the pair of their
// weights rounded to bf16 (2^-8 relative, against e4m3's own 2^-4; GPU fp8
// attention rounds the weights to fp8). Per two rows of 64 elements and
// four query heads: 14 loads, permutes and unpacks and 16 dot products,
// where the float pass takes 24 conversions and 32 FMAs; the fp8 attend
// was bound by those (docs/perf.md).
struct Fp8Bf16Bytes {
  alignas(64) uint8_t lo[128];  // low byte of the bf16 of each code 0..127
  alignas(64) uint8_t hi[128];  // high byte (the sign is the code's bit 7)
};

// The codes' bf16, divided by kLoadScale as the other loads' floats are.
template <int Dtype>
const Fp8Bf16Bytes& fp8_bf16_bytes() {
  static const Fp8Bf16Bytes table = [] {
    Fp8Bf16Bytes t{};
    for (int c = 0; c < 128; ++c) {
      const float f = (Dtype == PQ_DTYPE_FP8_E4M3 ? kE4m3ToFloat[c] : kE5m2ToFloat[c]) /
                      kLoadScale<Dtype>;
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof bits);  // at most 3 significant bits: the bf16 is exact
      t.lo[c] = static_cast<uint8_t>(bits >> 16);
      t.hi[c] = static_cast<uint8_t>(bits >> 24);
    }
    return t;
  }();
  return table;
}

// The VPERMT2B indices of the interleave, for the 32 elements from 0 and
// from 32: byte p takes row r's element j (p even) or row r + 1's (p odd),
// ordered so that the in-lane unpacks of the looked-up bytes give elements
// 0..15 (low) and 16..31 (high) of the 32, in order. Built at compile time:
// the pass loads them once per call.
struct PairInterleave {
  alignas(64) uint8_t idx[2][64];
  constexpr PairInterleave() : idx{} {
    for (int h = 0; h < 2; ++h)
      for (int p = 0; p < 64; ++p) {
        const int lane = p / 16, o = p % 16;
        const int j = (o < 8 ? 0 : 16) + 4 * lane + (o % 8) / 2;
        idx[h][p] = static_cast<uint8_t>((o % 2 ? 64 : 0) + 32 * h + j);
      }
  }
};
inline constexpr PairInterleave kPairInterleave{};

// acc[g][k..k + 16W) += sum_i w[g][i] * V_i[k..k + 16W) over the block (W
// 2 or 4), as add_values, with the weights as bf16 pairs (wb [G][kB]; rows
// past `rows` weigh 0).
// Not inlined: its target adds AVX512_VBMI, which attend_block_rows (run on
// CPUs without it) must not be compiled with.
template <int Dtype, int G, int W>
__attribute__((noinline)) PQ_ATTEND_TARGET_PAIRS void add_values_pairs(const uint8_t* const* values,
                                                              const uint16_t* wb, int64_t rows,
                                                              int32_t d, int32_t k, float* acc) {
  static_assert(W == 2 || W == 4, "an interleave gives two strips");
  const Fp8Bf16Bytes& t = fp8_bf16_bytes<Dtype>();
  const __m512i lo0 = _mm512_load_si512(t.lo), lo1 = _mm512_load_si512(t.lo + 64);
  const __m512i hi0 = _mm512_load_si512(t.hi), hi1 = _mm512_load_si512(t.hi + 64);
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i idx[W / 2];
  PQ_UNROLL for (int h = 0; h < W / 2; ++h) idx[h] = _mm512_load_si512(kPairInterleave.idx[h]);
  __m512 o[G][W];
  PQ_UNROLL for (int g = 0; g < G; ++g) PQ_UNROLL for (int s = 0; s < W; ++s) o[g][s] =
      _mm512_loadu_ps(acc + static_cast<size_t>(g) * d + k + 16 * s);
  const __mmask64 bytes = W == 4 ? ~__mmask64(0) : __mmask64(0xFFFFFFFFu);
  for (int64_t i = 0; i < rows; i += 2) {
    const __m512i a = _mm512_maskz_loadu_epi8(bytes, values[i] + k);
    const __m512i b = _mm512_maskz_loadu_epi8(bytes, values[i + 1 < rows ? i + 1 : i] + k);
    __m512bh v[W];
    PQ_UNROLL for (int h = 0; h < W / 2; ++h) {
      const __m512i x = _mm512_permutex2var_epi8(a, idx[h], b);
      const __m512i l = _mm512_permutex2var_epi8(lo0, x, lo1);
      const __m512i u = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi0, x, hi1), x, sign, 0xF8);
      v[2 * h] = (__m512bh)_mm512_unpacklo_epi8(l, u);
      v[2 * h + 1] = (__m512bh)_mm512_unpackhi_epi8(l, u);
    }
    add_pair<G, W>(o, v, wb, i);
  }
  PQ_UNROLL for (int g = 0; g < G; ++g) PQ_UNROLL for (int s = 0; s < W; ++s)
      _mm512_storeu_ps(acc + static_cast<size_t>(g) * d + k + 16 * s, o[g][s]);
}

// The value pass of bf16 rows with VDPBF16PS, two rows a step: their
// elements interleaved as pairs by the 16-bit unpacks (no conversion at
// all) and multiplied by the pair of their weights rounded to bf16, as
// PyTorch's CPU flash attention rounds them to the rows' type before the
// product with V. The unpacks work within 128-bit lanes, so o[g][2h] holds
// elements 32h + 8L + j and o[g][2h + 1] elements 32h + 8L + 4 + j (lane L,
// j < 4); acc is permuted into that order and back once per call.
template <int G, int W>
PQ_ALWAYS_INLINE PQ_ATTEND_TARGET_BF16 void add_values_pairs_bf16(const uint8_t* const* values,
                                                                  const uint16_t* wb, int64_t rows,
                                                                  int32_t d, int32_t k, float* acc) {
  static_assert(W == 2 || W == 4, "an unpack gives two strips");
  const __m512i to_lo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const __m512i to_hi = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  const __m512i from_lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i from_hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  __m512 o[G][W];
  PQ_UNROLL for (int g = 0; g < G; ++g) PQ_UNROLL for (int h = 0; h < W / 2; ++h) {
    const float* a = acc + static_cast<size_t>(g) * d + k + 32 * h;
    const __m512 lo = _mm512_loadu_ps(a), hi = _mm512_loadu_ps(a + 16);
    o[g][2 * h] = _mm512_permutex2var_ps(lo, to_lo, hi);
    o[g][2 * h + 1] = _mm512_permutex2var_ps(lo, to_hi, hi);
  }
  for (int64_t i = 0; i < rows; i += 2) {
    const uint8_t* ra = values[i] + 2 * k;
    const uint8_t* rb = values[i + 1 < rows ? i + 1 : i] + 2 * k;
    __m512bh v[W];
    PQ_UNROLL for (int h = 0; h < W / 2; ++h) {
      const __m512i a = _mm512_loadu_si512(ra + 64 * h), b = _mm512_loadu_si512(rb + 64 * h);
      v[2 * h] = (__m512bh)_mm512_unpacklo_epi16(a, b);
      v[2 * h + 1] = (__m512bh)_mm512_unpackhi_epi16(a, b);
    }
    add_pair<G, W>(o, v, wb, i);
  }
  PQ_UNROLL for (int g = 0; g < G; ++g) PQ_UNROLL for (int h = 0; h < W / 2; ++h) {
    float* a = acc + static_cast<size_t>(g) * d + k + 32 * h;
    _mm512_storeu_ps(a, _mm512_permutex2var_ps(o[g][2 * h], from_lo, o[g][2 * h + 1]));
    _mm512_storeu_ps(a + 16, _mm512_permutex2var_ps(o[g][2 * h], from_hi, o[g][2 * h + 1]));
  }
}

}  // namespace pq

#endif
