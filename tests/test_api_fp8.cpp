// fp8 K/V (PQ_DTYPE_FP8_E4M3, PQ_DTYPE_FP8_E5M2) through the public API:
// every code's value against a decoding of its bit fields written here,
// the scales (per layer and per kv head), fetches that copy the stored
// bytes, selections equal to those of an f32 context holding the
// dequantised keys, the attention against a double reference, and every
// check (scales, query dtype, non-finite codes, a restore with other
// scales).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "api_test_util.h"

namespace {

using namespace pqt;

// --- The formats from their bit fields (not the library's tables) ---------

double decode_e4m3(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 0x7;
  const double sign = (b & 0x80) ? -1.0 : 1.0;
  if (e == 0xF && m == 0x7) return std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(m / 8.0, -6);
  return sign * std::ldexp(1.0 + m / 8.0, e - 7);
}

double decode_e5m2(uint8_t b) {
  const int e = (b >> 2) & 0x1F, m = b & 0x3;
  const double sign = (b & 0x80) ? -1.0 : 1.0;
  if (e == 0x1F) return m == 0 ? sign * std::numeric_limits<double>::infinity()
                               : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(m / 4.0, -14);
  return sign * std::ldexp(1.0 + m / 4.0, e - 15);
}

double decode(int32_t dtype, uint8_t b) {
  return dtype == PQ_DTYPE_FP8_E4M3 ? decode_e4m3(b) : decode_e5m2(b);
}

// The value the library must read for a stored code: the code's value (exact
// in float) times the scale, rounded once to float.
float dequant(int32_t dtype, uint8_t b, float scale) {
  return static_cast<float>(decode(dtype, b)) * scale;
}

// Random finite codes of magnitude at most `most` (softmax stays spread).
std::vector<uint8_t> random_codes(int32_t dtype, size_t n, uint64_t seed, double most = 8.0) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<uint8_t> out(n);
  for (uint8_t& c : out) {
    for (;;) {
      const auto b = static_cast<uint8_t>(rng() & 0xFF);
      const double v = decode(dtype, b);
      if (std::isfinite(v) && std::abs(v) <= most) {
        c = b;
        break;
      }
    }
  }
  return out;
}

// A dense token-major host tensor over caller bytes.
pq_tensor tensor_of(void* data, int32_t dtype, int64_t tokens, int32_t heads, int32_t dim) {
  pq_tensor t;
  EXPECT_EQ(pq_tensor_init(&t, data, dtype, PQ_LAYOUT_TOKEN_MAJOR, tokens, heads, dim), PQ_OK);
  return t;
}

pq_config fp8_config(int32_t dtype, int32_t q_heads, int32_t kv_heads, int32_t dim,
                     int32_t selector = PQ_SELECTOR_EXACT) {
  pq_config c = make_config(1, q_heads, kv_heads, dim, dtype);
  c.selector = selector;
  c.sink_tokens = 4;
  c.local_tokens = 16;  // top-k: the default fraction, 1/5
  c.worker_threads = 1;
  return c;
}

class Fp8 : public ::testing::TestWithParam<int32_t> {
 protected:
  int32_t dtype() const { return GetParam(); }
};

// --- Conversion of every code ---------------------------------------------

// Attention over one selected token is that token's value row (weight 1),
// and its log-sum-exp is the one logit: with query head g one-hot on
// dimension g, lse[g] is K[g]. Both exactly, so every code's value is seen
// through the public API: head_dim 8 runs the vector kernel, 4 the portable.
void check_every_code(int32_t dtype, int32_t dim, float k_scale, float v_scale) {
  const int32_t tokens = 256 / dim;
  std::vector<uint8_t> codes(256);
  for (int b = 0; b < 256; ++b) codes[b] = std::isfinite(decode(dtype, static_cast<uint8_t>(b)))
                                               ? static_cast<uint8_t>(b) : 0;
  std::vector<uint8_t> values(codes.rbegin(), codes.rend());  // other codes per row than K
  pq_config c = fp8_config(dtype, dim, 1, dim);
  c.pq_subspaces = 1;
  const float scales[2] = {k_scale, v_scale};
  c.kv_scale_count = 1;
  c.kv_scales = scales;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  pq_tensor k = tensor_of(codes.data(), dtype, tokens, 1, dim);
  pq_tensor v = tensor_of(values.data(), dtype, tokens, 1, dim);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, &k, &v));
  std::vector<float> q(static_cast<size_t>(dim) * dim, 0.f);
  for (int32_t g = 0; g < dim; ++g) q[static_cast<size_t>(g) * dim + g] = 1.f;
  pq_tensor query = tensor_of(q.data(), PQ_DTYPE_F32, 1, dim, dim);
  for (int32_t t = 0; t < tokens; ++t) {
    int32_t pos = t, count = 1;
    pq_selection sel{&pos, &count, 1};
    std::vector<float> out(static_cast<size_t>(dim) * dim), lse(static_cast<size_t>(dim));
    PQ_ASSERT_OK(pq_decode_attend(ctx, 1, 0, &query, &sel, 1.f, out.data(), lse.data()));
    for (int32_t g = 0; g < dim; ++g) {
      const uint8_t kc = codes[static_cast<size_t>(t) * dim + g];
      EXPECT_EQ(lse[g], dequant(dtype, kc, k_scale)) << "key code 0x" << std::hex << int{kc};
      for (int32_t d = 0; d < dim; ++d) {
        const uint8_t vc = values[static_cast<size_t>(t) * dim + d];
        EXPECT_EQ(out[static_cast<size_t>(g) * dim + d], dequant(dtype, vc, v_scale))
            << "value code 0x" << std::hex << int{vc};
      }
    }
  }
}

