// Sequence state against re-computing it (issue 14): a fork of a long
// sequence against a fresh prefill and index build of the same tokens, and a
// save to a file and a restore against a re-prefill, each up to the first
// selection. One process, the variants interleaved in every repetition;
// medians and ratios against the re-prefill measured in the same run.
//
//   bench_state [tokens=32768] [layers=4] [repetitions=3] [dir=/tmp]
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "bench_data.h"
#include "heap_counter.h"

using namespace pqbench;

namespace {

constexpr const char* kProgram = "bench_state";

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}


uint64_t host_bytes(pq_context* ctx) {
  pq_stats s{};
  s.struct_size = sizeof s;
  check_status(kProgram, pq_stats_get(ctx, &s), "pq_stats_get");
  return s.host_bytes;
}

struct Bench {
  pq_context* ctx;
  int32_t layers;
  pq_tensor keys, values, query;
  std::vector<int32_t> positions, counts;

  void prefill(uint64_t id) {
    check_status(kProgram, pq_sequence_add(ctx, id), "pq_sequence_add");
    for (int32_t l = 0; l < layers; ++l)
      check_status(kProgram, pq_prefill_layer(ctx, id, l, &keys, &values), "pq_prefill_layer");
    check_status(kProgram, pq_wait_builds(ctx), "pq_wait_builds");
  }
  void first_select(uint64_t id) {
    int64_t cap = 0;
    check_status(kProgram, pq_selection_capacity(ctx, id, 0, &cap), "pq_selection_capacity");
    positions.resize(size_t(cap) * kKvHeads);
    counts.resize(kKvHeads);
    pq_selection sel{positions.data(), counts.data(), cap};
    check_status(kProgram, pq_decode_select(ctx, id, 0, &query, &sel), "pq_decode_select");
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 32768;
  const int32_t layers = argc > 2 ? std::atoi(argv[2]) : 4;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 3;
  const std::string dir = argc > 4 ? argv[4] : "/tmp";
  const std::string path = dir + "/bench_state." + std::to_string(getpid()) + ".pqstate";

  pq_config cfg = layer_config(0);  // the adaptive K-Means budget, as a server runs it
  cfg.num_layers = layers;
  pq_context* ctx = nullptr;
  check_status(kProgram, pq_create(&cfg, &ctx), "pq_create");
  std::unique_ptr<ClusteredKv> kv = make_clustered_kv(tokens, 7, 1, true);
  Bench b{ctx, layers, {}, {}, {}, {}, {}};
  check_status(kProgram,
               pq_tensor_init(&b.keys, kv->keys.data(), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR,
                              tokens, kKvHeads, kHeadDim),
               "pq_tensor_init");
  check_status(kProgram,
               pq_tensor_init(&b.values, kv->values.data(), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR,
                              tokens, kKvHeads, kHeadDim),
               "pq_tensor_init");
  check_status(kProgram,
               pq_tensor_init(&b.query, kv->queries.data(), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 1,
                              kQHeads, kHeadDim),
               "pq_tensor_init");

  std::printf("bench_state: %lld tokens, %d layers, %d kv heads x %d, f16, PQ m=%d b=%d\n",
              (long long)tokens, layers, kKvHeads, kHeadDim, cfg.pq_subspaces, cfg.pq_bits);
  std::ifstream load("/proc/loadavg");
  std::string loadavg;
  std::getline(load, loadavg);
  std::printf("load before: %s\n", loadavg.c_str());

  b.prefill(1);  // the parent of every fork and the saved sequence
  const uint64_t base = host_bytes(ctx);
  std::vector<double> t_prefill, t_prefill_select, t_fork, t_save, t_restore, t_restore_select;
  uint64_t bytes_prefill = 0, bytes_fork = 0, file_bytes = 0;
  uint64_t heap_prefill = 0, heap_fork = 0;  // live operator-new bytes each added
  for (int r = 0; r < reps; ++r) {
    // Re-prefill (add, prefill every layer, wait for the builds), then the
    // first selection.
    uint64_t heap0 = bench::heap_bytes_live();
    double t0 = now();
    b.prefill(100);
    double t1 = now();
    b.first_select(100);
    double t2 = now();
    t_prefill.push_back(t1 - t0);
    t_prefill_select.push_back(t2 - t0);
    bytes_prefill = host_bytes(ctx) - base;
    heap_prefill = bench::heap_bytes_live() - heap0;
    check_status(kProgram, pq_sequence_remove(ctx, 100), "pq_sequence_remove");

    heap0 = bench::heap_bytes_live();
    t0 = now();
    check_status(kProgram, pq_sequence_fork(ctx, 1, 200), "pq_sequence_fork");
    t1 = now();
    t_fork.push_back(t1 - t0);
    bytes_fork = host_bytes(ctx) - base;
    heap_fork = bench::heap_bytes_live() - heap0;
    check_status(kProgram, pq_sequence_remove(ctx, 200), "pq_sequence_remove");

    t0 = now();
    check_status(kProgram, pq_sequence_save_file(ctx, 1, path.c_str()), "pq_sequence_save_file");
    t1 = now();
    check_status(kProgram, pq_sequence_restore_file(ctx, 300, path.c_str()),
                 "pq_sequence_restore_file");
    t2 = now();
    b.first_select(300);
    const double t3 = now();
    t_save.push_back(t1 - t0);
    t_restore.push_back(t2 - t1);
    t_restore_select.push_back(t3 - t1);
    struct stat st {};
    stat(path.c_str(), &st);
    file_bytes = uint64_t(st.st_size);
    check_status(kProgram, pq_sequence_remove(ctx, 300), "pq_sequence_remove");
  }
  std::remove(path.c_str());
  std::ifstream load2("/proc/loadavg");
  std::getline(load2, loadavg);
  std::printf("load after:  %s\n", loadavg.c_str());

  const double re = median(t_prefill), re_sel = median(t_prefill_select);
  std::printf("\n%-44s %10s %12s %12s %10s\n", "variant (median of repetitions)", "seconds",
              "host MiB", "heap MiB", "vs re-prefill");
  std::printf("%-44s %10.3f %12.1f %12.1f %10s\n", "re-prefill + index build (baseline)", re,
              bytes_prefill / 1048576.0, heap_prefill / 1048576.0, "1.00x");
  std::printf("%-44s %10.4f %12.1f %12.2f %9.0fx\n", "fork", median(t_fork),
              bytes_fork / 1048576.0, heap_fork / 1048576.0, re / median(t_fork));
  std::printf("%-44s %10.3f %12.1f %10s\n", "save to file (fsync)", median(t_save),
              file_bytes / 1048576.0, "");
  std::printf("%-44s %10.3f %12s %9.1fx\n", "restore from file", median(t_restore), "",
              re / median(t_restore));
  std::printf("%-44s %10.3f %12s %9.1fx\n", "first selection: after restore", median(t_restore_select),
              "", re_sel / median(t_restore_select));
  std::printf("%-44s %10.3f %12s %10s\n", "first selection: after re-prefill", re_sel, "", "1.00x");
  std::printf("host MiB: what the memory limit counts (pq_stats.host_bytes: the K/V, plus upper\n"
              "bounds of the state that grows with the tokens). heap MiB: what the operation left\n"
              "allocated (live operator-new bytes, every thread); the fork shares its parent's\n"
              "full K/V chunks and PQ codes and centroids.\n");
  std::printf("fork counts %.2f%% of a re-prefill's host bytes; the file is %.1f MiB (%.3f of the "
              "K/V)\n",
              100.0 * double(bytes_fork) / double(bytes_prefill), file_bytes / 1048576.0,
              double(file_bytes) / (2.0 * tokens * kKvHeads * kHeadDim * 2 * layers));
  pq_destroy(ctx);
  return 0;
}
