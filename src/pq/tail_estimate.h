// The tail estimate of pq_decode_attend (PQ_TAIL_CODE_MEANS, issue 44):
// what the middle tokens a selection leaves out (the tail) add to a kv
// head's attention, from the PQ index alone. A tail token's logit is scale x
// its lookup-table score (the score the select ranks it by), its value the
// mean value of the middle tokens that share its first subspace's code. So
// the tail's part of the softmax is, per query head g,
//   sum over codes c of W[c][g] x mean[c],   W[c][g] = sum over the tail
//   tokens t with code_0(t) = c of exp(scale x score_g(t) - shift_g),
// which needs one pass over the codes (as the select's scan) and a table
// of 2^b means per kv head, kept as tokens are coded.
// tools/pqeval/tail_estimate.py measured it before it was built here
// (docs/quality-data/tail-estimate-2k.md).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "pq/codebook.h"
#include "pq/pq_index.h"

namespace pq {

// fn(rows, count) over kv head `head`'s value rows [first, end) in token
// order, as stored (KvTier::for_each_run with keys false).
using ValueRuns = std::function<void(int32_t head, int64_t first, int64_t end,
                                     const std::function<void(const uint8_t*, int64_t)>& fn)>;

// Per kv head, the sum (as float) and the count of the stored values of
// coded tokens [begin, end), by the code of their first subspace.
class CodeValueSums {
 public:
  // Brings the sums to tokens [begin, end) of `index`: adds the tokens
  // coded since the last update, or starts over when the codebook or begin
  // changed or end went back (a rebuild, a restore, a truncate: the caller
  // calls clear() on a truncate too, since a truncate followed by appends
  // can come back to the same end with other tokens).
  void update(const PqIndex& index, int32_t head_dim, int32_t dtype, int64_t begin, int64_t end,
              const ValueRuns& values);
  void clear();

  // [centroids][head_dim] sums and [centroids] counts of kv head `head`.
  const float* sums(int32_t head) const {
    return sums_.data() + static_cast<size_t>(head) * centroids_ * head_dim_;
  }
  const uint32_t* counts(int32_t head) const {
    return counts_.data() + static_cast<size_t>(head) * centroids_;
  }
  // The bytes update() holds for this index (what the memory limit counts).
  static uint64_t bytes_for(const PqCodebook& codebook, int32_t head_dim) {
    return static_cast<uint64_t>(codebook.heads) * codebook.centroids *
           (static_cast<uint64_t>(head_dim) * sizeof(float) + sizeof(uint32_t));
  }

 private:
  std::shared_ptr<const PqCodebook> codebook_;  // the codes' codebook, held so its address is not reused
  int64_t begin_ = 0, end_ = 0;
  int32_t centroids_ = 0, head_dim_ = 0;
  std::vector<float> sums_;
  std::vector<uint32_t> counts_;
};

// The tail's weights of kv head `head` through its lookup table `lut`
// ([group][m][centroids], PqCodebook::lut): over the tokens t of [begin,
// end) whose bit t - begin of `chosen` is clear,
//   weights[c * group + g] = sum over those t with code_0(t) = c of
//                            exp(scale x score_g(t) - shift[g]),
// shift[g] = scale x sum_j max_c lut[g][j][c] (an upper bound of the
// logits, so every term is in (0, 1]; terms below the smallest normal
// float, about 87 below it, count 0, as in the select's scan).
void tail_weights(const PqCodebook& codebook, const float* lut, int32_t group, float scale,
                  const CodeColumn& codes, int64_t begin, int64_t end, const uint64_t* chosen,
                  float* weights, float* shift);

}  // namespace pq