TEST_P(Fp8, EveryFiniteCodeReadsAsItsBitFieldsSay) {
  check_every_code(dtype(), 8, 1.f, 1.f);
  check_every_code(dtype(), 4, 1.f, 1.f);
}

TEST_P(Fp8, EveryCodeIsScaledPerLayer) {
  check_every_code(dtype(), 8, 0.5f, 3.f);
  check_every_code(dtype(), 4, 0.5f, 3.f);
}

TEST_P(Fp8, NonFiniteCodesAreRejectedAtIngest) {
  std::vector<uint8_t> bad;
  for (int b = 0; b < 256; ++b)
    if (!std::isfinite(decode(dtype(), static_cast<uint8_t>(b)))) bad.push_back(static_cast<uint8_t>(b));
  // e4m3fn: 0x7F and 0xFF (NaN); e5m2: 0x7C-0x7F, 0xFC-0xFF (Inf, NaN).
  ASSERT_EQ(bad.size(), dtype() == PQ_DTYPE_FP8_E4M3 ? 2u : 8u);
  Ctx ctx(fp8_config(dtype(), 2, 1, 8));
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  std::vector<uint8_t> good = random_codes(dtype(), 64 * 8, 1);
  for (uint8_t code : bad) {
    for (const bool in_keys : {true, false}) {
      std::vector<uint8_t> k = good, v = good;
      (in_keys ? k : v)[5 * 8 + 3] = code;  // token 5, element 3
      pq_tensor kt = tensor_of(k.data(), dtype(), 64, 1, 8);
      pq_tensor vt = tensor_of(v.data(), dtype(), 64, 1, 8);
      PQ_EXPECT_ERR(pq_prefill_layer(ctx, 1, 0, &kt, &vt), PQ_ERR_INVALID_ARGUMENT,
                    "token 5");
      int64_t n = -1;
      PQ_ASSERT_OK(pq_sequence_length(ctx, 1, 0, &n));
      EXPECT_EQ(n, 0) << "nothing is stored after a rejected prefill";
    }
  }
  pq_tensor kt = tensor_of(good.data(), dtype(), 64, 1, 8);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, &kt, &kt));
  std::vector<uint8_t> one(8, 0x38);
  one[2] = bad.back();
  pq_tensor step = tensor_of(one.data(), dtype(), 1, 1, 8);
  pq_tensor fine = tensor_of(good.data(), dtype(), 1, 1, 8);
  PQ_EXPECT_ERR(pq_decode_append(ctx, 1, 0, &step, &fine), PQ_ERR_INVALID_ARGUMENT, "keys");
}

// --- Fetch copies the stored bytes ----------------------------------------

