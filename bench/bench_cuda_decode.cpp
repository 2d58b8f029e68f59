// bench_cuda_decode.cpp - the per-token decode cost of libpqcache's CUDA
// backend, through the public API, as a serving loop pays it.
//
// Geometry: one layer of a Llama-3-8B-like model: 32 query heads, 8 kv heads
// (GQA 4), head_dim 128, f16 K/V/Q; PQ with m = 2 subspaces, b = 6 bits;
// top-k = 1/5 of the middle tokens (plus the default 4 sink and 128 local
// tokens). Prompts of 8K, 32K, 128K and 1M tokens are prefilled from host
// memory once per (prompt, cache size) with a SHORT K-Means
// (kmeans_iterations = 4) so that the 1M setup stays affordable; the decode
// step depends on the index's shape (m, b, tokens), not on its iterations.
//
// Data: keys are seeded Gaussian clusters as in bench_pqcache (64 clusters
// per kv head, noise 0.35), with positional locality added: the sequence is
// cut into topics of 512 tokens (4 cache blocks) and half of a topic's tokens
// come from the topic's cluster, the rest from random clusters. Queries drift
// slowly: q_t = a_t + e_t with e_t = 0.9 e_{t-1} + noise (seeded), around an
// anchor a_t (1.5 x the centre of a topic of the prompt) that glides to
// another topic of the prompt over every 64 steps. Consecutive queries thus
// revisit similar tokens, which is what the block cache can exploit.
//
// Benchmarks (wall time per step; the arguments are prompt tokens and
// cache_tokens):
//   cuda_decode_memcpy_baseline/P  the same step with the fetch replaced by
//       ONE cudaMemcpyAsync of the same bytes (all selected K and V rows)
//       from pinned host memory: the fetch at the PCIe ceiling. It runs first
//       for each prompt so that the step rows can report their ratio to it.
//   cuda_decode_step/P/C  one decode step: pq_decode_append of one token (host
//       K/V), pq_decode_select with the query in device memory, pq_fetch_kv
//       into device buffers [kv_head][capacity][128] on the caller's stream
//       (pq_sequence_set_stream), cudaStreamSynchronize. C = 0 (no block
//       cache), 4096 or 8192 tokens (LRU, 128-token blocks).
//   cuda_decode_step_device/P  the step kept on the device (0.7): append,
//       pq_decode_select_device (the selection into device arrays) and
//       pq_fetch_kv_device on the stream, one cudaStreamSynchronize; no host
//       wait inside the library (no block cache: it needs host positions).
// Counters: hit_rate (cache_hits / (hits + misses) over the timed steps, 0
// without a cache), fetched_MB_per_step (K and V), selected_per_head,
// select_ms and fetch_ms (host time inside the two calls, from pq_stats),
// vs_memcpy_baseline (step time / baseline step time of the same prompt).
// Each run first takes 8 untimed warm-up steps. Every step appends a token,
// so the sequence grows by the steps taken (at most ~3% at 8K).
//
// Memory: one prompt's K/V (4 GiB at 1M tokens) and one context (another
// 4 GiB host) live at a time; a context is destroyed before the next is made.
//
// Without a CUDA device the program prints one line saying so and exits 0.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_data.h"
#include "pqcache.h"

