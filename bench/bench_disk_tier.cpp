// The disk tier (PQ_KV_TIER_DISK) against the host tier and against the
// disk itself: one layer of Llama-3-8B geometry (8 kv heads x 128, f16) at
// 1M tokens (4 GiB of K/V), the CPU backend.
//
// Printed: the memory each tier holds (pq_stats.host_bytes and the
// process's resident set), the store rate, and per round a fetch of k
// random middle rows per kv head (sorted, as selectors hand them) from the
// host tier, and from the disk tier cold (the file's pages dropped with
// posix_fadvise after an fdatasync) then warm (the same rows again, now in
// the page cache), each beside the file's own random-read bandwidth at the
// same row size, measured in the same round on the same file descriptor
// (the disk_read hook hands it over) with pread of the same number of rows
// at random row-aligned offsets, from 1, 2 and 16 threads. Medians over
// rounds, ratios per round, the load average.
//
//   bench_disk_tier [--tokens 1048576] [--k 2048] [--rounds 7] [--dir DIR]
//                   [--skip-host]
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_data.h"
#include "pqcache.h"

namespace {

using pqbench::median;

void check(pq_status s, const char* what) { pqbench::check_status("bench_disk_tier", s, what); }

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double resident_mib() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / 1048576.0;
}

// The disk tier's file descriptor, caught by its read hook.
std::atomic<int> g_fd{-1};
int64_t read_hook(void*, int fd, void* buf, uint64_t bytes, uint64_t offset) {
  g_fd.store(fd);
  const ssize_t n = ::pread(fd, buf, bytes, static_cast<off_t>(offset));
  return n < 0 ? -errno : n;
}
int64_t write_hook(void*, int fd, const void* buf, uint64_t bytes, uint64_t offset) {
  g_fd.store(fd);
  const ssize_t n = ::pwrite(fd, buf, bytes, static_cast<off_t>(offset));
  return n < 0 ? -errno : n;
}

struct Layer {
  pq_context* ctx = nullptr;
  double prefill_s = 0, resident_mib = 0;
  uint64_t host_bytes = 0;
};

constexpr int32_t kKv = pqbench::kKvHeads, kDim = pqbench::kHeadDim;
constexpr int64_t kPiece = 65536;  // tokens per call while filling

Layer fill(int32_t tier, const std::string& dir, int64_t tokens) {
  pq_config c = pqbench::layer_config(0);
  c.selector = PQ_SELECTOR_WINDOW;  // no index: the K/V path alone
  c.worker_threads = 2;
  c.kv_tier = tier;
  c.kv_disk_path = dir.c_str();
  pq_hooks h;
  pq_hooks_default(&h);
  h.disk_read = read_hook;
  h.disk_write = write_hook;
  Layer l;
  const double rss0 = resident_mib();
  check(pq_create_with_hooks(&c, &h, &l.ctx), "pq_create");
  check(pq_sequence_add(l.ctx, 1), "pq_sequence_add");
  pqbench::Rng rng{static_cast<uint64_t>(tier) + 1};
  std::vector<uint16_t> k(static_cast<size_t>(kPiece) * kKv * kDim), v(k.size());
  for (auto& x : k) x = static_cast<uint16_t>(0x3000 + (rng.next() % 0x0C00));
  for (auto& x : v) x = static_cast<uint16_t>(0x3000 + (rng.next() % 0x0C00));
  const double rss_buffers = resident_mib() - rss0;
  const double t0 = now();
  for (int64_t t = 0; t < tokens; t += kPiece) {
    pq_tensor kt{}, vt{};
    for (pq_tensor* x : {&kt, &vt}) {
      x->dtype = PQ_DTYPE_F16;
      x->memory = PQ_MEMORY_HOST;
      x->tokens = std::min(kPiece, tokens - t);
      x->heads = kKv;
      x->head_dim = kDim;
      x->token_stride = kKv * kDim;
      x->head_stride = kDim;
    }
    kt.data = k.data();
    vt.data = v.data();
    check(t == 0 ? pq_prefill_layer(l.ctx, 1, 0, &kt, &vt) : pq_decode_append(l.ctx, 1, 0, &kt, &vt),
          "storing K/V");
  }
  l.prefill_s = now() - t0;
  pq_stats s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  check(pq_stats_get(l.ctx, &s), "pq_stats_get");
  l.host_bytes = s.host_bytes;
  l.resident_mib = resident_mib() - rss0 - rss_buffers;
  return l;
}

