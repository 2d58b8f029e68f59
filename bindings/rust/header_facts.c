/* Prints what the C compiler knows about include/pqcache.h that
 * tests/struct_layout.c does not: every field's C type and every enum and
 * macro constant. pqcache-sys/tests/header.rs compares these lines with the
 * Rust declarations; together with pq_struct_layout (sizes, offsets) the
 * Rust side (bindgen's output, committed) cannot drift from the header
 * unnoticed.
 *   field STRUCT FIELD CTYPE     const NAME VALUE     string NAME VALUE
 *   callback NAME CTYPE
 * C11 for _Generic. The fields come from tests/public_fields.h; a constant
 * added to the header must be added here (the test finds the header's
 * names and asks for them). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pqcache.h"
#include "public_fields.h"

#define C_TYPE(x)                                                                         \
  _Generic((x), int32_t: "int32_t", uint32_t: "uint32_t", int64_t: "int64_t",              \
           uint64_t: "uint64_t", float: "float", double: "double", void*: "void*",          \
           const char*: "const char*", const float*: "const float*", int32_t*: "int32_t*", \
           pq_tensor: "pq_tensor",                                                          \
           const int64_t*: "const int64_t*", const int32_t*: "const int32_t*",             \
           pq_selection: "pq_selection",                            \
           pq_log_fn: "void (*)(void*, int32_t, const char*)",                             \
           pq_alloc_fn: "void* (*)(void*, size_t, size_t)",                                 \
           pq_free_fn: "void (*)(void*, void*, size_t)",                                    \
           pq_build_done_fn: "void (*)(void*, uint64_t, int32_t, pq_status)",              \
           pq_disk_read_fn: "int64_t (*)(void*, int, void*, uint64_t, uint64_t)",           \
           pq_disk_write_fn: "int64_t (*)(void*, int, const void*, uint64_t, uint64_t)",    \
           pq_build_progress_fn: "void (*)(void*, const pq_build_progress*)",               \
           pq_pool*: "pq_pool*", default: "unknown")
#define FIELD(s, f) printf("field %s %s %s\n", #s, #f, C_TYPE(((s*)0)->f));
#define CONST(c) printf("const %s %lld\n", #c, (long long)(c))
/* A function-pointer typedef's signature, confirmed by the compiler: the
 * association matches only a compatible function type. */
#define CALLBACK(name, signature) \
  printf("callback %s %s\n", #name, _Generic((name)0, signature: #signature, default: "unknown"))

int main(void) {
  PQ_PUBLIC_FIELDS(FIELD)

  CONST(PQ_VERSION_MAJOR); CONST(PQ_VERSION_MINOR); CONST(PQ_VERSION_PATCH); CONST(PQ_VERSION_NUMBER);
  printf("string PQ_VERSION_STRING %s\n", PQ_VERSION_STRING);

  CONST(PQ_OK); CONST(PQ_ERR_INVALID_ARGUMENT); CONST(PQ_ERR_OUT_OF_MEMORY); CONST(PQ_ERR_BAD_STATE);
  CONST(PQ_ERR_NOT_FOUND); CONST(PQ_ERR_UNSUPPORTED); CONST(PQ_ERR_BACKEND); CONST(PQ_ERR_INTERNAL);
  CONST(PQ_ERR_BUFFER_TOO_SMALL); CONST(PQ_ERR_CORRUPT); CONST(PQ_ERR_INCOMPATIBLE);
  CONST(PQ_DTYPE_F32); CONST(PQ_DTYPE_F16); CONST(PQ_DTYPE_BF16);
  CONST(PQ_DTYPE_FP8_E4M3); CONST(PQ_DTYPE_FP8_E5M2);
  CONST(PQ_MEMORY_HOST); CONST(PQ_MEMORY_DEVICE);
  CONST(PQ_SELECTOR_PQ); CONST(PQ_SELECTOR_EXACT); CONST(PQ_SELECTOR_WINDOW); CONST(PQ_SELECTOR_SPARQ);
  CONST(PQ_SELECTOR_INFLLM); CONST(PQ_SELECTOR_QUEST); CONST(PQ_SELECTOR_RANDOM); CONST(PQ_SELECTOR_H2O);
  CONST(PQ_SELECTOR_SCOPE); CONST(PQ_SELECTOR_SNAPKV); CONST(PQ_SELECTOR_PYRAMIDKV);
  CONST(PQ_SELECTOR_SCISSORHANDS);
  CONST(PQ_SELECTOR_KEYFORMER);
  CONST(PQ_SELECTOR_CLUSTERKV);
  CONST(PQ_SELECTOR_ADAKV);
  CONST(PQ_SELECTOR_ZIGZAGKV);
  CONST(PQ_SELECTOR_PYRAMIDINFER);
  CONST(PQ_SELECTOR_FASTGEN);
  CONST(PQ_SELECTOR_INFINIGEN); CONST(PQ_SELECTOR_COUNT);
  CONST(PQ_TOKEN_PLAIN); CONST(PQ_TOKEN_SPECIAL); CONST(PQ_TOKEN_PUNCTUATION);
  CONST(PQ_GQA_SUM_SOFTMAX); CONST(PQ_GQA_MAX); CONST(PQ_GQA_MEAN);
  CONST(PQ_KMEANS_INIT_RANDOM); CONST(PQ_KMEANS_INIT_KMEANSPP);
  CONST(PQ_BACKEND_CPU); CONST(PQ_BACKEND_CUDA); CONST(PQ_BACKEND_AUTO);
  CONST(PQ_CACHE_LRU); CONST(PQ_CACHE_LFU);
  CONST(PQ_ROTARY_NONE); CONST(PQ_ROTARY_HALF); CONST(PQ_ROTARY_INTERLEAVED);
  CONST(PQ_POOLING_MAX); CONST(PQ_POOLING_AVG);
  CONST(PQ_TAIL_NONE); CONST(PQ_TAIL_CODE_MEANS);
  CONST(PQ_KV_TIER_HOST); CONST(PQ_KV_TIER_DISK); CONST(PQ_KV_TIER_CALLER);
  CONST(PQ_ROWS_PER_TOKEN); CONST(PQ_ROWS_PER_HEAD); CONST(PQ_ROWS_PER_REQUEST);
  CONST(PQ_LAYOUT_TOKEN_MAJOR); CONST(PQ_LAYOUT_HEAD_MAJOR);
  CONST(PQ_LOG_ERROR); CONST(PQ_LOG_WARN); CONST(PQ_LOG_INFO); CONST(PQ_LOG_DEBUG);
  CONST(PQ_BUILD_STAGE_KMEANS); CONST(PQ_BUILD_STAGE_ENCODE);

  CALLBACK(pq_write_fn, int (*)(void*, const void*, size_t));
  CALLBACK(pq_log_fn, void (*)(void*, int32_t, const char*));
  CALLBACK(pq_alloc_fn, void* (*)(void*, size_t, size_t));
  CALLBACK(pq_free_fn, void (*)(void*, void*, size_t));
  CALLBACK(pq_build_done_fn, void (*)(void*, uint64_t, int32_t, pq_status));
  CALLBACK(pq_destroy_fn, void (*)(void*));
  CALLBACK(pq_disk_read_fn, int64_t (*)(void*, int, void*, uint64_t, uint64_t));
  CALLBACK(pq_disk_write_fn, int64_t (*)(void*, int, const void*, uint64_t, uint64_t));
  CALLBACK(pq_build_progress_fn, void (*)(void*, const pq_build_progress*));
  return 0;
}
