// Reading a caller's tensor that may live in device memory: a host copy
// made by the backend on the sequence's stream, and the query as floats.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "pqcache.h"

namespace pq {

// PQ_ERR_UNSUPPORTED, naming the tensor, unless `backend` can `access`
// ("read" or "write") the memory `t` lives in.
void require_memory_access(const Backend& backend, const pq_tensor& t, const char* name,
                           const char* access);

// Host copy of a caller tensor that may live in device memory, read on
// `stream` (the sequence's). For host tensors it is a plain view; the copy
// covers the tensor's whole span.
struct StagedTensor {
  pq_tensor view;
  std::vector<uint8_t> buffer;
};
StagedTensor stage_input(Backend& backend, const pq_tensor& t, void* stream);
// The staging of t, not filled yet (its buffer is empty for a host tensor).
StagedTensor staging_for(const pq_tensor& t);

// The query heads of one token as floats [q_heads][head_dim] (any dtype,
// host or device memory, read on `stream`), after rejecting NaN and Inf.
std::vector<float> query_floats(Backend& backend, const pq_tensor& query, int32_t q_heads,
                                int32_t head_dim, int32_t dtype, void* stream);
// The same from a query in host memory.
std::vector<float> query_floats(const pq_tensor& host_query, int32_t q_heads, int32_t head_dim,
                                int32_t dtype);

}  // namespace pq