TEST_P(Fp8, FetchCopiesTheStoredBytes) {
  constexpr int32_t kKv = 2, kDim = 16;
  constexpr int64_t kTokens = 700;
  const float scales[2 * kKv] = {0.25f, 0.75f, 2.f, 0.125f};
  pq_config c = fp8_config(dtype(), 4, kKv, kDim);
  c.kv_scale_count = kKv;
  c.kv_scales = scales;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  std::vector<uint8_t> k = random_codes(dtype(), kTokens * kKv * kDim, 2, 448.0);
  std::vector<uint8_t> v = random_codes(dtype(), kTokens * kKv * kDim, 3, 448.0);
  pq_tensor kt = tensor_of(k.data(), dtype(), kTokens, kKv, kDim);
  pq_tensor vt = tensor_of(v.data(), dtype(), kTokens, kKv, kDim);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, &kt, &vt));
  const std::vector<float> q = random_normal(4 * kDim, 4);
  pq_tensor query = tensor_of(const_cast<float*>(q.data()), PQ_DTYPE_F32, 1, 4, kDim);
  const int64_t cap = selection_capacity(ctx, 1, 0);
  Sel sel(kKv, cap);
  PQ_ASSERT_OK(pq_decode_select(ctx, 1, 0, &query, sel.get()));
  std::vector<uint8_t> ok(static_cast<size_t>(cap) * kKv * kDim, 0xEE), ov = ok;
  pq_tensor okt = tensor_of(ok.data(), dtype(), cap, kKv, kDim);
  pq_tensor ovt = tensor_of(ov.data(), dtype(), cap, kKv, kDim);
  PQ_ASSERT_OK(pq_fetch_kv(ctx, 1, 0, sel.get(), &okt, &ovt));
  for (int32_t h = 0; h < kKv; ++h) {
    const std::vector<int32_t> row = sel.row(h);
    ASSERT_FALSE(row.empty());
    for (size_t i = 0; i < row.size(); ++i)
      for (int32_t d = 0; d < kDim; ++d) {
        const size_t src = (static_cast<size_t>(row[i]) * kKv + h) * kDim + d;
        const size_t dst = (i * kKv + h) * kDim + d;
        ASSERT_EQ(ok[dst], k[src]) << "head " << h << " token " << row[i];
        ASSERT_EQ(ov[dst], v[src]) << "head " << h << " token " << row[i];
      }
  }
  // The outputs are in the stored dtype, not the query's.
  std::vector<uint16_t> wide(static_cast<size_t>(cap) * kKv * kDim);
  pq_tensor f16 = tensor_of(wide.data(), PQ_DTYPE_F16, cap, kKv, kDim);
  PQ_EXPECT_ERR(pq_fetch_kv(ctx, 1, 0, sel.get(), &f16, &ovt), PQ_ERR_INVALID_ARGUMENT,
                "out_keys.dtype");
}

// --- Selections equal those over the dequantised keys in f32 --------------

struct Pair {
  Ctx fp8, f32;
};

// Two contexts over the same numbers: fp8 codes with per-kv-head scales,
// and f32 keys and values holding code * scale.
void fill_pair(int32_t dtype, pq_config c, int64_t tokens, Pair& p, std::vector<float>* scales) {
  const int32_t kv = c.num_kv_heads, dim = c.head_dim;
  scales->resize(2 * static_cast<size_t>(kv));
  for (int32_t i = 0; i < 2 * kv; ++i) (*scales)[i] = 0.37f + 0.61f * static_cast<float>(i);
  c.dtype = dtype;
  c.kv_scale_count = kv;
  c.kv_scales = scales->data();
  p.fp8 = Ctx(c);
  pq_config f = c;
  f.dtype = PQ_DTYPE_F32;
  f.kv_scale_count = 0;
  f.kv_scales = nullptr;
  p.f32 = Ctx(f);
  ASSERT_TRUE(p.fp8.ok() && p.f32.ok()) << pq_last_error();
  const size_t n = static_cast<size_t>(tokens) * kv * dim;
  std::vector<uint8_t> k = random_codes(dtype, n, 11), v = random_codes(dtype, n, 12);
  std::vector<float> kf(n), vf(n);
  for (size_t i = 0; i < n; ++i) {
    const auto h = static_cast<size_t>((i / dim) % kv);
    kf[i] = dequant(dtype, k[i], (*scales)[h]);
    vf[i] = dequant(dtype, v[i], (*scales)[kv + h]);
  }
  PQ_ASSERT_OK(pq_sequence_add(p.fp8, 1));
  PQ_ASSERT_OK(pq_sequence_add(p.f32, 1));
  pq_tensor kt = tensor_of(k.data(), dtype, tokens, kv, dim);
  pq_tensor vt = tensor_of(v.data(), dtype, tokens, kv, dim);
  pq_tensor kft = tensor_of(kf.data(), PQ_DTYPE_F32, tokens, kv, dim);
  pq_tensor vft = tensor_of(vf.data(), PQ_DTYPE_F32, tokens, kv, dim);
  PQ_ASSERT_OK(pq_prefill_layer(p.fp8, 1, 0, &kt, &vt));
  PQ_ASSERT_OK(pq_prefill_layer(p.f32, 1, 0, &kft, &vft));
}

