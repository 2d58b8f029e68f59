// exp for non-positive arguments in straight-line float arithmetic that
// vectorises (libm's expf does not): the softmax of the GQA combine and of
// pq_decode_attend.
#pragma once

#include <cstdint>
#include <cstring>

#include "base/x86_intrinsics.h"

namespace pq {

// exp(x) for x <= 0, relative error below 2e-7 (Cephes' expf polynomial),
// written as straight-line float and int arithmetic so that the loops below
// vectorise; libm's expf does not, and it dominated the decode step. The
// clamp to [-87, 0] works on the bits (|x| as an integer, then the sign set)
// with a plain ternary: a float compare, or std::min's references, keep GCC
// 12 from vectorising inside the AVX2 build (checked in objdump).
inline float exp_nonpositive(float x) {
#if defined(__clang__)
#pragma clang fp contract(off)  // the same bits in an FMA target (cpu_dispatch.h)
#endif
  int32_t magnitude;
  std::memcpy(&magnitude, &x, sizeof magnitude);
  magnitude &= 0x7fffffff;
  magnitude = magnitude < 0x42ae0000 ? magnitude : 0x42ae0000;  // |x| <= 87.0f
  uint32_t clamped_bits = static_cast<uint32_t>(magnitude) | 0x80000000u;
  std::memcpy(&x, &clamped_bits, sizeof x);  // x = -|x|, in [-87, 0]
  const float log2e = 1.44269504088896341f;
  // Round x*log2e to the nearest integer with the 1.5*2^23 trick.
  const float shifter = 12582912.0f;
  float n = (x * log2e + shifter) - shifter;
  float r = x - n * 0.693359375f;    // ln2, high part (exact product)
  r = r - n * -2.12194440e-4f;       // ln2, low part
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n; n >= -126 here
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

#if PQ_X86_KERNELS
// exp_nonpositive on sixteen lanes: the same operations in the same order
// (no fused multiply-adds: PQ_TARGET_AVX512), so the same bits.
PQ_TARGET_AVX512 inline __m512 exp_nonpositive16(__m512 x) {
  __m512i magnitude = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
  magnitude = _mm512_min_epi32(magnitude, _mm512_set1_epi32(0x42ae0000));
  x = _mm512_castsi512_ps(
      _mm512_or_si512(magnitude, _mm512_set1_epi32(static_cast<int32_t>(0x80000000u))));
  const __m512 shifter = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(
      _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), shifter), shifter);
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(p, r), r), r), _mm512_set1_ps(1.0f));
  const __m512i bits =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}
#endif  // PQ_X86_KERNELS

}  // namespace pq
