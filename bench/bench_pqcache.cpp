// bench_pqcache.cpp - Google Benchmark programs for libpqcache (CPU backend).
//
// Geometry (one layer of a Llama-3-8B-like model): 32 query heads, 8 kv
// heads (GQA 4), head_dim 128, f16 K/V/Q; the default PQ setting (m = 4
// subspaces, b = 8 at head_dim 128); top-k = 1/5 of the middle tokens;
// contexts of 8K, 32K and 128K
// tokens. Keys are seeded and clustered (64 Gaussian clusters per kv head
// plus noise); each decode query points at one cluster.
//
// Benchmarks (the argument is the context length in tokens):
//   prefill_build        pq_prefill_layer + pq_wait_builds of one layer, with
//                        a FIXED K-Means budget (kmeans_iterations = 10,
//                        tolerance 0: exactly 10 iterations) so that runs are
//                        comparable. Context creation is not timed.
//   pq_select            pq_decode_select, PQ selector.
//   pq_select_fetch      one decode step: pq_decode_select + pq_fetch_kv
//                        (default GQA combination: sum of per-head softmax).
//   pq_select_fetch_gqa_max  the same with PQ_GQA_MAX, the combination the
//                        baseline uses (no exp per token and query head).
//   exact_select_fetch   the same through the library's EXACT selector.
//   exact_scan_baseline  the baseline without the library: q.k over every
//                        token for every query head (reading the f16 keys and
//                        converting them, AVX2/F16C when available), the max
//                        over each GQA group, std::nth_element top-k per kv
//                        head, positions sorted; kv heads split over the
//                        hardware threads.
//   prefill_overlap      an 8-layer prefill (same head geometry, 8K and 32K
//                        tokens, 10 K-Means iterations) where each layer first
//                        "computes" (sleeps, standing in for the caller's GPU
//                        work) and then calls pq_prefill_layer. Timed: the
//                        overlapped schedule (builds run on the worker pool
//                        while later layers compute; one pq_wait_builds at the
//                        end). Measured in the same iteration, untimed: the
//                        sequential schedule (pq_wait_builds after every
//                        layer). Counters: sequential_ms, overlap_speedup
//                        (sequential / overlapped), and from the sequential
//                        run, per layer: compute_ms (the sleep), prefill_ms
//                        (the pq_prefill_layer call: copy and checks) and
//                        build_ms (K-Means and encoding on the pool).
// All times are wall-clock (UseRealTime; prefill_overlap times itself with a
// steady clock). scripts/bench.sh turns the JSON output into tables.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PQ_BENCH_X86 1
#endif

#include "bench_data.h"
#include "pqcache.h"

