// fp8 K/V (PQ_DTYPE_FP8_E4M3) against f16: one layer of Llama-3-8B
// geometry (32 q heads, 8 kv heads x 128), the default index and top-k 1/5,
// the CPU backend. Both contexts hold the same clustered keys and values
// (the fp8 one rounded to e4m3 with one scale per tensor, as vLLM keeps
// them) and take the same f16 queries. Per round, alternating which goes
// first, each context runs `steps` decode steps of pq_decode_select then
// pq_decode_attend over that selection; printed: the medians over rounds
// of each round's median step, select + attend and attend alone, and the
// ratio f16 / fp8 of each (per round, then its median). Last, the floor of
// the attend: the same rows read with no arithmetic, and as many bytes
// read in order (rows_read_ms), each read after the caches were evicted
// (cache_evictor.h; bench_row_reads compares more ways to read them).
//
// First, the two ways to turn 8 fp8 codes into 8 floats with AVX2 that the
// attention kernel could use, over the same bytes: F16C on the codes moved
// into binary16 bit patterns (what the library does), and a gather from a
// 256-entry table.
//
//   bench_fp8 [--tokens 32768,131072] [--rounds 7] [--steps 16]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_data.h"
#include "cache_evictor.h"
#include "huge_page_buffer.h"
#include "pqcache.h"

namespace {

using pqbench::median;

void check(pq_status s, const char* what) { pqbench::check_status("bench_fp8", s, what); }

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr int32_t kQ = pqbench::kQHeads, kKv = pqbench::kKvHeads, kDim = pqbench::kHeadDim;
constexpr float kScale = 0.5f;  // real = stored * scale, K and V alike

// e4m3fn code nearest to x (ties to the even code), from the value table.
struct E4m3 {
  float value[256];
  E4m3() {
    for (int b = 0; b < 256; ++b) {
      const int e = (b >> 3) & 15, m = b & 7;
      const float mag = e == 0 ? std::ldexp(m / 8.f, -6) : std::ldexp(1.f + m / 8.f, e - 7);
      value[b] = (e == 15 && m == 7) ? NAN : (b & 0x80 ? -mag : mag);
    }
  }
  // Codes 0..0x7E hold the magnitudes ascending (0x7F is NaN): a binary
  // search, then the nearer neighbour (ties to the even code); saturates
  // at 448 as engines' casts do.
  uint8_t encode(float x) const {
    const float a = std::fabs(x);
    const int sign = x < 0 ? 0x80 : 0;
    const float* hi = std::lower_bound(value, value + 0x7F, a);
    int b = static_cast<int>(hi - value);
    if (b == 0x7F) b = 0x7E;
    else if (b > 0) {
      const float up = value[b] - a, down = a - value[b - 1];
      if (down < up || (down == up && (b & 1) != 0)) --b;
    }
    return static_cast<uint8_t>(b | sign);
  }
};

// --- 8 codes -> 8 floats, two ways -----------------------------------------

// The bit route, the codes widened by an unpack against zero or by a sign
// extension (one instruction fewer per 8 codes, the mask then clears bit 14).
template <bool kSignExtend>
__attribute__((target("avx2,f16c"))) float sum_f16c(const uint8_t* p, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + i));
    const __m128i w = kSignExtend ? _mm_slli_epi16(_mm_cvtepi8_epi16(codes), 7)
                                  : _mm_srai_epi16(_mm_unpacklo_epi8(_mm_setzero_si128(), codes), 1);
    acc = _mm256_add_ps(
        acc, _mm256_cvtph_ps(_mm_and_si128(w, _mm_set1_epi16(static_cast<short>(0xBF80)))));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  return (lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7]) *
         256.f;
}

__attribute__((target("avx2"))) float sum_gather(const uint8_t* p, int64_t n, const float* table) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + i)));
    acc = _mm256_add_ps(acc, _mm256_i32gather_ps(table, idx, 4));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

