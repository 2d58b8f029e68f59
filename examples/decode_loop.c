/*
 * decode_loop.c - libpqcache in the shape of an inference server's decode
 * loop, on a synthetic trace.
 *
 * The trace looks like attention data: for every (layer, kv head) the keys
 * come from a few dozen Gaussian clusters plus noise, and every decode query
 * points at one of those clusters, so that a small set of past tokens
 * carries most of the attention. The same trace goes into three contexts:
 *
 *   PQ     the PQCache selector (PQ codes + lookup table),
 *   EXACT  the oracle: exact q.k over every middle key,
 *   WINDOW StreamingLLM: sinks plus the most recent tokens,
 *
 * and the program reports how many of the oracle's middle tokens PQ (and
 * WINDOW, for contrast) also picked ("recall"), at the default budget of 1/5
 * of the middle tokens and again at 1/10, with timings and K-Means
 * iterations. It also checks that pq_fetch_kv returns the stored bytes.
 *
 * Usage: decode_loop [--small] [--f32] [--tokens N] [--steps N] [--seed N]
 *                    [--min-recall R]
 *   --small       a short trace (CTest uses it)
 *   --f32         f32 K/V/Q instead of f16
 *   --min-recall  exit 1 if the PQ recall at 1/5 is below R (0..1)
 *
 * C99; every call's status is checked and an error ends the program with
 * pq_status_string() and pq_last_error().
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pqcache.h"

/* ------------------------------------------------------------------------ */
/* Error handling                                                           */
/* ------------------------------------------------------------------------ */

static void die_status(pq_status st, const char* call, int line) {
  fprintf(stderr, "decode_loop: %s failed (line %d): %s\n  %s\n", call, line,
          pq_status_string(st), pq_last_error());
  exit(1);
}

