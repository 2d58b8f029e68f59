// bench_floor.cpp - the CPU decode step against the memory floor and its
// baselines (issue 13), side by side in one run. The machine's bandwidths are
// measured first, by this program, and printed in the context:
//   read_GBps        summing a 1 GiB buffer, all hardware threads: the best
//                    of 9 runs (read_median_GBps: their median), with the
//                    load average when measured (load_at_bandwidth) and
//                    when each benchmark ends (load)
//   copy_fresh_GBps  memcpy into pages fresh from mmap (page faults
//                    included: what an ingest into a new chunk pays), 1 thread
//
// Benchmarks (first argument: context length in tokens):
//   select/N/m      pq_decode_select (PQ m x b: m = 2 -> 2x6, m = 4 -> 4x4).
//                   floor_us = the middle's code bytes / the best read
//                   bandwidth;
//                   over_floor = time / floor.
//   attend/N        one decode step through pq_decode_select +
//                   pq_decode_attend (top 1/5), timed; measured in the same
//                   iteration, interleaved: pq_decode_attend alone
//                   (attend_ms) and pq_fetch_kv alone (fetch_ms) over the
//                   same selection; select + pq_fetch_kv + the library's
//                   attention kernel over the gathered copy, kv heads on all
//                   threads (gather_ms: the best "gather + attention" without
//                   pq_decode_attend); dense attention over every token
//                   through pq_decode_attend (dense_ms) and through BLAS
//                   sgemm on f32 copies of K and V (blas_ms, N <= 128K).
//                   median_ms is the step's median; attend_over_fetch,
//                   dense_over_ours and gather_over_ours are ratios of
//                   medians. PyTorch's SDPA: bench/cpu_step_vs_torch.py.
//   ingest/N        pq_prefill_layer of N tokens into a fresh sequence
//                   (WINDOW selector: no build), timed; memcpy of the same
//                   bytes into pages fresh from mmap in the same iteration
//                   (memcpy_ms), as the ingest writes into new chunks;
//                   of_memcpy = memcpy's median / the ingest's median.
// Geometry: one layer of a Llama-3-8B-like model (bench_data.h).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include <cblas.h>
#include <sys/mman.h>

#include "backend/attention.h"
#include "bench_data.h"
#include "pqcache.h"

namespace {

using namespace pqbench;
#define CHECK(call) check_status("bench_floor", (call), #call)
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// --- the machine's bandwidths ----------------------------------------------

struct Bandwidth {
  // read: the best of the reads (the floor must not flatter a step measured
  // under load with a bandwidth measured under load); read_median beside it.
  double read_gbps = 0, read_median_gbps = 0, copy_fresh_gbps = 0;
  double load = 0;  // 1-minute load average when measured
};

// `bytes` of fresh pages from the kernel (unmapped by the deleter): what an
// ingest into new chunks writes into, page faults included.
struct FreshPages {
  void operator()(uint8_t* p) const { munmap(p, bytes); }
  size_t bytes;
};
std::unique_ptr<uint8_t, FreshPages> fresh_pages(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();
  return std::unique_ptr<uint8_t, FreshPages>(static_cast<uint8_t*>(p), FreshPages{bytes});
}

Bandwidth measure_bandwidth() {
  Bandwidth b;
  const size_t bytes = size_t{1} << 30;
  std::vector<uint64_t> buf(bytes / 8, 1);
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<double> reads;
  b.load = pqbench::load_average();
  for (int rep = 0; rep < 9; ++rep) {
    std::vector<uint64_t> sums(threads, 0);
    auto t = Clock::now();
    std::vector<std::thread> pool;
    for (unsigned i = 0; i < threads; ++i)
      pool.emplace_back([&, i] {
        const size_t n = buf.size() / threads, begin = i * n;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t j = begin; j + 4 <= begin + n; j += 4) {
          s0 += buf[j];
          s1 += buf[j + 1];
          s2 += buf[j + 2];
          s3 += buf[j + 3];
        }
        sums[i] = s0 + s1 + s2 + s3;
      });
    for (auto& th : pool) th.join();
    reads.push_back(bytes / seconds_since(t) / 1e9);
    benchmark::DoNotOptimize(sums.data());
  }
  std::sort(reads.begin(), reads.end());
  b.read_gbps = reads.back();
  b.read_median_gbps = reads[reads.size() / 2];
  std::vector<double> copies;
  const size_t copy_bytes = size_t{256} << 20;
  for (int rep = 0; rep < 5; ++rep) {
    auto t = Clock::now();
    auto dst = fresh_pages(copy_bytes);
    std::memcpy(dst.get(), buf.data(), copy_bytes);
    copies.push_back(copy_bytes / seconds_since(t) / 1e9);
    benchmark::DoNotOptimize(dst.get());
  }
  std::sort(copies.begin(), copies.end());
  b.copy_fresh_gbps = copies[copies.size() / 2];
  return b;
}