// The fp8 context gets the query in f16 (its own dtype), the f32 one the
// same numbers in f32: both select on the same floats.
void expect_same_selection(Pair& p, int32_t q_heads, int32_t kv, int32_t dim, uint64_t seed) {
  const std::vector<float> qf = random_normal(static_cast<size_t>(q_heads) * dim, seed);
  std::vector<uint16_t> qh(qf.size());
  std::vector<float> qr(qf.size());
  for (size_t i = 0; i < qf.size(); ++i) {
    qh[i] = float_to_half(qf[i]);
    qr[i] = half_to_float(qh[i]);
  }
  pq_tensor q16 = tensor_of(qh.data(), PQ_DTYPE_F16, 1, q_heads, dim);
  pq_tensor q32 = tensor_of(qr.data(), PQ_DTYPE_F32, 1, q_heads, dim);
  const int64_t cap = selection_capacity(p.fp8, 1, 0);
  ASSERT_EQ(cap, selection_capacity(p.f32, 1, 0));
  Sel a(kv, cap), b(kv, cap);
  PQ_ASSERT_OK(pq_decode_select(p.fp8, 1, 0, &q16, a.get()));
  PQ_ASSERT_OK(pq_decode_select(p.f32, 1, 0, &q32, b.get()));
  for (int32_t h = 0; h < kv; ++h) EXPECT_EQ(a.row(h), b.row(h)) << "kv head " << h;
}

TEST_P(Fp8, ExactSelectionEqualsF32OverTheDequantisedKeys) {
  Pair p;
  std::vector<float> scales;
  fill_pair(dtype(), fp8_config(dtype(), 8, 2, 32), 3000, p, &scales);
  for (uint64_t seed = 20; seed < 24; ++seed) expect_same_selection(p, 8, 2, 32, seed);
}

TEST_P(Fp8, PqIndexAndSelectionEqualF32OverTheDequantisedKeys) {
  pq_config c = fp8_config(dtype(), 8, 2, 32, PQ_SELECTOR_PQ);
  c.kmeans_iterations = 6;
  c.pq_rerank = 1.f;  // the re-ranking reads the keys too
  Pair p;
  std::vector<float> scales;
  fill_pair(dtype(), c, 3000, p, &scales);
  PQ_ASSERT_OK(pq_wait_builds(p.fp8));
  PQ_ASSERT_OK(pq_wait_builds(p.f32));
  for (int32_t h = 0; h < 2; ++h) {
    const size_t floats = static_cast<size_t>(2) * 64 * 16;  // subspaces x 2^6 x 16
    std::vector<float> ca(floats), cb(floats);
    PQ_ASSERT_OK(pq_index_centroids(p.fp8, 1, 0, h, ca.data(), static_cast<int64_t>(floats)));
    PQ_ASSERT_OK(pq_index_centroids(p.f32, 1, 0, h, cb.data(), static_cast<int64_t>(floats)));
    EXPECT_EQ(ca, cb) << "kv head " << h;
    std::vector<uint8_t> xa(1000 * 2), xb(1000 * 2);
    PQ_ASSERT_OK(pq_index_codes(p.fp8, 1, 0, h, 100, 1000, xa.data()));
    PQ_ASSERT_OK(pq_index_codes(p.f32, 1, 0, h, 100, 1000, xb.data()));
    EXPECT_EQ(xa, xb) << "kv head " << h;
  }
  for (uint64_t seed = 30; seed < 34; ++seed) expect_same_selection(p, 8, 2, 32, seed);
}

TEST_P(Fp8, SparqQuestInfllmSelectEqualToF32) {
  for (int32_t selector : {PQ_SELECTOR_SPARQ, PQ_SELECTOR_QUEST, PQ_SELECTOR_INFLLM}) {
    Pair p;
    std::vector<float> scales;
    fill_pair(dtype(), fp8_config(dtype(), 8, 2, 32, selector), 2000, p, &scales);
    SCOPED_TRACE(selector);
    for (uint64_t seed = 40; seed < 42; ++seed) expect_same_selection(p, 8, 2, 32, seed);
  }
}

// --- Attention against a double reference ---------------------------------

