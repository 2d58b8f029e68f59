// Attention of one token's query over selected rows of the host store, for
// pq_decode_attend: what a CPU inference engine needs from a decode step,
// computed where the K/V already are, with no gathered copy.
//
// The rows are read once, in blocks: each block's keys give the group's
// logits, an online softmax (as flash-decoding) rescales what was
// accumulated so far, and the same block's values are added in while they
// are still in L1. A kv head's rows may be cut into parts attended
// independently (on different threads) and merged through their maxima and
// sums, which is exact up to float rounding.
#pragma once

#include <cstdint>
#include <limits>

#include "store/kv_store.h"

namespace pq {

// The running state of an attention over some rows, not yet normalised: for
// each query head g of the group, max[g] = the largest logit so far, sum[g] =
// sum_i exp(logit_i - max[g]) and acc[g][:] = sum_i exp(logit_i - max[g]) *
// V_i. No rows: max kNoRows (-inf), sum 0, acc 0.
struct AttentionPart {
  float* acc;   // [group][head_dim]
  float* max;   // [group]
  double* sum;  // [group]
};
constexpr float kNoRows = -std::numeric_limits<float>::infinity();

// Attends queries ([group][head_dim] floats) over rows pos[0..count) of
// kv_head (logit = scale * q_g . K[pos[i]]) and writes their part.
void attend_rows(const KvStore::RowTable& rows, int32_t kv_head, const int32_t* pos,
                 int64_t count, const float* queries, int32_t group, float scale,
                 AttentionPart part);

// Merges the parts of disjoint row sets of one group and normalises:
// out[g][:] = the attention over all their rows, lse[g] = the natural log of
// sum over those rows of exp(logit) (zeros and -inf when no part has a row).
// lse may be null.
void merge_attention(const AttentionPart* parts, int count, int32_t group, int32_t head_dim,
                     float* out, float* lse);

// The AVX2 + FMA + F16C kernel behind attend_rows (attention_avx2.cpp), for
// head_dim a multiple of 8 and a group of at most 8; false when it does not
// apply (the portable kernel then runs).
bool attend_rows_avx2(const KvStore::RowTable& rows, int32_t kv_head, const int32_t* pos,
                      int64_t count, const float* queries, int32_t group, float scale,
                      AttentionPart part);

// The AVX-512 kernel (attention_avx512.cpp), for a group of at most 8 and
// any head_dim; false when it does not apply.
bool attend_rows_avx512(const KvStore::RowTable& rows, int32_t kv_head, const int32_t* pos,
                        int64_t count, const float* queries, int32_t group, float scale,
                        AttentionPart part);

// The logits kernels of the AVX-512 attend: float FMAs (any dtype), and
// for bf16 keys with bf16 queries VDPBF16PS (AVX512_BF16) or TDPBF16PS
// tiles (AMX-BF16, attention_amx.h).
enum class AttendLogits : int { kFma, kBf16Dot, kAmxBf16 };
// How the AVX-512 attend widens f16 rows to float: VCVTPH2PS (AVX512F) or
// VCVTPH2PSX (AVX512_FP16; the same values, and measured the same time, so
// attend_rows keeps VCVTPH2PS; docs/perf.md). AVX512_FP16's arithmetic
// (VFMADDPH) would sum in binary16, outside pq_decode_attend's bound.
enum class F16Conversion : int { kF16c, kAvx512Fp16 };

// attend_rows_avx512 with its logits kernel chosen (bench_attend_logits
// compares them in one process; the kernel tests run each); false when
// the CPU, the dtype, the queries or the shape do not allow that kernel
// (kAvx512Fp16: f16 rows and the FMA logits only).
bool attend_rows_avx512_with(const KvStore::RowTable& rows, int32_t kv_head, const int32_t* pos,
                             int64_t count, const float* queries, int32_t group, float scale,
                             AttentionPart part, AttendLogits logits,
                             F16Conversion f16 = F16Conversion::kF16c);

// Whether attend_rows, at the kernel level in use, multiplies the values by
// the softmax weights rounded to bf16: bf16 rows on a CPU with AVX512_BF16,
// fp8 rows where it also has AVX512_VBMI, groups of at most 8 (the AVX-512
// kernel's; attention_value_pairs.h). The bound is pq_decode_attend's.
bool attend_rounds_weights_to_bf16(int32_t dtype, int32_t group);

// The rows of one block, in every kernel: 32 rows of K and V (16 KiB at
// head_dim 128 in f16) stay in L1 between the logits and the values; 16
// and 64 measured no better (64 was 15% slower).
constexpr int64_t kAttentionBlockRows = 32;

}  // namespace pq
