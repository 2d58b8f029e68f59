// Synthetic data helpers shared by the benchmark programs: a seeded
// SplitMix64 generator and f16 rounding (round to nearest even), so that
// every benchmark builds the same kind of data the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <memory>
#include <vector>

#include "pqcache.h"

namespace pqbench {

// One layer of a Llama-3-8B-like model: 32 query heads, 8 kv heads (GQA 4),
// head_dim 128, f16; the default PQ setting (4 x 8 bits at head_dim 128);
// top-k 1/5 of the middle tokens.
constexpr int kQHeads = 32;
constexpr int kKvHeads = 8;
constexpr int kGroup = kQHeads / kKvHeads;
constexpr int kHeadDim = 128;
constexpr float kTopkFraction = 0.2f;

// The machine a figure holds on: the CPU's model, the widest vector ISA the
// library's CPU kernels could use, and the 1-minute load average (-1 when
// /proc cannot tell).
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}
// The kernels the library uses here (pq_cpu_level: "avx512+bf16",
// "avx512", "avx2", "portable"; PQ_CPU_LEVEL lowers it).
inline const char* isa_level() { return pq_cpu_level(); }
inline double load_average() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

// A benchmark cannot go on after a failed call: says which and exits.
inline void check_status(const char* program, pq_status st, const char* what) {
  if (st != PQ_OK) {
    std::fprintf(stderr, "%s: %s: %s: %s\n", program, what, pq_status_string(st), pq_last_error());
    std::exit(1);
  }
}

// "4096,32768" -> {4096, 32768}: the list options of the benchmark programs.
inline std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p;) {
    out.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return out;
}

// The options of the interleaved decode-step programs (bench_fp8,
// bench_attend_kernels): --tokens a,b --rounds n --steps n over the
// defaults given. Exits with a message on another option. Prints the
// program's first line: the CPU, the kernels and the load.
struct StepOptions {
  std::vector<int64_t> tokens;
  int rounds, steps;
};
inline StepOptions step_options(const char* program, int argc, char** argv, StepOptions o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokens") o.tokens = parse_list(argv[i + 1]);
    else if (a == "--rounds") o.rounds = std::atoi(argv[i + 1]);
    else if (a == "--steps") o.steps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "%s: unknown option %s\n", program, a.c_str());
      std::exit(2);
    }
  }
  std::printf("%s: CPU %s, ISA %s, load average %.2f at start\n", program, cpu_model().c_str(),
              isa_level(), load_average());
  return o;
}

// The median of a benchmark's repeats (the upper one of an even count; 0
// for none).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

inline pq_config layer_config(int32_t kmeans_iterations) {
  pq_config cfg;
  pq_config_default(&cfg);
  cfg.num_layers = 1;
  cfg.num_q_heads = kQHeads;
  cfg.num_kv_heads = kKvHeads;
  cfg.head_dim = kHeadDim;
  cfg.dtype = PQ_DTYPE_F16;
  cfg.topk_fraction = kTopkFraction;
  cfg.kmeans_iterations = kmeans_iterations;
  return cfg;
}

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }
  // Approximately N(0, 1): the sum of four uniforms, rescaled (cheap, and
  // only the clustered shape matters here).
  float gauss() {
    return (uniform() + uniform() + uniform() + uniform() - 2.0f) * 1.7320508f;
  }
};

// Each kv head's selection as the benches draw it: 4 sinks, the last 128
// tokens and random middle tokens up to a fifth of all, ascending.
inline std::vector<std::vector<int32_t>> random_selection(int64_t tokens, int32_t kv_heads,
                                                          Rng& rng) {
  std::vector<std::vector<int32_t>> sel(static_cast<size_t>(kv_heads));
  const int64_t want = tokens / 5;
  for (auto& p : sel) {
    std::vector<char> taken(static_cast<size_t>(tokens), 0);
    for (int64_t t = 0; t < 4; ++t) taken[t] = 1;
    for (int64_t t = tokens - 128; t < tokens; ++t) taken[t] = 1;
    for (int64_t n = 132; n < want;) {
      const int64_t t = 4 + static_cast<int64_t>(rng.next() % static_cast<uint64_t>(tokens - 132));
      if (!taken[t]) taken[t] = 1, ++n;
    }
    for (int64_t t = 0; t < tokens; ++t)
      if (taken[t]) p.push_back(static_cast<int32_t>(t));
  }
  return sel;
}

