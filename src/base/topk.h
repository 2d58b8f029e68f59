// Combining the scores of a GQA group and picking the top k in O(n).
#pragma once

#include <cstdint>
#include <cstring>

#include "base/scratch.h"
#include "base/weighted_rows.h"

namespace pq {

// Reduces raw[g * n + i] (raw dot products of group_size query heads) to one
// score per token, out[i], by pq_gqa_combine `mode`, using logits
// raw * scale. SUM_SOFTMAX with one head reduces to the logit itself (softmax
// is monotone, so the order is the same and no exp is spent).
void combine_group_scores(const float* raw, int32_t group_size, int64_t n, int32_t mode,
                          float scale, float* out, SelectScratch& scratch);

// combine_group_scores's SUM_SOFTMAX for values that stand for several
// tokens each: raw[g * n + i] is the raw dot product of query head g with
// counts[i] tokens. The softmax normalisers weigh each value by its count
// (summed in double); out[i] is then what every one of those tokens scores.
void combine_softmax_weighted(const float* raw, const uint32_t* counts, int32_t group_size,
                              int64_t n, float scale, float* out, SelectScratch& scratch);

// Maps a float to a uint32 whose unsigned order is the float's order, with
// -0 and +0 equal (select_top_k's order).
// Inline: the top-k's passes compute it for every score.
inline uint32_t ordered_score_key(float f) {
  f += 0.0f;  // -0 becomes +0: equal scores must share a bucket
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The scores select_top_k reads first, from n >= kTopKSampledFrom of them:
// every stride-th, size of them (at 0, stride, ..., (size - 1) x stride).
constexpr int64_t kTopKSampledFrom = int64_t{1} << 14;
struct TopKSample {
  int64_t size, stride;
};
inline TopKSample top_k_sample(int64_t n) {
  const int64_t size = n < 4096 * 8 ? n / 8 : 4096;
  return {size, size > 0 ? n / size : 1};
}

// Writes the positions (first + i) of the k highest scores[i] into out,
// ascending. Ties go to the larger position. O(n): a radix select.
void select_top_k(const float* scores, int64_t n, int64_t k, int64_t first, int32_t* out,
                  SelectScratch& scratch);

// select_top_k of the scores weighted_rows_sum(rows) would write (the same
// positions), without writing them at the AVX-512 level: the sums are
// formed in registers by the pass that keeps those above the sampled
// threshold, and only where the sampled low key keeps fewer than k (or n
// is small) are they written. The PQ scan's default path (pq_selector.cpp) saves a
// write and a read of a float per token so.
void select_top_k_weighted(const WeightedRows& rows, int64_t k, int64_t first, int32_t* out,
                           SelectScratch& scratch);

}  // namespace pq
