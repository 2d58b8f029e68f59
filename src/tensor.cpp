#include "tensor.h"

#include <string>

#include "dtype.h"
#include "error.h"

namespace pq {

namespace {
std::string field(const TensorExpect& e, const char* f) { return std::string(e.name) + "." + f; }
}  // namespace

void validate_tensor(const pq_tensor* t, const TensorExpect& e) {
  if (t == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, std::string(e.name) + " is NULL");
  if (t->memory != PQ_MEMORY_HOST && t->memory != PQ_MEMORY_DEVICE)
    fail(PQ_ERR_INVALID_ARGUMENT, field(e, "memory") + " is " + std::to_string(t->memory) +
                                      "; expected PQ_MEMORY_HOST (0) or PQ_MEMORY_DEVICE (1)");
  if (t->dtype != e.dtype)
    fail(PQ_ERR_INVALID_ARGUMENT,
         field(e, "dtype") + " is " + std::to_string(t->dtype) + " (" + dtype_name(t->dtype) +
             "); the context stores " + dtype_name(e.dtype) + " (" + std::to_string(e.dtype) + ")");
  if (t->heads != e.heads)
    fail(PQ_ERR_INVALID_ARGUMENT, field(e, "heads") + " is " + std::to_string(t->heads) +
                                      "; expected " + std::to_string(e.heads));
  if (t->head_dim != e.head_dim)
    fail(PQ_ERR_INVALID_ARGUMENT, field(e, "head_dim") + " is " + std::to_string(t->head_dim) +
                                      "; expected " + std::to_string(e.head_dim));
  if (e.exact_tokens >= 0 && t->tokens != e.exact_tokens)
    fail(PQ_ERR_INVALID_ARGUMENT, field(e, "tokens") + " is " + std::to_string(t->tokens) +
                                      "; expected " + std::to_string(e.exact_tokens));
  if (t->tokens < e.min_tokens)
    fail(PQ_ERR_INVALID_ARGUMENT, field(e, "tokens") + " is " + std::to_string(t->tokens) +
                                      "; expected at least " + std::to_string(e.min_tokens));
  if (t->tokens > INT32_MAX)
    fail(PQ_ERR_INVALID_ARGUMENT, field(e, "tokens") + " is " + std::to_string(t->tokens) +
                                      "; at most 2147483647 tokens are supported");
  if (t->token_stride < 0 || t->head_stride < 0)
    fail(PQ_ERR_INVALID_ARGUMENT, field(e, "token_stride") + " / head_stride are " +
                                      std::to_string(t->token_stride) + " / " +
                                      std::to_string(t->head_stride) + "; strides must be >= 0");
  if (t->tokens > 0 && t->data == nullptr)
    fail(PQ_ERR_INVALID_ARGUMENT, field(e, "data") + " is NULL with " +
                                      std::to_string(t->tokens) + " tokens");
}

int64_t tensor_span_elements(const pq_tensor& t) {
  if (t.tokens == 0 || t.heads == 0) return 0;
  return (t.tokens - 1) * t.token_stride + static_cast<int64_t>(t.heads - 1) * t.head_stride +
         t.head_dim;
}

void reject_non_finite(const pq_tensor& t, const char* name) {
  size_t es = dtype_size(t.dtype);
  for (int64_t tok = 0; tok < t.tokens; ++tok) {
    for (int32_t h = 0; h < t.heads; ++h) {
      int64_t i = find_non_finite(tensor_row(t, tok, h, es), t.dtype, t.head_dim);
      if (i >= 0)
        fail(PQ_ERR_INVALID_ARGUMENT, std::string(name) + " holds a NaN or Inf at token " +
                                          std::to_string(tok) + ", head " + std::to_string(h) +
                                          ", element " + std::to_string(i) +
                                          "; K/V/Q values must be finite");
    }
  }
}

}  // namespace pq
