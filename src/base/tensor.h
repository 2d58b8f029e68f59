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

// The dtype a query tensor must have in a context that stores `stored`:
// that dtype, except with fp8 K/V, whose queries keep their own F32, F16
// or BF16 (an fp8 query throws PQ_ERR_INVALID_ARGUMENT naming `name`).
int32_t query_dtype(int32_t stored, const pq_tensor& query, const char* name);

// Throws pq::Error(PQ_ERR_INVALID_ARGUMENT) naming the field that is wrong,
// including a span (strides x sizes) that overflows int64 bytes or the
// address space: after it, every row address of the tensor is computable.
void validate_tensor(const pq_tensor* tensor, const TensorExpect& expect);

// The bytes from the first to one past the last element a tensor addresses
// (0 when it has no rows), or false when that overflows int64 or, with its
// data pointer added, the address space.
bool tensor_span_bytes(const pq_tensor& tensor, int64_t* bytes);

// Number of elements from the first to one past the last element addressed;
// for tensors validate_tensor accepted.
int64_t tensor_span_elements(const pq_tensor& tensor);

// Throws PQ_ERR_INVALID_ARGUMENT unless the rows of distinct (token, head)
// pairs are disjoint: sorting the strides of the dimensions with more than
// one element, the smaller is >= head_dim and the larger >= the smaller x
// (its count - 1) + head_dim. Outputs must pass it (inputs may repeat rows).
void require_disjoint_rows(const pq_tensor& tensor, const char* name);

// The same for two outputs written by one call: their spans are disjoint,
// or they have the same shape and strides and their rows interleave
// without touching.
void require_disjoint_outputs(const pq_tensor& a, const char* a_name, const pq_tensor& b,
                              const char* b_name);

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