// One fetch of k sorted random middle rows per kv head; seconds.
double fetch(pq_context* ctx, int64_t tokens, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> pick(4, static_cast<int32_t>(tokens - 129));
  std::vector<int32_t> pos(static_cast<size_t>(kKv * k)), counts(kKv, static_cast<int32_t>(k));
  for (int32_t h = 0; h < kKv; ++h) {
    for (int64_t i = 0; i < k; ++i) pos[static_cast<size_t>(h * k + i)] = pick(rng);
    std::sort(pos.begin() + h * k, pos.begin() + (h + 1) * k);
  }
  pq_selection sel{pos.data(), counts.data(), k};
  std::vector<uint16_t> ok(static_cast<size_t>(k) * kKv * kDim), ov(ok.size());
  pq_tensor kt{}, vt{};
  for (pq_tensor* x : {&kt, &vt}) {
    x->dtype = PQ_DTYPE_F16;
    x->memory = PQ_MEMORY_HOST;
    x->tokens = k;
    x->heads = kKv;
    x->head_dim = kDim;
    x->token_stride = kKv * kDim;
    x->head_stride = kDim;
  }
  kt.data = ok.data();
  vt.data = ov.data();
  const double t0 = now();
  check(pq_fetch_kv(ctx, 1, 0, &sel, &kt, &vt), "pq_fetch_kv");
  return now() - t0;
}

// The file's own random reads: `rows` preads of `row_bytes` at random
// row-aligned offsets below `file_bytes` (sorted, as a fetch's), split over
// `threads` threads (the tier's fetch reads on the context's pool, 2
// threads here; more show what the device gives at a deeper queue).
struct RawReads {
  std::vector<uint64_t> offsets;
  RawReads(int64_t rows, size_t row_bytes, uint64_t file_bytes, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<uint64_t> pick(0, file_bytes / row_bytes - 1);
    offsets.resize(static_cast<size_t>(rows));
    for (auto& o : offsets) o = pick(rng) * row_bytes;
    std::sort(offsets.begin(), offsets.end());
  }
  double run(int fd, size_t row_bytes, int threads) const {
    auto part = [&](size_t begin, size_t end) {
      std::vector<uint8_t> buf(row_bytes);
      for (size_t i = begin; i < end; ++i)
        if (::pread(fd, buf.data(), row_bytes, static_cast<off_t>(offsets[i])) !=
            static_cast<ssize_t>(row_bytes)) {
          std::perror("bench_disk_tier: pread");
          std::exit(1);
        }
    };
    const double t0 = now();
    std::vector<std::thread> pool;
    const size_t n = offsets.size();
    for (int t = 1; t < threads; ++t)
      pool.emplace_back(part, n * t / threads, n * (t + 1) / threads);
    part(0, n / threads);
    for (auto& t : pool) t.join();
    return now() - t0;
  }
};

