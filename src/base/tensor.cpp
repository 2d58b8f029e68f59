#include "base/tensor.h"

#include <algorithm>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"

namespace pq {

namespace {
std::string field(const TensorExpect& e, const char* f) { return std::string(e.name) + "." + f; }
}  // namespace

int32_t query_dtype(int32_t stored, const pq_tensor& query, const char* name) {
  if (!dtype_is_fp8(stored)) return stored;
  const int32_t d = query.dtype;
  if (d == PQ_DTYPE_F32 || d == PQ_DTYPE_F16 || d == PQ_DTYPE_BF16) return d;
  fail(PQ_ERR_INVALID_ARGUMENT,
       std::string(name) + ".dtype is " + dtype_text(d) + "; the context stores " +
           dtype_name(stored) + " K/V, whose queries are PQ_DTYPE_F32, PQ_DTYPE_F16 or "
           "PQ_DTYPE_BF16");
}

void validate_tensor(const pq_tensor* t, const TensorExpect& e) {
  if (t == nullptr) fail(PQ_ERR_INVALID_ARGUMENT, std::string(e.name) + " is NULL");
  if (t->memory != PQ_MEMORY_HOST && t->memory != PQ_MEMORY_DEVICE)
    fail(PQ_ERR_INVALID_ARGUMENT, field(e, "memory") + " is " + std::to_string(t->memory) +
                                      "; expected PQ_MEMORY_HOST (0) or PQ_MEMORY_DEVICE (1)");
  if (t->dtype != e.dtype)
    fail(PQ_ERR_INVALID_ARGUMENT,
         field(e, "dtype") + " is " + dtype_text(t->dtype) + "; the context stores " +
             dtype_name(e.dtype));
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
  int64_t bytes = 0;
  if (!tensor_span_bytes(*t, &bytes))
    fail(PQ_ERR_INVALID_ARGUMENT,
         std::string(e.name) + ": the span of " + std::to_string(t->tokens) + " tokens x " +
             "token_stride " + std::to_string(t->token_stride) + " and " +
             std::to_string(t->heads) + " heads x head_stride " + std::to_string(t->head_stride) +
             " overflows (it must fit in int64 bytes and in the address space after data)");
}

bool tensor_span_bytes(const pq_tensor& t, int64_t* bytes) {
  *bytes = 0;
  if (t.tokens <= 0 || t.heads <= 0) return true;
  int64_t tokens_part, heads_part, elements;
  if (__builtin_mul_overflow(t.tokens - 1, t.token_stride, &tokens_part) ||
      __builtin_mul_overflow(static_cast<int64_t>(t.heads) - 1, t.head_stride, &heads_part) ||
      __builtin_add_overflow(tokens_part, heads_part, &elements) ||
      __builtin_add_overflow(elements, static_cast<int64_t>(t.head_dim), &elements) ||
      __builtin_mul_overflow(elements, static_cast<int64_t>(dtype_size(t.dtype)), bytes))
    return false;
  uintptr_t end;
  return !__builtin_add_overflow(reinterpret_cast<uintptr_t>(t.data),
                                 static_cast<uintptr_t>(*bytes), &end);
}

int64_t tensor_span_elements(const pq_tensor& t) {
  if (t.tokens == 0 || t.heads == 0) return 0;
  return (t.tokens - 1) * t.token_stride + static_cast<int64_t>(t.heads - 1) * t.head_stride +
         t.head_dim;
}

namespace {
struct Dim {
  int64_t stride, count;
};

// Rows of head_dim elements at sum(i_k * stride_k), i_k < count_k, are
// pairwise disjoint when, dimensions sorted by stride (those of count 1
// dropped), each stride passes the extent of the smaller ones.
bool disjoint(std::vector<Dim> dims, int64_t head_dim) {
  dims.erase(std::remove_if(dims.begin(), dims.end(), [](const Dim& d) { return d.count <= 1; }),
             dims.end());
  std::sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  int64_t extent = head_dim;  // of the dimensions so far; spans were checked to fit int64
  for (const Dim& d : dims) {
    if (d.stride < extent) return false;
    extent = d.stride * (d.count - 1) + extent;
  }
  return true;
}
}  // namespace

void require_disjoint_rows(const pq_tensor& t, const char* name) {
  if (!disjoint({{t.token_stride, t.tokens}, {t.head_stride, t.heads}}, t.head_dim))
    fail(PQ_ERR_INVALID_ARGUMENT,
         std::string(name) + ": rows overlap (token_stride " + std::to_string(t.token_stride) +
             ", head_stride " + std::to_string(t.head_stride) + ", head_dim " +
             std::to_string(t.head_dim) + " for " + std::to_string(t.tokens) + " tokens and " +
             std::to_string(t.heads) + " heads); an output needs a place for every row");
}

void require_disjoint_outputs(const pq_tensor& a, const char* a_name, const pq_tensor& b,
                              const char* b_name) {
  int64_t a_bytes = 0, b_bytes = 0;
  tensor_span_bytes(a, &a_bytes);
  tensor_span_bytes(b, &b_bytes);
  const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  if (a_bytes == 0 || b_bytes == 0 || a0 + static_cast<uintptr_t>(a_bytes) <= b0 ||
      b0 + static_cast<uintptr_t>(b_bytes) <= a0)
    return;  // the spans do not meet
  const int64_t es = static_cast<int64_t>(dtype_size(a.dtype));
  const int64_t offset = static_cast<int64_t>(a0 > b0 ? a0 - b0 : b0 - a0);
  // Same layout, shifted by whole elements: a third dimension of count 2.
  if (a.dtype == b.dtype && a.tokens == b.tokens && a.heads == b.heads &&
      a.token_stride == b.token_stride && a.head_stride == b.head_stride && offset % es == 0 &&
      disjoint({{a.token_stride, a.tokens}, {a.head_stride, a.heads}, {offset / es, 2}},
               a.head_dim))
    return;
  fail(PQ_ERR_INVALID_ARGUMENT, std::string(a_name) + " and " + b_name +
                                    " overlap: their rows would overwrite each other");
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
