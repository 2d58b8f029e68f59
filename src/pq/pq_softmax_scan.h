// The PQ scan fused with the GQA softmax combine (PQ_GQA_SUM_SOFTMAX) for a
// group of two or more query heads: the host path of the default setting.
//
// Unfused, a kv head's scores went to memory (group x middle floats: 2 MiB
// at 128K tokens and four query heads), then each query head's softmax read
// them for its max, again for an exp per token, and read the exps again to
// add them into the combined scores; the exps and that traffic cost more
// than the scan. Here no score is formed: a score is a sum of table entries,
// so its exp is the product of the entries' exps, and the scan multiplies
// entries of a table of exps (group x m x 2^b of them, made once per call)
// straight into the numerators. Then each head's normaliser is summed and
// the numerators are added over it.
//
// The table's exps are shifted by each row's largest entry (every factor in
// (0, 1]), so a head's softmax is shifted by U = scale x the sum of those
// maxima, an upper bound of its logits, not by its largest logit; softmax
// does not depend on the shift, and numerically the result differs from the
// max-shifted form by rounding (about 1e-6 relative; tests/
// test_kernels_softmax_scan.cpp). Products below the smallest normal float
// become zero at every level (flush-to-zero for the scan): tokens about 87
// below U. Where U lies more than kMaxShiftSlack above a head's largest
// logit, too much of the tail would go, and the caller takes the
// max-shifted path (scores to memory, then combine_group_scores).
#pragma once

#include <cstdint>

#include "base/scratch.h"
#include "base/weighted_rows.h"
#include "pq/codebook.h"
#include "store/code_column.h"

namespace pq {

// So tokens within 57 of the top logit keep their numerators (87 - 30).
constexpr float kMaxShiftSlack = 30.f;

// combined[i] for the middle tokens i of [begin, end) of `codes` through
// `lut` ([group][m][centroids]): with table[g][j][c] = exp_nonpositive(
// lut[g][j][c] x scale - max_c(lut[g][j][c]) x scale), e_g[i] = 1 x
// table[g][0][code_0] x ... (left to right), Z_g = the sum of e_g in
// four lanes by i mod 4 over the whole fours, the lanes in order, then the
// rest in order, combined[i] = e_0[i] / Z_0 + e_1[i] / Z_1 + ...
// (as e x (1 / Z), left to right). The same bits at every kernel level and
// for every split of the codes into runs (a fork's). Returns false, combined
// untouched, where a head's largest e_g is below exp(-kMaxShiftSlack).
// log_normalisers (optional, [group]): each head's log of the sum of
// exp(scale x score) over the middle (its shift plus log Z_g), so that a
// logit x from elsewhere (an outlier's exact one) weighs exp(x - L_g) on
// the same scale as combined[].
bool pq_scan_sum_softmax(const PqCodebook& codebook, const float* lut, int32_t group,
                         const CodeColumn& codes, int64_t begin, int64_t end, float scale,
                         float* combined, SelectScratch& scratch,
                         double* log_normalisers = nullptr);

// pq_scan_sum_softmax up to the sums: *shares = {e_0 .. e_{group-1}, 1 / Z_g},
// whose weighted_rows_sum (base/weighted_rows.h) is combined[], left in
// scratch (raw and head_sums) until its next use, so that the top k can be
// taken without writing combined (select_top_k_weighted). Returns false,
// *shares untouched, where pq_scan_sum_softmax does.
bool pq_softmax_shares(const PqCodebook& codebook, const float* lut, int32_t group,
                       const CodeColumn& codes, int64_t begin, int64_t end, float scale,
                       WeightedRows* shares, SelectScratch& scratch,
                       double* log_normalisers = nullptr);

}  // namespace pq
