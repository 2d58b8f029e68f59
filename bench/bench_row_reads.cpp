// bench_row_reads.cpp - what this machine's memory gives the attend's
// reads: the K and V rows of a selection (1/5 of the tokens of each of 8 kv
// heads, 256-byte rows: head_dim 128 in f16/bf16), read with no arithmetic
// on two threads (4 kv heads each, as the attend's pool splits them), each
// read timed after the caches were evicted (cache_evictor.h: what the other
// layers' decode step leaves), against the same number of bytes read in
// order. The attend cannot read its rows faster than the fastest of these
// reads; docs/perf.md compares it with them.
//
// Variants, rotated round by round:
//   store T1/64      the store's layout (chunks of 256 tokens, a kv head's
//                    rows adjacent, K and V in separate blocks, 2 MiB
//                    pages), each row's 8 lines prefetched into L2 64 rows
//                    ahead: what attention_avx512.cpp does
//   store none       the same with no software prefetch
//   store T2/128     prefetched into L3 128 rows ahead
//   store T0/16      prefetched into L1 16 rows ahead
//   K|V T1/64        K and V of a token and kv head adjacent (512 bytes)
//   store warm       store T1/64 right after the same read, no eviction:
//                    what a benchmark that repeats one selection measures
//                    where the last-level cache holds the rows
//   in order         the same bytes from the start of the K and V blocks
// Printed per variant: the median over rounds, GB/s of K+V rows, and the
// median and range of the per-round ratio of its GB/s to "in order".
//
//   bench_row_reads [--tokens 32768,131072] [--rounds 9]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_data.h"
#include "cache_evictor.h"
#include "huge_page_buffer.h"

