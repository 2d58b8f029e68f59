// bench_cuda_engine_step.cpp - the device decode step as a serving engine
// pays it (issue 40), on one layer of a Llama-3-8B-like model (32 q heads, 8
// kv heads, head_dim 128, f16; PQ m = 2, b = 6; top-k 1/5 of the middle).
// Each figure is a median over interleaved repetitions, with its baseline
// measured in the same loop:
//
//   memcpy_rows     the floor: ONE cudaMemcpyAsync from pinned host memory
//                   of exactly the rows the step reads from host memory (the
//                   k selected middle rows, K and V, every kv head; sinks and
//                   the local window come from device memory), + sync.
//   step            what a decode step costs an engine after
//                   pq_sequence_reserve: pq_decode_append of the new token,
//                   pq_decode_select_device, pq_fetch_kv_device, one
//                   cudaStreamSynchronize. step / memcpy_rows is the target
//                   (<= 1.3 at 128K, <= 2 at 8K).
//   host_idle       the host time of the step's three calls (no sync) with
//   host_busy       the device idle, and with another stream running a
//                   device-to-device copy of ~80 ms: busy / idle <= 1.2 means
//                   the step never waits for the whole device.
//   select_host     the host time of pq_decode_select_device alone (target
//                   <= 0.03 ms at 128K).
//   batch_seq/B     B sequences' select_device + fetch_device, one after the
//   batch_one/B     other, against one pq_decode_select_device_batch + one
//                   pq_fetch_kv_device_batch (same stream), to completion.
//   captured        the select + fetch captured in a CUDA graph, replayed
//                   100 times; its outputs are compared with the uncaptured
//                   step's byte for byte ("captured_equal").
//
//   bench_cuda_engine_step [prompt tokens ...]   (default 8192 131072)
//
// Prints the GPU, driver, host CPU model and ISA level and the load, then
// one line per figure.
// Without a CUDA device it prints one line saying so and exits 0.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bench_data.h"
#include "pqcache.h"

namespace {

using pqbench::kHeadDim;
using pqbench::kKvHeads;
using pqbench::kQHeads;
constexpr size_t kRowBytes = kHeadDim * sizeof(uint16_t);
constexpr int kReps = 31;
constexpr int kBatch = 32;

#define CHECK(call) pqbench::check_status("bench_cuda_engine_step", (call), #call)

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_cuda_engine_step: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
#define CHECK_CUDA(call) check_cuda((call), #call)

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::vector<uint16_t> random_f16(size_t n, uint64_t seed) {
  pqbench::Rng rng{seed};
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = pqbench::f32_to_f16(rng.gauss());
  return v;
}

pq_tensor host_tensor(const void* data, int64_t tokens, int32_t heads) {
  pq_tensor t;
  CHECK(pq_tensor_init(&t, const_cast<void*>(data), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, tokens,
                       heads, kHeadDim));
  return t;
}

// The device buffers of one sequence's step.
struct DeviceStep {
  void* query = nullptr;
  int32_t* positions = nullptr;
  int32_t* counts = nullptr;
  void* keys = nullptr;
  void* values = nullptr;
  int64_t capacity = 0;
  pq_tensor q{}, k{}, v{};
  pq_selection sel{};
  void make(int64_t cap, uint64_t seed) {
    capacity = cap;
    const std::vector<uint16_t> hq = random_f16(size_t(kQHeads) * kHeadDim, seed);
    CHECK_CUDA(cudaMalloc(&query, hq.size() * 2));
    CHECK_CUDA(cudaMemcpy(query, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&positions), size_t(kKvHeads) * cap * 4));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&counts), size_t(kKvHeads) * 4));
    CHECK_CUDA(cudaMalloc(&keys, size_t(kKvHeads) * cap * kRowBytes));
    CHECK_CUDA(cudaMalloc(&values, size_t(kKvHeads) * cap * kRowBytes));
    CHECK(pq_tensor_init(&q, query, PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 1, kQHeads, kHeadDim));
    q.memory = PQ_MEMORY_DEVICE;
    CHECK(pq_tensor_init(&k, keys, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR, cap, kKvHeads, kHeadDim));
    CHECK(pq_tensor_init(&v, values, PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR, cap, kKvHeads, kHeadDim));
    k.memory = v.memory = PQ_MEMORY_DEVICE;
    sel = pq_selection{positions, counts, cap};
  }
  void release() {
    for (void* p : {query, static_cast<void*>(positions), static_cast<void*>(counts), keys, values})
      cudaFree(p);
  }
};

void prefill(pq_context* ctx, uint64_t id, int64_t tokens) {
  CHECK(pq_sequence_add(ctx, id));
  const std::vector<uint16_t> k = random_f16(size_t(tokens) * kKvHeads * kHeadDim, 11 * id + 1);
  const std::vector<uint16_t> v = random_f16(size_t(tokens) * kKvHeads * kHeadDim, 11 * id + 2);
  const pq_tensor kt = host_tensor(k.data(), tokens, kKvHeads);
  const pq_tensor vt = host_tensor(v.data(), tokens, kKvHeads);
  CHECK(pq_prefill_layer(ctx, id, 0, &kt, &vt));
}

