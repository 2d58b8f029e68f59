/* pqtrace_dump: prints a .pqtrace file's header and a checksum per array
 * (sum of the elements as double), so the C reader can be checked against
 * the Python writer, and a trace can be inspected from the shell. */
#include <stdio.h>

#include "pqtrace.h"

static float half_to_float(uint16_t h) {
  /* Enough for a checksum: normal numbers, zeros and subnormals. */
  uint32_t sign = (uint32_t)(h >> 15), exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  float value;
  if (exponent == 0) value = (float)mantissa / 1024.0f / 16384.0f;
  else value = (1.0f + (float)mantissa / 1024.0f) * (float)(1u << exponent) / 32768.0f;
  return sign ? -value : value;
}

static double sum(const pqtrace* t, const void* data, size_t count) {
  double s = 0.0;
  size_t i;
  for (i = 0; i < count; ++i)
    s += t->is_f16 ? half_to_float(((const uint16_t*)data)[i]) : ((const float*)data)[i];
  return s;
}

int main(int argc, char** argv) {
  pqtrace t;
  int32_t i;
  int64_t id_sum = 0;
  size_t kv = 0, q = 0;
  if (argc != 2) {
    fprintf(stderr, "usage: pqtrace_dump FILE.pqtrace\n");
    return 2;
  }
  if (pqtrace_open(argv[1], &t) != 0) {
    fprintf(stderr, "pqtrace_dump: %s\n", t.error);
    return 1;
  }
  kv = (size_t)t.tokens * (size_t)t.kv_heads * (size_t)t.head_dim;
  q = (size_t)(t.tokens - t.q_first) * (size_t)t.q_heads * (size_t)t.head_dim;
  for (i = 0; i < (int32_t)t.tokens; ++i) id_sum += pqtrace_token_ids(&t)[i];
  printf("model %s\ntext %s\ndtype %s\ntokens %lld\nq_first %lld\n", t.model, t.text,
         t.is_f16 ? "f16" : "f32", (long long)t.tokens, (long long)t.q_first);
  printf("q_heads %d\nkv_heads %d\nhead_dim %d\ntoken_id_sum %lld\n", (int)t.q_heads,
         (int)t.kv_heads, (int)t.head_dim, (long long)id_sum);
  for (i = 0; i < t.layer_count; ++i)
    printf("layer %d q %.6f k %.6f v %.6f\n", (int)t.layers[i], sum(&t, pqtrace_queries(&t, i), q),
           sum(&t, pqtrace_keys(&t, i), kv), sum(&t, pqtrace_values(&t, i), kv));
  pqtrace_close(&t);
  return 0;
}