Bandwidth& bandwidth() {
  static Bandwidth b = measure_bandwidth();
  return b;
}

// --- data --------------------------------------------------------------------

// Clustered keys, Gaussian values, one query (bench_data.h), per length.
using Trace = ClusteredKv;

const Trace& trace_for(int64_t tokens) {
  static std::map<int64_t, std::unique_ptr<Trace>> traces;
  auto& t = traces[tokens];
  if (!t) t = make_clustered_kv(tokens, 0xF100Bull, 1, false);
  return *t;
}

void tensors(const Trace& t, pq_tensor* k, pq_tensor* v, pq_tensor* q) {
  CHECK(pq_tensor_init(k, const_cast<uint16_t*>(t.keys.data()), PQ_DTYPE_F16,
                       PQ_LAYOUT_TOKEN_MAJOR, t.tokens, kKvHeads, kHeadDim));
  CHECK(pq_tensor_init(v, const_cast<uint16_t*>(t.values.data()), PQ_DTYPE_F16,
                       PQ_LAYOUT_TOKEN_MAJOR, t.tokens, kKvHeads, kHeadDim));
  CHECK(pq_tensor_init(q, const_cast<uint16_t*>(t.queries.data()), PQ_DTYPE_F16,
                       PQ_LAYOUT_TOKEN_MAJOR, 1, kQHeads, kHeadDim));
}

// A prefilled context per (length, m), built once.
pq_context* context_for(int64_t tokens, int32_t m) {
  static std::map<std::pair<int64_t, int32_t>, pq_context*> contexts;
  pq_context*& ctx = contexts[{tokens, m}];
  if (ctx) return ctx;
  pq_config c = layer_config(10);
  c.pq_subspaces = m;
  c.pq_bits = m == 2 ? 6 : 4;
  CHECK(pq_create(&c, &ctx));
  CHECK(pq_sequence_add(ctx, 1));
  pq_tensor k, v, q;
  tensors(trace_for(tokens), &k, &v, &q);
  CHECK(pq_prefill_layer(ctx, 1, 0, &k, &v));
  CHECK(pq_wait_builds(ctx));
  return ctx;
}

struct Selection {
  std::vector<int32_t> positions, counts;
  pq_selection sel{};
  explicit Selection(int64_t capacity)
      : positions(size_t(capacity) * kKvHeads), counts(kKvHeads) {
    sel = pq_selection{positions.data(), counts.data(), capacity};
  }
};

void report_bandwidth(benchmark::State& state) {
  state.counters["read_GBps"] = bandwidth().read_gbps;
  state.counters["read_median_GBps"] = bandwidth().read_median_gbps;
  state.counters["copy_fresh_GBps"] = bandwidth().copy_fresh_gbps;
  state.counters["load_at_bandwidth"] = bandwidth().load;
  state.counters["load"] = pqbench::load_average();
}

// --- select ------------------------------------------------------------------

