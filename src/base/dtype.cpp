#include "base/dtype.h"

#include <cmath>
#include <cstring>

#include "base/cpu_dispatch.h"
#include <immintrin.h>

namespace pq {

bool dtype_valid(int32_t dtype) {
  return dtype == PQ_DTYPE_F32 || dtype == PQ_DTYPE_F16 || dtype == PQ_DTYPE_BF16 ||
         dtype_is_fp8(dtype);
}

size_t dtype_size(int32_t dtype) {
  return dtype == PQ_DTYPE_F32 ? 4 : dtype_is_fp8(dtype) ? 1 : 2;
}

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case PQ_DTYPE_F32: return "f32";
    case PQ_DTYPE_F16: return "f16";
    case PQ_DTYPE_BF16: return "bf16";
    case PQ_DTYPE_FP8_E4M3: return "fp8_e4m3";
    case PQ_DTYPE_FP8_E5M2: return "fp8_e5m2";
    default: return "invalid";
  }
}

std::string dtype_text(int32_t dtype) {
  if (dtype_valid(dtype)) return dtype_name(dtype);
  return std::to_string(dtype) +
         " (not a pq_dtype; PQ_DTYPE_F32 (0) is f32, PQ_DTYPE_F16 (1) f16, PQ_DTYPE_BF16 (2) bf16, "
         "PQ_DTYPE_FP8_E4M3 (3) fp8_e4m3, PQ_DTYPE_FP8_E5M2 (4) fp8_e5m2)";
}

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int shift = 0;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        ++shift;
      }
      mantissa &= 0x3ffu;
      bits = sign | static_cast<uint32_t>(127 - 15 + 1 - shift) << 23 | mantissa << 13;
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | mantissa << 13;
  } else {
    bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to Inf
  if (abs < 0x38800000u) {  // subnormal or zero in half
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t exponent = abs >> 23;
    uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exponent;  // 14 - (exponent - 127) + 13 - 1 ... bits to drop
    uint32_t half_m = mantissa >> (shift);
    uint32_t rem = mantissa & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_m & 1u))) ++half_m;
    return static_cast<uint16_t>(sign | half_m);
  }
  uint32_t half_bits = ((abs - 0x38000000u) >> 13);
  uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half_bits & 1u))) ++half_bits;
  return static_cast<uint16_t>(sign | half_bits);
}

float bf16_to_float(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

namespace {

// Element i of a caller's buffer, which need not be aligned (a numpy view at
// any byte offset): memcpy is the defined way, and compiles to one load.
template <typename T>
inline T load(const void* base, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const unsigned char*>(base) + i * static_cast<int64_t>(sizeof(T)),
              sizeof(T));
  return v;
}

// F16C converts eight halves per instruction, exactly; the exact scan and
// K-Means read every key through here. The portable loop is the fallback.
__attribute__((target("avx,f16c"))) void halves_to_float_f16c(const void* h, int64_t count,
                                                             float* out) {
  int64_t i = 0;
  const unsigned char* bytes = static_cast<const unsigned char*>(h);
  for (; i + 8 <= count; i += 8) {  // loadu: no alignment needed
    __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 2 * i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(packed));
  }
  for (; i < count; ++i) out[i] = half_to_float(load<uint16_t>(h, i));
}

// fp8 through F16C, eight codes per step: an e5m2 code is the top byte of
// a binary16, and an e4m3 code b is the binary16 ((b & 0x80) << 8) |
// ((b & 0x7F) << 7) times 2^8 (normals and subnormals alike: the exponent
// bias differs by 8). Exact: the products by 2^8 are, and the one by
// `scale` rounds once, as the table's value times scale does. Measured
// against a table gather in bench_fp8 (docs/perf.md).
__attribute__((target("avx2,f16c"))) void fp8_to_float_f16c(const uint8_t* src, bool e4m3,
                                                           int64_t count, float scale,
                                                           float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  const __m256 two8 = _mm256_set1_ps(256.f);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    __m128i w = _mm_unpacklo_epi8(_mm_setzero_si128(),
                                  _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i)));
    __m256 f;
    if (e4m3) {
      w = _mm_and_si128(_mm_srai_epi16(w, 1), _mm_set1_epi16(static_cast<short>(0xBF80)));
      f = _mm256_mul_ps(_mm256_cvtph_ps(w), two8);
    } else {
      f = _mm256_cvtph_ps(w);
    }
    _mm256_storeu_ps(out + i, _mm256_mul_ps(f, s));
  }
  const std::array<float, 256>& table = e4m3 ? kE4m3ToFloat : kE5m2ToFloat;
  for (; i < count; ++i) out[i] = table[src[i]] * scale;
}

}  // namespace