namespace {

using pqbench::kGroup;
using pqbench::kHeadDim;
using pqbench::kKvHeads;
using pqbench::kQHeads;
using pqbench::kTopkFraction;
constexpr int kQueries = 16;
constexpr int kKmeansIterations = 10;
constexpr uint64_t kSeq = 1;

#define CHECK(call) pqbench::check_status("bench_pqcache", (call), #call)

// ---------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------

using pqbench::f16_to_f32;
using pqbench::ClusteredKv;
using pqbench::make_clustered_kv;

// Keys, values ([token][kv_head][head_dim], f16) and queries
// ([query][q_head][head_dim], f16 and f32) for one context length.
struct Trace : ClusteredKv {
  std::vector<float> queries_f32;
};

std::unique_ptr<Trace> make_trace(int64_t tokens) {
  auto t = std::make_unique<Trace>();
  static_cast<ClusteredKv&>(*t) = std::move(*make_clustered_kv(tokens, 0xBE7C4ull, kQueries, true));
  t->queries_f32.resize(t->queries.size());
  for (size_t i = 0; i < t->queries.size(); ++i) t->queries_f32[i] = f16_to_f32(t->queries[i]);
  return t;
}

pq_config bench_config(int32_t selector, int32_t gqa_combine = PQ_GQA_SUM_SOFTMAX) {
  pq_config cfg = pqbench::layer_config(kKmeansIterations);
  cfg.kmeans_tolerance = 0.0f;  // no early stop: exactly kKmeansIterations
  cfg.selector = selector;
  cfg.gqa_combine = gqa_combine;
  return cfg;
}

void prefill(pq_context* ctx, const Trace& t, int32_t layer = 0) {
  pq_tensor k, v;
  CHECK(pq_tensor_init(&k, const_cast<uint16_t*>(t.keys.data()), PQ_DTYPE_F16,
                       PQ_LAYOUT_TOKEN_MAJOR, t.tokens, kKvHeads, kHeadDim));
  CHECK(pq_tensor_init(&v, const_cast<uint16_t*>(t.values.data()), PQ_DTYPE_F16,
                       PQ_LAYOUT_TOKEN_MAJOR, t.tokens, kKvHeads, kHeadDim));
  CHECK(pq_prefill_layer(ctx, kSeq, layer, &k, &v));
}

// Traces and prefilled contexts, built once per length and shared by the
// benchmarks (building the 128K ones takes seconds).
struct Prefilled {
  pq_context* ctx = nullptr;
  ~Prefilled() { pq_destroy(ctx); }
};
std::map<int64_t, std::unique_ptr<Trace>> g_traces;
std::map<std::tuple<int32_t, int32_t, int64_t>, std::unique_ptr<Prefilled>> g_contexts;

const Trace& trace_for(int64_t tokens) {
  auto& t = g_traces[tokens];
  if (!t) t = make_trace(tokens);
  return *t;
}

pq_context* context_for(int32_t selector, int32_t gqa_combine, int64_t tokens) {
  auto& p = g_contexts[std::make_tuple(selector, gqa_combine, tokens)];
  if (!p) {
    p = std::make_unique<Prefilled>();
    pq_config cfg = bench_config(selector, gqa_combine);
    CHECK(pq_create(&cfg, &p->ctx));
    CHECK(pq_sequence_add(p->ctx, kSeq));
    prefill(p->ctx, trace_for(tokens));
    CHECK(pq_wait_builds(p->ctx));
  }
  return p->ctx;
}

pq_stats stats_of(pq_context* ctx) {
  pq_stats st;
  std::memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK(pq_stats_get(ctx, &st));
  return st;
}

// ---------------------------------------------------------------------------
// (a) prefill + index build
// ---------------------------------------------------------------------------

void prefill_build(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const Trace& t = trace_for(tokens);
  pq_config cfg = bench_config(PQ_SELECTOR_PQ);
  double build_seconds = 0.0;
  int64_t iterations_run = 0, budget = 0;
  for (auto _ : state) {
    state.PauseTiming();
    pq_context* ctx = nullptr;
    CHECK(pq_create(&cfg, &ctx));
    CHECK(pq_sequence_add(ctx, kSeq));
    state.ResumeTiming();

    prefill(ctx, t);
    CHECK(pq_wait_builds(ctx));

    state.PauseTiming();
    pq_layer_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK(pq_layer_info_get(ctx, kSeq, 0, &info));
    build_seconds += info.build_seconds;
    iterations_run = info.kmeans_iterations;
    budget = info.kmeans_budget;
    pq_destroy(ctx);
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * tokens);
  state.counters["kmeans_iterations"] = double(iterations_run);
  state.counters["kmeans_budget"] = double(budget);
  state.counters["build_ms"] = 1e3 * build_seconds / double(state.iterations());
}

// ---------------------------------------------------------------------------
// (b) decode step through the library: PQ and EXACT selectors
// ---------------------------------------------------------------------------

struct StepBuffers {
  std::vector<int32_t> positions, counts;
  std::vector<uint16_t> out_k, out_v;
  pq_selection sel{};
  pq_tensor ok{}, ov{};
  int64_t capacity = 0;
};

void make_step_buffers(pq_context* ctx, StepBuffers& b) {
  CHECK(pq_selection_capacity(ctx, kSeq, 0, &b.capacity));
  b.positions.resize(size_t(b.capacity) * kKvHeads);
  b.counts.resize(kKvHeads);
  b.sel.positions = b.positions.data();
  b.sel.counts = b.counts.data();
  b.sel.capacity = b.capacity;
  b.out_k.resize(size_t(b.capacity) * kKvHeads * kHeadDim);
  b.out_v.resize(b.out_k.size());
  CHECK(pq_tensor_init(&b.ok, b.out_k.data(), PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR, b.capacity,
                       kKvHeads, kHeadDim));
  CHECK(pq_tensor_init(&b.ov, b.out_v.data(), PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR, b.capacity,
                       kKvHeads, kHeadDim));
}

void decode_step(benchmark::State& state, int32_t selector, int32_t combine, bool fetch) {
  const int64_t tokens = state.range(0);
  const Trace& t = trace_for(tokens);
  pq_context* ctx = context_for(selector, combine, tokens);
  StepBuffers b;
  make_step_buffers(ctx, b);
  std::vector<pq_tensor> q(kQueries);
  for (int i = 0; i < kQueries; ++i)
    CHECK(pq_tensor_init(&q[i], const_cast<uint16_t*>(&t.queries[size_t(i) * kQHeads * kHeadDim]),
                         PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 1, kQHeads, kHeadDim));
  const pq_stats before = stats_of(ctx);
  int i = 0;
  for (auto _ : state) {
    CHECK(pq_decode_select(ctx, kSeq, 0, &q[size_t(i)], &b.sel));
    if (fetch) CHECK(pq_fetch_kv(ctx, kSeq, 0, &b.sel, &b.ok, &b.ov));
    benchmark::DoNotOptimize(b.counts.data());
    benchmark::ClobberMemory();
    i = (i + 1) % kQueries;
  }
  const pq_stats after = stats_of(ctx);
  const double n = double(state.iterations());
  state.SetItemsProcessed(state.iterations() * tokens);  // tokens considered per second
  state.counters["selected_per_head"] = double(b.counts[0]);
  state.counters["MB_scored_per_step"] = double(after.bytes_scored - before.bytes_scored) / n / 1e6;
  state.counters["MB_fetched_per_step"] =
      double(after.bytes_fetched - before.bytes_fetched) / n / 1e6;
}

// Default GQA combination (sum of per-head softmax, as the paper's code).
void pq_select(benchmark::State& s) { decode_step(s, PQ_SELECTOR_PQ, PQ_GQA_SUM_SOFTMAX, false); }
void pq_select_fetch(benchmark::State& s) {
  decode_step(s, PQ_SELECTOR_PQ, PQ_GQA_SUM_SOFTMAX, true);
}
// PQ_GQA_MAX: the same combination as the exact-scan baseline (no exp).
void pq_select_fetch_gqa_max(benchmark::State& s) {
  decode_step(s, PQ_SELECTOR_PQ, PQ_GQA_MAX, true);
}
void exact_select_fetch(benchmark::State& s) {
  decode_step(s, PQ_SELECTOR_EXACT, PQ_GQA_SUM_SOFTMAX, true);
}

// ---------------------------------------------------------------------------
// (c) baseline: exact scan outside the library
// ---------------------------------------------------------------------------

// scores[t] = max over the group's query heads of q.k(t) / sqrt(d), for one
// kv head; keys are f16 rows of the token-major buffer.
void scan_head_scalar(const uint16_t* keys, int64_t tokens, int h, const float* q, float* scores) {
  const float scale = 1.0f / std::sqrt(float(kHeadDim));
  float k[kHeadDim];
  for (int64_t t = 0; t < tokens; ++t) {
    const uint16_t* row = keys + (size_t(t) * kKvHeads + h) * kHeadDim;
    for (int d = 0; d < kHeadDim; ++d) k[d] = f16_to_f32(row[d]);
    float best = -INFINITY;
    for (int g = 0; g < kGroup; ++g) {
      const float* qg = q + size_t(h * kGroup + g) * kHeadDim;
      float s = 0.0f;
      for (int d = 0; d < kHeadDim; ++d) s += qg[d] * k[d];
      best = std::max(best, s);
    }
    scores[t] = best * scale;
  }
}

#ifdef PQ_BENCH_X86
__attribute__((target("avx2,fma,f16c"))) void scan_head_avx2(const uint16_t* keys, int64_t tokens,
                                                              int h, const float* q,
                                                              float* scores) {
  static_assert(kGroup == 4 && kHeadDim % 8 == 0, "kernel assumes GQA 4");
  const float scale = 1.0f / std::sqrt(float(kHeadDim));
  const float* q0 = q + size_t(h * kGroup) * kHeadDim;
  for (int64_t t = 0; t < tokens; ++t) {
    const uint16_t* row = keys + (size_t(t) * kKvHeads + h) * kHeadDim;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int d = 0; d < kHeadDim; d += 8) {
      __m256 k = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d)));
      a0 = _mm256_fmadd_ps(k, _mm256_loadu_ps(q0 + d), a0);
      a1 = _mm256_fmadd_ps(k, _mm256_loadu_ps(q0 + kHeadDim + d), a1);
      a2 = _mm256_fmadd_ps(k, _mm256_loadu_ps(q0 + 2 * kHeadDim + d), a2);
      a3 = _mm256_fmadd_ps(k, _mm256_loadu_ps(q0 + 3 * kHeadDim + d), a3);
    }
    // Horizontal sums of the four accumulators.
    __m256 s01 = _mm256_hadd_ps(a0, a1), s23 = _mm256_hadd_ps(a2, a3);
    __m256 s = _mm256_hadd_ps(s01, s23);  // per 128-bit lane: a0 a1 a2 a3 partials
    __m128 sum = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    __m128 m = _mm_max_ps(sum, _mm_movehl_ps(sum, sum));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    scores[t] = _mm_cvtss_f32(m) * scale;
  }
}
#endif

