// Moving a long sequence between contexts: through Redis on loopback
// (pq_redis_put / pq_redis_get, and the streaming get: pq_redis_get_begin,
// the first selection, pq_redis_get_finish), through a file (pq_sequence_save_file /
// pq_sequence_restore_file) and, for contrast, a plain re-prefill of the
// same K/V (pq_sequence_add + pq_prefill_layer per layer + pq_wait_builds),
// interleaved, repeated; prints medians, bytes, the ratio against the
// re-prefill, the time to the first pq_decode_select after each, and the
// load average. It starts a redis-server of its own on a free loopback port
// (no persistence), as the tests do.
//
//   bench_redis [--tokens 32768] [--layers 30] [--kv-heads 8] [--q-heads 32]
//               [--head-dim 128] [--reps 3] [--block-kib 4096]
//               [--dir /tmp]
//
// f16 K/V. When the machine's available memory cannot hold about 4.5 copies
// of the state (the source context, Redis, the restore buffer, the
// destination context, slack), the layers drop to 8 and it says so.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bench_data.h"
#include "pqcache.h"
#include "pqcache_redis.h"
#include "redis_server.h"  // tests/redis: the test's redis-server launcher

namespace {

using pqbench::median;

void check(pq_status s, const char* what) {
  if (s != PQ_OK) {
    std::fprintf(stderr, "bench_redis: %s: %s | %s\n", what, pq_status_string(s),
                 pq_redis_last_error()[0] ? pq_redis_last_error() : pq_last_error());
    std::exit(1);
  }
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}


std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string line;
  std::getline(in, line);
  return line;
}

uint64_t mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

// Values in [-1, 1) as f16 bit patterns (xorshift; exponent 14 or less).
std::vector<uint16_t> random_f16(size_t n, uint64_t seed) {
  std::vector<uint16_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& h : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    h = static_cast<uint16_t>((x & 0x83FF) | (0x3000 + ((x >> 20) % 0x0C00)));
  }
  return v;
}

struct Geometry {
  int64_t tokens = 32768;
  int32_t layers = 30, kv_heads = 8, q_heads = 32, head_dim = 128;
  uint64_t kv_bytes() const {
    return static_cast<uint64_t>(tokens) * layers * kv_heads * head_dim * 2 /*f16*/ * 2 /*K,V*/;
  }
};

struct Bench {
  Geometry g;
  pq_context* ctx = nullptr;
  std::vector<uint16_t> keys, values, query;
  std::vector<int32_t> positions, counts;

  void prefill(uint64_t seq) {
    check(pq_sequence_add(ctx, seq), "pq_sequence_add");
    pq_tensor k, v;
    check(pq_tensor_init(&k, keys.data(), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, g.tokens,
                         g.kv_heads, g.head_dim),
          "pq_tensor_init");
    check(pq_tensor_init(&v, values.data(), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, g.tokens,
                         g.kv_heads, g.head_dim),
          "pq_tensor_init");
    for (int32_t l = 0; l < g.layers; ++l) check(pq_prefill_layer(ctx, seq, l, &k, &v), "prefill");
    check(pq_wait_builds(ctx), "pq_wait_builds");
  }

  // One pq_decode_select on layer 0: what a decode step does first.
  double first_select(uint64_t seq) {
    pq_tensor q;
    check(pq_tensor_init(&q, query.data(), PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 1, g.q_heads,
                         g.head_dim),
          "pq_tensor_init");
    int64_t cap = 0;
    check(pq_selection_capacity(ctx, seq, 0, &cap), "pq_selection_capacity");
    positions.resize(static_cast<size_t>(cap * g.kv_heads));
    counts.resize(static_cast<size_t>(g.kv_heads));
    pq_selection sel{positions.data(), counts.data(), cap};
    const double t = now_s();
    check(pq_decode_select(ctx, seq, 0, &q, &sel), "pq_decode_select");
    return now_s() - t;
  }
};

}  // namespace

