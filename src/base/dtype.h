// Element types of the caller's buffers and their conversion to float.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "pqcache.h"

namespace pq {

bool dtype_valid(int32_t dtype);
inline bool dtype_is_fp8(int32_t dtype) {
  return dtype == PQ_DTYPE_FP8_E4M3 || dtype == PQ_DTYPE_FP8_E5M2;
}
size_t dtype_size(int32_t dtype);
const char* dtype_name(int32_t dtype);
// A dtype as error messages write it: its name ("f16"), or for a value that
// is no pq_dtype the number and the values that are.
std::string dtype_text(int32_t dtype);

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);  // round to nearest even
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);  // round to nearest even

// Every fp8 code as float: 256 entries per format, built at compile time
// from the bit fields, so a conversion is one load and exact.
namespace fp8_detail {
constexpr float pow2(int e) {
  float f = 1.f;
  for (; e > 0; --e) f *= 2.f;
  for (; e < 0; ++e) f *= 0.5f;
  return f;
}
// exponent_bits 4 (e4m3fn: bias 7, no Inf, S.1111.111 NaN) or 5 (e5m2:
// bias 15, exponent 31 Inf or NaN).
constexpr std::array<float, 256> table(int exponent_bits) {
  std::array<float, 256> t{};
  const int mantissa_bits = 7 - exponent_bits;
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const int top = (1 << exponent_bits) - 1;
  for (int b = 0; b < 256; ++b) {
    const int e = (b >> mantissa_bits) & top, m = b & ((1 << mantissa_bits) - 1);
    float v = 0.f;
    if (exponent_bits == 5 && e == top)
      v = m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
    else if (exponent_bits == 4 && e == top && m == 7)
      v = std::numeric_limits<float>::quiet_NaN();
    else if (e == 0)
      v = static_cast<float>(m) * pow2(1 - bias - mantissa_bits);
    else
      v = static_cast<float>((1 << mantissa_bits) + m) * pow2(e - bias - mantissa_bits);
    // Negation, not a product with -1: clang refuses arithmetic on a NaN in
    // a constant expression (sign * NaN), and a negation is no arithmetic.
    t[static_cast<size_t>(b)] = (b & 0x80) ? -v : v;
  }
  return t;
}
}  // namespace fp8_detail
inline constexpr std::array<float, 256> kE4m3ToFloat = fp8_detail::table(4);
inline constexpr std::array<float, 256> kE5m2ToFloat = fp8_detail::table(5);

// Converts count elements of the given type to float, each times `scale`
// (an fp8 layer's scale; 1 for the other dtypes): one rounding, the same
// as stored value * scale computed in float.
void to_float(const void* src, int32_t dtype, int64_t count, float* out, float scale = 1.f);

// One stored element as float, unscaled (a call per element of to_float
// would cost more than the conversion).
inline float load_element(const uint8_t* p, int32_t dtype) {
  if (dtype == PQ_DTYPE_F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  if (dtype == PQ_DTYPE_FP8_E4M3) return kE4m3ToFloat[*p];
  if (dtype == PQ_DTYPE_FP8_E5M2) return kE5m2ToFloat[*p];
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dtype == PQ_DTYPE_F16 ? half_to_float(h) : bf16_to_float(h);
}

// Copies count elements and returns whether all of them are finite: the
// ingest's copy and check in one pass over the source.
bool copy_if_finite(void* dst, const void* src, int64_t count, int32_t dtype);

// Index of the first NaN or Inf among count elements, or -1.
int64_t find_non_finite(const void* src, int32_t dtype, int64_t count);

}  // namespace pq
