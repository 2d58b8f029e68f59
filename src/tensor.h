// Validation of and row access to the caller's pq_tensor descriptors.
#pragma once

#include <cstdint>

#include "pqcache.h"

namespace pq {

struct TensorExpect {
  const char* name;      // argument name for messages: "keys", "query", ...
  int32_t heads;         // required heads
  int32_t head_dim;      // required head_dim
  int32_t dtype;         // required dtype
  int64_t min_tokens;    // at least this many tokens
  int64_t exact_tokens;  // if >= 0, exactly this many tokens
};

// Throws pq::Error(PQ_ERR_INVALID_ARGUMENT) naming the field that is wrong.
void validate_tensor(const pq_tensor* tensor, const TensorExpect& expect);

// Number of elements from the first to one past the last element addressed.
int64_t tensor_span_elements(const pq_tensor& tensor);

// Host address of row (token, head).
inline const uint8_t* tensor_row(const pq_tensor& t, int64_t token, int32_t head,
                                 size_t element_size) {
  return static_cast<const uint8_t*>(t.data) +
         (token * t.token_stride + static_cast<int64_t>(head) * t.head_stride) *
             static_cast<int64_t>(element_size);
}
inline uint8_t* tensor_row_mut(const pq_tensor& t, int64_t token, int32_t head,
                               size_t element_size) {
  return static_cast<uint8_t*>(t.data) +
         (token * t.token_stride + static_cast<int64_t>(head) * t.head_stride) *
             static_cast<int64_t>(element_size);
}

// Throws PQ_ERR_INVALID_ARGUMENT naming the (token, head) of the first NaN or
// Inf in a host tensor.
void reject_non_finite(const pq_tensor& tensor, const char* name);

}  // namespace pq
