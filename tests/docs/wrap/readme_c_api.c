/* README.md's C walkthrough as a program: the caller's buffers it names
 * (keys[l], values[l], positions, counts, query, out_k, out_v), filled
 * with random f16 data, then the walkthrough, then a check of its result. */
#include <stdint.h>

#include "pqcache.h"
#include <stdio.h>
#include <stdlib.h>

enum { LAYERS = 32, PROMPT = 2048, KV = 8, QH = 32, DIM = 128 };

static uint16_t random_f16(uint32_t* state) {
  *state = *state * 1664525u + 1013904223u;  /* sign, exponent 12..13, mantissa: |x| < 0.5 */
  return (uint16_t)((*state >> 16 & 0x8000u) | 0x3000u | (*state >> 8 & 0x07ffu));
}

int main(void) {
  static uint16_t key_data[PROMPT * KV * DIM], value_data[PROMPT * KV * DIM];
  static int32_t positions[KV * PROMPT];
  static uint16_t out_k[KV * PROMPT * DIM], out_v[KV * PROMPT * DIM];
  uint16_t query[QH * DIM];
  int32_t counts[KV];
  uint16_t* keys[LAYERS];
  uint16_t* values[LAYERS];
  uint32_t state = 1;
  int64_t prompt_len = PROMPT;
  int32_t l = 3;
  size_t i;
  for (i = 0; i < sizeof key_data / sizeof key_data[0]; ++i) {
    key_data[i] = random_f16(&state);
    value_data[i] = random_f16(&state);
  }
  for (i = 0; i < sizeof query / sizeof query[0]; ++i) query[i] = random_f16(&state);
  for (i = 0; i < LAYERS; ++i) {
    keys[i] = key_data;
    values[i] = value_data;
  }
  {
@SNIPPET@
  }
  /* Sinks + top 1/5 of the middle + the local window, per kv head. */
  printf("layer %d: %d of %d tokens selected for kv head 0\n", (int)l, (int)counts[0], PROMPT);
  return counts[0] > PROMPT / 5 && counts[0] < PROMPT / 2 ? 0 : 1;
}
