// The AVX2 + FMA + F16C kernel of attend_rows (attention.h): per block of
// rows, the group's logits with two rows and all query heads in registers,
// then the values added into output strips held in registers across the
// block. Row addresses come from the store's RowTable; rows ahead are
// prefetched a row at a time between the logits.
#include "backend/attention.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>

#include <algorithm>

#include "backend/attention_simd.h"
#include "base/cpu_dispatch.h"
#include "base/fast_exp.h"
#include "pqcache.h"

#define PQ_TARGET_AVX2_FMA __attribute__((target("avx2,fma,f16c")))
#define PQ_KERNEL PQ_ALWAYS_INLINE PQ_TARGET_AVX2_FMA

namespace pq {

namespace {

constexpr int64_t kB = kAttentionBlockRows;
// Rows prefetched ahead of the one being computed. Selectors return
// positions ascending, which the hardware prefetcher follows within a page;
// positions in any other order (the API accepts them) need the software
// prefetch: on the 2-core machine of docs/perf.md, shuffled positions over
// 128K tokens took 69 ms without it and 43-58 ms with 64 rows ahead, while
// ascending ones took the same either way. The prefetches go to L2 (T1):
// into L1 (T0) they evict the block being computed; on an AMD EPYC with
// 2 cores (PQ_CPU_LEVEL=avx2) a 128K attend took 14.5-16.4 ms with T0 and
// 9.0-11.6 ms with T1 (f16 and bf16, interleaved runs, 2026-11-29), as the
// AVX-512 kernel measured.
constexpr int64_t kPrefetchRows = 64;

// Eight elements of a row as floats (times 1 / kLoadScale). fp8 rows are
// half the bytes of f16 and take two integer instructions more: an e5m2
// code is the top byte of a binary16, and an e4m3 code b is the binary16
// ((b & 0x80) << 8) | ((b & 0x7F) << 7) times 2^8, normals and subnormals
// alike (the exponent biases differ by 8): sign-extended and shifted by 7,
// the sign lands in bit 15 and the rest in bits 7..13, and the mask clears
// bit 14 (a copy of the sign). A table gather (_mm256_i32gather_ps over the
// 256 values) measured slower (bench_fp8).
template <int Dtype>
PQ_KERNEL __m256 load8(const uint8_t* p) {
  if constexpr (Dtype == PQ_DTYPE_FP8_E5M2 || Dtype == PQ_DTYPE_FP8_E4M3) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    if constexpr (Dtype == PQ_DTYPE_FP8_E4M3)
      return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(bytes), 7),
                                           _mm_set1_epi16(static_cast<short>(0xBF80))));
    return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(bytes), 8));
  } else if constexpr (Dtype == PQ_DTYPE_F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (Dtype == PQ_DTYPE_BF16) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  } else {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
}

// Sixteen fp8 elements as floats (times 1 / kLoadScale) in two registers:
// load8's bit route 16 at a time, so the integer steps run once per 16
// elements, not per 8.
template <int Dtype>
PQ_KERNEL void load16_fp8(const uint8_t* p, __m256& lo, __m256& hi) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  __m256i w;
  if constexpr (Dtype == PQ_DTYPE_FP8_E4M3)
    w = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7),
                         _mm256_set1_epi16(static_cast<short>(0xBF80)));
  else
    w = _mm256_slli_epi16(_mm256_cvtepu8_epi16(bytes), 8);
  lo = _mm256_cvtph_ps(_mm256_castsi256_si128(w));
  hi = _mm256_cvtph_ps(_mm256_extracti128_si256(w, 1));
}

PQ_KERNEL float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

PQ_KERNEL void prefetch_rows(const KvStore::RowTable& t, int32_t kv_head, const int32_t* pos,
                             int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) {
    const uint8_t* k = t.key_row(pos[i], kv_head);
    const uint8_t* v = t.value_row(pos[i], kv_head);
    for (size_t b = 0; b < t.row_bytes; b += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(k + b), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(v + b), _MM_HINT_T1);
    }
  }
}

