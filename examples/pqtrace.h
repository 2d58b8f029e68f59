/* pqtrace.h - a C99 header-only reader of .pqtrace attention traces (see
 * docs/trace-format.md). Reads the whole file into memory: traces used by
 * tests and demos are a few megabytes.
 *
 *   pqtrace t;
 *   if (pqtrace_open("tests/data/x.pqtrace", &t) != 0) { puts(t.error); ... }
 *   const void* k = pqtrace_keys(&t, 0);   // [tokens][kv_heads][head_dim]
 *   pqtrace_close(&t);
 */
#ifndef PQTRACE_H
#define PQTRACE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PQTRACE_MAX_LAYERS 256

typedef struct pqtrace {
  char model[128];
  char text[128];
  int dtype_bytes; /* 2 for f16, 4 for f32 */
  int is_f16;
  int64_t tokens, q_first;
  int32_t q_heads, kv_heads, head_dim;
  int32_t layer_count;
  int32_t layers[PQTRACE_MAX_LAYERS];
  unsigned char* data;  /* the whole file */
  size_t size;
  size_t token_offset;  /* of int32 token ids */
  size_t q_offset[PQTRACE_MAX_LAYERS], k_offset[PQTRACE_MAX_LAYERS],
      v_offset[PQTRACE_MAX_LAYERS];
  char error[256];
} pqtrace;

static size_t pqtrace_align64(size_t x) { return (x + 63u) & ~(size_t)63u; }

static void pqtrace_close(pqtrace* t) {
  free(t->data);
  t->data = NULL;
}

/* 0 on success; else -1 with t->error set and nothing to close. */
static int pqtrace_open(const char* path, pqtrace* t) {
  FILE* f;
  long size;
  size_t data_offset = 0, at, q_bytes, kv_bytes;
  char* line;
  char* next_line;
  int saw_end = 0, saw_magic = 0;
  int32_t i;
  memset(t, 0, sizeof *t);
  f = fopen(path, "rb");
  if (!f) {
    snprintf(t->error, sizeof t->error, "cannot open %s", path);
    return -1;
  }
  fseek(f, 0, SEEK_END);
  size = ftell(f);
  fseek(f, 0, SEEK_SET);
  t->data = (unsigned char*)malloc((size_t)size + 1);
  if (!t->data || fread(t->data, 1, (size_t)size, f) != (size_t)size) {
    fclose(f);
    free(t->data);
    t->data = NULL;
    snprintf(t->error, sizeof t->error, "cannot read %s", path);
    return -1;
  }
  fclose(f);
  t->size = (size_t)size;
  {
    /* Parse a copy of the header text only (up to "end\n"). */
    size_t header_len = 0;
    char* header;
    while (header_len + 4 <= t->size && memcmp(t->data + header_len, "end\n", 4) != 0) {
      while (header_len < t->size && t->data[header_len] != '\n') ++header_len;
      ++header_len;
    }
    header = (char*)malloc(header_len + 1);
    memcpy(header, t->data, header_len);
    header[header_len] = '\0';
    if (header_len + 4 <= t->size) saw_end = 1;
    for (line = header; *line; line = next_line) {
      next_line = strchr(line, '\n');
      if (next_line) *next_line++ = '\0';
      else next_line = line + strlen(line);
      char key[32] = {0};
      long long v = 0;
      if (sscanf(line, "%31s", key) != 1) continue;
      if (strcmp(key, "PQTRACE") == 0) saw_magic = sscanf(line, "PQTRACE %lld", &v) == 1 && v == 1;
      else if (strcmp(key, "model") == 0) sscanf(line, "model %127s", t->model);
      else if (strcmp(key, "text") == 0) sscanf(line, "text %127s", t->text);
      else if (strcmp(key, "dtype") == 0) {
        t->is_f16 = strstr(line, "f16") != NULL;
        t->dtype_bytes = t->is_f16 ? 2 : (strstr(line, "f32") ? 4 : 0);
      } else if (sscanf(line, "tokens %lld", &v) == 1) t->tokens = v;
      else if (sscanf(line, "q_first %lld", &v) == 1) t->q_first = v;
      else if (sscanf(line, "q_heads %lld", &v) == 1) t->q_heads = (int32_t)v;
      else if (sscanf(line, "kv_heads %lld", &v) == 1) t->kv_heads = (int32_t)v;
      else if (sscanf(line, "head_dim %lld", &v) == 1) t->head_dim = (int32_t)v;
      else if (sscanf(line, "data_offset %lld", &v) == 1) data_offset = (size_t)v;
      else if (strcmp(key, "layers") == 0) {
        char* p = line + 6;
        char* end;
        while (t->layer_count < PQTRACE_MAX_LAYERS) {
          long l = strtol(p, &end, 10);
          if (end == p) break;
          t->layers[t->layer_count++] = (int32_t)l;
          p = end;
        }
      }
    }
    free(header);
  }
  if (!saw_magic || !saw_end || t->dtype_bytes == 0 || t->tokens <= 0 || t->q_heads <= 0 ||
      t->kv_heads <= 0 || t->head_dim <= 0 || t->layer_count <= 0 || t->q_first < 0 ||
      t->q_first > t->tokens || data_offset == 0 || data_offset % 64 != 0) {
    snprintf(t->error, sizeof t->error, "%s is not a valid PQTRACE 1 file (header)", path);
    pqtrace_close(t);
    return -1;
  }
  at = data_offset;
  t->token_offset = at;
  at = pqtrace_align64(at + (size_t)t->tokens * 4);
  q_bytes = (size_t)(t->tokens - t->q_first) * t->q_heads * t->head_dim * t->dtype_bytes;
  kv_bytes = (size_t)t->tokens * t->kv_heads * t->head_dim * t->dtype_bytes;
  for (i = 0; i < t->layer_count; ++i) {
    t->q_offset[i] = at;
    at = pqtrace_align64(at + q_bytes);
    t->k_offset[i] = at;
    at = pqtrace_align64(at + kv_bytes);
    t->v_offset[i] = at;
    at = pqtrace_align64(at + kv_bytes);
  }
  if (t->v_offset[t->layer_count - 1] + kv_bytes > t->size) {
    snprintf(t->error, sizeof t->error, "%s is truncated: %zu bytes, payload needs %zu", path,
             t->size, t->v_offset[t->layer_count - 1] + kv_bytes);
    pqtrace_close(t);
    return -1;
  }
  return 0;
}

static const int32_t* pqtrace_token_ids(const pqtrace* t) {
  return (const int32_t*)(const void*)(t->data + t->token_offset);
}
/* Layer i of t->layers: Q rows for positions q_first..tokens-1. */
static const void* pqtrace_queries(const pqtrace* t, int32_t i) { return t->data + t->q_offset[i]; }
static const void* pqtrace_keys(const pqtrace* t, int32_t i) { return t->data + t->k_offset[i]; }
static const void* pqtrace_values(const pqtrace* t, int32_t i) { return t->data + t->v_offset[i]; }

#endif /* PQTRACE_H */