void to_float(const void* src, int32_t dtype, int64_t count, float* out, float scale) {
  if (dtype_is_fp8(dtype)) {
    const auto* bytes = static_cast<const uint8_t*>(src);
    const bool e4m3 = dtype == PQ_DTYPE_FP8_E4M3;
    // The e4m3 code 0x7F is NaN, which the binary16 route would not give:
    // stored K/V never hold it (rejected at ingest); the table does.
    if (cpu_has_avx2() && cpu_has_f16c()) return fp8_to_float_f16c(bytes, e4m3, count, scale, out);
    const std::array<float, 256>& table = e4m3 ? kE4m3ToFloat : kE5m2ToFloat;
    for (int64_t i = 0; i < count; ++i) out[i] = table[bytes[i]] * scale;
    return;
  }
  switch (dtype) {
    case PQ_DTYPE_F32:
      std::memcpy(out, src, static_cast<size_t>(count) * 4);
      break;
    case PQ_DTYPE_F16:
      if (cpu_has_f16c()) {
        halves_to_float_f16c(src, count, out);
      } else {
        for (int64_t i = 0; i < count; ++i) out[i] = half_to_float(load<uint16_t>(src, i));
      }
      break;
    default:
      for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_float(load<uint16_t>(src, i));
      break;
  }
  if (scale != 1.f)
    for (int64_t i = 0; i < count; ++i) out[i] *= scale;
}

namespace {
// One pass: each element is stored and its exponent tested, branch-free,
// so that the loop vectorises (the AVX2 build runs 16 halves a step).
template <typename Bits>
PQ_ALWAYS_INLINE bool copy_checking(void* dst, const void* src, int64_t count, Bits exponent) {
  Bits bad = 0;
  unsigned char* d = static_cast<unsigned char*>(dst);
  for (int64_t i = 0; i < count; ++i) {
    const Bits v = load<Bits>(src, i);
    std::memcpy(d + i * static_cast<int64_t>(sizeof(Bits)), &v, sizeof(Bits));
    bad |= static_cast<Bits>((v & exponent) == exponent);
  }
  return bad == 0;
}
// e4m3fn has no Inf, and NaN only where every bit but the sign is set.
PQ_ALWAYS_INLINE bool copy_checking_e4m3(void* dst, const void* src, int64_t count) {
  uint8_t bad = 0;
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < count; ++i) {
    d[i] = s[i];
    bad |= static_cast<uint8_t>((s[i] & 0x7fu) == 0x7fu);
  }
  return bad == 0;
}
PQ_ALWAYS_INLINE bool copy_if_finite_body(void* dst, const void* src, int64_t count,
                                          int32_t dtype) {
  switch (dtype) {
    case PQ_DTYPE_F32: return copy_checking<uint32_t>(dst, src, count, 0x7f800000u);
    case PQ_DTYPE_F16: return copy_checking<uint16_t>(dst, src, count, 0x7c00u);
    case PQ_DTYPE_FP8_E4M3: return copy_checking_e4m3(dst, src, count);
    case PQ_DTYPE_FP8_E5M2: return copy_checking<uint8_t>(dst, src, count, 0x7cu);
    default: return copy_checking<uint16_t>(dst, src, count, 0x7f80u);
  }
}
PQ_TARGET_AVX2 bool copy_if_finite_avx2(void* dst, const void* src, int64_t count, int32_t dtype) {
  return copy_if_finite_body(dst, src, count, dtype);
}
bool copy_if_finite_portable(void* dst, const void* src, int64_t count, int32_t dtype) {
  return copy_if_finite_body(dst, src, count, dtype);
}
}  // namespace

bool copy_if_finite(void* dst, const void* src, int64_t count, int32_t dtype) {
  static const auto impl = cpu_has_avx2() ? copy_if_finite_avx2 : copy_if_finite_portable;
  return impl(dst, src, count, dtype);
}

namespace {
// Index of the first element whose bits under `mask` are all set (an
// exponent of all ones: Inf or NaN; for e4m3fn, its NaN), or -1.
template <typename Bits>
int64_t first_all_set(const void* src, int64_t count, Bits mask) {
  for (int64_t i = 0; i < count; ++i)
    if ((load<Bits>(src, i) & mask) == mask) return i;
  return -1;
}
}  // namespace

int64_t find_non_finite(const void* src, int32_t dtype, int64_t count) {
  switch (dtype) {
    case PQ_DTYPE_F32: return first_all_set<uint32_t>(src, count, 0x7f800000u);
    case PQ_DTYPE_F16: return first_all_set<uint16_t>(src, count, 0x7c00u);
    case PQ_DTYPE_FP8_E4M3: return first_all_set<uint8_t>(src, count, 0x7fu);
    case PQ_DTYPE_FP8_E5M2: return first_all_set<uint8_t>(src, count, 0x7cu);
    default: return first_all_set<uint16_t>(src, count, 0x7f80u);
  }
}

}  // namespace pq
