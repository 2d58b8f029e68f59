// Shared helpers for the public-API tests (tests/test_api_*.cpp). They use
// only the public header pqcache.h; everything else (f16/bf16 encoding, the
// exact scores used as a cross-check) is re-implemented here on purpose so
// that the tests do not trust the library for their expectations.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "pqcache.h"

namespace pqt {

// Whether a sanitizer replaced malloc: then glibc's heap figures
// (mallinfo2) say nothing about what the library allocated.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerHeap = true;
#else
constexpr bool kSanitizerHeap = false;
#endif

// ---------------------------------------------------------------------------
// Status assertions
// ---------------------------------------------------------------------------

inline std::string status_name(pq_status s) {
  const char* str = pq_status_string(s);
  return std::string(str ? str : "(null)") + " (" + std::to_string(static_cast<int>(s)) + ")";
}

inline std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Case-insensitive substring test.
inline bool contains_ci(const std::string& haystack, const std::string& needle) {
  return lower(haystack).find(lower(needle)) != std::string::npos;
}

inline bool contains_any_ci(const std::string& haystack,
                            std::initializer_list<const char*> needles) {
  for (const char* n : needles)
    if (contains_ci(haystack, n)) return true;
  return false;
}

inline std::string join(std::initializer_list<const char*> needles) {
  std::string out;
  for (const char* n : needles) {
    if (!out.empty()) out += "|";
    out += n;
  }
  return out;
}

// The call must return `want`, and pq_last_error() must be non-empty and
// contain one of the names (case-insensitive).
inline ::testing::AssertionResult IsError(pq_status got, pq_status want,
                                          std::initializer_list<const char*> names) {
  std::string msg = pq_last_error() ? pq_last_error() : "";
  if (got != want)
    return ::testing::AssertionFailure()
           << "status " << status_name(got) << ", expected " << status_name(want)
           << "; pq_last_error() = \"" << msg << "\"";
  if (msg.empty())
    return ::testing::AssertionFailure() << "status is right but pq_last_error() is empty";
  if (names.size() != 0 && !contains_any_ci(msg, names))
    return ::testing::AssertionFailure()
           << "pq_last_error() = \"" << msg << "\" names none of {" << join(names) << "}";
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult IsOk(pq_status got) {
  if (got == PQ_OK) return ::testing::AssertionSuccess();
  const char* msg = pq_last_error();
  return ::testing::AssertionFailure() << "status " << status_name(got)
                                       << "; pq_last_error() = \"" << (msg ? msg : "") << "\"";
}

#define PQ_ASSERT_OK(call) ASSERT_TRUE(::pqt::IsOk(call)) << #call
#define PQ_EXPECT_OK(call) EXPECT_TRUE(::pqt::IsOk(call)) << #call
// PQ_EXPECT_ERR(call, PQ_ERR_X, "name1", "name2", ...)
#define PQ_EXPECT_ERR(call, want, ...) \
  EXPECT_TRUE(::pqt::IsError((call), (want), {__VA_ARGS__})) << #call

// ---------------------------------------------------------------------------
// f16 / bf16
// ---------------------------------------------------------------------------

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE 754 binary32 -> binary16, round to nearest, ties to even. Handles
// subnormals, overflow to Inf and NaN.
inline uint16_t float_to_half(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // Inf or NaN
    if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  int32_t exp = static_cast<int32_t>(absx >> 23) - 127;  // unbiased
  uint32_t mant = absx & 0x7fffffu;
  if (exp > 15) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow
  if (exp >= -14) {
    // normal half: 10 mantissa bits, drop 13.
    uint32_t hexp = static_cast<uint32_t>(exp + 15);
    uint32_t hm = mant >> 13;
    uint32_t rest = mant & 0x1fffu;
    uint32_t h = (hexp << 10) | hm;
    if (rest > 0x1000u || (rest == 0x1000u && (hm & 1u))) ++h;  // may carry into exp/Inf
    return static_cast<uint16_t>(sign | h);
  }
  if (exp < -25) return sign;  // rounds to zero (below half of the smallest subnormal)
  // subnormal half: value = m * 2^-24 with m in [0, 1023].
  uint32_t full = mant | 0x800000u;  // 24 bits, value = full * 2^(exp-23)
  int shift = -exp - 1;              // 2^(exp-23) / 2^-24 = 2^(exp+1): shift right by -(exp+1)
  uint32_t hm = full >> shift;
  uint32_t rest = full & ((1u << shift) - 1u);
  uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (hm & 1u))) ++hm;
  return static_cast<uint16_t>(sign | hm);
}

