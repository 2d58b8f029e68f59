// The AVX-512 attend's kernel variants against each other, interleaved in
// one process (docs/perf.md, "AMX-BF16 and AVX512_FP16 in the attend"):
// the project's bench workload (32 q / 8 kv heads, head_dim 128, 1/5 of the
// tokens selected: 4 sinks, 128 local, the rest random middle tokens in
// ascending order), rows in the host store's layout (chunks of 256 tokens,
// a kv head's rows adjacent, K and V in separate blocks, 2 MiB pages), the
// attend's two threads (the pool's worker and the caller, a kv head a task,
// as layer_attend.cpp). Per round every variant runs `steps` attends, the
// order rotating round by round; printed per variant: the median over
// rounds of each round's median attend, the GB/s of K+V rows that is, and
// the median and range of the per-round ratio to the first variant; the
// load average with every row; and the largest difference of each
// variant's output from the first's.
// The same selection is attended again and again: where the last-level
// cache holds its rows (the Intel guest of docs/perf.md reports 480 MiB;
// a 128K selection is 107 MB) they come from that cache, so compare the
// variants by their ratios; bench_row_reads gives the cold floor.
//
// Links the library's objects (pqcache_core) to call each variant.
//
//   bench_attend_kernels [--tokens 4096,32768,131072] [--rounds 9] [--steps 16]

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/attention.h"
#include "base/cpu_dispatch.h"
#include "base/dtype.h"
#include "base/thread_pool.h"
#include "bench_data.h"
#include "huge_page_buffer.h"
#include "pqcache.h"

namespace {

using pqbench::median;
constexpr int32_t kKv = pqbench::kKvHeads, kGroup = pqbench::kGroup, kDim = pqbench::kHeadDim;
constexpr int64_t kChunk = pq::RowTable::kChunkTokens;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// K and V of `tokens` tokens of every kv head in the store's layout.
struct Store {
  pq::RowTable table;
  pqbench::HugePageBuffer keys, values;

