// bench_select_one.cpp - one pq_decode_select of the default PQ setting
// (4 x 8 bits at head_dim 128), timed alone, in a process of its own: the
// library it runs is whichever libpqcache.so the loader finds, so that
// bench/select_ab.sh can run this program against two builds of the library
// alternately (an A/B of the select with the same program and data).
//
// One layer of 32 q / 8 kv heads, head_dim 128, f16, 4 sinks, 128 local
// tokens, top 1/5 of the middle; keys, values and queries Gaussian (fixed
// seed). Prints the CPU, the kernels, the load, the median and fastest of
// --steps selects, and a hash of the selected positions (equal between two
// builds that select the same tokens). With --cold MIB, each select comes
// after a read of that many MiB on two threads (cache_evictor.h: what the
// other layers' decode step does to the caches; bench/select_keys.py's cold
// rows read 256), and only the select is timed. With --append 1, each
// select comes after a pq_decode_append of one new token, as in an
// engine's decode step, and both are timed (a token leaves the local window
// at each append, and the select codes it first).
//
//   build/bench/bench_select_one --tokens 131072 --steps 200 [--cold 256] [--append 1]
#include <pqcache.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_data.h"
#include "cache_evictor.h"

namespace {

constexpr int32_t kQ = pqbench::kQHeads, kKv = pqbench::kKvHeads, kDim = pqbench::kHeadDim;

void check(pq_status st, const char* what) { pqbench::check_status("bench_select_one", st, what); }

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 131072;
  int steps = 200;
  int64_t cold_mib = 0;
  int append = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokens") tokens = std::atoll(argv[i + 1]);
    else if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--cold") cold_mib = std::atoll(argv[i + 1]);
    else if (a == "--append") append = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_select_one: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (tokens < 1024 || steps < 1 || cold_mib < 0 || (append != 0 && append != 1)) {
    std::fprintf(stderr, "bench_select_one: --tokens must be >= 1024, --steps >= 1, --cold >= 0 "
                         "and --append 0 or 1\n");
    return 2;
  }
  // The benches' layer (bench_data.h) with the default K-Means iterations.
  pq_config c = pqbench::layer_config(0);
  c.sink_tokens = 4;
  c.local_tokens = 128;
  pq_context* ctx = nullptr;
  check(pq_create(&c, &ctx), "pq_create");
  check(pq_sequence_add(ctx, 1), "pq_sequence_add");
  pqbench::Rng rng{0x5E1EC7ull};
  std::vector<uint16_t> k(static_cast<size_t>(tokens) * kKv * kDim),
      v(static_cast<size_t>(tokens) * kKv * kDim), q(static_cast<size_t>(kQ) * kDim);
  for (auto* a : {&k, &v, &q})
    for (uint16_t& x : *a) x = pqbench::f32_to_f16(rng.gauss());
  pq_tensor kt, vt, qt;
  check(pq_tensor_init(&kt, k.data(), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, tokens, kKv, kDim), "keys");
  check(pq_tensor_init(&vt, v.data(), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, tokens, kKv, kDim), "values");
  check(pq_tensor_init(&qt, q.data(), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 1, kQ, kDim), "queries");
  check(pq_prefill_layer(ctx, 1, 0, &kt, &vt), "pq_prefill_layer");
  check(pq_wait_builds(ctx), "pq_wait_builds");
  int64_t capacity = 0;
  check(pq_selection_capacity(ctx, 1, 0, &capacity), "pq_selection_capacity");
  // New tokens, one per step (--append 1); each can add a row per kv head.
  std::vector<uint16_t> step_kv(append ? static_cast<size_t>(steps) * 2 * kKv * kDim : 0);
  for (uint16_t& x : step_kv) x = pqbench::f32_to_f16(rng.gauss());
  capacity += append ? steps : 0;
  std::vector<int32_t> positions(static_cast<size_t>(capacity) * kKv), counts(kKv);
  pq_selection sel{positions.data(), counts.data(), capacity};
  const pqbench::CacheEvictor other_layers(static_cast<size_t>(cold_mib) << 20);
  uint64_t other_sum = 0;
  std::vector<double> ms;
  for (int s = 0; s < steps; ++s) {
    other_sum += other_layers.evict();
    const auto t = std::chrono::steady_clock::now();
    if (append) {
      uint16_t* token = step_kv.data() + static_cast<size_t>(s) * 2 * kKv * kDim;
      const auto layout = PQ_LAYOUT_TOKEN_MAJOR;
      pq_tensor nk, nv;
      check(pq_tensor_init(&nk, token, PQ_DTYPE_F16, layout, 1, kKv, kDim), "new key");
      check(pq_tensor_init(&nv, token + kKv * kDim, PQ_DTYPE_F16, layout, 1, kKv, kDim),
            "new value");
      check(pq_decode_append(ctx, 1, 0, &nk, &nv), "pq_decode_append");
    }
    check(pq_decode_select(ctx, 1, 0, &qt, &sel), "pq_decode_select");
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
  }
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over every head's positions
  for (int32_t h = 0; h < kKv; ++h)
    for (int32_t i = 0; i < counts[h]; ++i) {
      hash ^= static_cast<uint32_t>(positions[static_cast<size_t>(h) * capacity + i]);
      hash *= 1099511628211ull;
    }
  std::printf("bench_select_one: CPU %s, ISA %s, libpqcache %s, load %.2f, tokens %lld, "
              "cold_mib %lld, append %d, median_ms %.3f, min_ms %.3f, selection_hash %016llx\n",
              pqbench::cpu_model().c_str(), pqbench::isa_level(), pq_version_string(),
              pqbench::load_average(), static_cast<long long>(tokens),
              static_cast<long long>(cold_mib), append, pqbench::median(ms),
              *std::min_element(ms.begin(), ms.end()), static_cast<unsigned long long>(hash));
  pq_destroy(ctx);
  return other_sum == 42 ? 3 : 0;  // the reads' sum used, so they are not optimised away
}