TEST_P(Fp8, AttendMatchesDoubleReferenceWithPerHeadScales) {
  constexpr int32_t kQ = 8, kKv = 2, kDim = 64, kGroup = kQ / kKv;
  pq_config c = fp8_config(dtype(), kQ, kKv, kDim);
  Pair p;
  std::vector<float> scales;
  fill_pair(dtype(), c, 5000, p, &scales);
  const std::vector<float> qf = random_normal(kQ * kDim, 50, 0.3f);
  pq_tensor query = tensor_of(const_cast<float*>(qf.data()), PQ_DTYPE_F32, 1, kQ, kDim);
  const int64_t cap = selection_capacity(p.fp8, 1, 0);
  Sel sel(kKv, cap);
  PQ_ASSERT_OK(pq_decode_select(p.fp8, 1, 0, &query, sel.get()));
  // The reference reads the dequantised rows back from the f32 twin.
  std::vector<float> k(static_cast<size_t>(cap) * kKv * kDim), v(k.size());
  pq_tensor kt = tensor_of(k.data(), PQ_DTYPE_F32, cap, kKv, kDim);
  pq_tensor vt = tensor_of(v.data(), PQ_DTYPE_F32, cap, kKv, kDim);
  PQ_ASSERT_OK(pq_fetch_kv(p.f32, 1, 0, sel.get(), &kt, &vt));
  std::vector<float> out(kQ * kDim), lse(kQ);
  PQ_ASSERT_OK(pq_decode_attend(p.fp8, 1, 0, &query, sel.get(), 0.f, out.data(), lse.data()));
  const double scale = 1.0 / std::sqrt(double{kDim});
  double max_rel = 0;
  for (int32_t q = 0; q < kQ; ++q) {
    const int32_t h = q / kGroup, n = sel.counts[h];
    std::vector<double> logit(n);
    double max = -INFINITY, sum = 0;
    for (int32_t i = 0; i < n; ++i) {
      double s = 0;
      for (int32_t d = 0; d < kDim; ++d)
        s += double{qf[q * kDim + d]} * k[(static_cast<size_t>(i) * kKv + h) * kDim + d];
      max = std::max(max, logit[i] = s * scale);
    }
    for (double& l : logit) sum += (l = std::exp(l - max));
    // What pq_decode_attend documents for fp8: the weights may be rounded
    // to bf16 in the value sum, which moves each element by at most 2^-8 x
    // sum_i softmax_i |V_i[d]|; the excess over that is the error checked.
    double diff = 0, norm = 0;
    for (int32_t d = 0; d < kDim; ++d) {
      double want = 0, spread = 0;
      for (int32_t i = 0; i < n; ++i) {
        const double vi = v[(static_cast<size_t>(i) * kKv + h) * kDim + d];
        want += logit[i] / sum * vi;
        spread += logit[i] / sum * std::abs(vi);
      }
      diff += std::pow(std::max(0.0, std::abs(out[q * kDim + d] - want) - std::ldexp(spread, -8)), 2);
      norm += want * want;
    }
    max_rel = std::max(max_rel, std::sqrt(diff / norm));
    EXPECT_NEAR(lse[q], max + std::log(sum), 1e-5 * std::max(1.0, std::abs(max + std::log(sum))));
  }
  // The kernel's float accumulation and exp: the bound of the other dtypes.
  EXPECT_LT(max_rel, 1e-5);
  RecordProperty("max_relative_error", std::to_string(max_rel));
}

// The disk tier reads fp8 rows back from its file: selections and the
// attention equal the host tier's exactly (the same bytes, the same kernels).
TEST_P(Fp8, DiskTierSelectsAndAttendsAsTheHostTier) {
  constexpr int32_t kQ = 8, kKv = 2, kDim = 32;
  constexpr int64_t kTokens = 1500;  // chunks past the window go to the file
  const float scales[2 * kKv] = {0.75f, 1.25f, 0.5f, 2.f};
  pq_config c = fp8_config(dtype(), kQ, kKv, kDim);
  c.kv_scale_count = kKv;
  c.kv_scales = scales;
  Ctx host(c);
  const std::string dir = ::testing::TempDir();
  c.kv_tier = PQ_KV_TIER_DISK;
  c.kv_disk_path = dir.c_str();
  Ctx disk(c);
  ASSERT_TRUE(host.ok() && disk.ok()) << pq_last_error();
  std::vector<uint8_t> k = random_codes(dtype(), kTokens * kKv * kDim, 80);
  std::vector<uint8_t> v = random_codes(dtype(), kTokens * kKv * kDim, 81);
  pq_tensor kt = tensor_of(k.data(), dtype(), kTokens, kKv, kDim);
  pq_tensor vt = tensor_of(v.data(), dtype(), kTokens, kKv, kDim);
  const std::vector<float> qf = random_normal(kQ * kDim, 82, 0.5f);
  pq_tensor q = tensor_of(const_cast<float*>(qf.data()), PQ_DTYPE_F32, 1, kQ, kDim);
  const int64_t cap = [&] {
    for (pq_context* ctx : {host.get(), disk.get()}) {
      EXPECT_EQ(pq_sequence_add(ctx, 1), PQ_OK);
      EXPECT_EQ(pq_prefill_layer(ctx, 1, 0, &kt, &vt), PQ_OK) << pq_last_error();
    }
    return selection_capacity(host, 1, 0);
  }();
  Sel a(kKv, cap), b(kKv, cap);
  PQ_ASSERT_OK(pq_decode_select(host, 1, 0, &q, a.get()));
  PQ_ASSERT_OK(pq_decode_select(disk, 1, 0, &q, b.get()));
  for (int32_t h = 0; h < kKv; ++h) EXPECT_EQ(a.row(h), b.row(h)) << "kv head " << h;
  std::vector<float> oa(kQ * kDim), ob(kQ * kDim), la(kQ), lb(kQ);
  PQ_ASSERT_OK(pq_decode_attend(host, 1, 0, &q, a.get(), 0.f, oa.data(), la.data()));
  PQ_ASSERT_OK(pq_decode_attend(disk, 1, 0, &q, a.get(), 0.f, ob.data(), lb.data()));
  EXPECT_EQ(oa, ob);
  EXPECT_EQ(la, lb);
}