  Store(int32_t dtype, int64_t tokens, pqbench::Rng& rng)
      : keys("bench_attend_kernels", bytes_of(dtype, tokens), 0),
        values("bench_attend_kernels", bytes_of(dtype, tokens), 0) {
    const size_t row = pq::dtype_size(dtype) * kDim, block = row * kChunk * kKv;
    const int64_t chunks = (tokens + kChunk - 1) / kChunk;
    for (uint8_t* base : {keys.data(), values.data()})
      for (size_t i = 0; i < keys.bytes() / 2; ++i) {
        const float f = rng.gauss();
        const uint16_t h = dtype == PQ_DTYPE_F16 ? pq::float_to_half(f) : pq::float_to_bf16(f);
        std::memcpy(base + 2 * i, &h, 2);
      }
    for (int64_t c = 0; c < chunks; ++c) {
      table.keys.push_back(keys.data() + c * block);
      table.values.push_back(values.data() + c * block);
    }
    table.row_bytes = row;
    table.head_bytes = row * kChunk;
    table.head_dim = kDim;
    table.dtype = dtype;
  }
  static size_t bytes_of(int32_t dtype, int64_t tokens) {
    const size_t chunks = static_cast<size_t>((tokens + kChunk - 1) / kChunk);
    return pq::dtype_size(dtype) * kDim * kChunk * kKv * chunks;
  }
};

struct Variant {
  std::string name;
  int32_t dtype;
  pq::AttendLogits logits;
  pq::F16Conversion f16 = pq::F16Conversion::kF16c;
};

// One attend of every kv head with the variant's kernel on the pool and
// the caller; out: [kv head][group][d] after the merge.
bool attend(const Variant& v, const Store& s, const std::vector<std::vector<int32_t>>& sel,
            const std::vector<float>& q, pq::ThreadPool& pool, std::vector<float>& out) {
  std::vector<float> acc(static_cast<size_t>(kKv) * kGroup * kDim), max(kKv * kGroup);
  std::vector<double> sum(kKv * kGroup);
  std::vector<char> ok(kKv, 0);
  auto part = [&](int64_t h) {
    return pq::AttentionPart{acc.data() + h * kGroup * kDim, max.data() + h * kGroup,
                             sum.data() + h * kGroup};
  };
  pool.parallel_for(kKv, [&](int64_t h) {
    const auto& p = sel[static_cast<size_t>(h)];
    std::fill(acc.begin() + h * kGroup * kDim, acc.begin() + (h + 1) * kGroup * kDim, 0.f);
    ok[h] = pq::attend_rows_avx512_with(s.table, static_cast<int32_t>(h), p.data(),
                                        static_cast<int64_t>(p.size()), q.data() + h * kGroup * kDim,
                                        kGroup, 1.f / std::sqrt(float(kDim)), part(h), v.logits, v.f16);
  });
  out.resize(acc.size());
  for (int32_t h = 0; h < kKv; ++h) {
    const pq::AttentionPart p = part(h);
    pq::merge_attention(&p, 1, kGroup, kDim, out.data() + h * kGroup * kDim, nullptr);
  }
  return std::all_of(ok.begin(), ok.end(), [](char c) { return c != 0; });
}

void run(int64_t tokens, const std::vector<Variant>& variants, int rounds, int steps) {
  pqbench::Rng rng{42};
  const auto sel = pqbench::random_selection(tokens, kKv, rng);
  std::vector<float> q(static_cast<size_t>(kKv) * kGroup * kDim);
  for (float& x : q) x = pq::bf16_to_float(pq::float_to_bf16(1.5f * rng.gauss()));
  int64_t rows = 0;
  for (const auto& p : sel) rows += static_cast<int64_t>(p.size());
  std::vector<std::unique_ptr<Store>> stores;  // one per dtype, shared by its variants
  std::vector<const Store*> store_of;
  for (const Variant& v : variants) {
    const Store* found = nullptr;
    for (const auto& s : stores)
      if (s->table.dtype == v.dtype) found = s.get();
    if (found == nullptr) {
      pqbench::Rng data{7};
      stores.push_back(std::make_unique<Store>(v.dtype, tokens, data));
      found = stores.back().get();
    }
    store_of.push_back(found);
  }
  pq::ThreadPool pool(1);  // + the caller: the attend's two threads here
  const size_t n = variants.size();
  std::vector<std::vector<float>> first(n);
  std::vector<bool> usable(n);
  for (size_t i = 0; i < n; ++i) usable[i] = attend(variants[i], *store_of[i], sel, q, pool, first[i]);
  std::vector<std::vector<double>> ms(n), ratio(n);
  std::vector<float> out;
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> round_ms(n, 0.0);
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (k + static_cast<size_t>(r)) % n;
      if (!usable[i]) continue;
      std::vector<double> t;
      for (int s = 0; s < steps; ++s) {
        const double t0 = now();
        attend(variants[i], *store_of[i], sel, q, pool, out);
        t.push_back(now() - t0);
      }
      round_ms[i] = median(t) * 1e3;
    }
    for (size_t i = 0; i < n; ++i)
      if (usable[i]) {
        ms[i].push_back(round_ms[i]);
        ratio[i].push_back(round_ms[i] / round_ms[0]);
      }
  }
  const double row_bytes = 2.0 * kDim * 2;  // K + V, 16-bit elements
  for (size_t i = 0; i < n; ++i) {
    if (!usable[i]) {
      std::printf("%8lld tokens  %-22s SKIPPED: the CPU or shape does not allow it\n",
                  static_cast<long long>(tokens), variants[i].name.c_str());
      continue;
    }
    double diff = 0;
    if (variants[i].dtype == variants[0].dtype)
      for (size_t j = 0; j < first[i].size(); ++j)
        diff = std::max(diff, static_cast<double>(std::fabs(first[i][j] - first[0][j])));
    const double m = median(ms[i]);
    char diff_text[32] = "-";
    if (variants[i].dtype == variants[0].dtype) std::snprintf(diff_text, sizeof diff_text, "%.1e", diff);
    std::printf("%8lld tokens  %-22s attend %7.3f ms  %5.1f GB/s  / %s: %.3f (rounds %.3f-%.3f)"
                "  max |out - %s| %s  load %.2f\n",
                static_cast<long long>(tokens), variants[i].name.c_str(), m,
                rows * row_bytes / (m * 1e-3) / 1e9, variants[0].name.c_str(), median(ratio[i]),
                *std::min_element(ratio[i].begin(), ratio[i].end()),
                *std::max_element(ratio[i].begin(), ratio[i].end()), variants[0].name.c_str(),
                diff_text,
                pqbench::load_average());
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const auto [token_counts, rounds, steps] =
      pqbench::step_options("bench_attend_kernels", argc, argv, {{32768, 131072}, 9, 16});
  std::printf("%d kv heads x %d query heads, head_dim %d, 1/5 selected; %d rounds of %d attends, "
              "variants interleaved; ratios per round to the first variant\n",
              kKv, kGroup, kDim, rounds, steps);
  const std::vector<Variant> variants = {
      {"bf16 VDPBF16PS logits", PQ_DTYPE_BF16, pq::AttendLogits::kBf16Dot},
      {"bf16 AMX-BF16 logits", PQ_DTYPE_BF16, pq::AttendLogits::kAmxBf16},
      {"bf16 FMA logits", PQ_DTYPE_BF16, pq::AttendLogits::kFma},
  };
  const std::vector<Variant> f16_variants = {
      {"f16 VCVTPH2PS", PQ_DTYPE_F16, pq::AttendLogits::kFma},
      {"f16 VCVTPH2PSX", PQ_DTYPE_F16, pq::AttendLogits::kFma, pq::F16Conversion::kAvx512Fp16},
  };
  for (const int64_t tokens : token_counts) {
    run(tokens, variants, rounds, steps);
    run(tokens, f16_variants, rounds, steps);
  }
  return 0;
}
