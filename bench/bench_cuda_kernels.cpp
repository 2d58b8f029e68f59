// The CUDA plug-in's kernels against the CPU code they replace, in one run:
// the PQ lookup-table scan with the GQA combine (one layer, 8 kv heads, GQA 4,
// m = 2, b = 6, sum of softmax) and the radix top-k (1/5 of the tokens per kv
// head), at 8K to 1M tokens. GPU times are stream-synchronised wall times of
// the kernels alone (inputs already on the device).
//
// ABI v3: the fetch of pq_fetch_kv, k = 1/5 of the context per kv head
// (8 kv heads, head_dim 128 in f16: 256-byte rows) from a K store in mapped
// pinned host memory to the device, by the gather_rows kernel and by
// copy_rows (one cudaMemcpyAsync per contiguous run), each against the PCIe
// ceiling measured in the same run: one cudaMemcpyAsync of the same total
// bytes from pinned memory. Counters: GB_per_s, ceiling_GB_per_s and
// of_ceiling (the ratio). And PQ encoding of 1 and 4096 tokens (8 kv heads,
// m = 2, 64 or 256 centroids) on the GPU and with the CPU's PqCodebook::encode.
//
// Without a GPU the program says so once, the GPU benchmarks report an error
// saying why, the CPU ones still run, and it exits with 0.
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "pq/codebook.h"
#include "backend/cuda/cuda_plugin_abi.h"
#include "pq/kmeans.h"
#include "base/scratch.h"
#include "base/topk.h"