bool have_avx2() {
#ifdef PQ_BENCH_X86
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  return ok;
#else
  return false;
#endif
}

// One kv head: scores, top-k of the middle tokens, positions ascending.
void exact_head(const Trace& t, int h, const float* q, int32_t sink, int32_t local,
                std::vector<float>& scores, std::vector<int32_t>& idx, int32_t* out,
                int64_t* out_count) {
#ifdef PQ_BENCH_X86
  if (have_avx2())
    scan_head_avx2(t.keys.data(), t.tokens, h, q, scores.data());
  else
#endif
    scan_head_scalar(t.keys.data(), t.tokens, h, q, scores.data());
  const int64_t lo = std::min<int64_t>(sink, t.tokens);
  const int64_t hi = std::max<int64_t>(lo, t.tokens - local);
  const int64_t middle = hi - lo;
  // The library's rounding: ceil, forgiving the float representation of 0.2f.
  const int64_t k = std::min<int64_t>(
      middle, int64_t(std::ceil(double(kTopkFraction) * double(middle) * (1.0 - 1e-6))));
  idx.resize(size_t(middle));
  std::iota(idx.begin(), idx.end(), int32_t(lo));
  std::nth_element(idx.begin(), idx.begin() + k, idx.end(),
                   [&](int32_t a, int32_t b) { return scores[size_t(a)] > scores[size_t(b)]; });
  int64_t n = 0;
  for (int32_t p = 0; p < lo; ++p) out[n++] = p;  // sinks
  std::sort(idx.begin(), idx.begin() + k);
  for (int64_t i = 0; i < k; ++i) out[n++] = idx[size_t(i)];
  for (int64_t p = hi; p < t.tokens; ++p) out[n++] = int32_t(p);  // local window
  *out_count = n;
}