int main(int argc, char** argv) {
  Geometry g;
  int reps = 3;
  uint64_t block_kib = 4096;
  std::string dir = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--tokens") g.tokens = std::atoll(v);
    else if (a == "--layers") g.layers = std::atoi(v);
    else if (a == "--kv-heads") g.kv_heads = std::atoi(v);
    else if (a == "--q-heads") g.q_heads = std::atoi(v);
    else if (a == "--head-dim") g.head_dim = std::atoi(v);
    else if (a == "--reps") reps = std::atoi(v);
    else if (a == "--block-kib") block_kib = std::strtoull(v, nullptr, 10);
    else if (a == "--dir") dir = v;
    else {
      std::fprintf(stderr, "bench_redis: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const uint64_t avail = mem_available();
  std::printf("bench_redis: %lld tokens, %d layers asked, kv_heads %d, q_heads %d, head_dim %d, "
              "f16; MemAvailable %.1f GiB\n",
              static_cast<long long>(g.tokens), g.layers, g.kv_heads, g.q_heads, g.head_dim,
              avail / 1073741824.0);
  if (avail > 0 && 4.5 * static_cast<double>(g.kv_bytes()) > static_cast<double>(avail) &&
      g.layers > 8) {
    std::printf("bench_redis: %.2f GiB of K/V per copy x 4.5 does not fit in %.1f GiB: "
                "8 layers instead of %d\n",
                g.kv_bytes() / 1073741824.0, avail / 1073741824.0, g.layers);
    g.layers = 8;
  }
  std::printf("bench_redis: load average at start: %s\n", loadavg().c_str());

  pqrt::RedisServer server;
  const std::string why = server.start();
  if (!why.empty()) {
    std::fprintf(stderr, "bench_redis: cannot start redis-server: %s\n", why.c_str());
    return 1;
  }
  pq_redis* conn = nullptr;
  check(pq_redis_connect("127.0.0.1", server.port(), 60000, &conn), "pq_redis_connect");

  pq_config c;
  pq_config_default(&c);
  c.num_layers = g.layers;
  c.num_q_heads = g.q_heads;
  c.num_kv_heads = g.kv_heads;
  c.head_dim = g.head_dim;
  c.dtype = PQ_DTYPE_F16;
  Bench src, dst;  // two contexts: the one that saves and the one that restores
  src.g = dst.g = g;
  check(pq_create(&c, &src.ctx), "pq_create");
  check(pq_create(&c, &dst.ctx), "pq_create");
  const size_t n = static_cast<size_t>(g.tokens) * g.kv_heads * g.head_dim;
  dst.keys = random_f16(n, 1);  // one layer's K/V, the same for every layer
  dst.values = random_f16(n, 2);
  dst.query = random_f16(static_cast<size_t>(g.q_heads) * g.head_dim, 3);
  src.query = dst.query;
  {
    src.keys = dst.keys;
    src.values = dst.values;
    const double t = now_s();
    src.prefill(1);
    std::printf("bench_redis: source prefill + build of %d layers: %.2f s\n", g.layers,
                now_s() - t);
    src.keys.clear();
    src.keys.shrink_to_fit();
    src.values.clear();
    src.values.shrink_to_fit();
  }
  uint64_t state_bytes = 0;
  check(pq_sequence_state_size(src.ctx, 1, &state_bytes), "pq_sequence_state_size");
  const uint64_t block = block_kib * 1024;
  const std::string path = dir + "/bench_redis_state." + std::to_string(getpid());

  std::vector<double> put_s, get_s, get_sel_s, save_s, restore_s, restore_sel_s, prefill_s,
      prefill_sel_s, begin_s, begin_sel_s, stream_s;
  uint64_t begin_bytes = 0;
  uint64_t file_bytes = 0;
  uint64_t seq = 100;
  for (int rep = 0; rep < reps; ++rep) {
    // Redis: put from the source, get into the destination.
    double t = now_s();
    check(pq_redis_put(conn, src.ctx, 1, "bench", block), "pq_redis_put");
    put_s.push_back(now_s() - t);
    t = now_s();
    check(pq_redis_get(conn, dst.ctx, seq, "bench"), "pq_redis_get");
    get_s.push_back(now_s() - t);
    get_sel_s.push_back(dst.first_select(seq));
    check(pq_sequence_remove(dst.ctx, seq++), "pq_sequence_remove");
    // The streaming get: the first selection after the description's blocks,
    // then the rest.
    t = now_s();
    pq_redis_transfer* transfer = nullptr;
    check(pq_redis_get_begin(conn, dst.ctx, seq, "bench", &transfer), "pq_redis_get_begin");
    begin_s.push_back(now_s() - t);
    begin_sel_s.push_back(dst.first_select(seq));
    check(pq_redis_transfer_progress(transfer, &begin_bytes, nullptr, nullptr, nullptr),
          "pq_redis_transfer_progress");
    check(pq_redis_get_finish(transfer), "pq_redis_get_finish");
    stream_s.push_back(now_s() - t);
    pq_redis_transfer_free(transfer);
    check(pq_sequence_remove(dst.ctx, seq++), "pq_sequence_remove");
    // A file (the page cache keeps it: a warm file).
    t = now_s();
    check(pq_sequence_save_file(src.ctx, 1, path.c_str()), "pq_sequence_save_file");
    save_s.push_back(now_s() - t);
    {
      std::ifstream f(path, std::ios::binary | std::ios::ate);
      file_bytes = static_cast<uint64_t>(f.tellg());
    }
    t = now_s();
    check(pq_sequence_restore_file(dst.ctx, seq, path.c_str()), "pq_sequence_restore_file");
    restore_s.push_back(now_s() - t);
    restore_sel_s.push_back(dst.first_select(seq));
    check(pq_sequence_remove(dst.ctx, seq++), "pq_sequence_remove");
    std::remove(path.c_str());
    // Re-prefill: the K/V again, and the index built again.
    t = now_s();
    dst.prefill(seq);
    prefill_s.push_back(now_s() - t);
    prefill_sel_s.push_back(dst.first_select(seq));
    check(pq_sequence_remove(dst.ctx, seq++), "pq_sequence_remove");
    std::printf("bench_redis: rep %d: redis put %.3f get %.3f | streamed begin %.3f whole %.3f | "
                "file save %.3f restore %.3f | re-prefill %.3f s\n",
                rep, put_s.back(), get_s.back(), begin_s.back(), stream_s.back(), save_s.back(),
                restore_s.back(), prefill_s.back());
    std::fflush(stdout);
  }
  std::string used = "?";
  {
    pqrt::RawRedis raw(server.port());
    std::string info = raw.run({"INFO", "memory"});
    size_t at = info.find("used_memory_human:");
    if (at != std::string::npos) used = info.substr(at + 18, info.find('\r', at) - at - 18);
  }

  const double kv_gib = g.kv_bytes() / 1073741824.0;
  std::printf("\nbench_redis: %lld tokens x %d layers x %d kv heads x %d dims, f16: "
              "K/V %.2f GiB; state %llu bytes (%.2f GiB); file %llu bytes; Redis used_memory %s; "
              "block %llu KiB (%llu blocks); %d reps, medians\n",
              static_cast<long long>(g.tokens), g.layers, g.kv_heads, g.head_dim, kv_gib,
              static_cast<unsigned long long>(state_bytes), state_bytes / 1073741824.0,
              static_cast<unsigned long long>(file_bytes), used.c_str(),
              static_cast<unsigned long long>(block_kib),
              static_cast<unsigned long long>((state_bytes + block - 1) / block), reps);
  const double pf = median(prefill_s), pf_sel = median(prefill_sel_s);
  auto row = [&](const char* name, double save, double restore, double sel) {
    const double gibs = restore > 0 ? state_bytes / 1073741824.0 / restore : 0;
    std::printf("  %-12s save %8.3f s   restore %8.3f s (%5.2f GiB/s)   first select %7.2f ms   "
                "restore+select / re-prefill+select %.3f\n",
                name, save, restore, gibs, sel * 1e3, (restore + sel) / (pf + pf_sel));
  };
  row("redis", median(put_s), median(get_s), median(get_sel_s));
  row("file", median(save_s), median(restore_s), median(restore_sel_s));
  std::printf("  %-12s                  prefill+build %8.3f s   first select %7.2f ms\n",
              "re-prefill", pf, pf_sel * 1e3);
  // Time to the first selection: the streaming get against the whole get and
  // the re-prefill.
  const double begin_first = median(begin_s) + median(begin_sel_s);
  const double get_first = median(get_s) + median(get_sel_s);
  std::printf("  %-12s begin %8.3f s (%.2f MiB fetched, %.2f%% of the state)   first select "
              "%7.2f ms   whole %8.3f s\n",
              "redis stream", median(begin_s), begin_bytes / 1048576.0,
              100.0 * begin_bytes / state_bytes, median(begin_sel_s) * 1e3, median(stream_s));
  std::printf("  time to the first selection: streamed %.3f s, whole get %.3f s (%.1fx sooner), "
              "re-prefill %.3f s (%.1fx sooner)\n",
              begin_first, get_first, get_first / begin_first, pf + pf_sel,
              (pf + pf_sel) / begin_first);
  std::printf("bench_redis: load average at end: %s\n", loadavg().c_str());

  pq_redis_close(conn);
  pq_destroy(src.ctx);
  pq_destroy(dst.ctx);
  server.stop();
  return 0;
}
