// Small float kernels shared by the selectors.
#pragma once

#include <cstdint>

namespace pq {

// q . c with eight partial sums, so that g++ vectorises it without
// -ffast-math (a single running sum fixes the order of the additions).
// Integer-valued inputs still give exact results.
inline float dot(const float* q, const float* c, int32_t n) {
  constexpr int kLanes = 8;
  float lanes[kLanes] = {};
  int32_t d = 0;
  for (; d + kLanes <= n; d += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += q[d + l] * c[d + l];
  float s = 0.f;
  for (int l = 0; l < kLanes; ++l) s += lanes[l];
  for (; d < n; ++d) s += q[d] * c[d];
  return s;
}

}  // namespace pq
