#include "call_args.h"

#include <algorithm>
#include <string>

#include "dtype.h"
#include "error.h"
#include "tensor.h"

namespace pq {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
[[noreturn]] void invalid(const std::string& message) { fail(PQ_ERR_INVALID_ARGUMENT, message); }
}  // namespace

int64_t check_selection(const pq_selection* sel, int32_t kv_heads) {
  if (sel == nullptr) invalid("selection is NULL");
  if (sel->counts == nullptr) invalid("selection->counts is NULL");
  if (sel->capacity < 0) invalid("selection->capacity is " + str(sel->capacity));
  if (sel->positions == nullptr && sel->capacity > 0) invalid("selection->positions is NULL");
  int64_t max_count = 0;
  for (int32_t h = 0; h < kv_heads; ++h) {
    if (sel->counts[h] < 0 || sel->counts[h] > sel->capacity)
      invalid("selection->counts[" + str(h) + "] is " + str(sel->counts[h]) + "; expected 0.." +
              str(sel->capacity));
    max_count = std::max<int64_t>(max_count, sel->counts[h]);
  }
  return max_count;
}

void check_positions(const pq_selection* sel, int32_t kv_heads, int64_t n, int32_t layer) {
  for (int32_t h = 0; h < kv_heads; ++h)
    for (int32_t i = 0; i < sel->counts[h]; ++i) {
      const int32_t p = sel->positions[h * sel->capacity + i];
      if (p < 0 || p >= n)
        invalid("selection->positions[" + str(h) + " * capacity + " + str(i) + "] is " + str(p) +
                "; layer " + str(layer) + " holds " + str(n) + " tokens");
    }
}

StagedTensor stage_input(Backend& backend, const pq_tensor& t) {
  StagedTensor s;
  s.view = t;
  if (t.memory == PQ_MEMORY_HOST) return s;
  const size_t bytes = static_cast<size_t>(tensor_span_elements(t)) * dtype_size(t.dtype);
  s.buffer.resize(bytes);
  backend.copy_to_host(s.buffer.data(), t.data, bytes, t.memory);
  s.view.data = s.buffer.data();
  s.view.memory = PQ_MEMORY_HOST;
  return s;
}

std::vector<float> query_floats(Backend& backend, const pq_tensor& query, int32_t q_heads,
                                int32_t head_dim, int32_t dtype) {
  StagedTensor q = stage_input(backend, query);
  reject_non_finite(q.view, "query");
  std::vector<float> out(static_cast<size_t>(q_heads) * head_dim);
  for (int32_t h = 0; h < q_heads; ++h)
    to_float(tensor_row(q.view, 0, h, dtype_size(dtype)), dtype, head_dim,
             out.data() + static_cast<size_t>(h) * head_dim);
  return out;
}

}  // namespace pq