namespace {

constexpr int32_t kHeads = 8, kGroup = 4, kM = 2, kCentroids = 64;

// Why the GPU benchmarks cannot run ("" when they can).
std::string& no_gpu_reason() {
  static std::string reason;
  return reason;
}

const pq_cuda_plugin* plugin() {
  static const pq_cuda_plugin* table = []() -> const pq_cuda_plugin* {
    const char* env = std::getenv("PQCACHE_CUDA_PLUGIN");
    const char* path = env && *env ? env : PQ_CUDA_PLUGIN_FILE;
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* why = dlerror();
      no_gpu_reason() = std::string("cannot open the plug-in: ") + (why ? why : path);
      return nullptr;
    }
    auto entry = reinterpret_cast<pq_cuda_plugin_entry_fn>(dlsym(h, PQ_CUDA_PLUGIN_ENTRY));
    const pq_cuda_plugin* t = entry ? entry(PQ_CUDA_PLUGIN_ABI_VERSION) : nullptr;
    if (!t || t->abi_version != PQ_CUDA_PLUGIN_ABI_VERSION ||
        t->struct_size != sizeof(pq_cuda_plugin)) {
      no_gpu_reason() = std::string("the plug-in ") + path + " does not serve this build's plug-in ABI version";
      return nullptr;
    }
    if (t->device_count() <= 0) {
      no_gpu_reason() = "no CUDA device (the plug-in reports 0 usable devices)";
      return nullptr;
    }
    return t;
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
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// Mapped pinned host memory (the host K/V store of the CUDA backend).
struct PinnedBuffer {
  void* p = nullptr;
  explicit PinnedBuffer(size_t bytes) {
    char err[256];
    if (bytes && plugin()->host_alloc(&p, bytes, err, sizeof err) != 0) p = nullptr;
  }
  ~PinnedBuffer() {
    char err[256];
    if (p) plugin()->host_free(p, err, sizeof err);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
};

struct Stream {
  void* s = nullptr;
  Stream() {
    char err[256];
    if (plugin()->stream_create(&s, err, sizeof err) != 0) s = nullptr;
  }
  ~Stream() {
    char err[256];
    if (s) plugin()->stream_destroy(s, err, sizeof err);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

void cpu_scan(benchmark::State& state) {
  const int64_t n = state.range(0);
  Inputs in(n);
  pq::SelectScratch scratch;
  std::vector<float> raw(kGroup * n), out(n);
  for (auto _ : state)
    for (int32_t h = 0; h < kHeads; ++h) {
      pq::PqCodebook::pq_scores(in.lut.data() + h * kGroup * kM * kCentroids, kGroup, kM, kCentroids,
                     in.codes.data() + h * n * kM, n, raw.data(), n);
      pq::combine_group_scores(raw.data(), kGroup, n, 0, 0.125f, out.data(), scratch);
    }
  state.SetItemsProcessed(state.iterations() * kHeads * n);
}

void gpu_scan(benchmark::State& state) {
  if (!plugin()) return state.SkipWithError(no_gpu_reason().c_str());
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
  if (!plugin()) return state.SkipWithError(no_gpu_reason().c_str());
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

// ---------------------------------------------------------------------------
// Fetch: k = n / 5 rows per kv head from pinned host memory to the device.
// ---------------------------------------------------------------------------

constexpr int32_t kKvHeads = 8;
constexpr size_t kRowBytes = 128 * 2;  // head_dim 128, f16

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

enum class FetchMethod { kGatherKernel, kCopyPerRun };

void gpu_fetch(benchmark::State& state, FetchMethod method) {
  if (!plugin()) return state.SkipWithError(no_gpu_reason().c_str());
  const pq_cuda_plugin* p = plugin();
  const int64_t n = state.range(0), k = n / 5;
  const int64_t rows = kKvHeads * k;
  const size_t bytes = static_cast<size_t>(rows) * kRowBytes;
  PinnedBuffer store(static_cast<size_t>(kKvHeads) * n * kRowBytes);  // K of one layer
  DeviceBuffer dst(bytes), d_srcs(rows * sizeof(void*)), d_dsts(rows * sizeof(void*));
  Stream stream;
  if (!store.p || !dst.p || !d_srcs.p || !d_dsts.p || !stream.s)
    return state.SkipWithError("cannot allocate the K store, the destination or a stream");

  // k distinct positions per head, ascending (as pq_decode_select returns
  // them), gathered into one contiguous [head][k] destination.
  std::mt19937 rng(3);
  std::vector<int64_t> positions(static_cast<size_t>(n));
  std::vector<const void*> srcs(static_cast<size_t>(rows));
  std::vector<void*> dsts(static_cast<size_t>(rows));
  for (int32_t h = 0; h < kKvHeads; ++h) {
    std::iota(positions.begin(), positions.end(), 0);
    for (int64_t i = 0; i < k; ++i)  // partial Fisher-Yates: the first k are a random subset
      std::swap(positions[i], positions[i + rng() % (n - i)]);
    std::sort(positions.begin(), positions.begin() + k);
    for (int64_t i = 0; i < k; ++i) {
      srcs[h * k + i] = static_cast<const char*>(store.p) + (h * n + positions[i]) * kRowBytes;
      dsts[h * k + i] = static_cast<char*>(dst.p) + (h * k + i) * kRowBytes;
    }
  }
  char err[256];
  if (p->copy(d_srcs.p, srcs.data(), rows * sizeof(void*), PQ_COPY_HOST_TO_DEVICE, err,
              sizeof err) != 0 ||
      p->copy(d_dsts.p, dsts.data(), rows * sizeof(void*), PQ_COPY_HOST_TO_DEVICE, err,
              sizeof err) != 0)
    return state.SkipWithError(err);

  auto fetch = [&]() {
    const int rc = method == FetchMethod::kGatherKernel
                       ? p->gather_rows(static_cast<const void* const*>(d_srcs.p),
                                        static_cast<void* const*>(d_dsts.p), rows, kRowBytes,
                                        stream.s, err, sizeof err)
                       : p->copy_rows(srcs.data(), dsts.data(), rows, kRowBytes, stream.s, err,
                                      sizeof err);
    return rc == 0 && p->stream_synchronize(stream.s, err, sizeof err) == 0;
  };

  // The PCIe ceiling in this run: the same bytes as one contiguous copy from
  // pinned memory, best of 5 (after a warm-up).
  double ceiling_seconds = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    if (p->copy_async(dst.p, store.p, bytes, stream.s, err, sizeof err) != 0 ||
        p->stream_synchronize(stream.s, err, sizeof err) != 0)
      return state.SkipWithError(err);
    if (rep > 0) ceiling_seconds = std::min(ceiling_seconds, seconds_since(start));
  }
  if (!fetch()) return state.SkipWithError(err);  // warm-up

  double fetch_seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    if (!fetch()) return state.SkipWithError(err);
    fetch_seconds += seconds_since(start);
  }
  const double gbps = static_cast<double>(bytes) * state.iterations() / fetch_seconds / 1e9;
  const double ceiling_gbps = static_cast<double>(bytes) / ceiling_seconds / 1e9;
  state.counters["rows"] = static_cast<double>(rows);
  state.counters["MB"] = static_cast<double>(bytes) / 1e6;
  state.counters["GB_per_s"] = gbps;
  state.counters["ceiling_GB_per_s"] = ceiling_gbps;
  state.counters["of_ceiling"] = gbps / ceiling_gbps;
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
}

void gpu_fetch_gather_rows(benchmark::State& state) { gpu_fetch(state, FetchMethod::kGatherKernel); }
void gpu_fetch_copy_rows(benchmark::State& state) { gpu_fetch(state, FetchMethod::kCopyPerRun); }

// ---------------------------------------------------------------------------
// Encode: the codes of `tokens` keys of 8 kv heads (one layer), keys
// token-major [tokens][kv heads][128], one codebook per head.
// ---------------------------------------------------------------------------

constexpr int32_t kHeadDim = 128, kEncodeM = 2, kSubDim = kHeadDim / kEncodeM;

struct EncodeInputs {
  pq::PqCodebook book;
  std::vector<float> keys;  // [tokens][kKvHeads][kHeadDim]
  EncodeInputs(int64_t tokens, int32_t centroids)
      : keys(static_cast<size_t>(tokens) * kKvHeads * kHeadDim) {
    book.heads = kKvHeads;
    book.subspaces = kEncodeM;
    book.centroids = centroids;
    book.sub_dim = kSubDim;
    book.data.resize(static_cast<size_t>(kKvHeads) * kEncodeM * centroids * kSubDim);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    for (auto& x : book.data) x = normal(rng);
    for (auto& x : keys) x = normal(rng);
  }
};

void cpu_encode(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int32_t centroids = static_cast<int32_t>(state.range(1));
  EncodeInputs in(tokens, centroids);
  std::vector<uint8_t> codes(static_cast<size_t>(kKvHeads) * tokens * kEncodeM);
  std::vector<uint8_t*> code_rows(kKvHeads);
  for (int32_t h = 0; h < kKvHeads; ++h) code_rows[h] = codes.data() + h * tokens * kEncodeM;
  pq::KeyGather gather = [&](int32_t head, const int64_t* rows, int64_t count, float* out) {
    for (int64_t i = 0; i < count; ++i)
      std::memcpy(out + i * kHeadDim, in.keys.data() + (rows[i] * kKvHeads + head) * kHeadDim,
                  kHeadDim * sizeof(float));
  };
  for (auto _ : state)
    in.book.encode(kHeadDim, 0, tokens, gather, nullptr, code_rows.data());
  state.SetItemsProcessed(state.iterations() * tokens * kKvHeads);
}

void gpu_encode(benchmark::State& state) {
  if (!plugin()) return state.SkipWithError(no_gpu_reason().c_str());
  const pq_cuda_plugin* p = plugin();
  const int64_t tokens = state.range(0);
  const int32_t centroids = static_cast<int32_t>(state.range(1));
  EncodeInputs in(tokens, centroids);
  DeviceBuffer keys(in.keys.size() * sizeof(float)), book(in.book.data.size() * sizeof(float)),
      codes(static_cast<size_t>(kKvHeads) * tokens * kEncodeM);
  Stream stream;
  if (!keys.p || !book.p || !codes.p || !stream.s)
    return state.SkipWithError("cannot allocate device memory or a stream");
  char err[256];
  if (p->copy(keys.p, in.keys.data(), in.keys.size() * sizeof(float), PQ_COPY_HOST_TO_DEVICE,
              err, sizeof err) != 0 ||
      p->copy(book.p, in.book.data.data(), in.book.data.size() * sizeof(float),
              PQ_COPY_HOST_TO_DEVICE, err, sizeof err) != 0)
    return state.SkipWithError(err);
  auto encode_layer = [&]() {
    for (int32_t h = 0; h < kKvHeads; ++h)
      if (p->encode(static_cast<const float*>(keys.p) + h * kHeadDim, tokens,
                    int64_t{kKvHeads} * kHeadDim,
                    static_cast<const float*>(book.p) +
                        static_cast<size_t>(h) * kEncodeM * centroids * kSubDim,
                    kEncodeM, centroids, kSubDim,
                    static_cast<uint8_t*>(codes.p) + h * tokens * kEncodeM, kEncodeM, stream.s,
                    err, sizeof err) != 0)
        return false;
    return p->stream_synchronize(stream.s, err, sizeof err) == 0;
  };
  if (!encode_layer()) return state.SkipWithError(err);  // warm-up
  for (auto _ : state)
    if (!encode_layer()) return state.SkipWithError(err);
  state.SetItemsProcessed(state.iterations() * tokens * kKvHeads);
}

#define SIZES ->Arg(8192)->Arg(32768)->Arg(131072)->Arg(1 << 20)->Unit(benchmark::kMicrosecond)
BENCHMARK(cpu_scan) SIZES;
BENCHMARK(gpu_scan) SIZES->UseRealTime();
BENCHMARK(cpu_topk) SIZES;
BENCHMARK(gpu_topk) SIZES->UseRealTime();
BENCHMARK(gpu_fetch_gather_rows) SIZES->UseRealTime();
BENCHMARK(gpu_fetch_copy_rows) SIZES->UseRealTime();
#define ENCODE_SIZES \
  ->Args({1, 64})->Args({4096, 64})->Args({1, 256})->Args({4096, 256})->Unit(benchmark::kMicrosecond)
BENCHMARK(cpu_encode) ENCODE_SIZES;
BENCHMARK(gpu_encode) ENCODE_SIZES->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (plugin() == nullptr)
    std::fprintf(stderr,
                 "bench_cuda_kernels: %s: the GPU benchmarks are skipped (each reports this "
                 "error); the CPU ones run.\n",
                 no_gpu_reason().c_str());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