void conversion(const E4m3& e4m3, int rounds) {
  // 16 KiB of codes: in L1, so the conversion and not memory is timed.
  std::vector<uint8_t> codes(16384);
  pqbench::Rng rng{7};
  for (uint8_t& c : codes) c = static_cast<uint8_t>(rng.next() % 0x7E);  // finite, >= 0
  std::vector<double> unpack, extend, gather;
  float sink = 0;
  auto time = [&](auto&& f) {
    constexpr int kReps = 2000;
    const double t0 = now();
    for (int i = 0; i < kReps; ++i) {
      asm volatile("" : : "r"(codes.data()) : "memory");  // the codes may have changed
      sink += f();
    }
    return (now() - t0) / (kReps * 16384.0) * 1e9;
  };
  for (int r = 0; r < rounds; ++r) {
    unpack.push_back(time([&] { return sum_f16c<false>(codes.data(), 16384); }));
    extend.push_back(time([&] { return sum_f16c<true>(codes.data(), 16384); }));
    gather.push_back(time([&] { return sum_gather(codes.data(), 16384, e4m3.value); }));
  }
  const float a = sum_f16c<false>(codes.data(), 16384), b = sum_gather(codes.data(), 16384, e4m3.value);
  const float c = sum_f16c<true>(codes.data(), 16384);
  std::printf("e4m3 -> float, 16 KiB of codes in L1 (ns per code, median of %d): F16C bit route "
              "by unpack %.3f, by sign extension %.3f, table gather %.3f; sums %s (%g)\n",
              rounds, median(unpack), median(extend), median(gather),
              a == b && b == c ? "equal" : "DIFFER", static_cast<double>(sink > 0 ? a : b));
}

// --- The decode step ------------------------------------------------------

struct Layer {
  pq_context* ctx = nullptr;
  int32_t dtype = 0;
};

pq_tensor tensor(void* data, int32_t dtype, int64_t tokens, int32_t heads) {
  pq_tensor t;
  check(pq_tensor_init(&t, data, dtype, PQ_LAYOUT_TOKEN_MAJOR, tokens, heads, kDim),
        "pq_tensor_init");
  return t;
}

Layer make_layer(int32_t dtype, const pqbench::ClusteredKv& kv, const E4m3& e4m3) {
  pq_config c;
  pq_config_default(&c);  // the default index (4 x 8 bits at head_dim 128), top-k 1/5
  c.num_layers = 1;
  c.num_q_heads = kQ;
  c.num_kv_heads = kKv;
  c.head_dim = kDim;
  c.dtype = dtype;
  c.kmeans_iterations = 8;  // the build's time is not measured; its length is fixed
  const float scales[2] = {kScale, kScale};
  if (dtype == PQ_DTYPE_FP8_E4M3) {
    c.kv_scale_count = 1;
    c.kv_scales = scales;
  }
  Layer l;
  l.dtype = dtype;
  check(pq_create(&c, &l.ctx), "pq_create");
  check(pq_sequence_add(l.ctx, 1), "pq_sequence_add");
  if (dtype == PQ_DTYPE_F16) {
    pq_tensor k = tensor(const_cast<uint16_t*>(kv.keys.data()), dtype, kv.tokens, kKv);
    pq_tensor v = tensor(const_cast<uint16_t*>(kv.values.data()), dtype, kv.tokens, kKv);
    check(pq_prefill_layer(l.ctx, 1, 0, &k, &v), "pq_prefill_layer");
  } else {
    std::vector<uint8_t> k(kv.keys.size()), v(kv.values.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = e4m3.encode(pqbench::f16_to_f32(kv.keys[i]) / kScale);
      v[i] = e4m3.encode(pqbench::f16_to_f32(kv.values[i]) / kScale);
    }
    pq_tensor kt = tensor(k.data(), dtype, kv.tokens, kKv);
    pq_tensor vt = tensor(v.data(), dtype, kv.tokens, kKv);
    check(pq_prefill_layer(l.ctx, 1, 0, &kt, &vt), "pq_prefill_layer");
  }
  check(pq_wait_builds(l.ctx), "pq_wait_builds");
  return l;
}

struct Step {
  double both, attend;  // seconds, the median step of a round
};

Step run_steps(const Layer& l, const pqbench::ClusteredKv& kv, int steps, int queries) {
  int64_t cap = 0;
  check(pq_selection_capacity(l.ctx, 1, 0, &cap), "pq_selection_capacity");
  std::vector<int32_t> positions(static_cast<size_t>(cap) * kKv), counts(kKv);
  pq_selection sel{positions.data(), counts.data(), cap};
  std::vector<float> out(kQ * kDim), lse(kQ);
  std::vector<double> both, attend;
  for (int s = 0; s < steps; ++s) {
    auto* q = const_cast<uint16_t*>(kv.queries.data()) + static_cast<size_t>(s % queries) * kQ * kDim;
    pq_tensor query = tensor(q, PQ_DTYPE_F16, 1, kQ);  // the fp8 context's queries stay f16
    const double t0 = now();
    check(pq_decode_select(l.ctx, 1, 0, &query, &sel), "pq_decode_select");
    const double t1 = now();
    check(pq_decode_attend(l.ctx, 1, 0, &query, &sel, 0.f, out.data(), lse.data()),
          "pq_decode_attend");
    const double t2 = now();
    both.push_back(t2 - t0);
    attend.push_back(t2 - t1);
  }
  return {median(both), median(attend)};
}

