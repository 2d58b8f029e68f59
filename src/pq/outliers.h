// PQ outliers (config.pq_outliers): the keys the codebook represents worst,
// found as tokens are coded and scored by their exact q.k at each select.
//
// A key far from every centroid scores through its codes like its
// centroids; a needle's key is such a key (tools/pqeval/needle_study.py: on
// 4K needle prompts the most attended needle token PQ lost ranked 898-2,758
// by its codes, with one of the largest 0.33% residuals in 6 of 8). Each kv
// head keeps a threshold, the residual that config.pq_outliers of its coded
// tokens reach when the index is built, and the ascending positions of the
// tokens whose residual reaches it.
#pragma once

#include <cstdint>
#include <vector>

#include "pq/codebook.h"

namespace pq {

struct PqIndex;

// A residual is |k - centroids(codes)|^2, in the codebook's dimension order.
struct OutlierList {
  float threshold = 0.f;           // squared residual an outlier reaches
  std::vector<int32_t> positions;  // ascending
};

// Sets every kv head's threshold and outliers from its coded tokens
// [from, index.coded_tokens): the ceil(share x n) largest residuals (ties at
// the threshold all join). Leaves index.outliers empty (not yet found) when
// no token past `from` is coded.
void find_outliers(PqIndex& index, int32_t head_dim, int64_t from, float share,
                   const KeyGather& gather, ThreadPool* pool);

// Adds the tokens [from, to), just coded, whose residual reaches their
// head's threshold. No-op before find_outliers.
void add_outliers(PqIndex& index, int32_t head_dim, int64_t from, int64_t to,
                  const KeyGather& gather);

// Keeps the outliers below `tokens` (a truncate).
void shrink_outliers(PqIndex& index, int64_t tokens);

// A kv head's outliers within [begin, end), ascending.
struct OutlierSpan {
  const int32_t* positions = nullptr;
  int64_t count = 0;
};
OutlierSpan outliers_between(const PqIndex& index, int32_t head, int64_t begin, int64_t end);

}  // namespace pq
