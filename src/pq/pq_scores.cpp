// PqCodebook::pq_scores, the hot loop of PQ selection on the host, per
// kernel level (base/cpu_dispatch.h). Every level adds a token's table
// entries in the same order (j = 0 .. m-1, starting from 0 except for two
// subspaces, as the portable loop), so the scores, and the selections, are
// bit-identical across levels (tests/test_kernels_select.cpp).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/cpu_dispatch.h"
#include "pq/codebook.h"

#include "base/x86_intrinsics.h"

namespace pq {

namespace {

// One token's score through one query head's table lq.
inline float score_one(const float* lq, int32_t subspaces, int32_t centroids, const uint8_t* c) {
  if (subspaces == 2) return lq[c[0]] + lq[centroids + c[1]];
  float s = 0.f;
  for (int32_t j = 0; j < subspaces; ++j) s += lq[j * centroids + c[j]];
  return s;
}

void pq_scores_portable(const float* lut, int32_t queries, int32_t subspaces, int32_t centroids,
                        const uint8_t* codes, int64_t tokens, int64_t first, float* out,
                        int64_t out_stride) {
  for (int32_t q = 0; q < queries; ++q) {
    const float* lq = lut + static_cast<size_t>(q) * subspaces * centroids;
    float* oq = out + static_cast<size_t>(q) * out_stride;
    if (subspaces == 2) {  // the paper's default; keep the loop tight
      const float* l0 = lq;
      const float* l1 = lq + centroids;
      for (int64_t t = first; t < tokens; ++t) oq[t] = l0[codes[2 * t]] + l1[codes[2 * t + 1]];
      continue;
    }
    for (int64_t t = first; t < tokens; ++t) oq[t] = score_one(lq, subspaces, centroids, codes + t * subspaces);
  }
}

// pq_products_summed at the portable level, for tokens [from, to).
void products_summed_portable(const float* table, int32_t queries, int32_t subspaces,
                              int32_t centroids, const uint8_t* codes, int64_t from, int64_t to,
                              float* out, int64_t out_stride, const ProductSums& sums) {
  for (int32_t q = 0; q < queries; ++q) {
    const float* tq = table + static_cast<size_t>(q) * subspaces * centroids;
    float* oq = out + static_cast<size_t>(q) * out_stride;
    float* lanes = sums.lanes + q * kProductLanes;
    for (int64_t t = from; t < to; ++t) {
      const uint8_t* c = codes + t * subspaces;
      float p = 1.f;
      for (int32_t j = 0; j < subspaces; ++j) p *= tq[j * centroids + c[j]];
      oq[t] = p;
      const int64_t i = sums.first_index + t;
      if (i < sums.whole) lanes[i % kProductLanes] += p;
      sums.tops[q] = std::max(sums.tops[q], p);
    }
  }
}

#if PQ_X86_KERNELS

// Rows of heads, the kernel of the AVX2 and AVX-512 levels for a group of
// two or more query heads. The table is transposed to [j][c][4]: the entries
// of four query heads for one code sit in one 16-byte row, so a token costs
// one load and one add per code for four heads at once, where a gather
// costs one lane per head and code (9.2 against 2.3 ms for 8 kv heads x 4
// query heads x 128K tokens, m = 4, b = 8, one core of an AMD EPYC; the
// gathers' sixteen lanes did not make up for their cost per lane). Four
// tokens' rows are then transposed in registers into four heads' scores.
// Each lane adds a token's entries in pq_scores_portable's order, so the
// bits are the same.
constexpr int kRowHeads = 4;

// lut_rows[j][c][4] for query heads [first, first + heads) (heads <= 4;
// unused lanes zero) from lut[q][j][c].
void transpose_lut(const float* lut, int32_t first, int32_t heads, int32_t m, int32_t centroids,
                   float* lut_rows) {
  const size_t per_query = static_cast<size_t>(m) * centroids;
  for (size_t e = 0; e < per_query; ++e)
    for (int32_t g = 0; g < kRowHeads; ++g)
      lut_rows[e * kRowHeads + g] = g < heads ? lut[(first + g) * per_query + e] : 0.f;
}

// kProduct: the product of the entries from 1 (pq_products_summed), else
// the sum.
// C > 0: a fixed number of centroids (256, the default's), so that a code's
// row is a constant offset plus the code x 16 bytes.
template <int M, int C, bool kProduct>
PQ_TARGET_AVX2 inline __m128 row_score(const float* lut_rows, int32_t m, int32_t centroids,
                                       const uint8_t* c) {
  const int32_t mm = M > 0 ? M : m;
  const size_t cc = C > 0 ? C : centroids;
  auto row = [&](int32_t j) { return _mm_loadu_ps(lut_rows + (j * cc + c[j]) * kRowHeads); };
  if constexpr (kProduct) {
    __m128 p = _mm_set1_ps(1.f);
    for (int32_t j = 0; j < mm; ++j) p = _mm_mul_ps(p, row(j));
    return p;
  } else if constexpr (M == 2) {
    return _mm_add_ps(row(0), row(1));
  }
  __m128 s = _mm_setzero_ps();
  for (int32_t j = 0; j < mm; ++j) s = _mm_add_ps(s, row(j));
  return s;
}

// Scores of `heads` (<= 4) query heads for tokens [0, whole), whole a
// multiple of 4, through lut_rows.
// lanes: null, or four heads' four lanes, to which each head's four tokens
// of a step are added (the caller aligns token 0 to a lane-0 index), and
// tops, the heads' largest values.
template <int M, int C, bool kProduct>
PQ_TARGET_AVX2 void scores_rows(const float* lut_rows, int32_t heads, int32_t m, int32_t centroids,
                                const uint8_t* codes, int64_t whole, float* out,
                                int64_t out_stride, float* lanes = nullptr,
                                float* tops = nullptr) {
  const int32_t mm = M > 0 ? M : m;
  __m128 sum[kRowHeads], top[kRowHeads];
  if (lanes != nullptr)
    for (int g = 0; g < kRowHeads; ++g) {  // lanes and tops of `heads` heads only
      sum[g] = g < heads ? _mm_loadu_ps(lanes + g * kProductLanes) : _mm_setzero_ps();
      top[g] = _mm_set1_ps(g < heads ? tops[g] : 0.f);
    }
  for (int64_t t = 0; t < whole; t += 4) {
    __m128 r0 = row_score<M, C, kProduct>(lut_rows, m, centroids, codes + (t + 0) * mm);
    __m128 r1 = row_score<M, C, kProduct>(lut_rows, m, centroids, codes + (t + 1) * mm);
    __m128 r2 = row_score<M, C, kProduct>(lut_rows, m, centroids, codes + (t + 2) * mm);
    __m128 r3 = row_score<M, C, kProduct>(lut_rows, m, centroids, codes + (t + 3) * mm);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    if (lanes != nullptr) {
      sum[0] = _mm_add_ps(sum[0], r0), top[0] = _mm_max_ps(top[0], r0);
      sum[1] = _mm_add_ps(sum[1], r1), top[1] = _mm_max_ps(top[1], r1);
      sum[2] = _mm_add_ps(sum[2], r2), top[2] = _mm_max_ps(top[2], r2);
      sum[3] = _mm_add_ps(sum[3], r3), top[3] = _mm_max_ps(top[3], r3);
    }
    if (heads == kRowHeads) {  // the common case: no branch per head
      _mm_storeu_ps(out + t, r0);
      _mm_storeu_ps(out + out_stride + t, r1);
      _mm_storeu_ps(out + 2 * out_stride + t, r2);
      _mm_storeu_ps(out + 3 * out_stride + t, r3);
      continue;
    }
    const __m128 by_head[kRowHeads] = {r0, r1, r2, r3};
    for (int32_t g = 0; g < heads; ++g) _mm_storeu_ps(out + g * out_stride + t, by_head[g]);
  }
  if (lanes != nullptr)
    for (int32_t g = 0; g < heads; ++g) {
      _mm_storeu_ps(lanes + g * kProductLanes, sum[g]);
      float four[4];
      _mm_storeu_ps(four, top[g]);
      tops[g] = std::max(std::max(four[0], four[1]), std::max(four[2], four[3]));
    }
}

// The kernel for m subspaces of `centroids` entries: fixed forms for the
// common shapes.
template <bool kProduct>
void scores_rows_any(const float* lut_rows, int32_t heads, int32_t m, int32_t centroids,
                     const uint8_t* codes, int64_t whole, float* out, int64_t out_stride,
                     float* lanes = nullptr, float* tops = nullptr) {
  const auto run = [&](auto kernel) {
    kernel(lut_rows, heads, m, centroids, codes, whole, out, out_stride, lanes, tops);
  };
  if (centroids == 256 && m == 4) return run(scores_rows<4, 256, kProduct>);
  if (centroids == 256 && m == 2) return run(scores_rows<2, 256, kProduct>);
  if (centroids == 256 && m == 8) return run(scores_rows<8, 256, kProduct>);
  switch (m) {
    case 2: return run(scores_rows<2, 0, kProduct>);
    case 4: return run(scores_rows<4, 0, kProduct>);
    case 8: return run(scores_rows<8, 0, kProduct>);
    default: return run(scores_rows<0, 0, kProduct>);
  }
}

void pq_scores_by_rows(const float* lut, int32_t queries, int32_t subspaces, int32_t centroids,
                       const uint8_t* codes, int64_t tokens, float* out, int64_t out_stride) {
  const int64_t whole = tokens - tokens % 4;
  std::vector<float> lut_rows(static_cast<size_t>(subspaces) * centroids * kRowHeads);
  for (int32_t first = 0; first < queries; first += kRowHeads) {
    const int32_t heads = std::min(kRowHeads, queries - first);
    transpose_lut(lut, first, heads, subspaces, centroids, lut_rows.data());
    scores_rows_any<false>(lut_rows.data(), heads, subspaces, centroids, codes, whole,
                           out + first * out_stride, out_stride);
  }
  pq_scores_portable(lut, queries, subspaces, centroids, codes, tokens, whole, out, out_stride);
}

// pq_products_summed by rows: the tokens before the first lane-0 index and
// from the last whole four on go the portable way, in order around them.
void products_summed_by_rows(const float* table, int32_t queries, int32_t subspaces,
                             int32_t centroids, const uint8_t* codes, int64_t tokens, float* out,
                             int64_t out_stride, const ProductSums& sums) {
  const int64_t lead = std::min(tokens, (kProductLanes - sums.first_index % kProductLanes) % kProductLanes);
  int64_t body = std::max<int64_t>(0, std::min(tokens, sums.whole - sums.first_index) - lead);
  body -= body % 4;
  products_summed_portable(table, queries, subspaces, centroids, codes, 0, lead, out, out_stride,
                           sums);
  std::vector<float> lut_rows(static_cast<size_t>(subspaces) * centroids * kRowHeads);
  for (int32_t first = 0; first < queries && body > 0; first += kRowHeads) {
    const int32_t heads = std::min(kRowHeads, queries - first);
    transpose_lut(table, first, heads, subspaces, centroids, lut_rows.data());
    scores_rows_any<true>(lut_rows.data(), heads, subspaces, centroids, codes + lead * subspaces,
                          body, out + first * out_stride + lead, out_stride,
                          sums.lanes + first * kProductLanes, sums.tops + first);
  }
  products_summed_portable(table, queries, subspaces, centroids, codes, lead + body, tokens, out,
                           out_stride, sums);
}

// Sixteen tokens per step: their codes are unpacked once into one vector of
// 32-bit table indices per subspace, then every query head of the group
// gathers its table entries with them (the codes are read once per group,
// not once per query head). M > 0: a fixed number of subspaces; M == 0:
// any, the codes gathered byte by byte.
template <int M>
PQ_TARGET_AVX512 inline void unpack_codes(const uint8_t* block, int32_t m, __m512i* idx) {
  const __m512i low = _mm512_set1_epi32(0xff);
  if constexpr (M == 1) {
    idx[0] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
  } else if constexpr (M == 2) {
    const __m512i v =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
    idx[0] = _mm512_and_si512(v, low);
    idx[1] = _mm512_srli_epi32(v, 8);
  } else if constexpr (M == 4) {
    const __m512i v = _mm512_loadu_si512(block);
    idx[0] = _mm512_and_si512(v, low);
    idx[1] = _mm512_and_si512(_mm512_srli_epi32(v, 8), low);
    idx[2] = _mm512_and_si512(_mm512_srli_epi32(v, 16), low);
    idx[3] = _mm512_srli_epi32(v, 24);
  } else if constexpr (M == 8) {
    const __m512i a = _mm512_loadu_si512(block);
    const __m512i b = _mm512_loadu_si512(block + 64);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i halves[2] = {_mm512_permutex2var_epi32(a, even, b),
                               _mm512_permutex2var_epi32(a, odd, b)};
    for (int h = 0; h < 2; ++h) {
      idx[4 * h + 0] = _mm512_and_si512(halves[h], low);
      idx[4 * h + 1] = _mm512_and_si512(_mm512_srli_epi32(halves[h], 8), low);
      idx[4 * h + 2] = _mm512_and_si512(_mm512_srli_epi32(halves[h], 16), low);
      idx[4 * h + 3] = _mm512_srli_epi32(halves[h], 24);
    }
  } else {
    (void)block;
    (void)m;
    (void)idx;
  }
}

template <int M>
PQ_TARGET_AVX512 inline void scores_avx512_body(const float* lut, int32_t queries, int32_t m,
                                         int32_t centroids, const uint8_t* codes, int64_t tokens,
                                         float* out, int64_t out_stride) {
  constexpr int kStep = 16;
  const size_t per_query = static_cast<size_t>(m) * centroids;
  int64_t whole = tokens - tokens % kStep;
  if constexpr (M == 0) {
    // Byte offsets t * m + j read as 32-bit words: the last three bytes of
    // a word may lie past the codes, so the last block goes scalar.
    while (whole > 0 && whole * m + 3 > tokens * m) whole -= kStep;
  }
  const __m512i step_offsets = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(m));
  for (int64_t t = 0; t < whole; t += kStep) {
    const uint8_t* block = codes + t * m;
    if constexpr (M > 0) {
      __m512i idx[M];
      unpack_codes<M>(block, m, idx);
      for (int32_t q = 0; q < queries; ++q) {
        const float* lq = lut + q * per_query;
        __m512 s;
        if constexpr (M == 2) {
          s = _mm512_add_ps(_mm512_i32gather_ps(idx[0], lq, 4),
                            _mm512_i32gather_ps(idx[1], lq + centroids, 4));
        } else {
          s = _mm512_setzero_ps();
          for (int j = 0; j < M; ++j)
            s = _mm512_add_ps(s, _mm512_i32gather_ps(idx[j], lq + j * centroids, 4));
        }
        _mm512_storeu_ps(out + q * out_stride + t, s);
      }
    } else {
      for (int32_t q = 0; q < queries; ++q) {
        const float* lq = lut + q * per_query;
        __m512 s = _mm512_setzero_ps();
        for (int32_t j = 0; j < m; ++j) {
          const __m512i words = _mm512_i32gather_epi32(step_offsets, block + j, 1);
          const __m512i idx = _mm512_and_si512(words, _mm512_set1_epi32(0xff));
          s = _mm512_add_ps(s, _mm512_i32gather_ps(idx, lq + j * centroids, 4));
        }
        _mm512_storeu_ps(out + q * out_stride + t, s);
      }
    }
  }
  pq_scores_portable(lut, queries, m, centroids, codes, tokens, whole, out, out_stride);
}

PQ_TARGET_AVX512 void pq_scores_avx512(const float* lut, int32_t queries, int32_t subspaces,
                                       int32_t centroids, const uint8_t* codes, int64_t tokens,
                                       int64_t first, float* out, int64_t out_stride) {
  (void)first;
  switch (subspaces) {
    case 1: return scores_avx512_body<1>(lut, queries, 1, centroids, codes, tokens, out, out_stride);
    // Two subspaces: the scalar loop's two loads per token beat two gathers
    // of sixteen (0.29 ms against 0.39 ms for four query heads x 128K
    // tokens, b = 8, on an AMD EPYC with AVX-512).
    case 2: return pq_scores_portable(lut, queries, 2, centroids, codes, tokens, 0, out, out_stride);
    case 4: return scores_avx512_body<4>(lut, queries, 4, centroids, codes, tokens, out, out_stride);
    case 8: return scores_avx512_body<8>(lut, queries, 8, centroids, codes, tokens, out, out_stride);
    default:
      return scores_avx512_body<0>(lut, queries, subspaces, centroids, codes, tokens, out, out_stride);
  }
}

#endif  // PQ_X86_KERNELS

}  // namespace