// --- The rows read alone -------------------------------------------------

// The floor an attend over a selection could reach on this machine: the
// selected rows of every kv head read and nothing computed, in a copy of
// the host store's layout (chunks of 256 tokens, a kv head's rows adjacent,
// K and V blocks apart), with the attend's threads (two, a half of the kv
// heads each) and its prefetch (T1, 64 rows ahead); and as many bytes read
// sequentially from the same buffers by the same threads, alternated with
// the rows. What scattered rows cost the memory system beyond their bytes:
// an attend's share of the sequential read cannot exceed rows / sequential.
// Medians of `runs`, ms.
struct RowsRead {
  double rows_ms, sequential_ms;
};
RowsRead rows_read_ms(const pq_selection& sel, int64_t tokens, int64_t row_bytes, int runs,
                      const pqbench::CacheEvictor& evictor) {
  constexpr int64_t kChunk = 256, kAhead = 64;
  const int64_t chunks = (tokens + kChunk - 1) / kChunk;
  const size_t block = static_cast<size_t>(kKv * kChunk * row_bytes);
  // On 2 MiB pages where the kernel gives them, as the store's slabs are.
  const pqbench::HugePageBuffer key_rows("bench_fp8", static_cast<size_t>(chunks) * block, 1),
      value_rows("bench_fp8", static_cast<size_t>(chunks) * block, 2);
  const uint8_t* keys = key_rows.data();
  const uint8_t* values = value_rows.data();
  auto row = [&](const uint8_t* base, uint32_t pos, uint32_t head) {
    return base + (pos / kChunk) * block + (head * kChunk + pos % kChunk) * row_bytes;
  };
  auto read_heads = [&](int32_t first, int32_t end, uint64_t* sum) {
    uint64_t s = 0;
    for (int32_t h = first; h < end; ++h) {
      const int32_t* p = sel.positions + h * sel.capacity;
      const int32_t n = sel.counts[h];
      for (int32_t i = 0; i < n; ++i) {
        if (i + kAhead < n)
          for (int64_t b = 0; b < row_bytes; b += 64) {
            __builtin_prefetch(row(keys, p[i + kAhead], h) + b, 0, 2);
            __builtin_prefetch(row(values, p[i + kAhead], h) + b, 0, 2);
          }
        const uint8_t* k = row(keys, p[i], h);
        const uint8_t* v = row(values, p[i], h);
        for (int64_t w = 0; w < row_bytes; w += 8) {
          uint64_t a, b;
          std::memcpy(&a, k + w, 8);
          std::memcpy(&b, v + w, 8);
          s += a ^ b;
        }
      }
    }
    *sum = s;
  };
  // The same bytes in order: each thread reads its half of the rows' count
  // from the start of the K and of the V buffer.
  int64_t selected = 0;
  for (int32_t h = 0; h < kKv; ++h) selected += sel.counts[h];
  const size_t half = static_cast<size_t>(selected / 2 * row_bytes) & ~size_t{63};
  auto read_sequential = [&](size_t from, uint64_t* sum) {
    uint64_t s = 0;
    for (size_t w = from; w < from + half; w += 8) {
      uint64_t a, b;
      std::memcpy(&a, keys + w, 8);
      std::memcpy(&b, values + w, 8);
      s += a ^ b;
    }
    *sum = s;
  };
  std::vector<double> rows_times, sequential_times;
  uint64_t sink = 0;
  for (int r = 0; r < runs; ++r) {
    uint64_t a = 0, b = 0;
    sink += evictor.evict();
    double t0 = now();
    std::thread other(read_heads, 0, kKv / 2, &a);
    read_heads(kKv / 2, kKv, &b);
    other.join();
    rows_times.push_back(now() - t0);
    sink += a + b;
    sink += evictor.evict();
    t0 = now();
    std::thread second(read_sequential, size_t{0}, &a);
    read_sequential(half, &b);
    second.join();
    sequential_times.push_back(now() - t0);
    sink += a + b;
  }
  if (sink == 42) std::printf(" ");  // keeps the reads
  return {median(rows_times) * 1e3, median(sequential_times) * 1e3};
}

