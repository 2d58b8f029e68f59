// What the SIMD kernels of attend_rows (attention_avx2.cpp,
// attention_avx512.cpp) share: element sizes, the fp8 load factor, the
// unroll pragma and the dispatch on the group size.
#pragma once

#include <cstdint>
#include <type_traits>

#include "pqcache.h"

#if defined(__clang__)
#define PQ_UNROLL _Pragma("unroll")
#else
#define PQ_UNROLL _Pragma("GCC unroll 16")
#endif

namespace pq {

// Bytes per element of a row.
template <int Dtype>
constexpr int kElem = Dtype == PQ_DTYPE_F32 ? 4
                      : (Dtype == PQ_DTYPE_FP8_E4M3 || Dtype == PQ_DTYPE_FP8_E5M2) ? 1
                                                                                    : 2;

// What an fp8 row's floats from the kernels' loads must be multiplied by:
// e4m3 comes out of the binary16 route 2^8 too small (see load8 in
// attention_avx2.cpp), e5m2 exact.
template <int Dtype>
constexpr float kLoadScale = Dtype == PQ_DTYPE_FP8_E4M3 ? 256.f : 1.f;

// f(std::integral_constant<int, group>{}) for a group of 1 to 8; false
// (nothing called) for any other.
template <typename F>
bool with_group(int32_t group, F&& f) {
  switch (group) {
    case 1: f(std::integral_constant<int, 1>{}); return true;
    case 2: f(std::integral_constant<int, 2>{}); return true;
    case 3: f(std::integral_constant<int, 3>{}); return true;
    case 4: f(std::integral_constant<int, 4>{}); return true;
    case 5: f(std::integral_constant<int, 5>{}); return true;
    case 6: f(std::integral_constant<int, 6>{}); return true;
    case 7: f(std::integral_constant<int, 7>{}); return true;
    case 8: f(std::integral_constant<int, 8>{}); return true;
    default: return false;
  }
}

}  // namespace pq