// logits[g * kB + i] for R rows from i: each key vector loaded once for the
// group, R x G accumulators.
template <int Dtype, int G, int R>
PQ_KERNEL void logits_rows(const uint8_t* const* keys, const float* q, int32_t d, float scale,
                           float* logits, int64_t i) {
  __m256 acc[R][G];
  PQ_UNROLL for (int r = 0; r < R; ++r) PQ_UNROLL for (int g = 0; g < G; ++g) acc[r][g] =
      _mm256_setzero_ps();
  int32_t k = 0;
  if constexpr (kElem<Dtype> == 1)
    for (; k + 16 <= d; k += 16) {
      __m256 key0[R], key1[R];
      PQ_UNROLL for (int r = 0; r < R; ++r) load16_fp8<Dtype>(keys[i + r] + k, key0[r], key1[r]);
      PQ_UNROLL for (int g = 0; g < G; ++g) {
        const float* qg = q + static_cast<size_t>(g) * d + k;
        const __m256 q0 = _mm256_loadu_ps(qg), q1 = _mm256_loadu_ps(qg + 8);
        PQ_UNROLL for (int r = 0; r < R; ++r) {
          acc[r][g] = _mm256_fmadd_ps(q0, key0[r], acc[r][g]);
          acc[r][g] = _mm256_fmadd_ps(q1, key1[r], acc[r][g]);
        }
      }
    }
  for (; k < d; k += 8) {
    __m256 key[R];
    PQ_UNROLL for (int r = 0; r < R; ++r) key[r] = load8<Dtype>(keys[i + r] + k * kElem<Dtype>);
    PQ_UNROLL for (int g = 0; g < G; ++g) {
      const __m256 qg = _mm256_loadu_ps(q + static_cast<size_t>(g) * d + k);
      PQ_UNROLL for (int r = 0; r < R; ++r) acc[r][g] = _mm256_fmadd_ps(qg, key[r], acc[r][g]);
    }
  }
  PQ_UNROLL for (int r = 0; r < R; ++r) PQ_UNROLL for (int g = 0; g < G; ++g)
      logits[g * kB + i + r] = hsum(acc[r][g]) * scale;
}

// acc[g][k..k + 8W) += sum_i w[g][i] * V_i[k..k + 8W) over the block, the
// strip of every query head in registers.
template <int Dtype, int G, int W>
PQ_KERNEL void add_values(const uint8_t* const* values, const float* w, int64_t rows, int32_t d,
                          int32_t k, float* acc) {
  __m256 o[G][W];
  PQ_UNROLL for (int g = 0; g < G; ++g) PQ_UNROLL for (int s = 0; s < W; ++s) o[g][s] =
      _mm256_loadu_ps(acc + static_cast<size_t>(g) * d + k + 8 * s);
  for (int64_t i = 0; i < rows; ++i) {
    __m256 v[W];
    if constexpr (kElem<Dtype> == 1 && W == 2) {
      load16_fp8<Dtype>(values[i] + k, v[0], v[1]);
    } else {
      PQ_UNROLL for (int s = 0; s < W; ++s)
          v[s] = load8<Dtype>(values[i] + (k + 8 * s) * kElem<Dtype>);
    }
    PQ_UNROLL for (int g = 0; g < G; ++g) {
      const __m256 wg = _mm256_broadcast_ss(w + g * kB + i);
      PQ_UNROLL for (int s = 0; s < W; ++s) o[g][s] = _mm256_fmadd_ps(wg, v[s], o[g][s]);
    }
  }
  PQ_UNROLL for (int g = 0; g < G; ++g) PQ_UNROLL for (int s = 0; s < W; ++s)
      _mm256_storeu_ps(acc + static_cast<size_t>(g) * d + k + 8 * s, o[g][s]);
}

// softmax_block (attention.cpp) with the block's max and sum 8 rows a
// register and the exps vectorised (the sum's order differs from the
// portable kernel's: the attend is checked against a double reference, not
// for bits). Only the first `rows` logits are read into the max and sum.
PQ_TARGET_AVX2_FMA void softmax_block8(float* logits, int64_t rows, int32_t group, int32_t d,
                                       AttentionPart part) {
  for (int32_t g = 0; g < group; ++g) {
    float* l = logits + static_cast<size_t>(g) * kB;
    __m256 wide_max = _mm256_set1_ps(kNoRows);
    int64_t i = 0;
    for (; i + 8 <= rows; i += 8) wide_max = _mm256_max_ps(wide_max, _mm256_load_ps(l + i));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(wide_max), _mm256_extractf128_ps(wide_max, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float block_max = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    for (; i < rows; ++i) block_max = l[i] > block_max ? l[i] : block_max;
    if (block_max > part.max[g]) {
      const float rescale = part.max[g] == kNoRows ? 0.f : exp_nonpositive(part.max[g] - block_max);
      float* acc = part.acc + static_cast<size_t>(g) * d;
      for (int32_t k = 0; k < d; ++k) acc[k] *= rescale;  // vectorised
      part.sum[g] *= rescale;
      part.max[g] = block_max;
    }
    const float max = part.max[g];
    alignas(32) float e[kB];
    for (int64_t j = 0; j < kB; ++j) e[j] = exp_nonpositive(l[j] - max);  // vectorised
    __m256 wide_sum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= rows; i += 8) {
      const __m256 ei = _mm256_load_ps(e + i);
      _mm256_store_ps(l + i, ei);
      wide_sum = _mm256_add_ps(wide_sum, ei);
    }
    float block_sum = hsum(wide_sum);
    for (; i < rows; ++i) block_sum += (l[i] = e[i]);
    part.sum[g] += block_sum;
  }
}

