// The CUDA plug-in's kernels against the CPU code they replace, in one run:
// the PQ lookup-table scan with the GQA combine (one layer, 8 kv heads, GQA 4,
// m = 2, b = 6, sum of softmax) and the radix top-k (1/5 of the tokens per kv
// head), at 8K to 1M tokens. GPU times are stream-synchronised wall times of
// the kernels alone (inputs already on the device). Without a GPU the GPU
// benchmarks report an error saying why and the CPU ones still run.
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "cuda_plugin_abi.h"
#include "scratch.h"
#include "topk.h"

namespace {

constexpr int32_t kHeads = 8, kGroup = 4, kM = 2, kCentroids = 64;

const pq_cuda_plugin_v2* plugin() {
  static const pq_cuda_plugin_v2* table = [] () -> const pq_cuda_plugin_v2* {
    const char* path = std::getenv("PQCACHE_CUDA_PLUGIN");
    void* h = dlopen(path && *path ? path : PQ_CUDA_PLUGIN_FILE, RTLD_NOW | RTLD_LOCAL);
    if (!h) return nullptr;
    auto entry = reinterpret_cast<pq_cuda_plugin_entry_fn>(dlsym(h, PQ_CUDA_PLUGIN_ENTRY));
    const pq_cuda_plugin_v1* t = entry ? entry(PQ_CUDA_PLUGIN_ABI_VERSION_2) : nullptr;
    if (!t || t->device_count() <= 0) return nullptr;
    return reinterpret_cast<const pq_cuda_plugin_v2*>(t);
  }();
  return table;
}

struct Inputs {
  std::vector<float> lut, scores;
  std::vector<uint8_t> codes;
  explicit Inputs(int64_t n) : lut(kHeads * kGroup * kM * kCentroids), scores(kHeads * n),
                               codes(kHeads * n * kM) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (auto& x : lut) x = normal(rng);
    for (auto& x : scores) x = normal(rng);
    for (auto& c : codes) c = static_cast<uint8_t>(rng() % kCentroids);
  }
};

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    char err[256];
    if (bytes && plugin()->device_alloc(&p, bytes, err, sizeof err) != 0) p = nullptr;
  }
  ~DeviceBuffer() {
    char err[256];
    if (p) plugin()->device_free(p, err, sizeof err);
  }
};

void cpu_scan(benchmark::State& state) {
  const int64_t n = state.range(0);
  Inputs in(n);
  auto cpu = pq::make_cpu_backend();
  pq::SelectScratch scratch;
  std::vector<float> raw(kGroup * n), out(n);
  for (auto _ : state)
    for (int32_t h = 0; h < kHeads; ++h) {
      cpu->pq_scores(in.lut.data() + h * kGroup * kM * kCentroids, kGroup, kM, kCentroids,
                     in.codes.data() + h * n * kM, n, raw.data());
      pq::combine_group_scores(raw.data(), kGroup, n, 0, 0.125f, out.data(), scratch);
    }
  state.SetItemsProcessed(state.iterations() * kHeads * n);
}

void gpu_scan(benchmark::State& state) {
  if (!plugin()) return state.SkipWithError("no CUDA device or plug-in");
  const int64_t n = state.range(0);
  Inputs in(n);
  DeviceBuffer lut(in.lut.size() * 4), codes(in.codes.size()), scores(in.scores.size() * 4);
  size_t ws_bytes = plugin()->pq_scan_workspace_size(kHeads, kGroup, kM, n, 0);
  DeviceBuffer ws(ws_bytes);
  char err[256];
  plugin()->copy(lut.p, in.lut.data(), in.lut.size() * 4, PQ_COPY_HOST_TO_DEVICE, err, sizeof err);
  plugin()->copy(codes.p, in.codes.data(), in.codes.size(), PQ_COPY_HOST_TO_DEVICE, err, sizeof err);
  for (auto _ : state) {
    if (plugin()->pq_scan(static_cast<float*>(lut.p), static_cast<uint8_t*>(codes.p), kHeads,
                          kGroup, kM, kCentroids, n, 0, n, 0, 0.125f,
                          static_cast<float*>(scores.p), ws.p, ws_bytes, nullptr, err,
                          sizeof err) != 0 ||
        plugin()->stream_synchronize(nullptr, err, sizeof err) != 0)
      return state.SkipWithError(err);
  }
  state.SetItemsProcessed(state.iterations() * kHeads * n);
}

void cpu_topk(benchmark::State& state) {
  const int64_t n = state.range(0), k = n / 5;
  Inputs in(n);
  pq::SelectScratch scratch;
  std::vector<int32_t> out(k);
  for (auto _ : state)
    for (int32_t h = 0; h < kHeads; ++h)
      pq::select_top_k(in.scores.data() + h * n, n, k, 0, out.data(), scratch);
  state.SetItemsProcessed(state.iterations() * kHeads * n);
}

void gpu_topk(benchmark::State& state) {
  if (!plugin()) return state.SkipWithError("no CUDA device or plug-in");
  const int64_t n = state.range(0), k = n / 5;
  Inputs in(n);
  DeviceBuffer scores(in.scores.size() * 4), out(kHeads * k * 4);
  size_t ws_bytes = plugin()->topk_workspace_size(kHeads, n, k);
  DeviceBuffer ws(ws_bytes);
  char err[256];
  plugin()->copy(scores.p, in.scores.data(), in.scores.size() * 4, PQ_COPY_HOST_TO_DEVICE, err,
                 sizeof err);
  for (auto _ : state) {
    if (plugin()->topk(static_cast<float*>(scores.p), kHeads, n, k, 0,
                       static_cast<int32_t*>(out.p), ws.p, ws_bytes, nullptr, err,
                       sizeof err) != 0 ||
        plugin()->stream_synchronize(nullptr, err, sizeof err) != 0)
      return state.SkipWithError(err);
  }
  state.SetItemsProcessed(state.iterations() * kHeads * n);
}

#define SIZES ->Arg(8192)->Arg(32768)->Arg(131072)->Arg(1 << 20)->Unit(benchmark::kMicrosecond)
BENCHMARK(cpu_scan) SIZES;
BENCHMARK(gpu_scan) SIZES->UseRealTime();
BENCHMARK(cpu_topk) SIZES;
BENCHMARK(gpu_topk) SIZES->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