void select(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int32_t m = int32_t(state.range(1));
  pq_context* ctx = context_for(tokens, m);
  pq_tensor k, v, q;
  tensors(trace_for(tokens), &k, &v, &q);
  int64_t cap = 0;
  CHECK(pq_selection_capacity(ctx, 1, 0, &cap));
  Selection s(cap);
  std::vector<double> times;
  for (auto _ : state) {
    auto t = Clock::now();
    CHECK(pq_decode_select(ctx, 1, 0, &q, &s.sel));
    times.push_back(seconds_since(t));
    state.SetIterationTime(times.back());
  }
  std::sort(times.begin(), times.end());
  const double floor_s = double(tokens) * kKvHeads * m / (bandwidth().read_gbps * 1e9);
  state.counters["median_us"] = times[times.size() / 2] * 1e6;
  state.counters["floor_us"] = floor_s * 1e6;
  state.counters["over_floor"] = times[times.size() / 2] / floor_s;
  report_bandwidth(state);
}

// --- attend ------------------------------------------------------------------

// The best "gather + attention" the project has without pq_decode_attend:
// pq_fetch_kv's copy ([kv_head][cap][dim], head-major), then the library's
// own attention kernel (pq::attend_rows, AVX2/F16C) over those contiguous
// rows, the kv heads split over the machine's threads as attend does.
void attend_gathered(const uint16_t* k, const uint16_t* v, const int32_t* counts, int64_t cap,
                     const float* q, float scale, float* out) {
  const size_t row_bytes = kHeadDim * sizeof(uint16_t);
  auto head = [&](int h) {
    // A RowTable whose "chunks" are the head's gathered rows: row i of head
    // h lies at chunk i >> shift, offset (i & mask) * row_bytes.
    pq::KvStore::RowTable t;
    t.row_bytes = row_bytes;
    t.head_bytes = 0;
    t.head_dim = kHeadDim;
    t.dtype = PQ_DTYPE_F16;
    for (int64_t c = 0; c * pq::KvStore::kChunkTokens < cap; ++c) {
      const size_t at = (size_t(h) * cap + size_t(c) * pq::KvStore::kChunkTokens) * row_bytes;
      t.keys.push_back(reinterpret_cast<const uint8_t*>(k) + at);
      t.values.push_back(reinterpret_cast<const uint8_t*>(v) + at);
    }
    std::vector<int32_t> rows(size_t(counts[h]));
    for (int32_t i = 0; i < counts[h]; ++i) rows[size_t(i)] = i;
    std::vector<float> acc(size_t(kGroup) * kHeadDim), max(kGroup);
    std::vector<double> sum(kGroup);
    pq::AttentionPart part{acc.data(), max.data(), sum.data()};
    pq::attend_rows(t, 0, rows.data(), counts[h], q + size_t(h) * kGroup * kHeadDim, kGroup,
                    scale, part);
    pq::merge_attention(&part, 1, kGroup, kHeadDim, out + size_t(h) * kGroup * kHeadDim, nullptr);
  };
  const int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w)
    pool.emplace_back([&, w] {
      for (int h = w; h < kKvHeads; h += threads) head(h);
    });
  for (auto& th : pool) th.join();
}

// f32 copies of K and V, [kv_head][token][dim], for the BLAS baseline.
struct F32Copy {
  std::vector<float> k, v;
};
const F32Copy& f32_copy(int64_t tokens) {
  static std::map<int64_t, std::unique_ptr<F32Copy>> copies;
  auto& c = copies[tokens];
  if (c) return *c;
  c = std::make_unique<F32Copy>();
  const Trace& t = trace_for(tokens);
  c->k.resize(t.keys.size());
  c->v.resize(t.values.size());
  for (int64_t tok = 0; tok < tokens; ++tok)
    for (int h = 0; h < kKvHeads; ++h)
      for (int d = 0; d < kHeadDim; ++d) {
        const size_t src = (size_t(tok) * kKvHeads + h) * kHeadDim + d;
        const size_t dst = (size_t(h) * tokens + tok) * kHeadDim + d;
        c->k[dst] = f16_to_f32(t.keys[src]);
        c->v[dst] = f16_to_f32(t.values[src]);
      }
  return *c;
}