namespace {

using pqbench::kGroup;
using pqbench::kHeadDim;
using pqbench::kKvHeads;
using pqbench::kQHeads;
using pqbench::kTopkFraction;
constexpr size_t kRowBytes = kHeadDim * sizeof(uint16_t);  // one (token, head) row in f16
constexpr int kClusters = 64;
constexpr int64_t kTopicTokens = 512;      // tokens per topic: 4 cache blocks of 128
constexpr float kTopicShare = 0.5f;        // share of a topic's tokens from its cluster
constexpr int kQueryPool = 1024;           // drifting queries, replayed back and forth
constexpr int kAnchorSteps = 64;           // steps to glide from one topic to the next
constexpr int kDecodePool = 1024;          // decode tokens' K/V, cycled
constexpr int kWarmupSteps = 8;
constexpr int kKmeansIterations = 4;
constexpr uint64_t kSeq = 1;

// Prompt lengths and the timed steps of each run (fixed, so that runs compare
// and the sequence grows by a known amount).
struct Plan {
  int64_t prompt_tokens;
  int64_t steps;
};
constexpr Plan kPlans[] = {{8192, 256}, {32768, 256}, {131072, 64}, {int64_t{1} << 20, 16}};
constexpr int64_t kCacheTokens[] = {0, 4096, 8192};

#define CHECK(call) pqbench::check_status("bench_cuda_decode", (call), #call)

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_cuda_decode: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
#define CHECK_CUDA(call) check_cuda((call), #call)

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ---------------------------------------------------------------------------
// Data (the generator and f16 rounding of bench_pqcache)
// ---------------------------------------------------------------------------

using pqbench::f32_to_f16;
using pqbench::Rng;

// One prompt: its keys and values ([token][kv_head][head_dim], f16), the K/V
// of the tokens decode steps append, and the drifting queries.
struct Prompt {
  int64_t tokens = 0;
  std::vector<float> centres;   // [kv_head][cluster][head_dim]
  std::vector<int32_t> topics;  // the cluster of each kTopicTokens-token topic
  std::vector<uint16_t> keys, values;
  std::vector<uint16_t> decode_keys, decode_values;  // kDecodePool tokens
  std::vector<uint16_t> queries;                     // [kQueryPool][q_head][head_dim]
};

// K/V of positions [first, first + count) into keys/values (token-major).
// Each topic piece has its own seed, so that the split across threads does
// not change the data.
void generate_kv(const Prompt& p, int64_t first, int64_t count, uint16_t* keys,
                 uint16_t* values) {
  const int64_t end = first + count;
  const int64_t first_topic = first / kTopicTokens, topics = (end - 1) / kTopicTokens + 1;
  const int workers = int(std::max(1u, std::thread::hardware_concurrency()));
  auto work = [&](int w) {
    for (int64_t topic = first_topic + w; topic < topics; topic += workers) {
      const int64_t lo = std::max(first, topic * kTopicTokens);
      const int64_t hi = std::min(end, (topic + 1) * kTopicTokens);
      Rng rng{0xDEC0DEull ^ (uint64_t(p.tokens) << 20) ^ (uint64_t(lo) * 0x9E3779B97F4A7C15ull)};
      for (int64_t pos = lo; pos < hi; ++pos)
        for (int h = 0; h < kKvHeads; ++h) {
          const int cluster = rng.uniform() < kTopicShare ? p.topics[size_t(topic)]
                                                          : int(rng.next() % kClusters);
          const float* c = &p.centres[(size_t(h) * kClusters + size_t(cluster)) * kHeadDim];
          const size_t row = (size_t(pos - first) * kKvHeads + size_t(h)) * kHeadDim;
          for (int d = 0; d < kHeadDim; ++d) {
            keys[row + size_t(d)] = f32_to_f16(c[d] + 0.35f * rng.gauss());
            values[row + size_t(d)] = f32_to_f16(rng.gauss());
          }
        }
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(work, w);
  work(0);
  for (auto& t : pool) t.join();
}

std::unique_ptr<Prompt> make_prompt(int64_t tokens) {
  auto p = std::make_unique<Prompt>();
  p->tokens = tokens;
  Rng rng{0xC0DAull ^ uint64_t(tokens)};
  p->centres.resize(size_t(kKvHeads) * kClusters * kHeadDim);
  for (int c = 0; c < kKvHeads * kClusters; ++c) {
    const float scale = 0.6f + 0.8f * rng.uniform();
    for (int d = 0; d < kHeadDim; ++d) p->centres[size_t(c) * kHeadDim + d] = scale * rng.gauss();
  }
  const int64_t topics = (tokens + kDecodePool + kTopicTokens - 1) / kTopicTokens;
  p->topics.resize(size_t(topics));
  for (auto& t : p->topics) t = int32_t(rng.next() % kClusters);

  const size_t n = size_t(tokens) * kKvHeads * kHeadDim;
  p->keys.resize(n);
  p->values.resize(n);
  generate_kv(*p, 0, tokens, p->keys.data(), p->values.data());
  p->decode_keys.resize(size_t(kDecodePool) * kKvHeads * kHeadDim);
  p->decode_values.resize(p->decode_keys.size());
  generate_kv(*p, tokens, kDecodePool, p->decode_keys.data(), p->decode_values.data());

  // Queries: anchors are topics of the prompt, so that something matches.
  const int64_t prompt_topics = std::max<int64_t>(1, tokens / kTopicTokens);
  auto anchor_topic = [&]() { return p->topics[size_t(rng.next() % uint64_t(prompt_topics))]; };
  int from = anchor_topic(), to = anchor_topic();
  std::vector<float> deviation(size_t(kQHeads) * kHeadDim);
  for (auto& e : deviation) e = 0.46f * rng.gauss();  // ~ the stationary spread of the AR(1)
  p->queries.resize(size_t(kQueryPool) * kQHeads * kHeadDim);
  for (int step = 0; step < kQueryPool; ++step) {
    if (step > 0 && step % kAnchorSteps == 0) {
      from = to;
      to = anchor_topic();
    }
    const float w = float(step % kAnchorSteps) / kAnchorSteps;  // glide from -> to
    for (int qh = 0; qh < kQHeads; ++qh) {
      const int h = qh / kGroup;
      const float* a = &p->centres[(size_t(h) * kClusters + size_t(from)) * kHeadDim];
      const float* b = &p->centres[(size_t(h) * kClusters + size_t(to)) * kHeadDim];
      for (int d = 0; d < kHeadDim; ++d) {
        float& e = deviation[size_t(qh) * kHeadDim + size_t(d)];
        e = 0.9f * e + 0.2f * rng.gauss();
        const float anchor = 1.5f * ((1.0f - w) * a[d] + w * b[d]);
        p->queries[(size_t(step) * kQHeads + size_t(qh)) * kHeadDim + size_t(d)] =
            f32_to_f16(anchor + e);
      }
    }
  }
  return p;
}

// ---------------------------------------------------------------------------
// CUDA memory owned by the benchmark
// ---------------------------------------------------------------------------

struct DeviceMemory {
  void* p = nullptr;
  DeviceMemory() = default;
  explicit DeviceMemory(size_t bytes) { CHECK_CUDA(cudaMalloc(&p, bytes)); }
  ~DeviceMemory() {
    if (p) cudaFree(p);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
};

struct PinnedMemory {
  void* p = nullptr;
  PinnedMemory() = default;
  explicit PinnedMemory(size_t bytes) { CHECK_CUDA(cudaMallocHost(&p, bytes)); }
  ~PinnedMemory() {
    if (p) cudaFreeHost(p);
  }
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;
};

// ---------------------------------------------------------------------------
// A prefilled context, its stream and the step's buffers
// ---------------------------------------------------------------------------

const char* plugin_path() {
  // $PQCACHE_CUDA_PLUGIN wins when set (the library reads it when the path
  // is NULL); otherwise the plug-in built next to this program.
  const char* env = std::getenv("PQCACHE_CUDA_PLUGIN");
  return env && *env ? nullptr : PQ_CUDA_PLUGIN_FILE;
}

pq_config bench_config(int64_t cache_tokens) {
  pq_config cfg = pqbench::layer_config(kKmeansIterations);
  cfg.backend = PQ_BACKEND_CUDA;
  cfg.cuda_plugin_path = plugin_path();
  cfg.cache_tokens = cache_tokens;
  cfg.cache_policy = PQ_CACHE_LRU;
  return cfg;
}

pq_stats stats_of(pq_context* ctx) {
  pq_stats st;
  std::memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  CHECK(pq_stats_get(ctx, &st));
  return st;
}

class Session {
 public:
  Session(const Prompt& prompt, int64_t cache_tokens)
      : prompt_(prompt), cache_tokens_(cache_tokens), queries_(prompt.queries.size() * 2) {
    const auto start = std::chrono::steady_clock::now();
    pq_config cfg = bench_config(cache_tokens);
    CHECK(pq_create(&cfg, &ctx_));
    CHECK(pq_sequence_add(ctx_, kSeq));
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CHECK(pq_sequence_set_stream(ctx_, kSeq, stream_));
    CHECK_CUDA(cudaMemcpy(queries_.p, prompt.queries.data(), prompt.queries.size() * 2,
                          cudaMemcpyHostToDevice));
    pq_tensor k, v;
    CHECK(pq_tensor_init(&k, const_cast<uint16_t*>(prompt.keys.data()), PQ_DTYPE_F16,
                         PQ_LAYOUT_TOKEN_MAJOR, prompt.tokens, kKvHeads, kHeadDim));
    CHECK(pq_tensor_init(&v, const_cast<uint16_t*>(prompt.values.data()), PQ_DTYPE_F16,
                         PQ_LAYOUT_TOKEN_MAJOR, prompt.tokens, kKvHeads, kHeadDim));
    CHECK(pq_prefill_layer(ctx_, kSeq, 0, &k, &v));
    CHECK(pq_wait_builds(ctx_));
    std::fprintf(stderr, "bench_cuda_decode: prefilled %lld tokens (cache_tokens %lld) in %.1f s\n",
                 static_cast<long long>(prompt.tokens), static_cast<long long>(cache_tokens),
                 seconds_since(start));
  }
  ~Session() {
    // The stream must outlive its use by the sequence: detach it first.
    pq_sequence_set_stream(ctx_, kSeq, nullptr);
    pq_destroy(ctx_);
    cudaStreamDestroy(stream_);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int64_t prompt_tokens() const { return prompt_.tokens; }
  int64_t cache_tokens() const { return cache_tokens_; }
  pq_context* ctx() const { return ctx_; }

  // Makes the selection and output buffers large enough for `steps` more
  // steps: each appended token raises the capacity by at most one.
  void reserve_steps(int64_t steps) {
    int64_t now = 0;
    CHECK(pq_selection_capacity(ctx_, kSeq, 0, &now));
    const int64_t needed = now + steps + 1;
    if (needed <= capacity_) return;
    capacity_ = needed;
    positions_.assign(size_t(capacity_) * kKvHeads, 0);
    counts_.assign(kKvHeads, 0);
    sel_.positions = positions_.data();
    sel_.counts = counts_.data();
    sel_.capacity = capacity_;
    // K then V, each [kv_head][capacity][head_dim]: one contiguous buffer,
    // so that the baseline's single copy has a single destination.
    const size_t tensor_bytes = size_t(capacity_) * kKvHeads * kRowBytes;
    kv_out_ = std::make_unique<DeviceMemory>(2 * tensor_bytes);
    baseline_src_ = std::make_unique<PinnedMemory>(2 * tensor_bytes);
    std::memset(baseline_src_->p, 0, 2 * tensor_bytes);  // touch the pages once
    char* base = static_cast<char*>(kv_out_->p);
    CHECK(pq_tensor_init(&out_k_, base, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR, capacity_, kKvHeads,
                         kHeadDim));
    CHECK(pq_tensor_init(&out_v_, base + tensor_bytes, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR,
                         capacity_, kKvHeads, kHeadDim));
    out_k_.memory = out_v_.memory = PQ_MEMORY_DEVICE;
  }

  // pq_decode_append of the next decode token, then pq_decode_select with
  // the next query (device memory). Returns the selected rows (all heads).
  // pq_decode_append of the next decode token; returns the next query
  // (device memory), back and forth over the query pool: the drift never
  // jumps.
  pq_tensor append_next() {
    const size_t t = size_t(steps_ % kDecodePool);
    const size_t row = t * kKvHeads * kHeadDim;
    pq_tensor k, v, q;
    CHECK(pq_tensor_init(&k, const_cast<uint16_t*>(&prompt_.decode_keys[row]), PQ_DTYPE_F16,
                         PQ_LAYOUT_TOKEN_MAJOR, 1, kKvHeads, kHeadDim));
    CHECK(pq_tensor_init(&v, const_cast<uint16_t*>(&prompt_.decode_values[row]), PQ_DTYPE_F16,
                         PQ_LAYOUT_TOKEN_MAJOR, 1, kKvHeads, kHeadDim));
    CHECK(pq_decode_append(ctx_, kSeq, 0, &k, &v));
    int64_t i = steps_ % (2 * kQueryPool - 2);
    if (i >= kQueryPool) i = 2 * kQueryPool - 2 - i;
    uint16_t* query = static_cast<uint16_t*>(queries_.p) + size_t(i) * kQHeads * kHeadDim;
    CHECK(pq_tensor_init(&q, query, PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 1, kQHeads, kHeadDim));
    q.memory = PQ_MEMORY_DEVICE;
    return q;
  }

  int64_t append_and_select() {
    const pq_tensor q = append_next();
    CHECK(pq_decode_select(ctx_, kSeq, 0, &q, &sel_));
    ++steps_;
    int64_t rows = 0;
    for (int32_t c : counts_) rows += c;
    return rows;
  }

  // The library's fetch into the device buffers, on the sequence's stream.
  void fetch() {
    CHECK(pq_fetch_kv(ctx_, kSeq, 0, &sel_, &out_k_, &out_v_));
    CHECK_CUDA(cudaStreamSynchronize(stream_));
  }

  // The step kept on the device: selection and fetch enqueued on the stream,
  // no host round trip until the caller's sync.
  void device_step() {
    const pq_tensor q = append_next();
    if (!device_sel_) {
      device_sel_ = std::make_unique<DeviceMemory>(size_t(capacity_ + 1) * kKvHeads * 4);
      device_counts_ = std::make_unique<DeviceMemory>(kKvHeads * 4);
    }
    pq_selection sel{static_cast<int32_t*>(device_sel_->p), static_cast<int32_t*>(device_counts_->p),
                     capacity_};
    CHECK(pq_decode_select_device(ctx_, kSeq, 0, &q, &sel));
    CHECK(pq_fetch_kv_device(ctx_, kSeq, 0, &sel, &out_k_, &out_v_));
    CHECK_CUDA(cudaStreamSynchronize(stream_));
    ++steps_;
  }

  // The baseline's fetch: the same bytes as one copy from pinned memory.
  void copy_baseline(size_t bytes) {
    CHECK_CUDA(cudaMemcpyAsync(kv_out_->p, baseline_src_->p, bytes, cudaMemcpyHostToDevice,
                               stream_));
    CHECK_CUDA(cudaStreamSynchronize(stream_));
  }

  int64_t selected_per_head() const { return counts_.empty() ? 0 : counts_[0]; }
  int64_t length() const {
    int64_t n = 0;
    CHECK(pq_sequence_length(ctx_, kSeq, 0, &n));
    return n;
  }

 private:
  const Prompt& prompt_;
  int64_t cache_tokens_;
  pq_context* ctx_ = nullptr;
  cudaStream_t stream_ = nullptr;
  DeviceMemory queries_;
  int64_t steps_ = 0;
  int64_t capacity_ = 0;
  std::vector<int32_t> positions_, counts_;
  pq_selection sel_{};
  pq_tensor out_k_{}, out_v_{};
  std::unique_ptr<DeviceMemory> kv_out_;
  std::unique_ptr<PinnedMemory> baseline_src_;
  std::unique_ptr<DeviceMemory> device_sel_, device_counts_;
};

// One prompt and one session at a time (a 1M prompt and its context take
// 8 GiB of host memory); the runs are registered prompt by prompt.
std::unique_ptr<Prompt> g_prompt;
std::unique_ptr<Session> g_session;
std::map<int64_t, double> g_baseline_step_seconds;  // per prompt length

Session& session_for(int64_t prompt_tokens, int64_t cache_tokens) {
  if (g_session && g_session->prompt_tokens() == prompt_tokens &&
      g_session->cache_tokens() == cache_tokens)
    return *g_session;
  g_session.reset();
  if (!g_prompt || g_prompt->tokens != prompt_tokens) {
    g_prompt.reset();
    const auto start = std::chrono::steady_clock::now();
    g_prompt = make_prompt(prompt_tokens);
    std::fprintf(stderr, "bench_cuda_decode: generated %lld prompt tokens in %.1f s\n",
                 static_cast<long long>(prompt_tokens), seconds_since(start));
  }
  g_session = std::make_unique<Session>(*g_prompt, cache_tokens);
  return *g_session;
}

// ---------------------------------------------------------------------------
// Benchmarks
// ---------------------------------------------------------------------------

void cuda_decode_step(benchmark::State& state) {
  const int64_t prompt_tokens = state.range(0);
  Session& s = session_for(prompt_tokens, state.range(1));
  s.reserve_steps(kWarmupSteps + int64_t(state.max_iterations));
  for (int i = 0; i < kWarmupSteps; ++i) {  // codes resident, cache filled, buffers grown
    s.append_and_select();
    s.fetch();
  }
  const pq_stats before = stats_of(s.ctx());
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    s.append_and_select();
    s.fetch();
  }
  const double step_seconds = seconds_since(start) / double(state.iterations());
  const pq_stats after = stats_of(s.ctx());
  const double n = double(state.iterations());
  const double hits = double(after.cache_hits - before.cache_hits);
  const double misses = double(after.cache_misses - before.cache_misses);
  state.counters["hit_rate"] = hits + misses > 0 ? hits / (hits + misses) : 0.0;
  state.counters["fetched_MB_per_step"] =
      double(after.bytes_fetched - before.bytes_fetched) / n / 1e6;
  state.counters["selected_per_head"] = double(s.selected_per_head());
  state.counters["select_ms"] = 1e3 * (after.select_seconds - before.select_seconds) / n;
  state.counters["fetch_ms"] = 1e3 * (after.fetch_seconds - before.fetch_seconds) / n;
  state.counters["tokens_at_end"] = double(s.length());
  const auto baseline = g_baseline_step_seconds.find(prompt_tokens);
  if (baseline != g_baseline_step_seconds.end())
    state.counters["vs_memcpy_baseline"] = step_seconds / baseline->second;
}

void cuda_decode_step_device(benchmark::State& state) {
  const int64_t prompt_tokens = state.range(0);
  Session& s = session_for(prompt_tokens, 0);
  s.reserve_steps(kWarmupSteps + int64_t(state.max_iterations));
  for (int i = 0; i < kWarmupSteps; ++i) s.device_step();
  const pq_stats before = stats_of(s.ctx());
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) s.device_step();
  const double step_seconds = seconds_since(start) / double(state.iterations());
  const pq_stats after = stats_of(s.ctx());
  const double n = double(state.iterations());
  state.counters["select_ms"] = 1e3 * (after.select_seconds - before.select_seconds) / n;
  state.counters["fetch_ms"] = 1e3 * (after.fetch_seconds - before.fetch_seconds) / n;
  state.counters["tokens_at_end"] = double(s.length());
  const auto baseline = g_baseline_step_seconds.find(prompt_tokens);
  if (baseline != g_baseline_step_seconds.end())
    state.counters["vs_memcpy_baseline"] = step_seconds / baseline->second;
}

void cuda_decode_memcpy_baseline(benchmark::State& state) {
  const int64_t prompt_tokens = state.range(0);
  Session& s = session_for(prompt_tokens, 0);
  s.reserve_steps(kWarmupSteps + int64_t(state.max_iterations));
  for (int i = 0; i < kWarmupSteps; ++i)
    s.copy_baseline(size_t(s.append_and_select()) * 2 * kRowBytes);
  double copied = 0, copy_seconds = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const size_t bytes = size_t(s.append_and_select()) * 2 * kRowBytes;  // K and V rows
    const auto copy_start = std::chrono::steady_clock::now();
    s.copy_baseline(bytes);
    copy_seconds += seconds_since(copy_start);
    copied += double(bytes);
  }
  const double n = double(state.iterations());
  g_baseline_step_seconds[prompt_tokens] = seconds_since(start) / n;
  state.counters["fetched_MB_per_step"] = copied / n / 1e6;
  state.counters["selected_per_head"] = double(s.selected_per_head());
  state.counters["copy_ms"] = 1e3 * copy_seconds / n;
  state.counters["copy_GB_per_s"] = copy_seconds > 0 ? copied / copy_seconds / 1e9 : 0.0;
  state.counters["tokens_at_end"] = double(s.length());
}

// Says why the benchmarks cannot run here, or "" when a device is present.
std::string no_device_reason() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  if (devices == 0) return "cudaGetDeviceCount found 0 devices";
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const std::string why = no_device_reason();
  if (!why.empty()) {
    std::fprintf(stderr, "bench_cuda_decode: no CUDA device (%s); the CUDA decode benchmarks "
                         "are skipped.\n", why.c_str());
    return 0;
  }
  // A device but no usable plug-in is a broken setup, not a skip.
  {
    pq_config cfg = bench_config(0);
    pq_context* probe = nullptr;
    const pq_status st = pq_create(&cfg, &probe);
    if (st != PQ_OK) {
      std::fprintf(stderr, "bench_cuda_decode: the CUDA backend does not start: %s: %s\n",
                   pq_status_string(st), pq_last_error());
      return 1;
    }
    pq_destroy(probe);
  }

  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  benchmark::AddCustomContext("pqcache_version", pq_version_string());
  benchmark::AddCustomContext("device", prop.name);
  benchmark::AddCustomContext("geometry",
                              "1 layer, 32 q heads, 8 kv heads (GQA 4), head_dim 128, f16");
  benchmark::AddCustomContext("pq", "m=2 subspaces, b=6 bits, top-k 1/5 of middle tokens");
  benchmark::AddCustomContext("kmeans_iterations", std::to_string(kKmeansIterations) +
                                                       " (setup only; short on purpose)");
  benchmark::AddCustomContext("backend", "CUDA");
  // Prompt by prompt, the baseline first: one prompt in memory at a time,
  // and the step rows find the baseline's time for their ratio.
  for (const Plan& plan : kPlans) {
    benchmark::RegisterBenchmark("cuda_decode_memcpy_baseline", cuda_decode_memcpy_baseline)
        ->Arg(plan.prompt_tokens)
        ->Iterations(plan.steps)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark("cuda_decode_step_device", cuda_decode_step_device)
        ->Arg(plan.prompt_tokens)
        ->Iterations(plan.steps)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    for (int64_t cache : kCacheTokens)
      benchmark::RegisterBenchmark("cuda_decode_step", cuda_decode_step)
          ->Args({plan.prompt_tokens, cache})
          ->Iterations(plan.steps)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_session.reset();
  g_prompt.reset();
  return 0;
}