template <int Dtype, int G>
PQ_TARGET_AVX2_FMA void attend_block_rows(const KvStore::RowTable& t, int32_t kv_head,
                                          const int32_t* pos, int64_t count,
                                          const float* queries, float scale, AttentionPart part) {
  // Registers: logits use 2G accumulators + 2 keys + 1 query (16 for G = 4
  // with two rows; one row above); values 2 strips of G (one above 4).
  constexpr int kRows = G <= 4 ? 2 : 1;
  constexpr int kStrips = G <= 4 ? 2 : 1;
  const int32_t d = t.head_dim;
  // Exact: a power of two. The values' factor is applied to acc at the end.
  scale *= kLoadScale<Dtype>;
  // Zeroed: softmax_block8 takes the exps of all kB lanes, rows or not.
  alignas(32) float logits[G * kB] = {};
  const uint8_t* keys[kB];
  const uint8_t* values[kB];
  // Prefetches go out a row at a time between the logits of the current
  // rows, kPrefetchRows ahead: a burst of a block's prefetches fills the
  // core's miss buffers and stalls it, so memory and arithmetic would take
  // turns instead of overlapping.
  prefetch_rows(t, kv_head, pos, std::min(count, kPrefetchRows));
  for (int64_t b = 0; b < count; b += kB) {
    const int64_t rows = std::min(kB, count - b);
    for (int64_t i = 0; i < rows; ++i) {
      keys[i] = t.key_row(pos[b + i], kv_head);
      values[i] = t.value_row(pos[b + i], kv_head);
    }
    const int64_t ahead = b + kPrefetchRows;
    int64_t i = 0;
    for (; i + kRows <= rows; i += kRows) {
      if (ahead + i + kRows <= count) prefetch_rows(t, kv_head, pos + ahead + i, kRows);
      logits_rows<Dtype, G, kRows>(keys, queries, d, scale, logits, i);
    }
    for (; i < rows; ++i) {
      if (ahead + i < count) prefetch_rows(t, kv_head, pos + ahead + i, 1);
      logits_rows<Dtype, G, 1>(keys, queries, d, scale, logits, i);
    }
    softmax_block8(logits, rows, G, d, part);
    int32_t k = 0;
    for (; k + 8 * kStrips <= d; k += 8 * kStrips)
      add_values<Dtype, G, kStrips>(values, logits, rows, d, k, part.acc);
    for (; k < d; k += 8) add_values<Dtype, G, 1>(values, logits, rows, d, k, part.acc);
  }
  if constexpr (kLoadScale<Dtype> != 1.f)
    for (int64_t j = 0; j < int64_t{G} * d; ++j) part.acc[j] *= kLoadScale<Dtype>;
}

template <int Dtype>
bool attend_dtype(const KvStore::RowTable& t, int32_t kv_head, const int32_t* pos, int64_t count,
                  const float* q, int32_t group, float scale, AttentionPart part) {
  return with_group(group, [&](auto g) {
    attend_block_rows<Dtype, decltype(g)::value>(t, kv_head, pos, count, q, scale, part);
  });
}

}  // namespace

bool attend_rows_avx2(const KvStore::RowTable& t, int32_t kv_head, const int32_t* pos,
                      int64_t count, const float* queries, int32_t group, float scale,
                      AttentionPart part) {
  if (t.head_dim % 8 != 0) return false;
  switch (t.dtype) {
    case PQ_DTYPE_F16: return attend_dtype<PQ_DTYPE_F16>(t, kv_head, pos, count, queries, group, scale, part);
    case PQ_DTYPE_BF16: return attend_dtype<PQ_DTYPE_BF16>(t, kv_head, pos, count, queries, group, scale, part);
    case PQ_DTYPE_F32: return attend_dtype<PQ_DTYPE_F32>(t, kv_head, pos, count, queries, group, scale, part);
    case PQ_DTYPE_FP8_E4M3:
      return attend_dtype<PQ_DTYPE_FP8_E4M3>(t, kv_head, pos, count, queries, group, scale, part);
    case PQ_DTYPE_FP8_E5M2:
      return attend_dtype<PQ_DTYPE_FP8_E5M2>(t, kv_head, pos, count, queries, group, scale, part);
    default: return false;
  }
}

}  // namespace pq

#else  // not x86-64 with GCC or Clang: the portable kernel alone

namespace pq {
bool attend_rows_avx2(const KvStore::RowTable&, int32_t, const int32_t*, int64_t, const float*,
                      int32_t, float, AttentionPart) {
  return false;
}
}  // namespace pq

#endif