void drop_cache(int fd) {
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 1 << 20, k = 2048;
  int rounds = 7;
  bool skip_host = false;
  std::string dir = ".";
  for (int i = 1; i < argc; ++i) {
    const bool has = i + 1 < argc;
    if (!std::strcmp(argv[i], "--tokens") && has) tokens = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--k") && has) k = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--rounds") && has) rounds = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--dir") && has) dir = argv[++i];
    else if (!std::strcmp(argv[i], "--skip-host")) skip_host = true;
    else {
      std::fprintf(stderr, "usage: bench_disk_tier [--tokens N] [--k N] [--rounds N] [--dir DIR] [--skip-host]\n");
      return 2;
    }
  }
  const size_t row_bytes = static_cast<size_t>(kDim) * 2;
  const double kv_gib = 2.0 * tokens * kKv * row_bytes / (1 << 30);
  std::printf("libpqcache %s, CPU backend, 1 layer, %d kv heads x %d, f16, %lld tokens (%.2f GiB "
              "of K/V), fetch of %lld rows per kv head, %d rounds, file in %s\n",
              pq_version_string(), kKv, kDim, static_cast<long long>(tokens), kv_gib,
              static_cast<long long>(k), rounds, dir.c_str());
  std::printf("CPU: %s (%s), load average at start %.2f\n\n", pqbench::cpu_model().c_str(), pqbench::isa_level(),
              pqbench::load_average());

  Layer disk = fill(PQ_KV_TIER_DISK, dir, tokens);
  Layer host;
  if (!skip_host) host = fill(PQ_KV_TIER_HOST, dir, tokens);
  std::printf("| tier | host_bytes (MiB) | resident set growth (MiB) | store rate (GiB/s) |\n|---|---|---|---|\n");
  for (const Layer* l : {&host, &disk}) {
    if (l->ctx == nullptr) continue;
    std::printf("| %s | %.1f | %.1f | %.2f |\n", l == &host ? "host" : "disk",
                l->host_bytes / 1048576.0, l->resident_mib, kv_gib / l->prefill_s);
  }
  const int fd = g_fd.load();
  const uint64_t file_bytes = static_cast<uint64_t>(::lseek(fd, 0, SEEK_END));
  const int64_t rows = 2 * kKv * k;  // K and V rows of a fetch
  const double fetch_mib = rows * row_bytes / 1048576.0;

  // Per round, one set of rows: cold (the file's pages dropped: fdatasync,
  // posix_fadvise DONTNEED), then the same rows again, warm (page cache).
  // The tier and the raw reads take the same number of rows of the same
  // size; the raw reads at 1, 2 (the tier's pool) and 16 threads.
  const int kThreads[] = {1, 2, 16};
  std::vector<double> th, tc, tw, host_ratio;
  std::vector<double> rc[3], rw[3], cold_ratio[3], warm_ratio[3];
  for (int r = 0; r < rounds; ++r) {
    const uint64_t seed = 1000 + static_cast<uint64_t>(r);
    if (host.ctx != nullptr) th.push_back(fetch(host.ctx, tokens, k, seed));
    drop_cache(fd);
    tc.push_back(fetch(disk.ctx, tokens, k, seed));
    tw.push_back(fetch(disk.ctx, tokens, k, seed));
    if (host.ctx != nullptr) host_ratio.push_back(tw.back() / th.back());
    const RawReads raw(rows, row_bytes, file_bytes, seed);
    for (int t = 0; t < 3; ++t) {
      drop_cache(fd);
      rc[t].push_back(raw.run(fd, row_bytes, kThreads[t]));
      rw[t].push_back(raw.run(fd, row_bytes, kThreads[t]));
      cold_ratio[t].push_back(rc[t].back() / tc.back());
      warm_ratio[t].push_back(rw[t].back() / tw.back());
    }
  }
  auto mibps = [&](double s) { return fetch_mib / s; };
  std::printf("\nfetch of %lld rows (%.1f MiB of K and V), medians of %d rounds; a ratio > 1: "
              "the tier is faster than the file's own reads:\n\n",
              static_cast<long long>(rows), fetch_mib, rounds);
  std::printf("| what | ms | MiB/s | ratio (median of rounds) |\n|---|---|---|---|\n");
  if (host.ctx != nullptr)
    std::printf("| host tier fetch | %.2f | %.0f | disk-warm / host time %.1f |\n",
                median(th) * 1e3, mibps(median(th)), median(host_ratio));
  std::printf("| disk tier fetch, cold | %.2f | %.0f | |\n", median(tc) * 1e3, mibps(median(tc)));
  for (int t = 0; t < 3; ++t)
    std::printf("| file's pread, %zu B rows, cold, %d threads | %.2f | %.0f | pread / tier %.3f |\n",
                row_bytes, kThreads[t], median(rc[t]) * 1e3, mibps(median(rc[t])),
                median(cold_ratio[t]));
  std::printf("| disk tier fetch, warm | %.2f | %.0f | |\n", median(tw) * 1e3, mibps(median(tw)));
  for (int t = 0; t < 3; ++t)
    std::printf("| file's pread, %zu B rows, warm, %d threads | %.2f | %.0f | pread / tier %.3f |\n",
                row_bytes, kThreads[t], median(rw[t]) * 1e3, mibps(median(rw[t])),
                median(warm_ratio[t]));
  std::printf("\nfile: %.2f GiB; load average at end %.2f\n", file_bytes / 1073741824.0,
              pqbench::load_average());
  if (host.ctx != nullptr) pq_destroy(host.ctx);
  pq_destroy(disk.ctx);
  return 0;
}