namespace {

using pqbench::median;
constexpr int32_t kKv = pqbench::kKvHeads;
constexpr int64_t kChunk = 256, kRowBytes = 256;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Where a token's K and V rows of a kv head lie.
struct Layout {
  const uint8_t* keys;
  const uint8_t* values;
  bool adjacent;  // K|V: values unused, a token's V right after its K
  const uint8_t* key(int64_t t, int32_t h) const {
    const int64_t row = adjacent ? 2 * kRowBytes : kRowBytes;
    return keys + ((t / kChunk) * kKv + h) * kChunk * row + (t % kChunk) * row;
  }
  const uint8_t* value(int64_t t, int32_t h) const {
    if (adjacent) return key(t, h) + kRowBytes;
    return values + ((t / kChunk) * kKv + h) * kChunk * kRowBytes + (t % kChunk) * kRowBytes;
  }
};

struct Prefetch {
  int locality;  // __builtin_prefetch's: 3 = T0, 2 = T1, 1 = T2; -1 none
  int64_t ahead;
};

// 256 bytes xor-ed into acc, 32 bytes a load (AVX2, which every machine of
// this project has; main checks), two chains. Intrinsics, not memcpy into
// vector types: GCC moved those through the stack, and the reloads' stalls
// bounded the in-order read at two thirds of the machine's.
#define PQ_READS_TARGET __attribute__((target("avx2")))
struct Lanes {
  __m256i a, b;
};

PQ_READS_TARGET inline Lanes read_row(const uint8_t* p, Lanes acc) {
  const auto* v = reinterpret_cast<const __m256i*>(p);
  for (int64_t i = 0; i < kRowBytes / 32; i += 2) {
    acc.a = _mm256_xor_si256(acc.a, _mm256_loadu_si256(v + i));
    acc.b = _mm256_xor_si256(acc.b, _mm256_loadu_si256(v + i + 1));
  }
  return acc;
}

PQ_READS_TARGET inline uint64_t lanes_sum(Lanes acc) {
  alignas(32) uint64_t w[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(w), _mm256_xor_si256(acc.a, acc.b));
  return w[0] + w[1] + w[2] + w[3];
}

template <int L>
inline void prefetch_row(const Layout& s, int64_t t, int32_t h) {
  const auto* k = s.key(t, h);
  const auto* v = s.value(t, h);
  for (int64_t b = 0; b < kRowBytes; b += 64) {
    __builtin_prefetch(k + b, 0, L);
    __builtin_prefetch(v + b, 0, L);
  }
}

using Selection = std::vector<std::vector<int32_t>>;

template <int L>
PQ_READS_TARGET uint64_t read_heads_with(const Layout& s, const Selection& sel, int32_t first,
                                         int64_t ahead) {
  Lanes acc = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  for (int32_t h = first; h < kKv; h += 2) {
    const std::vector<int32_t>& p = sel[static_cast<size_t>(h)];
    const int64_t n = static_cast<int64_t>(p.size());
    if (L >= 0)
      for (int64_t i = 0; i < std::min(n, ahead); ++i) prefetch_row<L < 0 ? 0 : L>(s, p[i], h);
    for (int64_t i = 0; i < n; ++i) {
      if (L >= 0 && i + ahead < n) prefetch_row<L < 0 ? 0 : L>(s, p[i + ahead], h);
      acc = read_row(s.value(p[i], h), read_row(s.key(p[i], h), acc));
    }
  }
  return lanes_sum(acc);
}

// kv heads first, first + 2, ... of the selection (the prefetch's
// locality is a compile-time argument of __builtin_prefetch).
PQ_READS_TARGET uint64_t read_heads(const Layout& s, const Selection& sel, int32_t first,
                                    Prefetch f) {
  switch (f.locality) {
    case 3: return read_heads_with<3>(s, sel, first, f.ahead);
    case 2: return read_heads_with<2>(s, sel, first, f.ahead);
    case 1: return read_heads_with<1>(s, sel, first, f.ahead);
    default: return read_heads_with<-1>(s, sel, first, 0);
  }
}

PQ_READS_TARGET uint64_t read_in_order(const uint8_t* keys, const uint8_t* values, size_t from,
                                       size_t to) {
  Lanes acc = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  for (size_t b = from; b < to; b += kRowBytes) acc = read_row(values + b, read_row(keys + b, acc));
  return lanes_sum(acc);
}

struct Variant {
  std::string name;
  bool adjacent = false, in_order = false, warm = false;
  Prefetch prefetch{2, 64};
};

void run(int64_t tokens, int rounds, const pqbench::CacheEvictor& evictor, uint64_t& sink) {
  pqbench::Rng rng{42};
  const auto sel = pqbench::random_selection(tokens, kKv, rng);
  int64_t rows = 0;
  for (const auto& p : sel) rows += static_cast<int64_t>(p.size());
  const int64_t chunks = (tokens + kChunk - 1) / kChunk;
  const size_t block = static_cast<size_t>(chunks * kKv * kChunk * kRowBytes);
  const pqbench::HugePageBuffer keys_buffer("bench_row_reads", block, 1),
      values_buffer("bench_row_reads", block, 2), pairs_buffer("bench_row_reads", 2 * block, 3);
  const uint8_t* keys = keys_buffer.data();
  const uint8_t* values = values_buffer.data();
  const Layout store{keys, values, false}, adjacent{pairs_buffer.data(), nullptr, true};
  const std::vector<Variant> variants = {
      {"store T1/64", false, false, false, {2, 64}},
      {"store none", false, false, false, {-1, 0}},
      {"store T2/128", false, false, false, {1, 128}},
      {"store T0/16", false, false, false, {3, 16}},
      {"K|V T1/64", true, false, false, {2, 64}},
      {"store warm", false, false, true, {2, 64}},
      {"in order", false, true, false, {-1, 0}}};
  const size_t n = variants.size(), in_order = n - 1;
  // Each thread reads half the rows' bytes in order, so the K and V
  // prefixes it reads hold as many bytes as the rows.
  const size_t half = static_cast<size_t>(rows / 2 * kRowBytes) & ~size_t{63};
  std::vector<std::vector<double>> ms(n), share(n);
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> round_ms(n);
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (k + static_cast<size_t>(r)) % n;
      const Variant& v = variants[i];
      const Layout& s = v.adjacent ? adjacent : store;
      auto once = [&] {
        uint64_t a = 0, b = 0;
        const double t0 = now();
        std::thread other([&] {
          a = v.in_order ? read_in_order(keys, values, half, 2 * half)
                         : read_heads(s, sel, 1, v.prefetch);
        });
        b = v.in_order ? read_in_order(keys, values, 0, half) : read_heads(s, sel, 0, v.prefetch);
        other.join();
        const double t = now() - t0;
        sink += a + b;
        return t;
      };
      if (v.warm) once();  // the same rows just read: what stays in the last-level cache
      else sink += evictor.evict();
      round_ms[i] = once() * 1e3;
    }
    for (size_t i = 0; i < n; ++i) {
      ms[i].push_back(round_ms[i]);
      share[i].push_back(round_ms[in_order] / round_ms[i]);
    }
  }
  const double mb = static_cast<double>(rows) * 2 * kRowBytes / 1e6;
  for (size_t i = 0; i < n; ++i) {
    const double m = median(ms[i]);
    std::printf("%8lld tokens  %-13s %7.3f ms  %5.1f GB/s  of in order: %.2f (rounds %.2f-%.2f)"
                "  load %.2f\n",
                static_cast<long long>(tokens), variants[i].name.c_str(), m, mb / m,
                median(share[i]), *std::min_element(share[i].begin(), share[i].end()),
                *std::max_element(share[i].begin(), share[i].end()), pqbench::load_average());
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("avx2")) {
    std::printf("bench_row_reads: SKIPPED: its reads use AVX2, which this CPU does not have\n");
    return 0;
  }
  const pqbench::StepOptions o =
      pqbench::step_options("bench_row_reads", argc, argv, {{32768, 131072}, 9, 1});
  const pqbench::CacheEvictor evictor;
  std::printf("8 kv heads, 256-byte K and V rows, 1/5 of the tokens; 2 threads; each read after "
              "reading %zu MiB (last-level cache %zu MiB) unless warm; %d rounds, variants "
              "rotated\n",
              evictor.bytes() >> 20, pqbench::last_level_cache_bytes() >> 20, o.rounds);
  uint64_t sink = 0;
  for (int64_t tokens : o.tokens) run(tokens, o.rounds, evictor, sink);
  return sink == 42 ? 3 : 0;  // the reads' sum used, so they are not optimised away
}