// Dense attention with BLAS: per kv head, logits = K q (sgemm over the
// group's queries), softmax, out = V^T w.
void attend_blas(const F32Copy& c, int64_t tokens, const float* q, float scale, float* out,
                 std::vector<float>& logits) {
  logits.resize(size_t(tokens) * kGroup);
  for (int h = 0; h < kKvHeads; ++h) {
    const float* K = &c.k[size_t(h) * tokens * kHeadDim];
    const float* V = &c.v[size_t(h) * tokens * kHeadDim];
    const float* Q = q + size_t(h) * kGroup * kHeadDim;
    // logits [tokens][group] = K [tokens][dim] x Q^T [dim][group]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(tokens), kGroup, kHeadDim, scale, K,
                kHeadDim, Q, kHeadDim, 0.f, logits.data(), kGroup);
    for (int g = 0; g < kGroup; ++g) {
      float mx = -INFINITY;
      for (int64_t i = 0; i < tokens; ++i) mx = std::max(mx, logits[size_t(i) * kGroup + g]);
      double sum = 0;
      for (int64_t i = 0; i < tokens; ++i)
        sum += (logits[size_t(i) * kGroup + g] = std::exp(logits[size_t(i) * kGroup + g] - mx));
      const float inv = float(1.0 / sum);
      for (int64_t i = 0; i < tokens; ++i) logits[size_t(i) * kGroup + g] *= inv;
    }
    // out [group][dim] = W^T [group][tokens] x V [tokens][dim]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kGroup, kHeadDim, int(tokens), 1.f,
                logits.data(), kGroup, V, kHeadDim, 0.f, out + size_t(h) * kGroup * kHeadDim,
                kHeadDim);
  }
}

