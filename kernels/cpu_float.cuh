// The CPU's float arithmetic on the device, operation for operation, for
// the kernels whose results must be the host's bit for bit: elements read
// as float exactly, the eight-lane dot() of src/base/vector_math.h and the
// exp_nonpositive() of src/base/fast_exp.h. __fmul_rn / __fadd_rn keep nvcc
// from contracting into FMAs, which the CPU build never uses.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "pqcache.h"

namespace pqcuda {

// One element of a query or key row, as float (exact for f16 and bf16).
__device__ __forceinline__ float load_element(const uint8_t* p, int32_t dtype) {
  if (dtype == PQ_DTYPE_F16) return __half2float(*reinterpret_cast<const __half*>(p));
  if (dtype == PQ_DTYPE_BF16) return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
  return *reinterpret_cast<const float*>(p);
}

// dot(): lane l sums the products of elements l, l + 8, ..., the lanes are
// added in order to 0, then the tail. a(d) and b(d) give element d.
template <typename A, typename B>
__device__ __forceinline__ float cpu_dot(A a, B b, int32_t n) {
  float lanes[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int32_t d = 0;
  for (; d + 8 <= n; d += 8)
#pragma unroll
    for (int l = 0; l < 8; ++l) lanes[l] = __fadd_rn(lanes[l], __fmul_rn(a(d + l), b(d + l)));
  float s = 0.f;
#pragma unroll
  for (int l = 0; l < 8; ++l) s = __fadd_rn(s, lanes[l]);
  for (; d < n; ++d) s = __fadd_rn(s, __fmul_rn(a(d), b(d)));
  return s;
}

// exp_nonpositive(): the softmax numerators of the GQA combine.
__device__ __forceinline__ float exp_nonpositive(float x) {
  int32_t magnitude = __float_as_int(x) & 0x7fffffff;
  magnitude = magnitude < 0x42ae0000 ? magnitude : 0x42ae0000;  // |x| <= 87
  x = __int_as_float(magnitude | static_cast<int32_t>(0x80000000u));
  const float log2e = 1.44269504088896341f;
  const float shifter = 12582912.0f;
  float n = __fsub_rn(__fadd_rn(__fmul_rn(x, log2e), shifter), shifter);
  float r = __fsub_rn(x, __fmul_rn(n, 0.693359375f));
  r = __fsub_rn(r, __fmul_rn(n, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = __fadd_rn(__fmul_rn(p, r), 1.3981999507e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 8.3334519073e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 4.1665795894e-2f);
  p = __fadd_rn(__fmul_rn(p, r), 1.6666665459e-1f);
  p = __fadd_rn(__fmul_rn(p, r), 5.0000001201e-1f);
  p = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(p, r), r), r), 1.0f);
  float scale = __int_as_float((static_cast<int32_t>(n) + 127) << 23);
  return __fmul_rn(p, scale);
}

}  // namespace pqcuda
