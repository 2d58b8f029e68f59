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
// rounding, so near-ties may resolve differently (on a real 8K trace no
// selected position differed: docs/perf.md).
//
// The first pass need not run per call: for m*b <= 12 the index keeps each
// kv head's tuple counts over all its coded tokens, updated as tokens are
// coded (one per decode step), and a selection subtracts the few coded
// tokens outside its middle (the sinks, the local window's coded tokens).
#pragma once

#include <cstdint>

#include "base/scratch.h"

namespace pq {

class CodeColumn;
struct PqIndex;

// Entries of a kept count table for m subspaces of `centroids` centroids:
// 2^(m*b) when m*b <= 12 (at most 16 KiB per kv head), else 0 (none kept;
// selections count their middle).
int64_t pq_tuple_table_size(int32_t subspaces, int32_t centroids);

// Brings index.tuple_counts up to date with codes [from, to) just written
// (from = 0 starts the tables afresh). No-op when no table is kept.
void pq_index_count_tuples(PqIndex& index, int64_t from, int64_t to);

// A kept count table: counts[t] = coded tokens [0, coded) whose tuple is t.
struct TupleCountTable {
  const uint32_t* counts = nullptr;
  int64_t coded = 0;
};

// Whether the tuple path applies: m * b <= 16, and a middle long enough
// that counting beats scoring every token (n >= 8 x the number of tuples).
bool pq_tuple_select_applies(int32_t subspaces, int32_t centroids, int64_t n);
// Whether the selector takes the tuple path for the middle [first, first +
// n) of `codes`: where it applies, and also from one token per tuple on
// where a sample of the middle shows keys that repeat (at most one distinct
// tuple in four sampled tokens).
bool pq_tuple_select_pays(const CodeColumn& codes, int32_t subspaces, int32_t centroids,
                          int64_t first, int64_t n, SelectScratch& scratch);

// Selects the k (0 < k < n) best of tokens [first, first + n) of the
// column `codes`, with the lookup table lut[g][j][c] of the group's query
// heads; writes the positions ascending into out. Ties go to the larger
// position, as select_top_k's. With a table (first + n <= table.coded),
// the column must hold tokens [0, table.coded): the middle's counts are
// the table's minus the tokens outside [first, first + n).
void pq_tuple_select(const float* lut, int32_t group_size, int32_t subspaces, int32_t centroids,
                     const CodeColumn& codes, int64_t n, int64_t first, int32_t combine,
                     float scale,
                     int64_t k, int32_t* out, SelectScratch& scratch,
                     const TupleCountTable& table = {});

}  // namespace pq
