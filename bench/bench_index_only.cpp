// The index-only tier (PQ_KV_TIER_CALLER) against the host tier: one layer
// of Llama-3-8B geometry (32 q / 8 kv heads x 128, f16), clustered keys, the
// default index (m and b chosen by the library), top-k 1/5, the CPU backend.
//
// Printed per context length: what each context holds (pq_stats.host_bytes)
// after its first select, whether both select the same positions, and per
// round the median time of a pq_decode_select in each, run alternately
// (which goes first alternates by round), with the ratio index-only / host
// per round; also pq_decode_select_multi for 4 query tokens against 4
// pq_decode_select calls in the index-only context. Medians over rounds,
// the load average before and after.
//
//   bench_index_only [--tokens 32768,131072] [--rounds 7] [--selects 20]
//                    [--iterations 8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_data.h"
#include "pqcache.h"

namespace {

using pqbench::median;

void check(pq_status s, const char* what) { pqbench::check_status("bench_index_only", s, what); }

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr int32_t kKv = pqbench::kKvHeads, kQ = pqbench::kQHeads, kDim = pqbench::kHeadDim;
constexpr int kQueries = 16;

pq_context* make(int32_t tier, int32_t iterations) {
  pq_config c = pqbench::layer_config(iterations);
  c.pq_subspaces = 0;  // the default index
  c.pq_bits = 0;
  c.worker_threads = 2;
  c.kv_tier = tier;
  pq_context* ctx = nullptr;
  check(pq_create(&c, &ctx), "pq_create");
  check(pq_sequence_add(ctx, 1), "pq_sequence_add");
  return ctx;
}

pq_tensor tensor(const uint16_t* data, int64_t tokens, int32_t heads) {
  pq_tensor t;
  pq_tensor_init(&t, const_cast<uint16_t*>(data), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, tokens,
                 heads, kDim);
  return t;
}

struct Selection {
  std::vector<int32_t> positions, counts;
  pq_selection s{};
  Selection(int64_t rows, int64_t capacity)
      : positions(static_cast<size_t>(rows * capacity)), counts(static_cast<size_t>(rows)) {
    s = {positions.data(), counts.data(), capacity};
  }
};

// Milliseconds per select over `selects` selects of the bench's queries.
double time_selects(pq_context* ctx, const pqbench::ClusteredKv& kv, Selection& sel, int selects) {
  const double t0 = now();
  for (int i = 0; i < selects; ++i) {
    pq_tensor q = tensor(&kv.queries[size_t(i % kQueries) * kQ * kDim], 1, kQ);
    check(pq_decode_select(ctx, 1, 0, &q, &sel.s), "pq_decode_select");
  }
  return (now() - t0) * 1e3 / selects;
}

uint64_t host_bytes(pq_context* ctx) {
  pq_stats s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  check(pq_stats_get(ctx, &s), "pq_stats_get");
  return s.host_bytes;
}

void run(int64_t tokens, int rounds, int selects, int32_t iterations) {
  const auto kv = pqbench::make_clustered_kv(tokens, 42, kQueries, true);
  pq_context* host = make(PQ_KV_TIER_HOST, iterations);
  pq_context* index = make(PQ_KV_TIER_CALLER, iterations);
  pq_tensor k = tensor(kv->keys.data(), tokens, kKv), v = tensor(kv->values.data(), tokens, kKv);
  double t0 = now();
  check(pq_prefill_layer(host, 1, 0, &k, &v), "prefill host");
  check(pq_wait_builds(host), "build host");
  const double host_build = now() - t0;
  t0 = now();
  check(pq_prefill_layer(index, 1, 0, &k, nullptr), "prefill index-only");
  check(pq_wait_builds(index), "build index-only");
  const double index_build = now() - t0;

  int64_t capacity = 0;
  check(pq_selection_capacity(host, 1, 0, &capacity), "capacity");
  Selection a(kKv, capacity), b(kKv, capacity);
  bool same = true;
  for (int i = 0; i < kQueries; ++i) {
    pq_tensor q = tensor(&kv->queries[size_t(i) * kQ * kDim], 1, kQ);
    check(pq_decode_select(host, 1, 0, &q, &a.s), "select host");
    check(pq_decode_select(index, 1, 0, &q, &b.s), "select index-only");
    same = same && a.positions == b.positions && a.counts == b.counts;
  }
  std::printf("tokens %lld: prefill+build host %.1f s, index-only %.1f s; held after the first "
              "select: host %.1f MiB, index-only %.1f MiB; same positions over %d queries: %s\n",
              static_cast<long long>(tokens), host_build, index_build,
              host_bytes(host) / 1048576.0, host_bytes(index) / 1048576.0, kQueries,
              same ? "yes" : "NO");

  constexpr int64_t kMulti = 4;
  int64_t rows = 0, multi_capacity = 0;
  check(pq_selection_capacity_multi(index, 1, 0, kMulti, PQ_ROWS_PER_TOKEN, &rows,
                                    &multi_capacity),
        "capacity multi");
  Selection multi(rows, multi_capacity);
  std::vector<double> host_ms, index_ms, ratio, multi_ms, singles_ms, multi_ratio;
  for (int r = 0; r < rounds; ++r) {
    double h, x;
    if (r % 2 == 0) {
      h = time_selects(host, *kv, a, selects);
      x = time_selects(index, *kv, b, selects);
    } else {
      x = time_selects(index, *kv, b, selects);
      h = time_selects(host, *kv, a, selects);
    }
    host_ms.push_back(h);
    index_ms.push_back(x);
    ratio.push_back(x / h);
    // 4 query tokens: one multi call against 4 single selects.
    pq_tensor qs = tensor(&kv->queries[0], kMulti, kQ);
    const double m0 = now();
    for (int i = 0; i < selects / 4 + 1; ++i)
      check(pq_decode_select_multi(index, 1, 0, &qs, PQ_ROWS_PER_TOKEN, nullptr, &multi.s),
            "select multi");
    const double m = (now() - m0) * 1e3 / (selects / 4 + 1);
    const double s = time_selects(index, *kv, b, 4 * (selects / 4 + 1)) * kMulti;
    multi_ms.push_back(m);
    singles_ms.push_back(s);
    multi_ratio.push_back(m / s);
  }
  std::printf("  select ms (median of %d rounds x %d): host %.3f, index-only %.3f, "
              "index-only / host %.3f (per-round ratios min %.3f max %.3f)\n",
              rounds, selects, median(host_ms), median(index_ms), median(ratio),
              *std::min_element(ratio.begin(), ratio.end()),
              *std::max_element(ratio.begin(), ratio.end()));
  std::printf("  4 query tokens, index-only: select_multi %.3f ms, 4 x select %.3f ms, "
              "ratio %.3f\n",
              median(multi_ms), median(singles_ms), median(multi_ratio));
  pq_destroy(host);
  pq_destroy(index);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> tokens = {32768, 131072};
  int rounds = 7, selects = 20;
  int32_t iterations = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokens") tokens = pqbench::parse_list(argv[i + 1]);
    else if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (a == "--selects") selects = std::atoi(argv[i + 1]);
    else if (a == "--iterations") iterations = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "bench_index_only: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  std::printf("bench_index_only: %s, %s, one layer %d q / %d kv heads x %d, f16, default index, "
              "top-k 1/5, K-Means %d iterations, load %.2f\n",
              pqbench::cpu_model().c_str(), pqbench::isa_level(), kQ, kKv, kDim, iterations,
              pqbench::load_average());
  for (int64_t t : tokens) run(t, rounds, selects, iterations);
  std::printf("load after: %.2f\n", pqbench::load_average());
  return 0;
}