// --- Checks ----------------------------------------------------------------

TEST(Fp8Config, ScaleChecksNameTheFieldAndIndex) {
  pq_config c = fp8_config(PQ_DTYPE_FP8_E4M3, 8, 4, 16);
  pq_context* ctx = nullptr;
  std::vector<float> s(2 * 4, 1.f);
  c.kv_scales = s.data();
  c.kv_scale_count = 2;  // neither 1 nor num_kv_heads
  PQ_EXPECT_ERR(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, "kv_scale_count is 2");
  c.kv_scale_count = -1;
  PQ_EXPECT_ERR(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, "kv_scale_count is -1");
  c.kv_scale_count = 0;  // a pointer without a count
  PQ_EXPECT_ERR(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, "kv_scales");
  c.kv_scale_count = 4;
  c.kv_scales = nullptr;
  PQ_EXPECT_ERR(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, "kv_scales is NULL");
  c.kv_scales = s.data();
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(), 0.f, -1.f,
                       std::numeric_limits<float>::infinity()};
  for (float b : bad) {
    s.assign(8, 1.f);
    s[5] = b;  // V of kv head 1
    PQ_EXPECT_ERR(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, "kv_scales[5]");
    EXPECT_TRUE(contains_ci(pq_last_error(), "V, kv head 1")) << pq_last_error();
  }
  // Scales of a dtype that is not fp8.
  s.assign(8, 1.f);
  c.dtype = PQ_DTYPE_F16;
  PQ_EXPECT_ERR(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, "fp8 dtypes only");
  c.kv_scale_count = 0;
  c.kv_scales = nullptr;
  Ctx plain(c);
  EXPECT_TRUE(plain.ok()) << pq_last_error();
  EXPECT_EQ(ctx, nullptr);
}

TEST(Fp8Config, GetConfigReturnsTheContextsOwnCopy) {
  pq_config c = fp8_config(PQ_DTYPE_FP8_E5M2, 8, 4, 16);
  c.num_layers = 2;
  std::vector<float> s(2 * 2 * 4);
  for (size_t i = 0; i < s.size(); ++i) s[i] = 0.5f + static_cast<float>(i);
  c.kv_scale_count = 4;
  c.kv_scales = s.data();
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  const std::vector<float> given = s;
  s.assign(s.size(), -7.f);  // the caller's array is only read by pq_create
  pq_config got;
  pq_config_default(&got);
  PQ_ASSERT_OK(pq_get_config(ctx, &got));
  EXPECT_EQ(got.dtype, PQ_DTYPE_FP8_E5M2);
  EXPECT_EQ(got.kv_scale_count, 4);
  ASSERT_NE(got.kv_scales, nullptr);
  EXPECT_NE(got.kv_scales, s.data());
  EXPECT_EQ(std::vector<float>(got.kv_scales, got.kv_scales + given.size()), given);
  // The defaults: no scales.
  pq_config d;
  pq_config_default(&d);
  EXPECT_EQ(d.kv_scale_count, 0);
  EXPECT_EQ(d.kv_scales, nullptr);
  Ctx unit(fp8_config(PQ_DTYPE_FP8_E4M3, 2, 1, 8));
  PQ_ASSERT_OK(pq_get_config(unit, &got));
  EXPECT_EQ(got.kv_scale_count, 0);
  EXPECT_EQ(got.kv_scales, nullptr);
}

