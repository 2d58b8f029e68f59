#include "backend/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/cpu_dispatch.h"
#include "base/dtype.h"
#include "base/fast_exp.h"
#include "base/vector_math.h"

namespace pq {

namespace {

void clear(AttentionPart part, int32_t group, int32_t head_dim) {
  std::fill(part.acc, part.acc + static_cast<size_t>(group) * head_dim, 0.f);
  std::fill(part.max, part.max + group, kNoRows);
  std::fill(part.sum, part.sum + group, 0.0);
}

// The online softmax step for one block: logits[g * stride + i] (i < rows)
// become exp(logit - new max), and the part's max, sum and acc are rescaled
// to the new max. The SIMD kernels have their own, in registers.
void softmax_block(float* logits, int64_t stride, int64_t rows, int32_t group, int32_t head_dim,
                   AttentionPart part) {
  for (int32_t g = 0; g < group; ++g) {
    float* l = logits + static_cast<size_t>(g) * stride;
    const float block_max = *std::max_element(l, l + rows);
    if (block_max > part.max[g]) {
      // exp(old max - new max) <= 1; a part with no rows yet has nothing to
      // rescale (and -inf - x must not reach the polynomial).
      const float rescale =
          part.max[g] == kNoRows ? 0.f : exp_nonpositive(part.max[g] - block_max);
      float* acc = part.acc + static_cast<size_t>(g) * head_dim;
      for (int32_t k = 0; k < head_dim; ++k) acc[k] *= rescale;
      part.sum[g] *= rescale;
      part.max[g] = block_max;
    }
    const float max = part.max[g];
    float block_sum = 0.f;
    for (int64_t i = 0; i < rows; ++i) block_sum += (l[i] = exp_nonpositive(l[i] - max));
    part.sum[g] += block_sum;
  }
}

// The portable kernel: the same blocks and online softmax as the AVX2 one,
// in plain loops (any head_dim, any group), compiled twice below.
PQ_ALWAYS_INLINE void attend_rows_body(const KvStore::RowTable& t, int32_t kv_head,
                                       const int32_t* pos, int64_t count, const float* queries,
                                       int32_t group, float scale, AttentionPart part) {
  const int32_t d = t.head_dim;
  constexpr int64_t kB = kAttentionBlockRows;
  std::vector<float> logits(static_cast<size_t>(group) * kB), row(static_cast<size_t>(d));
  for (int64_t b = 0; b < count; b += kB) {
    const int64_t rows = std::min(kB, count - b);
    for (int64_t i = 0; i < rows; ++i) {
      to_float(t.key_row(pos[b + i], kv_head), t.dtype, d, row.data());
      for (int32_t g = 0; g < group; ++g)
        logits[static_cast<size_t>(g) * kB + i] =
            dot(queries + static_cast<size_t>(g) * d, row.data(), d) * scale;
    }
    softmax_block(logits.data(), kB, rows, group, d, part);
    for (int64_t i = 0; i < rows; ++i) {
      to_float(t.value_row(pos[b + i], kv_head), t.dtype, d, row.data());
      for (int32_t g = 0; g < group; ++g) {
        const float w = logits[static_cast<size_t>(g) * kB + i];
        float* acc = part.acc + static_cast<size_t>(g) * d;
        for (int32_t k = 0; k < d; ++k) acc[k] += w * row[k];
      }
    }
  }
}

PQ_TARGET_AVX2 void attend_rows_autovec(const KvStore::RowTable& t, int32_t kv_head,
                                        const int32_t* pos, int64_t count, const float* queries,
                                        int32_t group, float scale, AttentionPart part) {
  attend_rows_body(t, kv_head, pos, count, queries, group, scale, part);
}
void attend_rows_portable(const KvStore::RowTable& t, int32_t kv_head, const int32_t* pos,
                          int64_t count, const float* queries, int32_t group, float scale,
                          AttentionPart part) {
  attend_rows_body(t, kv_head, pos, count, queries, group, scale, part);
}

bool cpu_has_avx2_fma_f16c() { return cpu_has_avx2(); }  // the AVX2 level has FMA and F16C

}  // namespace

void attend_rows(const KvStore::RowTable& rows, int32_t kv_head, const int32_t* pos,
                 int64_t count, const float* queries, int32_t group, float scale,
                 AttentionPart part) {
  clear(part, group, rows.head_dim);
  if (count == 0) return;
  static const bool avx512 = cpu_level() >= CpuLevel::kAvx512;
  if (avx512 && attend_rows_avx512(rows, kv_head, pos, count, queries, group, scale, part)) return;
  static const bool avx2 = cpu_has_avx2_fma_f16c();
  if (avx2 && attend_rows_avx2(rows, kv_head, pos, count, queries, group, scale, part)) return;
  static const auto portable = cpu_has_avx2() ? attend_rows_autovec : attend_rows_portable;
  portable(rows, kv_head, pos, count, queries, group, scale, part);
}

void merge_attention(const AttentionPart* parts, int count, int32_t group, int32_t head_dim,
                     float* out, float* lse) {
  std::fill(out, out + static_cast<size_t>(group) * head_dim, 0.f);
  std::vector<float> weight(static_cast<size_t>(count));
  for (int32_t g = 0; g < group; ++g) {
    float max = kNoRows;
    for (int p = 0; p < count; ++p) max = std::max(max, parts[p].max[g]);
    if (max == kNoRows) {
      if (lse) lse[g] = kNoRows;
      continue;
    }
    double sum = 0.0;
    std::fill(weight.begin(), weight.end(), 0.f);
    for (int p = 0; p < count; ++p)
      if (parts[p].max[g] != kNoRows) {
        weight[p] = exp_nonpositive(parts[p].max[g] - max);
        sum += parts[p].sum[g] * weight[p];
      }
    float* o = out + static_cast<size_t>(g) * head_dim;
    for (int p = 0; p < count; ++p) {
      const float w = static_cast<float>(weight[p] / sum);
      const float* acc = parts[p].acc + static_cast<size_t>(g) * head_dim;
      if (w != 0.f)
        for (int32_t k = 0; k < head_dim; ++k) o[k] += w * acc[k];
    }
    if (lse) lse[g] = max + static_cast<float>(std::log(sum));
  }
}

}  // namespace pq
