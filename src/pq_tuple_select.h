// PQ selection through the histogram of code tuples: with m subspaces of
// 2^b centroids, a token's score depends only on its m codes, one of
// 2^(m*b) tuples. When that number is small (m*b <= 16: 2x6, 2x8, 4x4) the
// tuples, not the tokens, are scored: one pass counts the tuples of the
// middle, the GQA combine and the threshold of the top k are computed per
// tuple, and a second pass emits the positions above the threshold. The
// codes are read twice and no per-token float array is written.
//
// With PQ_GQA_MAX and PQ_GQA_MEAN (and SUM_SOFTMAX over a single query
// head) a token's combined score is the same float operations on the same
// values as the per-token pipeline, so the selection is bit-identical. With
// SUM_SOFTMAX over a group, the softmax normalisers are sums over tokens,
// which the tuple path sums per tuple (count x exp): the same value up to
// rounding, so near-ties may resolve differently (measured on the real
// trace in tests/test_quality_floors.cpp).
#pragma once

#include <cstdint>

#include "scratch.h"

namespace pq {

// Whether the tuple path applies: m * b <= 16, and a middle long enough
// that counting beats scoring every token (n >= the number of tuples).
bool pq_tuple_select_applies(int32_t subspaces, int32_t centroids, int64_t n);

// Selects the k (0 < k < n) best of tokens [first, first + n) whose codes
// are codes[i * subspaces + j], with the lookup table lut[g][j][c] of the
// group's query heads; writes the positions ascending into out. Ties go to
// the larger position, as select_top_k's.
void pq_tuple_select(const float* lut, int32_t group_size, int32_t subspaces, int32_t centroids,
                     const uint8_t* codes, int64_t n, int64_t first, int32_t combine, float scale,
                     int64_t k, int32_t* out, SelectScratch& scratch);

}  // namespace pq