TEST_P(Fp8, Fp8QueriesAreRefusedEverywhere) {
  constexpr int32_t kQ = 4, kKv = 2, kDim = 8;
  Ctx ctx(fp8_config(dtype(), kQ, kKv, kDim, PQ_SELECTOR_SNAPKV));
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  std::vector<uint8_t> kv = random_codes(dtype(), 300 * kKv * kDim, 60);
  pq_tensor kt = tensor_of(kv.data(), dtype(), 300, kKv, kDim);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, &kt, &kt));
  std::vector<uint8_t> q8(40 * kQ * kDim, 0x38);
  pq_tensor one = tensor_of(q8.data(), dtype(), 1, kQ, kDim);
  pq_tensor many = tensor_of(q8.data(), dtype(), 40, kQ, kDim);
  Sel sel(kKv, selection_capacity(ctx, 1, 0));
  std::vector<float> out(kQ * kDim);
  PQ_EXPECT_ERR(pq_decode_select(ctx, 1, 0, &one, sel.get()), PQ_ERR_INVALID_ARGUMENT,
                "query.dtype");
  PQ_EXPECT_ERR(pq_decode_speculate(ctx, 1, 0, &one, sel.get()), PQ_ERR_INVALID_ARGUMENT,
                "query.dtype");
  PQ_EXPECT_ERR(pq_prefill_queries(ctx, 1, 0, &many), PQ_ERR_INVALID_ARGUMENT, "queries.dtype");
  pq_select_item item{1, one, *sel.get(), PQ_OK};
  PQ_EXPECT_ERR(pq_decode_select_batch(ctx, 0, &item, 1), PQ_ERR_INVALID_ARGUMENT, "query.dtype");
  EXPECT_EQ(item.status, PQ_ERR_INVALID_ARGUMENT);
  // Every other query dtype works, prefill queries included.
  for (int32_t qd : {PQ_DTYPE_F32, PQ_DTYPE_F16, PQ_DTYPE_BF16}) {
    std::vector<uint8_t> q(40 * kQ * kDim * 4, 0);
    pq_tensor qs = tensor_of(q.data(), qd, 40, kQ, kDim);
    PQ_EXPECT_OK(pq_prefill_queries(ctx, 1, 0, &qs));
    pq_tensor q1 = tensor_of(q.data(), qd, 1, kQ, kDim);
    PQ_EXPECT_OK(pq_decode_select(ctx, 1, 0, &q1, sel.get()));
    PQ_EXPECT_OK(pq_decode_attend(ctx, 1, 0, &q1, sel.get(), 0.f, out.data(), nullptr));
  }
  PQ_EXPECT_ERR(pq_decode_attend(ctx, 1, 0, &one, sel.get(), 0.f, out.data(), nullptr),
                PQ_ERR_INVALID_ARGUMENT, "query.dtype");
  // A context of another dtype still takes its own dtype only.
  Ctx f16(make_config(1, kQ, kKv, kDim, PQ_DTYPE_F16));
  PQ_ASSERT_OK(pq_sequence_add(f16, 1));
  std::vector<float> f(kQ * kDim);
  pq_tensor q32 = tensor_of(f.data(), PQ_DTYPE_F32, 1, kQ, kDim);
  PQ_EXPECT_ERR(pq_decode_select(f16, 1, 0, &q32, sel.get()), PQ_ERR_INVALID_ARGUMENT,
                "query.dtype");
}

// --- Saved state ------------------------------------------------------------

std::vector<uint8_t> save(pq_context* ctx, uint64_t seq) {
  uint64_t size = 0;
  EXPECT_EQ(pq_sequence_state_size(ctx, seq, &size), PQ_OK) << pq_last_error();
  std::vector<uint8_t> bytes(size);
  uint64_t written = 0;
  EXPECT_EQ(pq_sequence_save_buffer(ctx, seq, bytes.data(), size, &written), PQ_OK)
      << pq_last_error();
  return bytes;
}