// Reads rows at the f16 context's selection of its first query, in both
// row sizes.
void print_rows_read(const Layer& f16, const pqbench::ClusteredKv& kv, int64_t tokens, int runs) {
  int64_t cap = 0;
  check(pq_selection_capacity(f16.ctx, 1, 0, &cap), "pq_selection_capacity");
  std::vector<int32_t> positions(static_cast<size_t>(cap) * kKv), counts(kKv);
  pq_selection sel{positions.data(), counts.data(), cap};
  pq_tensor query = tensor(const_cast<uint16_t*>(kv.queries.data()), PQ_DTYPE_F16, 1, kQ);
  check(pq_decode_select(f16.ctx, 1, 0, &query, &sel), "pq_decode_select");
  std::vector<double> f16_ms, fp8_ms, f16_seq, fp8_seq;
  const pqbench::CacheEvictor evictor;
  for (int r = 0; r < 3; ++r) {  // interleaved
    const RowsRead a = rows_read_ms(sel, tokens, kDim * 2, runs, evictor);
    const RowsRead b = rows_read_ms(sel, tokens, kDim, runs, evictor);
    f16_ms.push_back(a.rows_ms);
    f16_seq.push_back(a.sequential_ms);
    fp8_ms.push_back(b.rows_ms);
    fp8_seq.push_back(b.sequential_ms);
  }
  std::printf("%lld tokens: the selected rows read alone (no arithmetic; store layout, 2 threads, "
              "prefetch 64 rows ahead; caches evicted before each read): f16 %.2f ms, fp8 %.2f ms; "
              "the same bytes read in order: "
              "f16 %.2f ms, fp8 %.2f ms (rows at %.2f, %.2f of the sequential rate)\n",
              static_cast<long long>(tokens), median(f16_ms), median(fp8_ms), median(f16_seq),
              median(fp8_seq), median(f16_seq) / median(f16_ms), median(fp8_seq) / median(fp8_ms));
}

}  // namespace

int main(int argc, char** argv) {
  const auto [token_counts, rounds, steps] =
      pqbench::step_options("bench_fp8", argc, argv, {{32768, 131072}, 7, 16});
  std::printf("one layer: %d q heads, %d kv heads x %d, default index, top-k 1/5, CPU backend; "
              "%d rounds of %d steps, f16 and fp8 alternated\n",
              kQ, kKv, kDim, rounds, steps);
  const E4m3 e4m3;
  conversion(e4m3, rounds);
  constexpr int kQueries = 8;
  for (const int64_t tokens : token_counts) {
    const auto kv = pqbench::make_clustered_kv(tokens, 42, kQueries, false);
    const Layer f16 = make_layer(PQ_DTYPE_F16, *kv, e4m3);
    const Layer fp8 = make_layer(PQ_DTYPE_FP8_E4M3, *kv, e4m3);
    run_steps(f16, *kv, 2, kQueries);  // warm both
    run_steps(fp8, *kv, 2, kQueries);
    std::vector<double> f16_both, f16_attend, fp8_both, fp8_attend, r_both, r_attend;
    for (int r = 0; r < rounds; ++r) {
      Step a, b;
      if (r % 2 == 0) {
        a = run_steps(f16, *kv, steps, kQueries);
        b = run_steps(fp8, *kv, steps, kQueries);
      } else {
        b = run_steps(fp8, *kv, steps, kQueries);
        a = run_steps(f16, *kv, steps, kQueries);
      }
      f16_both.push_back(a.both);
      f16_attend.push_back(a.attend);
      fp8_both.push_back(b.both);
      fp8_attend.push_back(b.attend);
      r_both.push_back(a.both / b.both);
      r_attend.push_back(a.attend / b.attend);
    }
    std::printf("%lld tokens: select+attend f16 %.2f ms, fp8 %.2f ms, ratio %.2fx (per round "
                "%.2f-%.2f); attend alone f16 %.2f ms, fp8 %.2f ms, ratio %.2fx (per round "
                "%.2f-%.2f); load average %.2f\n",
                static_cast<long long>(tokens), median(f16_both) * 1e3, median(fp8_both) * 1e3,
                median(r_both), *std::min_element(r_both.begin(), r_both.end()),
                *std::max_element(r_both.begin(), r_both.end()), median(f16_attend) * 1e3,
                median(fp8_attend) * 1e3, median(r_attend),
                *std::min_element(r_attend.begin(), r_attend.end()),
                *std::max_element(r_attend.begin(), r_attend.end()), pqbench::load_average());
    print_rows_read(f16, *kv, tokens, rounds);
    std::fflush(stdout);
    pq_destroy(f16.ctx);
    pq_destroy(fp8.ctx);
  }
  return 0;
}
