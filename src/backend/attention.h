// Attention of one token's query over selected rows of the host store, for
// pq_decode_attend: what a CPU inference engine needs from a decode step,
// computed where the K/V already are, with no gathered copy.
#pragma once

#include <cstdint>

#include "store/kv_store.h"

namespace pq {

// For one kv head and its group of query heads: out[g][d] = sum_i w[g][i] *
// V[pos[i]][d] with w[g] = softmax_i(scale * q_g . K[pos[i]]), accumulated
// in float; lse[g] = the natural log of sum_i exp(scale * q_g . K[pos[i]])
// (so that attentions over disjoint sets of tokens can be merged). count 0
// gives zeros and -inf. work: at least attention_work_floats(...) floats.
void attend_head(const KvStore& store, int32_t kv_head, const int32_t* pos, int64_t count,
                 const float* queries, int32_t group_size, float scale, float* out, float* lse,
                 float* work);

// Floats of working memory attend_head needs.
int64_t attention_work_floats(int64_t count, int32_t group_size, int32_t head_dim);

}  // namespace pq