void PqCodebook::pq_scores(const float* lut, int32_t queries, int32_t subspaces,
                           int32_t centroids, const uint8_t* codes, int64_t tokens, float* out,
                           int64_t out_stride) {
#if PQ_X86_KERNELS
  // A group of query heads goes by rows at both SIMD levels; a single head
  // keeps the AVX-512 gathers (sixteen tokens per gather, nothing to share).
  static const CpuLevel level = cpu_level();
  if (queries >= 2 && level >= CpuLevel::kAvx2)
    return pq_scores_by_rows(lut, queries, subspaces, centroids, codes, tokens, out, out_stride);
  static const auto impl = level >= CpuLevel::kAvx512 ? pq_scores_avx512 : pq_scores_portable;
#else
  static const auto impl = pq_scores_portable;
#endif
  impl(lut, queries, subspaces, centroids, codes, tokens, 0, out, out_stride);
}

void PqCodebook::pq_products_summed(const float* table, int32_t queries, int32_t subspaces,
                                    int32_t centroids, const uint8_t* codes, int64_t tokens,
                                    float* out, int64_t out_stride, const ProductSums& sums) {
#if PQ_X86_KERNELS
  static const CpuLevel level = cpu_level();
  if (queries >= 2 && level >= CpuLevel::kAvx2)
    return products_summed_by_rows(table, queries, subspaces, centroids, codes, tokens, out,
                                   out_stride, sums);
#endif
  products_summed_portable(table, queries, subspaces, centroids, codes, 0, tokens, out, out_stride,
                           sums);
}

}  // namespace pq
