// Checks and staging of a call's arguments that several calls share.
#pragma once

#include <cstdint>
#include <vector>

#include "backend.h"
#include "pqcache.h"

namespace pq {

// Checks a caller's selection (pointers, capacity, counts) and returns its
// largest count. positions may be NULL only when capacity is 0.
int64_t check_selection(const pq_selection* sel, int32_t kv_heads);

// Checks every selected position against a layer of n tokens.
void check_positions(const pq_selection* sel, int32_t kv_heads, int64_t n, int32_t layer);

// Host copy of a caller tensor that may live in device memory. For host
// tensors it is a plain view; the copy covers the tensor's whole span.
struct StagedTensor {
  pq_tensor view;
  std::vector<uint8_t> buffer;
};
StagedTensor stage_input(Backend& backend, const pq_tensor& t);

// The query heads of one token as floats [q_heads][head_dim] (any dtype,
// host or device memory), after rejecting NaN and Inf.
std::vector<float> query_floats(Backend& backend, const pq_tensor& query, int32_t q_heads,
                                int32_t head_dim, int32_t dtype);

}  // namespace pq