void exact_scan_baseline(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const Trace& t = trace_for(tokens);
  const pq_config cfg = bench_config(PQ_SELECTOR_EXACT);
  const int threads = std::max(1, std::min<int>(kKvHeads, int(std::thread::hardware_concurrency())));
  std::vector<std::vector<float>> scores(static_cast<size_t>(threads),
                                         std::vector<float>(static_cast<size_t>(tokens)));
  std::vector<std::vector<int32_t>> idx(static_cast<size_t>(threads));
  std::vector<int32_t> out(size_t(kKvHeads) * size_t(tokens));
  std::vector<int64_t> counts(kKvHeads);
  int qi = 0;
  for (auto _ : state) {
    const float* q = &t.queries_f32[size_t(qi) * kQHeads * kHeadDim];
    auto work = [&](int w) {
      for (int h = w; h < kKvHeads; h += threads)
        exact_head(t, h, q, cfg.sink_tokens, cfg.local_tokens, scores[size_t(w)], idx[size_t(w)],
                   &out[size_t(h) * size_t(tokens)], &counts[size_t(h)]);
    };
    std::vector<std::thread> pool;
    for (int w = 1; w < threads; ++w) pool.emplace_back(work, w);
    work(0);
    for (auto& th : pool) th.join();
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    qi = (qi + 1) % kQueries;
  }
  state.SetItemsProcessed(state.iterations() * tokens);
  state.counters["selected_per_head"] = double(counts[0]);
  state.counters["threads"] = threads;
  state.counters["avx2_f16c"] = have_avx2() ? 1 : 0;
}

// ---------------------------------------------------------------------------
// (d) prefill overlapped with the caller's compute (paper section 3.3)
// ---------------------------------------------------------------------------

constexpr int32_t kOverlapLayers = 8;

