// bench_cuda_host.cpp - the host side of the CUDA backend's decode step,
// measured on any machine through the host fake of the plug-in
// (tests/cuda_fake): the fake defers "device" work until a wait, so the time
// of a pq_fetch_kv call into device buffers is the library's own host work
// (the fetch plan; for a store the device cannot read, the staging copies),
// and its counters say how many host waits, launches and uploaded bytes a
// step costs, for one sequence and for batches.
//
// Geometry: one layer, 32 q heads / 8 kv heads, head_dim 128, f16, PQ 2x6,
// top-k 1/5 (bench_data.h). Per prompt length (8K, 32K, 128K tokens):
//   pinned  the backend's own K/V store (page-locked, device-mapped pool):
//           the gather reads rows across PCIe itself, the CPU copies none;
//   staged  the same store in the caller's memory (a pq_hooks.host_alloc
//           hook), which the device cannot read: the rows are staged;
//   memcpy  one memcpy of the same K/V bytes, the CPU's cost of moving them.
// The three are interleaved round by round in one process; the table gives
// medians over the rounds, the ratios, and the load average.
// Then the counters of a decode step (device-resident step, host-positions
// step) and of a batch of 8 and 32 sequences at one layer (batched calls
// against per-sequence calls).
//
//   bench_cuda_host [--rounds N]
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_data.h"
#include "backend/cuda/cuda_plugin_abi.h"
#include "fake_cuda_plugin.h"
#include "pqcache.h"

namespace {

using pqbench::kHeadDim;
using pqbench::median;
using pqbench::kKvHeads;
using pqbench::kQHeads;

#define CHECK(call) pqbench::check_status("bench_cuda_host", (call), #call)

struct Fake {
  const pq_cuda_plugin* table = nullptr;
  pq_fake_cuda_counters_get_fn counters = nullptr;
  pq_fake_cuda_synchronize_all_fn sync = nullptr;
};

Fake open_fake() {
  Fake f;
  void* h = dlopen(PQ_FAKE_CUDA_PLUGIN_FILE, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    std::fprintf(stderr, "bench_cuda_host: cannot open %s: %s\n", PQ_FAKE_CUDA_PLUGIN_FILE, dlerror());
    std::exit(1);
  }
  auto entry = reinterpret_cast<pq_cuda_plugin_entry_fn>(dlsym(h, PQ_CUDA_PLUGIN_ENTRY));
  f.table = entry(PQ_CUDA_PLUGIN_ABI_VERSION);
  f.counters = reinterpret_cast<pq_fake_cuda_counters_get_fn>(dlsym(h, "pq_fake_cuda_counters_get"));
  f.sync = reinterpret_cast<pq_fake_cuda_synchronize_all_fn>(dlsym(h, "pq_fake_cuda_synchronize_all"));
  return f;
}
Fake& fake() {
  static Fake f = open_fake();
  return f;
}
pq_fake_cuda_counters counters() {
  pq_fake_cuda_counters c{};
  fake().counters(&c);
  return c;
}

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  char err[256];
  if (fake().table->device_alloc(&p, bytes, err, sizeof err) != 0) {
    std::fprintf(stderr, "bench_cuda_host: %s\n", err);
    std::exit(1);
  }
  return p;
}

void* caller_alloc(void*, size_t bytes, size_t alignment) {
  return std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
}
void caller_free(void*, void* p, size_t) { std::free(p); }

double seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A fake-CUDA context with `seqs` sequences of one prompt (the first
// prefilled, the others forks), a device query and device outputs.
struct Setup {
  pq_context* ctx = nullptr;
  int64_t capacity = 0;
  std::vector<int32_t> positions, counts;
  pq_selection sel{};
  void* d_query = nullptr;
  std::vector<void*> d_out;  // K and V per sequence
  pq_tensor query{}, out_k{}, out_v{};

  Setup(const pqbench::ClusteredKv& kv, bool caller_store, int seqs) {
    pq_config cfg = pqbench::layer_config(4);
    cfg.backend = PQ_BACKEND_CUDA;
    cfg.cuda_plugin_path = PQ_FAKE_CUDA_PLUGIN_FILE;
    pq_hooks hooks;
    pq_hooks_default(&hooks);
    if (caller_store) hooks.host_alloc = caller_alloc, hooks.host_free = caller_free;
    CHECK(pq_create_with_hooks(&cfg, &hooks, &ctx));
    CHECK(pq_sequence_add(ctx, 0));
    pq_tensor k, v;
    CHECK(pq_tensor_init(&k, const_cast<uint16_t*>(kv.keys.data()), PQ_DTYPE_F16,
                         PQ_LAYOUT_TOKEN_MAJOR, kv.tokens, kKvHeads, kHeadDim));
    CHECK(pq_tensor_init(&v, const_cast<uint16_t*>(kv.values.data()), PQ_DTYPE_F16,
                         PQ_LAYOUT_TOKEN_MAJOR, kv.tokens, kKvHeads, kHeadDim));
    CHECK(pq_prefill_layer(ctx, 0, 0, &k, &v));
    CHECK(pq_wait_builds(ctx));
    for (int s = 1; s < seqs; ++s) CHECK(pq_sequence_fork(ctx, 0, s));
    CHECK(pq_selection_capacity(ctx, 0, 0, &capacity));
    positions.assign(size_t(capacity) * kKvHeads, 0);
    counts.assign(kKvHeads, 0);
    sel = pq_selection{positions.data(), counts.data(), capacity};
    const size_t qbytes = size_t(kQHeads) * kHeadDim * 2;
    d_query = device_alloc(qbytes);
    std::memcpy(d_query, kv.queries.data(), qbytes);  // fake device memory is host memory
    CHECK(pq_tensor_init(&query, d_query, PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 1, kQHeads, kHeadDim));
    query.memory = PQ_MEMORY_DEVICE;
    const size_t out_bytes = size_t(capacity) * kKvHeads * kHeadDim * 2;
    for (int s = 0; s < 2 * seqs; ++s) d_out.push_back(device_alloc(out_bytes));
    out(0, &out_k, &out_v);
  }
  void out(int seq, pq_tensor* k, pq_tensor* v) const {
    CHECK(pq_tensor_init(k, d_out[2 * seq], PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR, capacity,
                         kKvHeads, kHeadDim));
    CHECK(pq_tensor_init(v, d_out[2 * seq + 1], PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR, capacity,
                         kKvHeads, kHeadDim));
    k->memory = v->memory = PQ_MEMORY_DEVICE;
  }
  ~Setup() {
    fake().sync();
    pq_destroy(ctx);
    char err[256];
    fake().table->device_free(d_query, err, sizeof err);
    for (void* p : d_out) fake().table->device_free(p, err, sizeof err);
  }
  uint64_t rows() const {
    uint64_t r = 0;
    for (int32_t c : counts) r += uint64_t(c);
    return r;
  }
  uint64_t staged() const {
    pq_stats st;
    std::memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK(pq_stats_get(ctx, &st));
    return st.bytes_staged;
  }
};

// Host time of one pq_fetch_kv into device buffers (the deferred gather runs
// after the clock stops).
double fetch_seconds(Setup& s) {
  const auto start = std::chrono::steady_clock::now();
  CHECK(pq_fetch_kv(s.ctx, 0, 0, &s.sel, &s.out_k, &s.out_v));
  const double t = seconds(start);
  fake().sync();
  return t;
}

void fetch_table(int rounds) {
  std::printf("## Host work of one pq_fetch_kv into device buffers (fake plug-in)\n\n");
  std::printf("| prompt | rows (K+V) | MB | pinned store ms | staged store ms | memcpy ms | "
              "pinned/memcpy | staged/pinned | CPU bytes staged (pinned / staged) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (int64_t tokens : {int64_t{8192}, int64_t{32768}, int64_t{131072}}) {
    auto kv = pqbench::make_clustered_kv(tokens, 7, 1, false);
    Setup pinned(*kv, false, 1), staged(*kv, true, 1);
    CHECK(pq_decode_select(pinned.ctx, 0, 0, &pinned.query, &pinned.sel));
    CHECK(pq_decode_select(staged.ctx, 0, 0, &staged.query, &staged.sel));
    const size_t bytes = size_t(pinned.rows()) * 2 * kHeadDim * 2;
    std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
    std::vector<double> tp, ts, tm;
    const uint64_t pinned_before = pinned.staged(), staged_before = staged.staged();
    for (int r = 0; r < rounds; ++r) {
      tp.push_back(fetch_seconds(pinned));
      ts.push_back(fetch_seconds(staged));
      const auto start = std::chrono::steady_clock::now();
      std::memcpy(dst.data(), src.data(), bytes);
      tm.push_back(seconds(start));
    }
    const double p = median(tp), s = median(ts), m = median(tm);
    std::printf("| %lldK | %llu | %.1f | %.3f | %.3f | %.3f | %.2fx | %.2fx | %llu / %llu |\n",
                static_cast<long long>(tokens / 1024),
                static_cast<unsigned long long>(2 * pinned.rows()), bytes / 1e6, 1e3 * p, 1e3 * s,
                1e3 * m, p / m, s / p,
                static_cast<unsigned long long>((pinned.staged() - pinned_before) / rounds),
                static_cast<unsigned long long>((staged.staged() - staged_before) / rounds));
  }
}

struct Count {
  uint64_t waits, launches, up;
};
Count since(const pq_fake_cuda_counters& b) {
  const pq_fake_cuda_counters a = counters();
  return {a.host_waits - b.host_waits, a.kernel_launches - b.kernel_launches,
          a.bytes_to_device - b.bytes_to_device};
}

void counter_table() {
  std::printf("\n## Waits, launches and bytes up per call (32K tokens, fake plug-in)\n\n");
  std::printf("| call | host waits | kernel launches | bytes up |\n|---|---|---|---|\n");
  auto kv = pqbench::make_clustered_kv(32768, 11, 1, false);
  for (int batch : {1, 8, 32}) {
    Setup s(*kv, false, batch);
    // Warm: codes resident on the "device".
    for (int i = 0; i < batch; ++i) CHECK(pq_decode_select(s.ctx, i, 0, &s.query, &s.sel));
    fake().sync();
    std::vector<std::vector<int32_t>> pos(batch, s.positions), cnt(batch, s.counts);
    std::vector<pq_select_item> items(batch);
    std::vector<pq_fetch_item> fetches(batch);
    for (int i = 0; i < batch; ++i) {
      items[i] = {uint64_t(i), s.query, pq_selection{pos[i].data(), cnt[i].data(), s.capacity}, PQ_OK};
      fetches[i].seq_id = uint64_t(i);
      fetches[i].selection = items[i].out;
      s.out(i, &fetches[i].out_keys, &fetches[i].out_values);
    }
    auto row = [](const std::string& name, const Count& c) {
      std::printf("| %s | %llu | %llu | %llu |\n", name.c_str(),
                  static_cast<unsigned long long>(c.waits),
                  static_cast<unsigned long long>(c.launches),
                  static_cast<unsigned long long>(c.up));
    };
    const std::string b = std::to_string(batch);
    pq_fake_cuda_counters before = counters();
    for (int i = 0; i < batch; ++i) CHECK(pq_decode_select(s.ctx, i, 0, &s.query, &items[i].out));
    row(b + " x pq_decode_select", since(before));
    before = counters();
    if (batch > 1) {
      CHECK(pq_decode_select_batch(s.ctx, 0, items.data(), batch));
      row("pq_decode_select_batch of " + b, since(before));
    }
    fake().sync();
    before = counters();
    for (int i = 0; i < batch; ++i)
      CHECK(pq_fetch_kv(s.ctx, i, 0, &fetches[i].selection, &fetches[i].out_keys,
                        &fetches[i].out_values));
    row(b + " x pq_fetch_kv", since(before));
    fake().sync();
    if (batch > 1) {
      before = counters();
      CHECK(pq_fetch_kv_batch(s.ctx, 0, fetches.data(), batch));
      row("pq_fetch_kv_batch of " + b, since(before));
      fake().sync();
    }
    if (batch == 1) {
      std::vector<int32_t> dpos_host;  // device arrays: fake device memory
      void* dpos = device_alloc(size_t(s.capacity) * kKvHeads * 4);
      void* dcnt = device_alloc(kKvHeads * 4);
      pq_selection dsel{static_cast<int32_t*>(dpos), static_cast<int32_t*>(dcnt), s.capacity};
      before = counters();
      CHECK(pq_decode_select_device(s.ctx, 0, 0, &s.query, &dsel));
      row("pq_decode_select_device", since(before));
      before = counters();
      CHECK(pq_fetch_kv_device(s.ctx, 0, 0, &dsel, &s.out_k, &s.out_v));
      row("pq_fetch_kv_device", since(before));
      fake().sync();
      char err[256];
      fake().table->device_free(dpos, err, sizeof err);
      fake().table->device_free(dcnt, err, sizeof err);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 15;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = std::atoi(argv[++i]);
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) < 0) load[0] = -1;
  std::printf("bench_cuda_host: libpqcache %s, fake plug-in %s, %d rounds, load average %.2f\n\n",
              pq_version_string(), PQ_FAKE_CUDA_PLUGIN_FILE, rounds, load[0]);
  fetch_table(rounds);
  counter_table();
  if (getloadavg(load, 3) >= 0) std::printf("\nload average at the end: %.2f\n", load[0]);
  return 0;
}
