// backend/staging.h.
#include "backend/staging.h"

#include "base/dtype.h"
#include "base/error.h"
#include "base/tensor.h"

namespace pq {

void require_memory_access(const Backend& backend, const pq_tensor& t, const char* name,
                           const char* access) {
  if (!backend.supports_memory(t.memory))
    fail(PQ_ERR_UNSUPPORTED, std::string(name) + ".memory is PQ_MEMORY_DEVICE, which the " +
                                 backend.name() + " backend cannot " + access +
                                 " (use PQ_BACKEND_CUDA or PQ_BACKEND_AUTO)");
}

StagedTensor stage_input(Backend& backend, const pq_tensor& t, void* stream) {
  StagedTensor s = staging_for(t);
  if (!s.buffer.empty())
    backend.copy_to_host(s.buffer.data(), t.data, s.buffer.size(), t.memory, stream);
  return s;
}

StagedTensor staging_for(const pq_tensor& t) {
  StagedTensor s;
  s.view = t;
  if (t.memory == PQ_MEMORY_HOST) return s;
  const size_t bytes = static_cast<size_t>(tensor_span_elements(t)) * dtype_size(t.dtype);
  s.buffer.resize(bytes);
  s.view.data = s.buffer.data();
  s.view.memory = PQ_MEMORY_HOST;
  return s;
}

std::vector<float> query_floats(Backend& backend, const pq_tensor& query, int32_t q_heads,
                                int32_t head_dim, int32_t dtype, void* stream) {
  return query_floats(stage_input(backend, query, stream).view, q_heads, head_dim, dtype);
}

std::vector<float> query_floats(const pq_tensor& host_query, int32_t q_heads, int32_t head_dim,
                                int32_t dtype) {
  reject_non_finite(host_query, "query");
  std::vector<float> out(static_cast<size_t>(q_heads) * head_dim);
  for (int32_t h = 0; h < q_heads; ++h)
    to_float(tensor_row(host_query, 0, h, dtype_size(dtype)), dtype, head_dim,
             out.data() + static_cast<size_t>(h) * head_dim);
  return out;
}

}  // namespace pq