void attend(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  pq_context* ctx = context_for(tokens, 2);
  const Trace& tr = trace_for(tokens);
  pq_tensor k, v, q;
  tensors(tr, &k, &v, &q);
  int64_t cap = 0;
  CHECK(pq_selection_capacity(ctx, 1, 0, &cap));
  Selection s(cap);
  Selection all(tokens);
  for (int h = 0; h < kKvHeads; ++h) {
    all.counts[size_t(h)] = int32_t(tokens);
    for (int64_t i = 0; i < tokens; ++i) all.positions[size_t(h) * tokens + i] = int32_t(i);
  }
  std::vector<uint16_t> ok(size_t(cap) * kKvHeads * kHeadDim), ov(ok.size());
  pq_tensor tk, tv;
  CHECK(pq_tensor_init(&tk, ok.data(), PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR, cap, kKvHeads, kHeadDim));
  CHECK(pq_tensor_init(&tv, ov.data(), PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR, cap, kKvHeads, kHeadDim));
  std::vector<float> qf(tr.queries.size()), out(size_t(kQHeads) * kHeadDim), logits;
  for (size_t i = 0; i < qf.size(); ++i) qf[i] = f16_to_f32(tr.queries[i]);
  const float scale = 1.0f / std::sqrt(float(kHeadDim));
  const bool blas = tokens <= 131072;
  const F32Copy* f32 = blas ? &f32_copy(tokens) : nullptr;
  std::vector<double> ours, attend_only, fetch_only, gather, dense, dense_blas;
  CHECK(pq_decode_select(ctx, 1, 0, &q, &s.sel));
  for (auto _ : state) {
    auto t = Clock::now();
    CHECK(pq_decode_select(ctx, 1, 0, &q, &s.sel));
    CHECK(pq_decode_attend(ctx, 1, 0, &q, &s.sel, 0.f, out.data(), nullptr));
    ours.push_back(seconds_since(t));
    state.SetIterationTime(ours.back());
    t = Clock::now();
    CHECK(pq_decode_attend(ctx, 1, 0, &q, &s.sel, 0.f, out.data(), nullptr));
    attend_only.push_back(seconds_since(t));
    t = Clock::now();
    CHECK(pq_fetch_kv(ctx, 1, 0, &s.sel, &tk, &tv));
    fetch_only.push_back(seconds_since(t));
    t = Clock::now();
    CHECK(pq_decode_select(ctx, 1, 0, &q, &s.sel));
    CHECK(pq_fetch_kv(ctx, 1, 0, &s.sel, &tk, &tv));
    attend_gathered(ok.data(), ov.data(), s.counts.data(), cap, qf.data(), scale, out.data());
    gather.push_back(seconds_since(t));
    t = Clock::now();
    CHECK(pq_decode_attend(ctx, 1, 0, &q, &all.sel, 0.f, out.data(), nullptr));
    dense.push_back(seconds_since(t));
    if (blas) {
      t = Clock::now();
      attend_blas(*f32, tokens, qf.data(), scale, out.data(), logits);
      dense_blas.push_back(seconds_since(t));
    }
    benchmark::DoNotOptimize(out.data());
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // Medians of the interleaved runs, and the ratios the issue asks about.
  state.counters["median_ms"] = median(ours) * 1e3;
  state.counters["attend_ms"] = median(attend_only) * 1e3;
  state.counters["fetch_ms"] = median(fetch_only) * 1e3;
  state.counters["attend_over_fetch"] = median(attend_only) / median(fetch_only);
  state.counters["gather_ms"] = median(gather) * 1e3;
  state.counters["dense_ms"] = median(dense) * 1e3;
  state.counters["dense_over_ours"] = median(dense) / median(ours);
  state.counters["gather_over_ours"] = median(gather) / median(ours);
  if (blas) state.counters["blas_ms"] = median(dense_blas) * 1e3;
  report_bandwidth(state);
}

// --- ingest ------------------------------------------------------------------

void ingest(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const Trace& tr = trace_for(tokens);
  pq_config c = layer_config(10);
  c.selector = PQ_SELECTOR_WINDOW;  // no index: the ingest alone
  pq_context* ctx = nullptr;
  CHECK(pq_create(&c, &ctx));
  pq_tensor k, v, q;
  tensors(tr, &k, &v, &q);
  const size_t bytes = tr.keys.size() * 2;
  std::vector<double> ingests, copies;
  uint64_t seq = 1;
  for (auto _ : state) {
    CHECK(pq_sequence_add(ctx, seq));
    auto t = Clock::now();
    CHECK(pq_prefill_layer(ctx, seq, 0, &k, &v));
    ingests.push_back(seconds_since(t));
    state.SetIterationTime(ingests.back());
    CHECK(pq_sequence_remove(ctx, seq++));
    t = Clock::now();
    auto dk = fresh_pages(bytes), dv = fresh_pages(bytes);
    std::memcpy(dk.get(), tr.keys.data(), bytes);
    std::memcpy(dv.get(), tr.values.data(), bytes);
    benchmark::DoNotOptimize(dk.get());
    benchmark::DoNotOptimize(dv.get());
    copies.push_back(seconds_since(t));
  }
  std::sort(copies.begin(), copies.end());
  std::sort(ingests.begin(), ingests.end());
  state.counters["median_ms"] = ingests[ingests.size() / 2] * 1e3;
  state.counters["memcpy_ms"] = copies[copies.size() / 2] * 1e3;
  // The share of memcpy's speed the ingest reaches (1 = as fast as memcpy).
  state.counters["of_memcpy"] = copies[copies.size() / 2] / ingests[ingests.size() / 2];
  state.counters["GB"] = 2.0 * bytes / 1e9;
  report_bandwidth(state);
  pq_destroy(ctx);
}

}  // namespace

BENCHMARK(select)->ArgsProduct({{8192, 32768, 131072, 524288}, {2, 4}})->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(attend)->Arg(8192)->Arg(32768)->Arg(131072)->Arg(524288)->UseManualTime()
    ->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK(ingest)->Arg(8192)->Arg(32768)->Arg(131072)->Arg(524288)->UseManualTime()
    ->Unit(benchmark::kMillisecond)->MinTime(0.5);

BENCHMARK_MAIN();
