// Scores that are weighted sums of rows: score[i] = rows[0][i] x weights[0]
// + rows[1][i] x weights[1] + ..., left to right (the first term alone).
// The fused PQ scan's softmax shares are such a sum (pq/pq_softmax_scan.h):
// its numerators per query head, each over its head's normaliser. The top k
// can be taken from the rows without writing the sums (select_top_k_weighted
// in base/topk.h), so they have one home here, shared by the scan and the
// top-k, and the same bits wherever they are formed.
#pragma once

#include <cstdint>

#include "base/cpu_dispatch.h"

namespace pq {

struct WeightedRows {
  const float* rows;      // [count][n]
  int32_t count;          // rows (>= 1)
  int64_t n;              // entries per row
  const float* weights;   // [count]
};

// One sum: a product and an add per row, never fused into one rounding
// (the kernels' lanes round the same way).
PQ_ALWAYS_INLINE float weighted_rows_at(const WeightedRows& w, int64_t i) {
  PQ_FP_CONTRACT_OFF
  float s = w.rows[i] * w.weights[0];
  for (int32_t r = 1; r < w.count; ++r) s += w.rows[static_cast<int64_t>(r) * w.n + i] * w.weights[r];
  return s;
}

// out[i] = weighted_rows_at(w, i) for every i, at the kernel level of
// base/cpu_dispatch.h (the same bits at every level).
void weighted_rows_sum(const WeightedRows& w, float* out);

}  // namespace pq
