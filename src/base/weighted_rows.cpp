// weighted_rows_sum (weighted_rows.h), compiled per kernel level: the loop
// is the same operations at each, so the compiler's vectors give the same
// bits as weighted_rows_at.
#include "base/weighted_rows.h"

#include <algorithm>

#include "base/x86_intrinsics.h"

namespace pq {

namespace {

// Tokens per block: one row's block and the sums stay in L1 while the rows
// are added in.
constexpr int64_t kBlock = 4096;

PQ_ALWAYS_INLINE void sum_body(const WeightedRows& w, float* __restrict out) {
  PQ_FP_CONTRACT_OFF
  for (int64_t at = 0; at < w.n; at += kBlock) {
    const int64_t b = std::min(kBlock, w.n - at);
    float* __restrict o = out + at;
    const float* __restrict first = w.rows + at;
    const float w0 = w.weights[0];
    for (int64_t i = 0; i < b; ++i) o[i] = first[i] * w0;
    for (int32_t r = 1; r < w.count; ++r) {
      const float* __restrict row = w.rows + static_cast<int64_t>(r) * w.n + at;
      const float wr = w.weights[r];
      for (int64_t i = 0; i < b; ++i) o[i] += row[i] * wr;
    }
  }
}

void sum_portable(const WeightedRows& w, float* out) { sum_body(w, out); }
#if PQ_X86_KERNELS
PQ_TARGET_AVX2 void sum_avx2(const WeightedRows& w, float* out) { sum_body(w, out); }
PQ_TARGET_AVX512 void sum_avx512(const WeightedRows& w, float* out) { sum_body(w, out); }
#endif

}  // namespace

void weighted_rows_sum(const WeightedRows& w, float* out) {
#if PQ_X86_KERNELS
  static const auto fn = cpu_level() >= CpuLevel::kAvx512 ? sum_avx512
                         : cpu_level() >= CpuLevel::kAvx2 ? sum_avx2
                                                          : sum_portable;
#else
  static const auto fn = sum_portable;
#endif
  fn(w, out);
}

}  // namespace pq