void report(const char* name, int64_t prompt, double value, const char* unit,
            const char* note = "") {
  std::printf("%-14s prompt=%-7lld %10.4f %s %s\n", name, static_cast<long long>(prompt), value,
              unit, note);
}

void run(int64_t prompt, const char* plugin) {
  pq_config cfg = pqbench::layer_config(4);
  cfg.backend = PQ_BACKEND_CUDA;
  cfg.cuda_plugin_path = plugin;
  pq_context* ctx = nullptr;
  CHECK(pq_create(&cfg, &ctx));
  cudaStream_t stream, busy;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking));
  // One sequence for the step, kBatch more (8K each) for the batch figures.
  prefill(ctx, 1, prompt);
  for (int b = 0; b < kBatch; ++b) prefill(ctx, 100 + b, 8192);
  CHECK(pq_wait_builds(ctx));
  const int64_t steps = 8 + 6 * kReps + 4;
  CHECK(pq_sequence_set_stream(ctx, 1, stream));
  CHECK(pq_sequence_reserve(ctx, 1, prompt + steps));
  for (int b = 0; b < kBatch; ++b) {
    CHECK(pq_sequence_set_stream(ctx, 100 + b, stream));
    CHECK(pq_sequence_reserve(ctx, 100 + b, 8192 + 4 * kReps));
  }
  int64_t cap = 0, batch_cap = 0;
  CHECK(pq_selection_capacity_for(ctx, 0, prompt + steps, &cap));
  CHECK(pq_selection_capacity_for(ctx, 0, 8192 + 4 * kReps, &batch_cap));
  DeviceStep step;
  step.make(cap, 7);
  std::vector<DeviceStep> batch(kBatch);
  for (int b = 0; b < kBatch; ++b) batch[b].make(batch_cap, 1000 + b);
  // The decode tokens' K/V (host, as the caller hands them).
  const std::vector<uint16_t> tok_k = random_f16(size_t(kKvHeads) * kHeadDim, 5);
  const std::vector<uint16_t> tok_v = random_f16(size_t(kKvHeads) * kHeadDim, 6);
  const pq_tensor tk = host_tensor(tok_k.data(), 1, kKvHeads);
  const pq_tensor tv = host_tensor(tok_v.data(), 1, kKvHeads);
  // The floor: the host-resident rows of a step in one pinned copy.
  // k per kv head: the selection's entries less the sinks and the window.
  int64_t now_cap = 0;
  CHECK(pq_selection_capacity(ctx, 1, 0, &now_cap));
  const int64_t middle_rows = now_cap - cfg.sink_tokens - cfg.local_tokens;
  const size_t floor_bytes = size_t(middle_rows) * kKvHeads * kRowBytes * 2;
  void* pinned = nullptr;
  void* landing = nullptr;
  CHECK_CUDA(cudaHostAlloc(&pinned, floor_bytes, cudaHostAllocDefault));
  CHECK_CUDA(cudaMalloc(&landing, floor_bytes));
  // The other stream's work: an ~80 ms device-to-device copy.
  const size_t busy_bytes = size_t(2) << 30;
  void *busy_src = nullptr, *busy_dst = nullptr;
  CHECK_CUDA(cudaMalloc(&busy_src, busy_bytes));
  CHECK_CUDA(cudaMalloc(&busy_dst, busy_bytes));

  auto device_step = [&](double* host_ms) {
    const auto t = Clock::now();
    CHECK(pq_decode_append(ctx, 1, 0, &tk, &tv));
    CHECK(pq_decode_select_device(ctx, 1, 0, &step.q, &step.sel));
    CHECK(pq_fetch_kv_device(ctx, 1, 0, &step.sel, &step.k, &step.v));
    if (host_ms != nullptr) *host_ms = ms_since(t);
    CHECK_CUDA(cudaStreamSynchronize(stream));
  };
  for (int i = 0; i < 8; ++i) device_step(nullptr);  // warm-up (the first uploads)

  std::vector<double> floor_ms, step_ms, idle_ms, busy_ms, select_ms, seq_ms, one_ms;
  for (int r = 0; r < kReps; ++r) {
    auto t = Clock::now();
    CHECK_CUDA(cudaMemcpyAsync(landing, pinned, floor_bytes, cudaMemcpyHostToDevice, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    floor_ms.push_back(ms_since(t));

    t = Clock::now();
    double host = 0;
    device_step(&host);
    step_ms.push_back(ms_since(t));
    idle_ms.push_back(host);

    CHECK_CUDA(cudaMemcpyAsync(busy_dst, busy_src, busy_bytes, cudaMemcpyDeviceToDevice, busy));
    device_step(&host);
    busy_ms.push_back(host);
    CHECK_CUDA(cudaStreamSynchronize(busy));

    CHECK(pq_decode_append(ctx, 1, 0, &tk, &tv));
    t = Clock::now();
    CHECK(pq_decode_select_device(ctx, 1, 0, &step.q, &step.sel));
    select_ms.push_back(ms_since(t));
    CHECK(pq_fetch_kv_device(ctx, 1, 0, &step.sel, &step.k, &step.v));
    CHECK_CUDA(cudaStreamSynchronize(stream));

    // The batch: one after the other, then in one chain.
    t = Clock::now();
    for (int b = 0; b < kBatch; ++b) {
      CHECK(pq_decode_select_device(ctx, 100 + b, 0, &batch[b].q, &batch[b].sel));
      CHECK(pq_fetch_kv_device(ctx, 100 + b, 0, &batch[b].sel, &batch[b].k, &batch[b].v));
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    seq_ms.push_back(ms_since(t));
    std::vector<pq_select_item> select_items(kBatch);
    std::vector<pq_fetch_item> fetch_items(kBatch);
    for (int b = 0; b < kBatch; ++b) {
      select_items[b] = pq_select_item{uint64_t(100 + b), batch[b].q, batch[b].sel, PQ_OK};
      fetch_items[b] = pq_fetch_item{uint64_t(100 + b), batch[b].sel, batch[b].k, batch[b].v, PQ_OK};
    }
    t = Clock::now();
    CHECK(pq_decode_select_device_batch(ctx, 0, select_items.data(), kBatch));
    CHECK(pq_fetch_kv_device_batch(ctx, 0, fetch_items.data(), kBatch));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    one_ms.push_back(ms_since(t));
  }
  const double floor = pqbench::median(floor_ms), full = pqbench::median(step_ms);
  report("memcpy_rows", prompt, floor, "ms", ("(" + std::to_string(floor_bytes >> 10) +
                                              " KiB, the step's host-resident rows)").c_str());
  report("step", prompt, full, "ms", "(append + select_device + fetch_device + sync)");
  report("step/memcpy", prompt, full / floor, "x");
  const double idle = pqbench::median(idle_ms), busy_host = pqbench::median(busy_ms);
  report("host_idle", prompt, idle, "ms");
  report("host_busy", prompt, busy_host, "ms", "(another stream copying 2 GiB)");
  report("busy/idle", prompt, busy_host / idle, "x");
  report("select_host", prompt, pqbench::median(select_ms), "ms");
  const double seq = pqbench::median(seq_ms), one = pqbench::median(one_ms);
  report("batch_seq/32", 8192, seq, "ms");
  report("batch_one/32", 8192, one, "ms");
  report("batch speedup", 8192, seq / one, "x");

  // The captured step: select + fetch at the current length.
  CHECK(pq_decode_select_device(ctx, 1, 0, &step.q, &step.sel));
  CHECK(pq_fetch_kv_device(ctx, 1, 0, &step.sel, &step.k, &step.v));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const size_t out_bytes = size_t(kKvHeads) * cap * kRowBytes;
  std::vector<uint8_t> want(out_bytes), got(out_bytes);
  CHECK_CUDA(cudaMemcpy(want.data(), step.keys, out_bytes, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemset(step.keys, 0, out_bytes));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const pq_status s1 = pq_decode_select_device(ctx, 1, 0, &step.q, &step.sel);
  const pq_status s2 = pq_fetch_kv_device(ctx, 1, 0, &step.sel, &step.k, &step.v);
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (s1 != PQ_OK || s2 != PQ_OK || end != cudaSuccess) {
    std::printf("captured       prompt=%-7lld refused: %s / %s\n", static_cast<long long>(prompt),
                pq_last_error(), cudaGetErrorString(end));
  } else {
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    std::vector<double> replay_ms;
    bool equal = true;
    for (int i = 0; i < 100; ++i) {
      const auto t = Clock::now();
      CHECK_CUDA(cudaGraphLaunch(exec, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
      replay_ms.push_back(ms_since(t));
      CHECK_CUDA(cudaMemcpy(got.data(), step.keys, out_bytes, cudaMemcpyDeviceToHost));
      equal = equal && got == want;
    }
    report("captured", prompt, pqbench::median(replay_ms), "ms",
           equal ? "(captured_equal: 100 of 100 replays)" : "(captured_equal: NO)");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  step.release();
  for (auto& b : batch) b.release();
  cudaFreeHost(pinned);
  for (void* p : {landing, busy_src, busy_dst}) cudaFree(p);
  cudaStreamDestroy(stream);
  cudaStreamDestroy(busy);
  pq_destroy(ctx);
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_cuda_engine_step: no CUDA device; nothing measured\n");
    return 0;
  }
  const char* plugin = std::getenv("PQCACHE_CUDA_PLUGIN");
  if (plugin == nullptr) plugin = PQ_CUDA_PLUGIN_FILE;
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int driver = 0;
  cudaDriverGetVersion(&driver);
  double load = 0;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  std::printf("gpu: %s (cc %d.%d), CUDA driver API %d; host: %s (%s); load %.2f; "
              "libpqcache %s\n",
              prop.name, prop.major, prop.minor, driver, pqbench::cpu_model().c_str(), pqbench::isa_level(), load,
              pq_version_string());
  std::vector<int64_t> prompts{8192, 131072};
  if (argc > 1) {
    prompts.clear();
    for (int i = 1; i < argc; ++i) prompts.push_back(std::atoll(argv[i]));
  }
  for (int64_t p : prompts) run(p, plugin);
  return 0;
}