inline uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, mant = x & 0x7FFFFFu;
  int32_t exp = int32_t((x >> 23) & 0xFFu) - 127 + 15;
  if (((x >> 23) & 0xFFu) == 0xFFu) return uint16_t(sign | 0x7C00u | (mant ? 0x200u : 0u));
  if (exp >= 31) return uint16_t(sign | 0x7C00u);
  if (exp <= 0) {
    if (exp < -10) return uint16_t(sign);
    mant |= 0x800000u;
    uint32_t shift = uint32_t(14 - exp), half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = sign | (uint32_t(exp) << 10) | (mant >> 13);
  if ((mant & 0x1FFFu) > 0x1000u || ((mant & 0x1FFFu) == 0x1000u && (half & 1u))) ++half;
  return uint16_t(half);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) { mant <<= 1; --exp; }
      x = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7F800000u | (mant << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// Clustered keys: kClusters Gaussian centres per kv head, each token a random
// centre plus noise (0.35); Gaussian values; `queries` queries of kQHeads
// heads, each kv head's group aimed at a random centre. Token-major f16,
// seeded. scaled_centres scales each centre by U(0.6, 1.4).
struct ClusteredKv {
  int64_t tokens = 0;
  std::vector<uint16_t> keys, values;
  std::vector<uint16_t> queries;  // [query][q_head][head_dim]
};

inline std::unique_ptr<ClusteredKv> make_clustered_kv(int64_t tokens, uint64_t seed, int queries,
                                                      bool scaled_centres) {
  constexpr int kClusters = 64;
  auto t = std::make_unique<ClusteredKv>();
  t->tokens = tokens;
  Rng rng{seed ^ uint64_t(tokens)};
  std::vector<float> centres(size_t(kKvHeads) * kClusters * kHeadDim);
  for (int c = 0; c < kKvHeads * kClusters; ++c) {
    const float scale = scaled_centres ? 0.6f + 0.8f * rng.uniform() : 1.0f;
    for (int d = 0; d < kHeadDim; ++d) centres[size_t(c) * kHeadDim + d] = scale * rng.gauss();
  }
  const size_t n = size_t(tokens) * kKvHeads * kHeadDim;
  t->keys.resize(n);
  t->values.resize(n);
  for (int64_t tok = 0; tok < tokens; ++tok)
    for (int h = 0; h < kKvHeads; ++h) {
      const float* c = &centres[(size_t(h) * kClusters + rng.next() % kClusters) * kHeadDim];
      uint16_t* k = &t->keys[(size_t(tok) * kKvHeads + h) * kHeadDim];
      uint16_t* v = &t->values[(size_t(tok) * kKvHeads + h) * kHeadDim];
      for (int d = 0; d < kHeadDim; ++d) {
        k[d] = f32_to_f16(c[d] + 0.35f * rng.gauss());
        v[d] = f32_to_f16(rng.gauss());
      }
    }
  t->queries.resize(size_t(queries) * kQHeads * kHeadDim);
  for (int q = 0; q < queries; ++q)
    for (int h = 0; h < kKvHeads; ++h) {
      const float* c = &centres[(size_t(h) * kClusters + rng.next() % kClusters) * kHeadDim];
      for (int g = 0; g < kGroup; ++g)
        for (int d = 0; d < kHeadDim; ++d)
          t->queries[(size_t(q) * kQHeads + size_t(h) * kGroup + g) * kHeadDim + d] =
              f32_to_f16(1.5f * c[d] + 0.5f * rng.gauss());
    }
  return t;
}

}  // namespace pqbench

