// The selectors that learn from attention, per decode step of one layer:
// pq_observe_attention of the last selection, then pq_decode_select, at
// several context lengths. H2O is the baseline (a float per token and an
// add per observed token); every selector's step is timed interleaved with
// it in one process, in rounds that alternate which goes first, and the
// report is the median time and the median of the per-round ratios, with
// the load average. PQ and ClusterKV (no observation; select only) are
// timed the same way for scale. ZigZagKV and PyramidInfer read the other
// layers' shares: they are timed at the top layer of a 30-layer context
// (PyramidInfer's nesting makes that layer the dearest), against H2O at the
// same depth (every step appends to all layers and selects the top one).
//
//   bench_selectors [--lengths 8192,32768] [--rounds 15]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench_data.h"
#include "pqcache.h"

namespace {

using pqbench::median;
using pqbench::parse_list;

constexpr int32_t kQHeads = 8, kKvHeads = 2, kDim = 64;

void check(pq_status s, const char* what) { pqbench::check_status("bench_selectors", s, what); }

// One sequence under a selector, fed as a server would: the prompt of every
// layer, its window queries, one observation of every prompt token of the
// top layer, then a decode step per call of step() (a token appended to
// every layer, the top layer observed and selected).
class Stepper {
 public:
  Stepper(int32_t selector, int64_t tokens, uint32_t seed, int32_t layers = 1)
      : rng_(seed), layers_(layers), top_(layers - 1) {
    pq_config c;
    pq_config_default(&c);
    c.num_layers = layers;
    c.num_q_heads = kQHeads;
    c.num_kv_heads = kKvHeads;
    c.head_dim = kDim;
    c.dtype = PQ_DTYPE_F32;
    c.selector = selector;
    c.worker_threads = 1;
    c.cluster_count = 400;
    check(pq_create(&c, &ctx_), "pq_create");
    check(pq_sequence_add(ctx_, 1), "pq_sequence_add");
    std::normal_distribution<float> normal;
    std::vector<float> kv(static_cast<size_t>(tokens) * kKvHeads * kDim);
    for (float& x : kv) x = normal(rng_);
    pq_tensor k;
    check(pq_tensor_init(&k, kv.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, tokens, kKvHeads, kDim),
          "tensor");
    for (int32_t l = 0; l < layers; ++l)
      check(pq_prefill_layer(ctx_, 1, l, &k, &k), "pq_prefill_layer");
    check(pq_wait_builds(ctx_), "pq_wait_builds");
    std::vector<float> window(32 * kQHeads * kDim);
    pq_tensor w;
    check(pq_tensor_init(&w, window.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 32, kQHeads, kDim),
          "tensor");
    for (int32_t l = 0; l < layers; ++l) {  // each layer its own window queries
      for (float& x : window) x = normal(rng_);
      check(pq_prefill_queries(ctx_, 1, l, &w), "pq_prefill_queries");
    }
    // One observation of the whole prompt (the seed H2O and Scissorhands take).
    std::vector<int32_t> all(static_cast<size_t>(tokens) * kKvHeads), counts(kKvHeads, static_cast<int32_t>(tokens));
    std::vector<float> probs(all.size());
    for (int32_t h = 0; h < kKvHeads; ++h)
      for (int64_t t = 0; t < tokens; ++t) {
        all[static_cast<size_t>(h * tokens + t)] = static_cast<int32_t>(t);
        probs[static_cast<size_t>(h * tokens + t)] = std::uniform_real_distribution<float>(0.f, 2.f / tokens)(rng_);
      }
    pq_selection everything{all.data(), counts.data(), tokens};
    check(pq_observe_attention(ctx_, 1, top_, &everything, probs.data()), "pq_observe_attention");
    int64_t cap = 0;
    check(pq_selection_capacity_for(ctx_, top_, tokens + 1, &cap), "capacity");
    positions_.resize(static_cast<size_t>(cap) * kKvHeads);
    counts_.resize(kKvHeads);
    probs_.resize(positions_.size());
    sel_ = {positions_.data(), counts_.data(), cap};
    query_.resize(kQHeads * kDim);
    one_.resize(kKvHeads * kDim);
    step();  // a first selection to observe
  }
  ~Stepper() { pq_destroy(ctx_); }
  Stepper(const Stepper&) = delete;
  Stepper& operator=(const Stepper&) = delete;

