#include "backend/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/cpu_dispatch.h"
#include "base/dtype.h"
#include "base/fast_exp.h"
#include "base/vector_math.h"

namespace pq {

namespace {

// Selected rows are scattered over the store: the loops are bound by
// memory latency, so every cache line of a row a few tokens ahead is
// requested early.
constexpr int64_t kPrefetchAhead = 8;
PQ_ALWAYS_INLINE void prefetch_row(const uint8_t* row, size_t bytes) {
  for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b);
}

PQ_ALWAYS_INLINE void attend_body(const KvStore& store, int32_t kv_head, const int32_t* pos,
                                  int64_t count, const float* queries, int32_t group_size,
                                  float scale, float* out, float* lse, float* work) {
  const int32_t d = store.head_dim(), dtype = store.dtype();
  std::fill(out, out + static_cast<size_t>(group_size) * d, 0.f);
  if (count == 0) {
    for (int32_t g = 0; g < group_size; ++g)
      if (lse) lse[g] = -std::numeric_limits<float>::infinity();
    return;
  }
  float* logits = work;                                        // [group][count]
  float* row = work + static_cast<size_t>(group_size) * count;  // one K or V row as floats
  const size_t row_bytes = store.row_bytes();
  // Logits: each key row converted once for the whole group.
  for (int64_t i = 0; i < count; ++i) {
    if (i + kPrefetchAhead < count) prefetch_row(store.key_row(pos[i + kPrefetchAhead], kv_head), row_bytes);
    to_float(store.key_row(pos[i], kv_head), dtype, d, row);
    for (int32_t g = 0; g < group_size; ++g)
      logits[static_cast<size_t>(g) * count + i] =
          dot(queries + static_cast<size_t>(g) * d, row, d) * scale;
  }
  // Softmax weights per query head, and the log-sum-exp.
  for (int32_t g = 0; g < group_size; ++g) {
    float* l = logits + static_cast<size_t>(g) * count;
    const float max = *std::max_element(l, l + count);
    for (int64_t i = 0; i < count; ++i) l[i] = exp_nonpositive(l[i] - max);
    double sum = 0.0;
    for (int64_t i = 0; i < count; ++i) sum += l[i];
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < count; ++i) l[i] *= inv;
    if (lse) lse[g] = max + static_cast<float>(std::log(sum));
  }
  // Values: each row converted once, added into every query head's output.
  for (int64_t i = 0; i < count; ++i) {
    if (i + kPrefetchAhead < count)
      prefetch_row(store.value_row(pos[i + kPrefetchAhead], kv_head), row_bytes);
    to_float(store.value_row(pos[i], kv_head), dtype, d, row);
    for (int32_t g = 0; g < group_size; ++g) {
      const float w = logits[static_cast<size_t>(g) * count + i];
      float* o = out + static_cast<size_t>(g) * d;
      for (int32_t k = 0; k < d; ++k) o[k] += w * row[k];
    }
  }
}

// FMA too: the dot products and the value updates contract to it.
__attribute__((target("avx2,fma"))) void attend_avx2(const KvStore& store, int32_t kv_head, const int32_t* pos,
                                int64_t count, const float* queries, int32_t group_size,
                                float scale, float* out, float* lse, float* work) {
  attend_body(store, kv_head, pos, count, queries, group_size, scale, out, lse, work);
}
void attend_portable(const KvStore& store, int32_t kv_head, const int32_t* pos, int64_t count,
                     const float* queries, int32_t group_size, float scale, float* out,
                     float* lse, float* work) {
  attend_body(store, kv_head, pos, count, queries, group_size, scale, out, lse, work);
}

}  // namespace

void attend_head(const KvStore& store, int32_t kv_head, const int32_t* pos, int64_t count,
                 const float* queries, int32_t group_size, float scale, float* out, float* lse,
                 float* work) {
  static const auto impl =
      cpu_has_avx2() && __builtin_cpu_supports("fma") ? attend_avx2 : attend_portable;
  impl(store, kv_head, pos, count, queries, group_size, scale, out, lse, work);
}

int64_t attention_work_floats(int64_t count, int32_t group_size, int32_t head_dim) {
  return count * group_size + head_dim;
}

}  // namespace pq