// The caller's compute for one layer of a Llama-3-8B-like model over a prompt
// of s tokens, which the benchmark sleeps for: 2 FLOPs per weight and token
// (218M weights per layer: 42M in attention, 176M in the MLP) plus causal
// attention (QK^T and AV over half of the s x s scores: 2 s^2 d, d = 4096),
// at 500 TFLOP/s (an H100's bf16 at about half of its dense peak). That is
// 8.2 ms per layer at 8K tokens and 46 ms at 32K.
double layer_compute_seconds(int64_t s) {
  constexpr double kWeightsPerLayer = 218e6, kModelDim = 4096, kFlopsPerSecond = 500e12;
  const double n = double(s);
  return (2.0 * kWeightsPerLayer * n + 2.0 * kModelDim * n * n) / kFlopsPerSecond;
}

// Prefills every layer of a fresh context with the trace, each after
// `compute` seconds of the caller's work; `overlapped` waits for the builds
// once at the end, otherwise after every layer. Returns the wall time
// (context creation excluded); adds the time inside pq_prefill_layer and the
// builds' wall time to *prefill_seconds and *build_seconds.
double prefill_all_layers(const Trace& t, double compute, bool overlapped, double* prefill_seconds,
                          double* build_seconds) {
  pq_config cfg = bench_config(PQ_SELECTOR_PQ);
  cfg.num_layers = kOverlapLayers;
  pq_context* ctx = nullptr;
  CHECK(pq_create(&cfg, &ctx));
  CHECK(pq_sequence_add(ctx, kSeq));
  const auto start = std::chrono::steady_clock::now();
  for (int32_t layer = 0; layer < kOverlapLayers; ++layer) {
    std::this_thread::sleep_for(std::chrono::duration<double>(compute));
    const auto call = std::chrono::steady_clock::now();
    prefill(ctx, t, layer);
    *prefill_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - call).count();
    if (!overlapped) CHECK(pq_wait_builds(ctx));
  }
  if (overlapped) CHECK(pq_wait_builds(ctx));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *build_seconds += stats_of(ctx).build_seconds;
  pq_destroy(ctx);
  return wall;
}

void prefill_overlap(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const Trace& t = trace_for(tokens);
  const double compute = layer_compute_seconds(tokens);
  double sequential = 0, overlapped = 0, prefill_calls = 0, builds = 0, unused = 0;
  for (auto _ : state) {
    // The reference first, in the same process; its builds do not overlap
    // one another, so their wall time is a layer's build cost.
    sequential += prefill_all_layers(t, compute, false, &prefill_calls, &builds);
    const double wall = prefill_all_layers(t, compute, true, &unused, &unused);
    overlapped += wall;
    state.SetIterationTime(wall);
  }
  const double n = double(state.iterations()), per_layer = 1e3 / n / kOverlapLayers;
  state.counters["sequential_ms"] = 1e3 * sequential / n;
  state.counters["overlap_speedup"] = sequential / overlapped;
  state.counters["compute_ms"] = 1e3 * compute;
  state.counters["prefill_ms"] = prefill_calls * per_layer;
  state.counters["build_ms"] = builds * per_layer;
}

}  // namespace

// Prefill + build: a fixed number of iterations keeps the 128K run affordable.
BENCHMARK(prefill_build)->Arg(8192)->Arg(32768)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(prefill_build)->Arg(131072)->Iterations(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(pq_select)->Arg(8192)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(pq_select_fetch)->Arg(8192)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(pq_select_fetch_gqa_max)->Arg(8192)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(exact_select_fetch)->Arg(8192)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(exact_scan_baseline)->Arg(8192)->Arg(32768)->Arg(131072)->Unit(benchmark::kMicrosecond)->UseRealTime();
// Each iteration runs both schedules (about 8 s at 8K and 15 s at 32K on 2
// cores), so few iterations.
BENCHMARK(prefill_overlap)->Arg(8192)->Iterations(2)->Unit(benchmark::kMillisecond)->UseManualTime();
BENCHMARK(prefill_overlap)->Arg(32768)->Iterations(1)->Unit(benchmark::kMillisecond)->UseManualTime();

int main(int argc, char** argv) {
  benchmark::AddCustomContext("pqcache_version", pq_version_string());
  benchmark::AddCustomContext(
      "geometry", "1 layer, 32 q heads, 8 kv heads (GQA 4), head_dim 128, f16");
  benchmark::AddCustomContext("pq", "m=2 subspaces, b=6 bits, top-k 1/5 of middle tokens");
  benchmark::AddCustomContext("kmeans_iterations",
                              std::to_string(kKmeansIterations) + " (fixed, tolerance 0)");
  benchmark::AddCustomContext("backend", "CPU");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_contexts.clear();
  g_traces.clear();
  return 0;
}
