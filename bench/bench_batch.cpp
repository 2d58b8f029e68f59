// A decode step (select + fetch at every layer) for a batch of sequences on
// the CPU backend: through the batched calls (pq_decode_select_batch,
// pq_fetch_kv_batch: 2 calls per layer) against the same work through the
// per-sequence calls (2 x batch calls per layer), interleaved in one
// process, alternating which goes first, repeated; prints medians, the
// ratio per round's median and the load average.
//
//   bench_batch [--lengths 4096,32768] [--batches 1,8,32] [--rounds 15]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_data.h"
#include "pqcache.h"

namespace {

using pqbench::median;
using pqbench::parse_list;

constexpr int32_t kLayers = 2, kQHeads = 8, kKvHeads = 2, kDim = 64;

void check(pq_status s, const char* what) { pqbench::check_status("bench_batch", s, what); }

std::vector<uint16_t> random_f16(size_t n, uint32_t seed) {
  // Values in [-1, 1) as f16 bit patterns: sign, exponent 14 or less.
  std::mt19937 rng(seed);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = static_cast<uint16_t>((rng() & 0x83FF) | (0x3000 + (rng() % 0x0C00)));
  return v;
}

struct Sequence {
  std::vector<int32_t> positions, counts;
  std::vector<uint16_t> out_k, out_v, query;
  pq_selection sel{};
  pq_tensor q{}, k{}, v{};
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> lengths = {4096, 32768}, batches = {1, 8, 32};
  int rounds = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--lengths")) lengths = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batches")) batches = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
  }
  std::printf("libpqcache %s, CPU backend, %d layers, %d q / %d kv heads, head_dim %d, f16, "
              "PQ 2x6, top 1/5, sink 4, local 64, worker_threads 2\n",
              pq_version_string(), kLayers, kQHeads, kKvHeads, kDim);
  std::printf("load average at start: %.2f\n\n", pqbench::load_average());
  std::printf("| tokens | batch | calls/step batched | calls/step per-sequence | batched ms "
              "(median) | per-sequence ms (median) | per-sequence / batched (median of "
              "rounds) | load |\n|---|---|---|---|---|---|---|---|\n");

  for (int64_t tokens : lengths) {
    const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
    pq_config c;
    pq_config_default(&c);
    c.num_layers = kLayers;
    c.num_q_heads = kQHeads;
    c.num_kv_heads = kKvHeads;
    c.head_dim = kDim;
    c.dtype = PQ_DTYPE_F16;
    c.pq_subspaces = 2;
    c.pq_bits = 6;
    c.kmeans_iterations = 2;  // the index's quality is not what is measured
    c.sink_tokens = 4;
    c.local_tokens = 64;
    c.topk_fraction = 0.2f;
    c.worker_threads = 2;
    pq_context* ctx = nullptr;
    check(pq_create(&c, &ctx), "pq_create");
    // One prompt shared by every sequence: the per-token work is the same.
    const auto keys = random_f16(static_cast<size_t>(tokens) * kKvHeads * kDim, 1);
    const auto values = random_f16(keys.size(), 2);
    pq_tensor k, v;
    check(pq_tensor_init(&k, const_cast<uint16_t*>(keys.data()), PQ_DTYPE_F16,
                         PQ_LAYOUT_TOKEN_MAJOR, tokens, kKvHeads, kDim), "tensor");
    check(pq_tensor_init(&v, const_cast<uint16_t*>(values.data()), PQ_DTYPE_F16,
                         PQ_LAYOUT_TOKEN_MAJOR, tokens, kKvHeads, kDim), "tensor");
    for (int64_t s = 0; s < max_batch; ++s) {
      check(pq_sequence_add(ctx, static_cast<uint64_t>(s)), "pq_sequence_add");
      for (int32_t l = 0; l < kLayers; ++l)
        check(pq_prefill_layer(ctx, static_cast<uint64_t>(s), l, &k, &v), "pq_prefill_layer");
    }
    check(pq_wait_builds(ctx), "pq_wait_builds");
    int64_t cap = 0;
    check(pq_selection_capacity_for(ctx, 0, tokens, &cap), "capacity");
    std::vector<Sequence> seqs(static_cast<size_t>(max_batch));
    for (size_t s = 0; s < seqs.size(); ++s) {
      Sequence& q = seqs[s];
      q.positions.resize(static_cast<size_t>(kKvHeads * cap));
      q.counts.resize(kKvHeads);
      q.out_k.resize(static_cast<size_t>(kKvHeads * cap * kDim));
      q.out_v.resize(q.out_k.size());
      q.query = random_f16(kQHeads * kDim, 100 + static_cast<uint32_t>(s));
      q.sel = pq_selection{q.positions.data(), q.counts.data(), cap};
      check(pq_tensor_init(&q.q, q.query.data(), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 1, kQHeads,
                           kDim), "tensor");
      check(pq_tensor_init(&q.k, q.out_k.data(), PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR, cap,
                           kKvHeads, kDim), "tensor");
      check(pq_tensor_init(&q.v, q.out_v.data(), PQ_DTYPE_F16, PQ_LAYOUT_HEAD_MAJOR, cap,
                           kKvHeads, kDim), "tensor");
    }

    for (int64_t batch : batches) {
      std::vector<pq_select_item> select_items(static_cast<size_t>(batch));
      std::vector<pq_fetch_item> fetch_items(static_cast<size_t>(batch));
      for (int64_t s = 0; s < batch; ++s) {
        Sequence& q = seqs[static_cast<size_t>(s)];
        select_items[s] = pq_select_item{static_cast<uint64_t>(s), q.q, q.sel, PQ_OK};
        fetch_items[s] = pq_fetch_item{static_cast<uint64_t>(s), q.sel, q.k, q.v, PQ_OK};
      }
      auto batched = [&] {
        for (int32_t l = 0; l < kLayers; ++l) {
          check(pq_decode_select_batch(ctx, l, select_items.data(), batch), "select_batch");
          check(pq_fetch_kv_batch(ctx, l, fetch_items.data(), batch), "fetch_batch");
        }
      };
      auto per_sequence = [&] {
        for (int32_t l = 0; l < kLayers; ++l)
          for (int64_t s = 0; s < batch; ++s) {
            Sequence& q = seqs[static_cast<size_t>(s)];
            check(pq_decode_select(ctx, static_cast<uint64_t>(s), l, &q.q, &q.sel), "select");
            check(pq_fetch_kv(ctx, static_cast<uint64_t>(s), l, &q.sel, &q.k, &q.v), "fetch");
          }
      };
      batched();  // warm-up: scratch, caches, first-touch
      per_sequence();
      std::vector<double> tb, tp, ratio;
      for (int r = 0; r < rounds; ++r) {
        double b = 0, p = 0;
        const bool batched_first = r % 2 == 0;
        auto t = std::chrono::steady_clock::now();
        batched_first ? batched() : per_sequence();
        (batched_first ? b : p) = seconds_since(t);
        t = std::chrono::steady_clock::now();
        batched_first ? per_sequence() : batched();
        (batched_first ? p : b) = seconds_since(t);
        tb.push_back(b);
        tp.push_back(p);
        ratio.push_back(p / b);
      }
      std::printf("| %lld | %lld | %d | %lld | %.3f | %.3f | %.2fx | %.2f |\n",
                  static_cast<long long>(tokens), static_cast<long long>(batch), 2 * kLayers,
                  static_cast<long long>(2 * kLayers * batch), median(tb) * 1e3,
                  median(tp) * 1e3, median(ratio), pqbench::load_average());
      std::fflush(stdout);
    }
    pq_destroy(ctx);
  }
  return 0;
}