#define CHECK(call)                                   \
  do {                                                \
    pq_status check_st_ = (call);                     \
    if (check_st_ != PQ_OK) die_status(check_st_, #call, __LINE__); \
  } while (0)

static void* xmalloc(size_t bytes) {
  void* p = malloc(bytes ? bytes : 1);
  if (p == NULL) {
    fprintf(stderr, "decode_loop: out of memory (%lu bytes)\n", (unsigned long)bytes);
    exit(1);
  }
  return p;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* Seeded random numbers (splitmix64) and f16 conversion                     */
/* ------------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t* s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double rng_uniform(uint64_t* s) { /* (0, 1) */
  return ((double)(rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static float rng_gauss(uint64_t* s) { /* Box-Muller, one value per call */
  double u = rng_uniform(s), v = rng_uniform(s);
  return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static uint32_t rng_below(uint64_t* s, uint32_t n) {
  return (uint32_t)(rng_next(s) % n);
}

/* IEEE binary32 -> binary16, round to nearest even. */
static uint16_t f32_to_f16(float f) {
  uint32_t x, sign, mant, half;
  int32_t exp;
  memcpy(&x, &f, sizeof x);
  sign = (x >> 16) & 0x8000u;
  mant = x & 0x7FFFFFu;
  if (((x >> 23) & 0xFFu) == 0xFFu) return (uint16_t)(sign | 0x7C00u | (mant ? 0x200u : 0u));
  exp = (int32_t)((x >> 23) & 0xFFu) - 127 + 15;
  if (exp >= 31) return (uint16_t)(sign | 0x7C00u);
  if (exp <= 0) { /* subnormal or zero */
    uint32_t shift, rem, halfway;
    if (exp < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    shift = (uint32_t)(14 - exp);
    half = mant >> shift;
    rem = mant & ((1u << shift) - 1u);
    halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return (uint16_t)(sign | half);
  }
  half = sign | ((uint32_t)exp << 10) | (mant >> 13);
  if ((mant & 0x1FFFu) > 0x1000u || ((mant & 0x1FFFu) == 0x1000u && (half & 1u))) ++half;
  return (uint16_t)half;
}

/* ------------------------------------------------------------------------ */
/* The synthetic trace                                                      */
/* ------------------------------------------------------------------------ */

enum { NUM_LAYERS = 4, NUM_Q_HEADS = 8, NUM_KV_HEADS = 2, HEAD_DIM = 64, NUM_CLUSTERS = 48 };
#define GROUP (NUM_Q_HEADS / NUM_KV_HEADS)

typedef struct trace {
  int64_t prompt;      /* prompt tokens */
  int32_t steps;       /* decode steps */
  int64_t total;       /* prompt + steps */
  pq_dtype dtype;
  size_t elem;         /* bytes per element */
  /* [layer][token][kv_head][head_dim] in dtype; keys and values. */
  unsigned char* keys;
  unsigned char* values;
  /* [layer][kv_head][cluster][head_dim] f32: the planted centres. */
  float* centres;
  /* [step][layer][q_head][head_dim] in dtype: the decode queries. */
  unsigned char* queries;
} trace;

static void store(unsigned char* base, size_t index, float v, pq_dtype dtype) {
  if (dtype == PQ_DTYPE_F16) {
    uint16_t h = f32_to_f16(v);
    memcpy(base + index * 2, &h, 2);
  } else {
    memcpy(base + index * 4, &v, 4);
  }
}

static size_t kv_index(const trace* t, int layer, int64_t token, int head, int d) {
  return (((size_t)layer * (size_t)t->total + (size_t)token) * NUM_KV_HEADS + (size_t)head) *
             HEAD_DIM + (size_t)d;
}

static void make_trace(trace* t, int64_t prompt, int32_t steps, pq_dtype dtype, uint64_t seed) {
  uint64_t rng = seed;
  size_t kv_elems, q_elems, c;
  int l, h, k, d, s, q;
  int64_t tok;
  /* Cluster weights: a few popular topics, a long tail (Zipf-like). */
  double weight[NUM_CLUSTERS], cumulative[NUM_CLUSTERS], sum = 0.0;

  t->prompt = prompt;
  t->steps = steps;
  t->total = prompt + steps;
  t->dtype = dtype;
  t->elem = dtype == PQ_DTYPE_F16 ? 2 : 4;
  kv_elems = (size_t)NUM_LAYERS * (size_t)t->total * NUM_KV_HEADS * HEAD_DIM;
  q_elems = (size_t)steps * NUM_LAYERS * NUM_Q_HEADS * HEAD_DIM;
  t->keys = (unsigned char*)xmalloc(kv_elems * t->elem);
  t->values = (unsigned char*)xmalloc(kv_elems * t->elem);
  t->queries = (unsigned char*)xmalloc(q_elems * t->elem);
  t->centres = (float*)xmalloc((size_t)NUM_LAYERS * NUM_KV_HEADS * NUM_CLUSTERS * HEAD_DIM *
                               sizeof(float));

  for (k = 0; k < NUM_CLUSTERS; ++k) sum += (weight[k] = 1.0 / (1.0 + 0.25 * k));
  for (k = 0; k < NUM_CLUSTERS; ++k)
    cumulative[k] = (k ? cumulative[k - 1] : 0.0) + weight[k] / sum;

  /* Centres: Gaussian directions with a per-cluster norm. */
  for (c = 0; c < (size_t)NUM_LAYERS * NUM_KV_HEADS * NUM_CLUSTERS; ++c) {
    float scale = 0.6f + 0.8f * (float)rng_uniform(&rng);
    for (d = 0; d < HEAD_DIM; ++d) t->centres[c * HEAD_DIM + (size_t)d] = scale * rng_gauss(&rng);
  }

  /* Keys: centre of a (weighted) random cluster + noise; values: noise. */
  for (l = 0; l < NUM_LAYERS; ++l)
    for (tok = 0; tok < t->total; ++tok)
      for (h = 0; h < NUM_KV_HEADS; ++h) {
        double u = rng_uniform(&rng);
        const float* centre;
        k = 0;
        while (k < NUM_CLUSTERS - 1 && u > cumulative[k]) ++k;
        centre = t->centres + (((size_t)l * NUM_KV_HEADS + (size_t)h) * NUM_CLUSTERS + (size_t)k) *
                                  HEAD_DIM;
        for (d = 0; d < HEAD_DIM; ++d) {
          size_t i = kv_index(t, l, tok, h, d);
          store(t->keys, i, centre[d] + 0.35f * rng_gauss(&rng), dtype);
          store(t->values, i, rng_gauss(&rng), dtype);
        }
      }

  /* Queries: per step and layer, each kv group looks for one random planted
   * cluster; its query heads are that centre (scaled) plus their own noise. */
  for (s = 0; s < steps; ++s)
    for (l = 0; l < NUM_LAYERS; ++l)
      for (h = 0; h < NUM_KV_HEADS; ++h) {
        const float* centre;
        k = (int)rng_below(&rng, NUM_CLUSTERS);
        centre = t->centres + (((size_t)l * NUM_KV_HEADS + (size_t)h) * NUM_CLUSTERS + (size_t)k) *
                                  HEAD_DIM;
        for (q = h * GROUP; q < (h + 1) * GROUP; ++q)
          for (d = 0; d < HEAD_DIM; ++d) {
            size_t i = (((size_t)s * NUM_LAYERS + (size_t)l) * NUM_Q_HEADS + (size_t)q) * HEAD_DIM +
                       (size_t)d;
            store(t->queries, i, 1.5f * centre[d] + 0.5f * rng_gauss(&rng), dtype);
          }
      }
}

static void free_trace(trace* t) {
  free(t->keys);
  free(t->values);
  free(t->queries);
  free(t->centres);
}

/* ------------------------------------------------------------------------ */
/* One run: PQ, EXACT and WINDOW contexts over the same trace               */
/* ------------------------------------------------------------------------ */

enum { SEL_PQ = 0, SEL_EXACT = 1, SEL_WINDOW = 2, NUM_SEL = 3 };
static const char* const sel_name[NUM_SEL] = {"PQ", "EXACT", "WINDOW"};
static const int32_t sel_kind[NUM_SEL] = {PQ_SELECTOR_PQ, PQ_SELECTOR_EXACT, PQ_SELECTOR_WINDOW};

typedef struct run_result {
  double recall[NUM_SEL];        /* mean over steps x layers x kv heads */
  double prefill_build_seconds;  /* PQ context: first prefill .. builds done */
  double select_us[NUM_SEL];     /* mean pq_decode_select, from pq_stats_get */
  double fetch_us;               /* mean pq_fetch_kv (PQ context) */
  int32_t iterations[NUM_LAYERS];
  int32_t budget[NUM_LAYERS];
  double layer_build_seconds[NUM_LAYERS];
  int64_t topk_first;            /* middle tokens per kv head, first step */
  int32_t sink, local;
} run_result;

/* Size of (a AND b) restricted to [lo, hi); both ascending. Also counts b's entries. */
static int64_t overlap_in(const int32_t* a, int32_t na, const int32_t* b, int32_t nb, int64_t lo,
                          int64_t hi, int64_t* b_in_range) {
  int32_t i = 0, j = 0;
  int64_t both = 0, in_b = 0;
  for (j = 0; j < nb; ++j)
    if (b[j] >= lo && b[j] < hi) ++in_b;
  j = 0;
  while (i < na && j < nb) {
    if (a[i] < b[j]) {
      ++i;
    } else if (b[j] < a[i]) {
      ++j;
    } else {
      if (a[i] >= lo && a[i] < hi) ++both;
      ++i;
      ++j;
    }
  }
  *b_in_range = in_b;
  return both;
}

static void run(const trace* t, float fraction, int32_t kmeans_iterations, run_result* r) {
  pq_context* ctx[NUM_SEL];
  pq_config cfg;
  pq_selection sel[NUM_SEL];
  int64_t cap_alloc = 0;
  unsigned char *out_k = NULL, *out_v = NULL;
  const uint64_t seq = 42;
  double hits[NUM_SEL] = {0, 0, 0}, wanted = 0.0, t0;
  int i, l, s, h;
  const size_t row_bytes = HEAD_DIM * t->elem;

  memset(r, 0, sizeof *r);
  for (i = 0; i < NUM_SEL; ++i) {
    pq_config_default(&cfg);
    cfg.num_layers = NUM_LAYERS;
    cfg.num_q_heads = NUM_Q_HEADS;
    cfg.num_kv_heads = NUM_KV_HEADS;
    cfg.head_dim = HEAD_DIM;
    cfg.dtype = t->dtype;
    cfg.selector = sel_kind[i];
    cfg.topk_fraction = fraction;
    cfg.kmeans_iterations = kmeans_iterations; /* 0: adaptive (default) */
    CHECK(pq_create(&cfg, &ctx[i]));
    CHECK(pq_sequence_add(ctx[i], seq));
    sel[i].positions = NULL;
    sel[i].counts = (int32_t*)xmalloc(NUM_KV_HEADS * sizeof(int32_t));
    sel[i].capacity = 0;
  }
  pq_config_default(&cfg);
  CHECK(pq_get_config(ctx[SEL_PQ], &cfg));
  r->sink = cfg.sink_tokens;
  r->local = cfg.local_tokens;

  /* Prefill: as a server would, layer after layer; each call returns once
   * the K/V are copied and the layer's index builds in the background. */
  for (i = 0; i < NUM_SEL; ++i) {
    t0 = now_seconds();
    for (l = 0; l < NUM_LAYERS; ++l) {
      pq_tensor k, v;
      size_t off = kv_index(t, l, 0, 0, 0) * t->elem;
      CHECK(pq_tensor_init(&k, t->keys + off, t->dtype, PQ_LAYOUT_TOKEN_MAJOR, t->prompt,
                           NUM_KV_HEADS, HEAD_DIM));
      CHECK(pq_tensor_init(&v, t->values + off, t->dtype, PQ_LAYOUT_TOKEN_MAJOR, t->prompt,
                           NUM_KV_HEADS, HEAD_DIM));
      /* The layout preset assumes a dense [tokens][heads][dim] buffer, and
       * this one is: the trace's rows for one layer are contiguous. */
      CHECK(pq_prefill_layer(ctx[i], seq, l, &k, &v));
    }
    CHECK(pq_wait_builds(ctx[i]));
    if (i == SEL_PQ) r->prefill_build_seconds = now_seconds() - t0;
  }
  for (l = 0; l < NUM_LAYERS; ++l) {
    pq_layer_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK(pq_layer_info_get(ctx[SEL_PQ], seq, l, &info));
    r->iterations[l] = info.kmeans_iterations;
    r->budget[l] = info.kmeans_budget;
    r->layer_build_seconds[l] = info.build_seconds;
  }

  /* Decode. */
  for (s = 0; s < t->steps; ++s) {
    for (l = 0; l < NUM_LAYERS; ++l) {
      pq_tensor k, v, q, ok, ov;
      int64_t cap = 0, length = 0;
      size_t off = kv_index(t, l, t->prompt + s, 0, 0) * t->elem;
      size_t qoff = ((size_t)s * NUM_LAYERS + (size_t)l) * NUM_Q_HEADS * HEAD_DIM * t->elem;

      CHECK(pq_tensor_init(&k, t->keys + off, t->dtype, PQ_LAYOUT_TOKEN_MAJOR, 1, NUM_KV_HEADS,
                           HEAD_DIM));
      CHECK(pq_tensor_init(&v, t->values + off, t->dtype, PQ_LAYOUT_TOKEN_MAJOR, 1, NUM_KV_HEADS,
                           HEAD_DIM));
      CHECK(pq_tensor_init(&q, t->queries + qoff, t->dtype, PQ_LAYOUT_TOKEN_MAJOR, 1,
                           NUM_Q_HEADS, HEAD_DIM));
      for (i = 0; i < NUM_SEL; ++i) {
        int64_t c;
        CHECK(pq_decode_append(ctx[i], seq, l, &k, &v));
        CHECK(pq_selection_capacity(ctx[i], seq, l, &c));
        if (c > sel[i].capacity) {
          free(sel[i].positions);
          sel[i].positions = (int32_t*)xmalloc((size_t)c * NUM_KV_HEADS * sizeof(int32_t));
          sel[i].capacity = c;
        }
        CHECK(pq_decode_select(ctx[i], seq, l, &q, &sel[i]));
        if (i == SEL_PQ) cap = c;
      }
      CHECK(pq_sequence_length(ctx[SEL_PQ], seq, l, &length));

      /* Fetch what PQ selected, as attention would, and check the bytes. */
      if (cap > cap_alloc) {
        free(out_k);
        free(out_v);
        out_k = (unsigned char*)xmalloc((size_t)cap * NUM_KV_HEADS * row_bytes);
        out_v = (unsigned char*)xmalloc((size_t)cap * NUM_KV_HEADS * row_bytes);
        cap_alloc = cap;
      }
      CHECK(pq_tensor_init(&ok, out_k, t->dtype, PQ_LAYOUT_HEAD_MAJOR, cap, NUM_KV_HEADS,
                           HEAD_DIM));
      CHECK(pq_tensor_init(&ov, out_v, t->dtype, PQ_LAYOUT_HEAD_MAJOR, cap, NUM_KV_HEADS,
                           HEAD_DIM));
      CHECK(pq_fetch_kv(ctx[SEL_PQ], seq, l, &sel[SEL_PQ], &ok, &ov));
      for (h = 0; h < NUM_KV_HEADS; ++h) {
        int32_t j;
        for (j = 0; j < sel[SEL_PQ].counts[h]; ++j) {
          int32_t pos = sel[SEL_PQ].positions[(int64_t)h * sel[SEL_PQ].capacity + j];
          size_t src = kv_index(t, l, pos, h, 0) * t->elem;
          size_t dst = ((size_t)h * (size_t)cap + (size_t)j) * row_bytes;
          if (memcmp(out_k + dst, t->keys + src, row_bytes) != 0 ||
              memcmp(out_v + dst, t->values + src, row_bytes) != 0) {
            fprintf(stderr,
                    "decode_loop: pq_fetch_kv returned wrong bytes (layer %d, kv head %d, "
                    "position %d)\n",
                    l, h, (int)pos);
            exit(1);
          }
        }
      }

      /* Recall of the middle selection against the oracle's. */
      for (h = 0; h < NUM_KV_HEADS; ++h) {
        const int32_t* ex = sel[SEL_EXACT].positions + (int64_t)h * sel[SEL_EXACT].capacity;
        int32_t nex = sel[SEL_EXACT].counts[h];
        int64_t lo = r->sink, hi = length - r->local, ex_mid = 0;
        if (hi <= lo) continue;
        for (i = 0; i < NUM_SEL; ++i) {
          const int32_t* a = sel[i].positions + (int64_t)h * sel[i].capacity;
          hits[i] += (double)overlap_in(a, sel[i].counts[h], ex, nex, lo, hi, &ex_mid);
        }
        wanted += (double)ex_mid;
        if (s == 0 && l == 0 && h == 0) r->topk_first = ex_mid;
      }
    }
  }
  for (i = 0; i < NUM_SEL; ++i) r->recall[i] = wanted > 0 ? hits[i] / wanted : 0.0;

  for (i = 0; i < NUM_SEL; ++i) {
    pq_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK(pq_stats_get(ctx[i], &st));
    r->select_us[i] = st.select_calls ? 1e6 * st.select_seconds / (double)st.select_calls : 0.0;
    if (i == SEL_PQ) r->fetch_us = st.fetch_calls ? 1e6 * st.fetch_seconds / (double)st.fetch_calls : 0.0;
  }

  for (i = 0; i < NUM_SEL; ++i) {
    CHECK(pq_sequence_remove(ctx[i], seq));
    pq_destroy(ctx[i]);
    free(sel[i].positions);
    free(sel[i].counts);
  }
  free(out_k);
  free(out_v);
}

/* ------------------------------------------------------------------------ */
/* main                                                                     */
/* ------------------------------------------------------------------------ */

static long parse_long(const char* flag, const char* s, long lo, long hi) {
  char* end = NULL;
  long v = s ? strtol(s, &end, 10) : 0;
  if (s == NULL || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr, "decode_loop: %s needs an integer in [%ld, %ld]\n", flag, lo, hi);
    exit(2);
  }
  return v;
}

int main(int argc, char** argv) {
  int64_t prompt = 8192;
  int32_t steps = 32;
  uint64_t seed = 2025;
  pq_dtype dtype = PQ_DTYPE_F16;
  double min_recall = -1.0;
  trace t;
  run_result fifth, tenth;
  int a, l;

  for (a = 1; a < argc; ++a) {
    if (strcmp(argv[a], "--small") == 0) {
      prompt = 2048;
      steps = 8;
    } else if (strcmp(argv[a], "--f32") == 0) {
      dtype = PQ_DTYPE_F32;
    } else if (strcmp(argv[a], "--tokens") == 0) {
      prompt = parse_long("--tokens", a + 1 < argc ? argv[++a] : NULL, 256, 1L << 24);
    } else if (strcmp(argv[a], "--steps") == 0) {
      steps = (int32_t)parse_long("--steps", a + 1 < argc ? argv[++a] : NULL, 1, 100000);
    } else if (strcmp(argv[a], "--seed") == 0) {
      seed = (uint64_t)parse_long("--seed", a + 1 < argc ? argv[++a] : NULL, 0, 2147483647L);
    } else if (strcmp(argv[a], "--min-recall") == 0) {
      char* end = NULL;
      const char* v = a + 1 < argc ? argv[++a] : "";
      min_recall = strtod(v, &end);
      if (*v == '\0' || *end != '\0' || min_recall < 0.0 || min_recall > 1.0) {
        fprintf(stderr, "decode_loop: --min-recall needs a number in [0, 1]\n");
        return 2;
      }
    } else {
      fprintf(stderr,
              "usage: %s [--small] [--f32] [--tokens N] [--steps N] [--seed N] "
              "[--min-recall R]\n",
              argv[0]);
      return 2;
    }
  }

  printf("libpqcache %s decode-loop demo (synthetic, clustered keys, seed %lu)\n",
         pq_version_string(), (unsigned long)seed);
  printf("  model    : %d layers, %d q heads, %d kv heads (GQA %d), head_dim %d, %s\n", NUM_LAYERS,
         NUM_Q_HEADS, NUM_KV_HEADS, GROUP, HEAD_DIM, dtype == PQ_DTYPE_F16 ? "f16" : "f32");
  printf("  trace    : %ld prompt tokens, %d decode steps, %d planted key clusters per head\n",
         (long)prompt, (int)steps, NUM_CLUSTERS);

  make_trace(&t, prompt, steps, dtype, seed);
  run(&t, 0.2f, 0, &fifth);
  run(&t, 0.1f, 0, &tenth);

  printf("  budget   : %d sink + top-k middle + %d local tokens per kv head; top-k at the\n"
         "             first step: %ld (1/5) and %ld (1/10) of %ld middle tokens\n",
         (int)fifth.sink, (int)fifth.local, (long)fifth.topk_first, (long)tenth.topk_first,
         (long)(prompt + 1 - fifth.sink - fifth.local));
  printf("\nRecall of the middle selection against EXACT (oracle), mean over %d steps x %d "
         "layers x %d kv heads:\n",
         (int)steps, NUM_LAYERS, NUM_KV_HEADS);
  printf("  %-8s %10s %10s\n", "selector", "top 1/5", "top 1/10");
  printf("  %-8s %10.3f %10.3f\n", sel_name[SEL_PQ], fifth.recall[SEL_PQ], tenth.recall[SEL_PQ]);
  printf("  %-8s %10.3f %10.3f   (StreamingLLM: most recent tokens, for contrast)\n",
         sel_name[SEL_WINDOW], fifth.recall[SEL_WINDOW], tenth.recall[SEL_WINDOW]);

  printf("\nTimings (top 1/5 run, %s):\n", "CPU backend");
  printf("  prefill + index build, %d layers: %.1f ms wall\n", NUM_LAYERS,
         1e3 * fifth.prefill_build_seconds);
  printf("  K-Means per layer (iterations run / adaptive budget, build time):\n   ");
  for (l = 0; l < NUM_LAYERS; ++l)
    printf(" L%d %d/%d %.1f ms%s", l, (int)fifth.iterations[l], (int)fifth.budget[l],
           1e3 * fifth.layer_build_seconds[l], l + 1 < NUM_LAYERS ? "," : "\n");
  printf("  mean pq_decode_select: PQ %.1f us, EXACT %.1f us, WINDOW %.1f us (per layer)\n",
         fifth.select_us[SEL_PQ], fifth.select_us[SEL_EXACT], fifth.select_us[SEL_WINDOW]);
  printf("  mean pq_fetch_kv (PQ selection): %.1f us (per layer)\n", fifth.fetch_us);
  printf("  fetched K/V matched the stored bytes at every step\n");

  free_trace(&t);
  if (min_recall >= 0.0 && fifth.recall[SEL_PQ] < min_recall) {
    fprintf(stderr, "decode_loop: PQ recall %.3f is below --min-recall %.3f\n",
            fifth.recall[SEL_PQ], min_recall);
    return 1;
  }
  return 0;
}
