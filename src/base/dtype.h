// Element types of the caller's buffers and their conversion to float.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "pqcache.h"

namespace pq {

bool dtype_valid(int32_t dtype);
size_t dtype_size(int32_t dtype);
const char* dtype_name(int32_t dtype);
// A dtype as error messages write it: its name ("f16"), or for a value that
// is no pq_dtype the number and the values that are.
std::string dtype_text(int32_t dtype);

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);  // round to nearest even
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);  // round to nearest even

// Converts count elements of the given type to float.
void to_float(const void* src, int32_t dtype, int64_t count, float* out);

// One stored element as float (a call per element of to_float would cost
// more than the conversion).
inline float load_element(const uint8_t* p, int32_t dtype) {
  if (dtype == PQ_DTYPE_F32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
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