  // Observes the last selection (random probabilities), appends a token and
  // selects. The length grows by one a step: a few dozen steps change the
  // cost of nothing measured here.
  void step() {
    std::uniform_real_distribution<float> unif(0.f, 1.f);
    for (float& p : probs_) p = unif(rng_);
    if (counts_[0] > 0) check(pq_observe_attention(ctx_, 1, top_, &sel_, probs_.data()), "observe");
    std::normal_distribution<float> normal;
    for (float& x : one_) x = normal(rng_);
    for (float& x : query_) x = normal(rng_);
    pq_tensor k, q;
    check(pq_tensor_init(&k, one_.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 1, kKvHeads, kDim), "t");
    for (int32_t l = 0; l < layers_; ++l) check(pq_decode_append(ctx_, 1, l, &k, &k), "pq_decode_append");
    check(pq_tensor_init(&q, query_.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 1, kQHeads, kDim), "t");
    int64_t cap = 0;
    check(pq_selection_capacity(ctx_, 1, top_, &cap), "capacity");
    if (cap > sel_.capacity) {
      positions_.resize(static_cast<size_t>(cap) * kKvHeads);
      probs_.resize(positions_.size());
      sel_ = {positions_.data(), counts_.data(), cap};
    }
    check(pq_decode_select(ctx_, 1, top_, &q, &sel_), "pq_decode_select");
  }

 private:
  std::mt19937 rng_;
  const int32_t layers_, top_;
  pq_context* ctx_ = nullptr;
  std::vector<int32_t> positions_, counts_;
  std::vector<float> probs_, query_, one_;
  pq_selection sel_{};
};

double time_step(Stepper& s) {
  const auto t = std::chrono::steady_clock::now();
  s.step();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> lengths = {8192, 32768};
  int rounds = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--lengths")) lengths = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
  }
  struct Rival {
    const char* name;
    int32_t selector;
    int32_t layers;  // the top one is timed
  };
  const std::vector<Rival> rivals = {
      {"scissorhands", PQ_SELECTOR_SCISSORHANDS, 1}, {"keyformer", PQ_SELECTOR_KEYFORMER, 1},
      {"snapkv", PQ_SELECTOR_SNAPKV, 1},             {"adakv", PQ_SELECTOR_ADAKV, 1},
      {"clusterkv", PQ_SELECTOR_CLUSTERKV, 1},       {"pq", PQ_SELECTOR_PQ, 1},
      {"zigzagkv/30", PQ_SELECTOR_ZIGZAGKV, 30},     {"pyramidinfer/30", PQ_SELECTOR_PYRAMIDINFER, 30},
      {"fastgen", PQ_SELECTOR_FASTGEN, 1},           {"infinigen", PQ_SELECTOR_INFINIGEN, 1}};
  double load[3] = {0, 0, 0};
  std::printf("# one layer (name/L: the top of L layers), %d q heads, %d kv heads, head_dim %d, "
              "f32, 1 worker thread\n", kQHeads, kKvHeads, kDim);
  std::printf("%-8s %-17s %12s %12s %10s\n", "tokens", "selector", "step (us)", "h2o (us)",
              "ratio");
  for (int64_t n : lengths) {
    for (const Rival& rival : rivals) {
      Stepper base(PQ_SELECTOR_H2O, n, 7, rival.layers), other(rival.selector, n, 7, rival.layers);
      std::vector<double> a, b, ratio;
      for (int r = 0; r < rounds; ++r) {
        const bool base_first = r % 2 == 0;
        const double t1 = base_first ? time_step(base) : time_step(other);
        const double t2 = base_first ? time_step(other) : time_step(base);
        const double tb = base_first ? t1 : t2, to = base_first ? t2 : t1;
        a.push_back(to);
        b.push_back(tb);
        ratio.push_back(to / tb);
      }
      std::printf("%-8lld %-17s %12.1f %12.1f %10.2f\n", static_cast<long long>(n), rival.name,
                  1e6 * median(a), 1e6 * median(b), median(ratio));
    }
  }
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
    std::fclose(f);
  }
  std::printf("# load average %.2f %.2f %.2f (2 cores here; ratios are of the same round)\n",
              load[0], load[1], load[2]);
  return 0;
}