TEST_P(Fp8, StateKeepsItsScalesAndRefusesOthers) {
  constexpr int32_t kQ = 4, kKv = 2, kDim = 16;
  pq_config c = fp8_config(dtype(), kQ, kKv, kDim, PQ_SELECTOR_PQ);
  c.kmeans_iterations = 3;
  const float scales[2 * kKv] = {0.5f, 1.5f, 2.5f, 0.25f};
  c.kv_scale_count = kKv;
  c.kv_scales = scales;
  Ctx a(c);
  ASSERT_TRUE(a.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(a, 1));
  std::vector<uint8_t> kv = random_codes(dtype(), 1000 * kKv * kDim, 70);
  pq_tensor kt = tensor_of(kv.data(), dtype(), 1000, kKv, kDim);
  PQ_ASSERT_OK(pq_prefill_layer(a, 1, 0, &kt, &kt));
  const std::vector<uint8_t> state = save(a, 1);

  Ctx same(c);  // the same scales, given per layer where they agree: restores
  PQ_ASSERT_OK(pq_sequence_restore(same, 1, state.data(), state.size()));
  const std::vector<float> qf = random_normal(kQ * kDim, 71);
  pq_tensor q = tensor_of(const_cast<float*>(qf.data()), PQ_DTYPE_F32, 1, kQ, kDim);
  const int64_t cap = selection_capacity(a, 1, 0);
  Sel s1(kKv, cap), s2(kKv, cap);
  PQ_ASSERT_OK(pq_decode_select(a, 1, 0, &q, s1.get()));
  PQ_ASSERT_OK(pq_decode_select(same, 1, 0, &q, s2.get()));
  for (int32_t h = 0; h < kKv; ++h) EXPECT_EQ(s1.row(h), s2.row(h));

  const float other[2 * kKv] = {0.5f, 1.5f, 2.5f, 0.3f};  // V of kv head 1 differs
  c.kv_scales = other;
  Ctx differs(c);
  PQ_EXPECT_ERR(pq_sequence_restore(differs, 1, state.data(), state.size()), PQ_ERR_INCOMPATIBLE,
                "V, kv head 1");
  uint64_t used = 0;
  PQ_EXPECT_ERR(pq_sequence_restore_begin(differs, 1, state.data(), state.size(), &used),
                PQ_ERR_INCOMPATIBLE, "kv scale");
  int64_t count = -1;
  PQ_ASSERT_OK(pq_sequence_count(differs, &count));
  EXPECT_EQ(count, 0);
  c.kv_scale_count = 0;  // every scale 1
  c.kv_scales = nullptr;
  Ctx unit(c);
  PQ_EXPECT_ERR(pq_sequence_restore(unit, 1, state.data(), state.size()), PQ_ERR_INCOMPATIBLE,
                "kv scale");
}

// --- An index-only context (PQ_KV_TIER_CALLER) over fp8 keys -------------

// Its codes, and its re-rank from the caller's pool, read the keys scaled
// as the host tier does: it selects what a host-tier fp8 context selects.
TEST_P(Fp8, IndexOnlySelectsWhatTheHostTierSelects) {
  constexpr int32_t kKv = 2, kQ = 4, kDim = 16;
  constexpr int64_t kTokens = 1200;
  const float scales[2 * kKv] = {0.5f, 1.75f, 1.f, 1.f};
  pq_config c = fp8_config(dtype(), kQ, kKv, kDim, PQ_SELECTOR_PQ);
  c.kv_scale_count = kKv;
  c.kv_scales = scales;
  c.pq_rerank = 1.f;
  c.topk_tokens = 60;
  Ctx host(c);
  c.kv_tier = PQ_KV_TIER_CALLER;
  Ctx index(c);
  ASSERT_TRUE(host.ok() && index.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(host, 1));
  PQ_ASSERT_OK(pq_sequence_add(index, 1));
  std::vector<uint8_t> k = random_codes(dtype(), kTokens * kKv * kDim, 21);
  pq_tensor kt = tensor_of(k.data(), dtype(), kTokens, kKv, kDim);
  PQ_ASSERT_OK(pq_prefill_layer(host, 1, 0, &kt, &kt));
  PQ_ASSERT_OK(pq_prefill_layer(index, 1, 0, &kt, nullptr));
  pq_paged_keys pool{};
  pool.pool = kt;  // dense: position p is row p
  for (int step = 0; step < 4; ++step) {
    const std::vector<float> q = random_normal(kQ * kDim, 30 + step);
    pq_tensor query = tensor_of(const_cast<float*>(q.data()), PQ_DTYPE_F32, 1, kQ, kDim);
    const int64_t cap = selection_capacity(host, 1, 0);
    Sel want(kKv, cap), got(kKv, cap);
    PQ_ASSERT_OK(pq_decode_select(host, 1, 0, &query, want.get()));
    PQ_ASSERT_OK(
        pq_decode_select_multi(index, 1, 0, &query, PQ_ROWS_PER_TOKEN, &pool, got.get()));
    for (int32_t h = 0; h < kKv; ++h) EXPECT_EQ(got.row(h), want.row(h)) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8, ::testing::Values(PQ_DTYPE_FP8_E4M3, PQ_DTYPE_FP8_E5M2),
                         [](const ::testing::TestParamInfo<int32_t>& i) {
                           return i.param == PQ_DTYPE_FP8_E4M3 ? std::string("e4m3")
                                                               : std::string("e5m2");
                         });

}  // namespace