inline float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

// binary32 -> bfloat16, round to nearest even (NaN stays a quiet NaN).
inline uint16_t float_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

inline float bf16_to_float(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

inline size_t elem_size(int32_t dtype) { return dtype == PQ_DTYPE_F32 ? 4 : 2; }

// The value a float has once stored in `dtype` (what the library sees).
inline float round_to_dtype(float f, int32_t dtype) {
  if (dtype == PQ_DTYPE_F16) return half_to_float(float_to_half(f));
  if (dtype == PQ_DTYPE_BF16) return bf16_to_float(float_to_bf16(f));
  return f;
}

inline void encode_elem(float f, int32_t dtype, unsigned char* dst) {
  if (dtype == PQ_DTYPE_F32) {
    std::memcpy(dst, &f, 4);
  } else {
    uint16_t h = dtype == PQ_DTYPE_F16 ? float_to_half(f) : float_to_bf16(f);
    std::memcpy(dst, &h, 2);
  }
}

// ---------------------------------------------------------------------------
// Host tensors built from logical float data [token][head][dim]
// ---------------------------------------------------------------------------

struct HostTensor {
  std::vector<unsigned char> bytes;
  pq_tensor t{};

  const unsigned char* row(int64_t tok, int32_t head) const {
    return bytes.data() +
           static_cast<size_t>(tok * t.token_stride + head * t.head_stride) * elem_size(t.dtype);
  }
  unsigned char* row(int64_t tok, int32_t head) {
    return bytes.data() +
           static_cast<size_t>(tok * t.token_stride + head * t.head_stride) * elem_size(t.dtype);
  }
  size_t row_bytes() const { return static_cast<size_t>(t.head_dim) * elem_size(t.dtype); }
  pq_tensor* get() {
    t.data = bytes.empty() ? nullptr : bytes.data();
    return &t;
  }
};

// A tensor with explicit strides (in elements); the buffer is filled with
// `fill` first, so that gaps between rows keep that byte.
inline HostTensor make_tensor_strided(const float* src, int64_t tokens, int32_t heads,
                                      int32_t head_dim, int32_t dtype, int64_t token_stride,
                                      int64_t head_stride, unsigned char fill = 0xA5) {
  HostTensor ht;
  size_t es = elem_size(dtype);
  int64_t elems = 0;
  if (tokens > 0 && heads > 0)
    elems = (tokens - 1) * token_stride + static_cast<int64_t>(heads - 1) * head_stride + head_dim;
  ht.bytes.assign(static_cast<size_t>(elems) * es, fill);
  ht.t.dtype = dtype;
  ht.t.memory = PQ_MEMORY_HOST;
  ht.t.tokens = tokens;
  ht.t.heads = heads;
  ht.t.head_dim = head_dim;
  ht.t.token_stride = token_stride;
  ht.t.head_stride = head_stride;
  if (src) {
    for (int64_t tk = 0; tk < tokens; ++tk)
      for (int32_t h = 0; h < heads; ++h) {
        unsigned char* dst = ht.row(tk, h);
        const float* s = src + (tk * heads + h) * head_dim;
        for (int32_t d = 0; d < head_dim; ++d) encode_elem(s[d], dtype, dst + d * es);
      }
  }
  ht.get();
  return ht;
}

// Dense tensor in a preset layout, optionally with padding (elements) added
// after each head row (pad_head) and after each token / head block (pad_outer).
inline HostTensor make_tensor(const float* src, int64_t tokens, int32_t heads, int32_t head_dim,
                              int32_t dtype, int32_t layout = PQ_LAYOUT_TOKEN_MAJOR,
                              int64_t pad_inner = 0, int64_t pad_outer = 0,
                              unsigned char fill = 0xA5) {
  int64_t ts, hs;
  if (layout == PQ_LAYOUT_TOKEN_MAJOR) {
    hs = head_dim + pad_inner;
    ts = heads * hs + pad_outer;
  } else {
    ts = head_dim + pad_inner;
    hs = tokens * ts + pad_outer;
  }
  return make_tensor_strided(src, tokens, heads, head_dim, dtype, ts, hs, fill);
}

inline HostTensor make_tensor(const std::vector<float>& src, int64_t tokens, int32_t heads,
                              int32_t head_dim, int32_t dtype,
                              int32_t layout = PQ_LAYOUT_TOKEN_MAJOR, int64_t pad_inner = 0,
                              int64_t pad_outer = 0) {
  return make_tensor(src.empty() ? nullptr : src.data(), tokens, heads, head_dim, dtype, layout,
                     pad_inner, pad_outer);
}

// Tokens [first, first + count) of token-major f32 rows ([tokens][heads]
// [head_dim] floats) as their own f32 tensor.
inline HostTensor token_slice(const std::vector<float>& src, int64_t first, int64_t count,
                              int32_t heads, int32_t head_dim) {
  const size_t row = static_cast<size_t>(heads) * head_dim;
  std::vector<float> part(src.begin() + static_cast<std::ptrdiff_t>(first * row),
                          src.begin() + static_cast<std::ptrdiff_t>((first + count) * row));
  return make_tensor(part, count, heads, head_dim, PQ_DTYPE_F32);
}

// The bytes pq_sequence_save writes for sequence seq (empty on an error,
// which the call's EXPECT reports).
inline std::vector<uint8_t> saved_sequence(pq_context* ctx, uint64_t seq) {
  std::vector<uint8_t> saved;
  EXPECT_EQ(pq_sequence_save(
                ctx, seq,
                [](void* user, const void* data, size_t size) {
                  auto* out = static_cast<std::vector<uint8_t>*>(user);
                  out->insert(out->end(), static_cast<const uint8_t*>(data),
                              static_cast<const uint8_t*>(data) + size);
                  return 0;
                },
                &saved),
            PQ_OK)
      << pq_last_error();
  return saved;
}

// ---------------------------------------------------------------------------
// Random data
// ---------------------------------------------------------------------------

inline std::vector<float> random_normal(size_t n, uint64_t seed, float stddev = 1.0f,
                                        float mean = 0.0f) {
  std::mt19937 rng(static_cast<uint32_t>(seed * 2654435761u + 12345u));
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<float> random_uniform(size_t n, uint64_t seed, float lo = -1.0f,
                                         float hi = 1.0f) {
  std::mt19937 rng(static_cast<uint32_t>(seed * 40503u + 977u));
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Random small integers in [lo, hi] as floats (exact in every dtype for |v| <= 256).
inline std::vector<float> random_ints(size_t n, uint64_t seed, int lo, int hi) {
  std::mt19937 rng(static_cast<uint32_t>(seed * 7919u + 31u));
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(dist(rng));
  return v;
}

// Random f32 tokens of one layer and one query: keys and values
// ([tokens][kv_heads][head_dim]), the query ([q_heads][head_dim]), and
// their tensors, made by make_tensors() (after any edit of the arrays).
struct RandomLayer {
  int64_t n;
  int32_t q_heads, kv_heads, head_dim;
  std::vector<float> keys, values, query;
  HostTensor k, v, q;
  RandomLayer(int64_t tokens, int32_t qh, int32_t kvh, int32_t dim, uint64_t seed,
              float key_stddev = 1.0f, float query_stddev = 1.0f)
      : n(tokens), q_heads(qh), kv_heads(kvh), head_dim(dim),
        keys(random_normal(static_cast<size_t>(tokens) * kvh * dim, seed, key_stddev)),
        values(random_normal(static_cast<size_t>(tokens) * kvh * dim, seed + 1)),
        query(random_normal(static_cast<size_t>(qh) * dim, seed + 2, query_stddev)) {}
  float* key(int64_t t, int32_t h) {
    return keys.data() + (static_cast<size_t>(t) * kv_heads + h) * head_dim;
  }
  void make_tensors() {
    k = make_tensor(keys, n, kv_heads, head_dim, PQ_DTYPE_F32);
    v = make_tensor(values, n, kv_heads, head_dim, PQ_DTYPE_F32);
    q = make_tensor(query, 1, q_heads, head_dim, PQ_DTYPE_F32);
  }
};

// ---------------------------------------------------------------------------
// Context, config, selection
// ---------------------------------------------------------------------------

inline pq_config make_config(int32_t layers, int32_t q_heads, int32_t kv_heads, int32_t head_dim,
                             int32_t dtype = PQ_DTYPE_F32) {
  pq_config c;
  pq_config_default(&c);
  c.num_layers = layers;
  c.num_q_heads = q_heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.dtype = dtype;
  // The tests written for the paper's index keep it; the default chosen
  // from head_dim (0.7) has its own (test_api_index_quality.cpp).
  c.pq_subspaces = 2;
  c.pq_bits = 6;
  return c;
}

// RAII owner of a pq_context.
class Ctx {
 public:
  Ctx() = default;
  explicit Ctx(const pq_config& config) { status_ = pq_create(&config, &ctx_); }
  Ctx(const pq_config& config, const pq_hooks& hooks) {
    status_ = pq_create_with_hooks(&config, &hooks, &ctx_);
  }
  ~Ctx() { pq_destroy(ctx_); }
  Ctx(const Ctx&) = delete;
  Ctx& operator=(const Ctx&) = delete;
  Ctx(Ctx&& o) noexcept : ctx_(o.ctx_), status_(o.status_) { o.ctx_ = nullptr; }
  Ctx& operator=(Ctx&& o) noexcept {
    if (this != &o) {
      pq_destroy(ctx_);
      ctx_ = o.ctx_;
      status_ = o.status_;
      o.ctx_ = nullptr;
    }
    return *this;
  }

  pq_context* get() const { return ctx_; }
  operator pq_context*() const { return ctx_; }
  pq_status status() const { return status_; }
  bool ok() const { return status_ == PQ_OK && ctx_ != nullptr; }
  // Destroys now (for tests of pq_destroy itself).
  void reset() {
    pq_destroy(ctx_);
    ctx_ = nullptr;
  }

 private:
  pq_context* ctx_ = nullptr;
  pq_status status_ = PQ_ERR_INTERNAL;
};

// Caller-owned selection buffers.
struct Sel {
  std::vector<int32_t> positions;
  std::vector<int32_t> counts;
  int64_t capacity = 0;
  int32_t heads = 0;
  pq_selection s{};

  // Buffers are never empty, so that capacity 0 still passes non-NULL arrays.
  Sel(int32_t kv_heads, int64_t cap) : positions(static_cast<size_t>(std::max<int64_t>(kv_heads * cap, 1)), -1),
                                       counts(static_cast<size_t>(kv_heads), -1),
                                       capacity(cap), heads(kv_heads) {}
  pq_selection* get() {
    s.positions = positions.data();
    s.counts = counts.data();
    s.capacity = capacity;
    return &s;
  }
  std::vector<int32_t> row(int32_t h) const {
    int32_t c = counts[static_cast<size_t>(h)];
    if (c < 0) c = 0;
    return std::vector<int32_t>(positions.begin() + h * capacity,
                                positions.begin() + h * capacity + c);
  }
  int32_t max_count() const {
    int32_t m = 0;
    for (int32_t c : counts) m = std::max(m, c);
    return m;
  }
};

inline int64_t selection_capacity(pq_context* ctx, uint64_t seq, int32_t layer) {
  int64_t cap = -1;
  pq_status st = pq_selection_capacity(ctx, seq, layer, &cap);
  return st == PQ_OK ? cap : -1;
}

inline pq_layer_info layer_info(pq_context* ctx, uint64_t seq, int32_t layer,
                                pq_status* status = nullptr) {
  pq_layer_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof(pq_layer_info);
  pq_status st = pq_layer_info_get(ctx, seq, layer, &info);
  if (status) *status = st;
  return info;
}

inline pq_stats stats(pq_context* ctx, pq_status* status = nullptr) {
  pq_stats s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof(pq_stats);
  pq_status st = pq_stats_get(ctx, &s);
  if (status) *status = st;
  return s;
}

// ---------------------------------------------------------------------------
// Regions and the test's own exact scoring
// ---------------------------------------------------------------------------

struct Regions {
  int64_t n = 0;
  int64_t sink_end = 0;     // sinks: [0, sink_end)
  int64_t local_begin = 0;  // locals: [local_begin, n)
  int64_t middle = 0;       // [sink_end, local_begin)
  int64_t k = 0;            // middle tokens selected
  int64_t count() const { return sink_end + k + (n - local_begin); }
};

inline Regions regions(int64_t n, int32_t sink, int32_t local, int32_t topk_tokens,
                       float topk_fraction) {
  Regions r;
  r.n = n;
  r.sink_end = std::min<int64_t>(sink, n);
  r.local_begin = std::max<int64_t>(r.sink_end, n - local);
  r.middle = r.local_begin - r.sink_end;
  int64_t k = topk_tokens > 0
                  ? topk_tokens
                  : static_cast<int64_t>(std::ceil(static_cast<double>(topk_fraction) *
                                                   static_cast<double>(r.middle)));
  r.k = std::min<int64_t>(std::max<int64_t>(k, 0), r.middle);
  return r;
}

inline Regions regions(int64_t n, const pq_config& c) {
  return regions(n, c.sink_tokens, c.local_tokens, c.topk_tokens, c.topk_fraction);
}

// Combined score per middle token [mid_begin, mid_end) of kv head `h`,
// computed in double. keys: [n][kv_heads][head_dim], query: [q_heads][head_dim].
inline std::vector<double> combined_scores(const std::vector<float>& keys, int32_t kv_heads,
                                           int32_t head_dim, const std::vector<float>& query,
                                           int32_t q_heads, int32_t h, int64_t mid_begin,
                                           int64_t mid_end, int32_t combine) {
  int32_t G = q_heads / kv_heads;
  int64_t m = mid_end - mid_begin;
  std::vector<double> out(static_cast<size_t>(std::max<int64_t>(m, 0)), 0.0);
  if (m <= 0) return out;
  if (combine == PQ_GQA_MAX) std::fill(out.begin(), out.end(), -std::numeric_limits<double>::infinity());
  double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  std::vector<double> logit(static_cast<size_t>(m));
  for (int32_t g = 0; g < G; ++g) {
    const float* q = query.data() + static_cast<size_t>(h * G + g) * head_dim;
    for (int64_t i = 0; i < m; ++i) {
      const float* k = keys.data() + ((mid_begin + i) * kv_heads + h) * head_dim;
      double dot = 0;
      for (int32_t d = 0; d < head_dim; ++d) dot += static_cast<double>(q[d]) * k[d];
      logit[static_cast<size_t>(i)] = dot * scale;
    }
    if (combine == PQ_GQA_SUM_SOFTMAX) {
      double mx = *std::max_element(logit.begin(), logit.end());
      double sum = 0;
      for (double l : logit) sum += std::exp(l - mx);
      for (int64_t i = 0; i < m; ++i) out[static_cast<size_t>(i)] += std::exp(logit[static_cast<size_t>(i)] - mx) / sum;
    } else if (combine == PQ_GQA_MAX) {
      for (int64_t i = 0; i < m; ++i) out[static_cast<size_t>(i)] = std::max(out[static_cast<size_t>(i)], logit[static_cast<size_t>(i)]);
    } else {
      for (int64_t i = 0; i < m; ++i) out[static_cast<size_t>(i)] += logit[static_cast<size_t>(i)] / G;
    }
  }
  return out;
}

// Positions (ascending) of the k highest scores; ties favour the larger position.
inline std::vector<int32_t> topk_positions(const std::vector<double>& scores, int64_t mid_begin,
                                           int64_t k) {
  std::vector<int32_t> idx(scores.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    if (scores[static_cast<size_t>(a)] != scores[static_cast<size_t>(b)])
      return scores[static_cast<size_t>(a)] > scores[static_cast<size_t>(b)];
    return a > b;
  });
  idx.resize(static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(idx.size()))));
  for (int32_t& i : idx) i += static_cast<int32_t>(mid_begin);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// The middle positions of a selection row.
inline std::vector<int32_t> middle_of(const std::vector<int32_t>& row, const Regions& r) {
  std::vector<int32_t> out;
  for (int32_t p : row)
    if (p >= r.sink_end && p < r.local_begin) out.push_back(p);
  return out;
}

inline size_t overlap(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  std::vector<int32_t> x = a, y = b, z;
  std::sort(x.begin(), x.end());
  std::sort(y.begin(), y.end());
  std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(z));
  return z.size();
}

}  // namespace pqt
