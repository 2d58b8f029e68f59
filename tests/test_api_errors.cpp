// Every documented error path of the public API: the exact status, a
// non-empty pq_last_error() that names the offending argument, and no effect
// (outputs untouched, nothing stored).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"

using namespace pqt;

namespace {

constexpr int32_t kLayers = 2;
constexpr int32_t kQHeads = 4;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kDim = 8;
constexpr uint64_t kSeq = 77;
constexpr uint64_t kMissing = 987654321;
constexpr int64_t kTokens = 40;

pq_config base_config() {
  pq_config c = make_config(kLayers, kQHeads, kKvHeads, kDim, PQ_DTYPE_F32);
  c.pq_bits = 2;
  c.sink_tokens = 2;
  c.local_tokens = 4;
  c.topk_tokens = 4;
  c.kmeans_iterations = 5;
  c.worker_threads = 2;
  return c;
}

// ---------------------------------------------------------------------------
// Configuration errors
// ---------------------------------------------------------------------------

void expect_create_fails(const pq_config& c, pq_status want,
                         std::initializer_list<const char*> names, const char* what) {
  pq_context* ctx = reinterpret_cast<pq_context*>(0x10);
  pq_status st = pq_create(&c, &ctx);
  EXPECT_TRUE(IsError(st, want, names)) << what;
  EXPECT_EQ(ctx, reinterpret_cast<pq_context*>(0x10)) << what << ": *out written on failure";
  if (st == PQ_OK && ctx != reinterpret_cast<pq_context*>(0x10)) pq_destroy(ctx);
}

TEST(ApiErrors, CreateNullPointers) {
  pq_context* ctx = reinterpret_cast<pq_context*>(0x10);
  PQ_EXPECT_ERR(pq_create(nullptr, &ctx), PQ_ERR_INVALID_ARGUMENT, "config");
  EXPECT_EQ(ctx, reinterpret_cast<pq_context*>(0x10));
  pq_config c = base_config();
  PQ_EXPECT_ERR(pq_create(&c, nullptr), PQ_ERR_INVALID_ARGUMENT, "out");
}

TEST(ApiErrors, CreateBadGeometry) {
  pq_config c;
  c = base_config(); c.num_layers = 0;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"num_layers"}, "0 layers");
  c = base_config(); c.num_layers = -3;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"num_layers"}, "negative layers");
  c = base_config(); c.num_q_heads = 0;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"num_q_heads"}, "0 q heads");
  c = base_config(); c.num_kv_heads = 0;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"num_kv_heads"}, "0 kv heads");
  c = base_config(); c.num_q_heads = 5; c.num_kv_heads = 2;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"num_q_heads", "num_kv_heads"},
                      "q heads not a multiple of kv heads");
  c = base_config(); c.num_q_heads = 2; c.num_kv_heads = 4;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"num_q_heads", "num_kv_heads"},
                      "fewer q heads than kv heads");
  c = base_config(); c.head_dim = 0;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"head_dim"}, "head_dim 0");
  c = base_config(); c.head_dim = 9;  // m = 2
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"head_dim", "pq_subspaces"},
                      "head_dim not divisible by m");
  c = base_config(); c.pq_subspaces = 3;  // head_dim 8
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"head_dim", "pq_subspaces"},
                      "m does not divide head_dim");
  c = base_config(); c.pq_subspaces = -1;  // 0 is the default chosen from head_dim
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"pq_subspaces"}, "m = -1");
}

TEST(ApiErrors, CreateBadSettings) {
  pq_config c;
  c = base_config(); c.pq_bits = -1;  // 0 is the default, 8
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"pq_bits"}, "bits -1");
  c = base_config(); c.pq_bits = 9;
  expect_create_fails(c, PQ_ERR_UNSUPPORTED, {"pq_bits"}, "bits 9");
  c = base_config(); c.sink_tokens = -1;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"sink_tokens"}, "negative sink");
  c = base_config(); c.local_tokens = -1;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"local_tokens"}, "negative local");
  for (float f : {0.0f, -0.1f, 1.01f, 2.0f, std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::infinity()}) {
    c = base_config();
    c.topk_tokens = 0;
    c.topk_fraction = f;
    expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"topk_fraction"},
                        ("fraction " + std::to_string(f)).c_str());
  }
  c = base_config(); c.dtype = 5;  // 3 and 4 are fp8 (0.10)
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"dtype"}, "dtype 5");
  c = base_config(); c.dtype = -1;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"dtype"}, "dtype -1");
  c = base_config(); c.selector = PQ_SELECTOR_COUNT;  // one past the last
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"selector"},
                      ("selector " + std::to_string(PQ_SELECTOR_COUNT)).c_str());
  c = base_config(); c.selector = -1;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"selector"}, "selector -1");
  c = base_config(); c.gqa_combine = 3;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"gqa_combine"}, "combine 3");
  c = base_config(); c.kmeans_init = 2;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"kmeans_init"}, "init 2");
  c = base_config(); c.backend = 3;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"backend"}, "backend 3");
  c = base_config(); c.kmeans_iterations = -1;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"kmeans_iterations"}, "iterations -1");
  c = base_config(); c.worker_threads = -1;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"worker_threads"}, "worker_threads -1");
  c = base_config(); c.struct_size = 0;
  expect_create_fails(c, PQ_ERR_INVALID_ARGUMENT, {"struct_size"}, "struct_size 0");
}

// ---------------------------------------------------------------------------
// pq_tensor_init
// ---------------------------------------------------------------------------

TEST(ApiErrors, TensorInit) {
  float buf[64];
  pq_tensor t;
  std::memset(&t, 0x3c, sizeof t);
  pq_tensor before = t;
  PQ_EXPECT_ERR(pq_tensor_init(nullptr, buf, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 2, 2, 8),
                PQ_ERR_INVALID_ARGUMENT, "tensor");
  // Enum parameters are int32_t, so any value a C caller passes is checked.
  PQ_EXPECT_ERR(pq_tensor_init(&t, buf, 7, PQ_LAYOUT_TOKEN_MAJOR, 2, 2, 8),
                PQ_ERR_INVALID_ARGUMENT, "dtype");
  PQ_EXPECT_ERR(pq_tensor_init(&t, buf, PQ_DTYPE_F32, 9, 2, 2, 8),
                PQ_ERR_INVALID_ARGUMENT, "layout");
  EXPECT_STREQ(pq_status_string(-99), "unknown pq_status");
  PQ_EXPECT_ERR(pq_tensor_init(&t, buf, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, -1, 2, 8),
                PQ_ERR_INVALID_ARGUMENT, "tokens");
  PQ_EXPECT_ERR(pq_tensor_init(&t, buf, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 2, -2, 8),
                PQ_ERR_INVALID_ARGUMENT, "heads");
  PQ_EXPECT_ERR(pq_tensor_init(&t, buf, PQ_DTYPE_F32, PQ_LAYOUT_HEAD_MAJOR, 2, 2, -8),
                PQ_ERR_INVALID_ARGUMENT, "head_dim");
  PQ_EXPECT_ERR(pq_tensor_init(&t, nullptr, PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 2, 2, 8),
                PQ_ERR_INVALID_ARGUMENT, "data");
  EXPECT_EQ(std::memcmp(&t, &before, sizeof t), 0) << "tensor written on failure";
}

// ---------------------------------------------------------------------------
// A fixture with one sequence whose layer 0 is prefilled.
// ---------------------------------------------------------------------------

class ApiErrorsCtx : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = base_config();
    ctx_ = Ctx(cfg_);
    ASSERT_TRUE(ctx_.ok()) << pq_last_error();
    PQ_ASSERT_OK(pq_sequence_add(ctx_, kSeq));
    keys_ = random_normal(kTokens * kKvHeads * kDim, 11);
    values_ = random_normal(kTokens * kKvHeads * kDim, 12);
    K_ = make_tensor(keys_, kTokens, kKvHeads, kDim, PQ_DTYPE_F32);
    V_ = make_tensor(values_, kTokens, kKvHeads, kDim, PQ_DTYPE_F32);
    PQ_ASSERT_OK(pq_prefill_layer(ctx_, kSeq, 0, K_.get(), V_.get()));
    query_ = random_normal(kQHeads * kDim, 13);
    Q_ = make_tensor(query_, 1, kQHeads, kDim, PQ_DTYPE_F32);
    one_k_ = make_tensor(random_normal(kKvHeads * kDim, 14), 1, kKvHeads, kDim, PQ_DTYPE_F32);
    one_v_ = make_tensor(random_normal(kKvHeads * kDim, 15), 1, kKvHeads, kDim, PQ_DTYPE_F32);
  }

  int64_t length(int32_t layer) {
    int64_t n = -1;
    EXPECT_TRUE(IsOk(pq_sequence_length(ctx_, kSeq, layer, &n)));
    return n;
  }

  // Prefill data with one non-finite element at (token, head, dim).
  HostTensor poisoned(const std::vector<float>& base, int64_t tokens, int32_t heads, float bad,
                      int64_t tok, int32_t head, int32_t dim) {
    std::vector<float> d = base;
    d[static_cast<size_t>((tok * heads + head) * kDim + dim)] = bad;
    return make_tensor(d, tokens, heads, kDim, PQ_DTYPE_F32);
  }

  pq_config cfg_;
  Ctx ctx_;
  std::vector<float> keys_, values_, query_;
  HostTensor K_, V_, Q_, one_k_, one_v_;
};

TEST_F(ApiErrorsCtx, NullContext) {
  int64_t n = 0;
  int32_t b = 0;
  pq_config out;
  pq_config_default(&out);
  Sel sel(kKvHeads, 64);
  pq_layer_info info = {};
  info.struct_size = sizeof info;
  pq_stats st = {};
  st.struct_size = sizeof st;
  uint8_t codes[16];
  float cents[64];
  PQ_EXPECT_ERR(pq_get_config(nullptr, &out), PQ_ERR_INVALID_ARGUMENT, "ctx", "context");
  PQ_EXPECT_ERR(pq_get_backend(nullptr, &b), PQ_ERR_INVALID_ARGUMENT, "ctx", "context");
  PQ_EXPECT_ERR(pq_sequence_add(nullptr, 1), PQ_ERR_INVALID_ARGUMENT, "ctx", "context");
  PQ_EXPECT_ERR(pq_sequence_remove(nullptr, 1), PQ_ERR_INVALID_ARGUMENT, "ctx", "context");
  PQ_EXPECT_ERR(pq_sequence_length(nullptr, 1, 0, &n), PQ_ERR_INVALID_ARGUMENT, "ctx", "context");
  PQ_EXPECT_ERR(pq_sequence_count(nullptr, &n), PQ_ERR_INVALID_ARGUMENT, "ctx", "context");
  PQ_EXPECT_ERR(pq_prefill_layer(nullptr, kSeq, 0, K_.get(), V_.get()), PQ_ERR_INVALID_ARGUMENT,
                "ctx", "context");
  PQ_EXPECT_ERR(pq_decode_append(nullptr, kSeq, 0, one_k_.get(), one_v_.get()),
                PQ_ERR_INVALID_ARGUMENT, "ctx", "context");
  PQ_EXPECT_ERR(pq_selection_capacity(nullptr, kSeq, 0, &n), PQ_ERR_INVALID_ARGUMENT, "ctx",
                "context");
  PQ_EXPECT_ERR(pq_decode_select(nullptr, kSeq, 0, Q_.get(), sel.get()), PQ_ERR_INVALID_ARGUMENT,
                "ctx", "context");
  PQ_EXPECT_ERR(pq_fetch_kv(nullptr, kSeq, 0, sel.get(), K_.get(), V_.get()),
                PQ_ERR_INVALID_ARGUMENT, "ctx", "context");
  PQ_EXPECT_ERR(pq_layer_info_get(nullptr, kSeq, 0, &info), PQ_ERR_INVALID_ARGUMENT, "ctx",
                "context");
  PQ_EXPECT_ERR(pq_index_codes(nullptr, kSeq, 0, 0, 0, 1, codes), PQ_ERR_INVALID_ARGUMENT, "ctx",
                "context");
  PQ_EXPECT_ERR(pq_index_centroids(nullptr, kSeq, 0, 0, cents, 64), PQ_ERR_INVALID_ARGUMENT, "ctx",
                "context");
  PQ_EXPECT_ERR(pq_stats_get(nullptr, &st), PQ_ERR_INVALID_ARGUMENT, "ctx", "context");
  PQ_EXPECT_ERR(pq_sequence_stats_get(nullptr, kSeq, &st), PQ_ERR_INVALID_ARGUMENT, "ctx",
                "context");
  PQ_EXPECT_ERR(pq_wait_builds(nullptr), PQ_ERR_INVALID_ARGUMENT, "ctx", "context");
}

TEST_F(ApiErrorsCtx, NullOutputs) {
  Sel sel(kKvHeads, 64);
  PQ_EXPECT_ERR(pq_get_config(ctx_, nullptr), PQ_ERR_INVALID_ARGUMENT, "out");
  PQ_EXPECT_ERR(pq_get_backend(ctx_, nullptr), PQ_ERR_INVALID_ARGUMENT, "out");
  PQ_EXPECT_ERR(pq_sequence_length(ctx_, kSeq, 0, nullptr), PQ_ERR_INVALID_ARGUMENT, "out");
  PQ_EXPECT_ERR(pq_sequence_count(ctx_, nullptr), PQ_ERR_INVALID_ARGUMENT, "out");
  PQ_EXPECT_ERR(pq_selection_capacity(ctx_, kSeq, 0, nullptr), PQ_ERR_INVALID_ARGUMENT, "out");
  PQ_EXPECT_ERR(pq_layer_info_get(ctx_, kSeq, 0, nullptr), PQ_ERR_INVALID_ARGUMENT, "out");
  PQ_EXPECT_ERR(pq_stats_get(ctx_, nullptr), PQ_ERR_INVALID_ARGUMENT, "out");
  PQ_EXPECT_ERR(pq_sequence_stats_get(ctx_, kSeq, nullptr), PQ_ERR_INVALID_ARGUMENT, "out");
  PQ_EXPECT_ERR(pq_index_codes(ctx_, kSeq, 0, 0, 0, 1, nullptr), PQ_ERR_INVALID_ARGUMENT, "out");
  PQ_EXPECT_ERR(pq_index_centroids(ctx_, kSeq, 0, 0, nullptr, 64), PQ_ERR_INVALID_ARGUMENT, "out");
  // Tensors and selections.
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, nullptr, V_.get()), PQ_ERR_INVALID_ARGUMENT, "key");
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, K_.get(), nullptr), PQ_ERR_INVALID_ARGUMENT,
                "value");
  PQ_EXPECT_ERR(pq_decode_append(ctx_, kSeq, 0, nullptr, one_v_.get()), PQ_ERR_INVALID_ARGUMENT,
                "key");
  PQ_EXPECT_ERR(pq_decode_append(ctx_, kSeq, 0, one_k_.get(), nullptr), PQ_ERR_INVALID_ARGUMENT,
                "value");
  PQ_EXPECT_ERR(pq_decode_select(ctx_, kSeq, 0, nullptr, sel.get()), PQ_ERR_INVALID_ARGUMENT,
                "query");
  PQ_EXPECT_ERR(pq_decode_select(ctx_, kSeq, 0, Q_.get(), nullptr), PQ_ERR_INVALID_ARGUMENT,
                "out", "selection");
  Sel nopos(kKvHeads, 64);
  pq_selection* s = nopos.get();
  s->positions = nullptr;
  PQ_EXPECT_ERR(pq_decode_select(ctx_, kSeq, 0, Q_.get(), s), PQ_ERR_INVALID_ARGUMENT, "positions");
  Sel nocnt(kKvHeads, 64);
  s = nocnt.get();
  s->counts = nullptr;
  PQ_EXPECT_ERR(pq_decode_select(ctx_, kSeq, 0, Q_.get(), s), PQ_ERR_INVALID_ARGUMENT, "counts");

  PQ_ASSERT_OK(pq_decode_select(ctx_, kSeq, 0, Q_.get(), sel.get()));
  int32_t cap = sel.max_count();
  HostTensor ok = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32);
  HostTensor ok2 = make_tensor(nullptr, cap, kKvHeads, kDim, PQ_DTYPE_F32);
  PQ_EXPECT_ERR(pq_fetch_kv(ctx_, kSeq, 0, nullptr, ok.get(), ok2.get()), PQ_ERR_INVALID_ARGUMENT,
                "selection");
  PQ_EXPECT_ERR(pq_fetch_kv(ctx_, kSeq, 0, sel.get(), nullptr, ok2.get()), PQ_ERR_INVALID_ARGUMENT,
                "key");
  PQ_EXPECT_ERR(pq_fetch_kv(ctx_, kSeq, 0, sel.get(), ok.get(), nullptr), PQ_ERR_INVALID_ARGUMENT,
                "value");
  // A tensor with tokens > 0 and NULL data.
  pq_tensor nodata = *K_.get();
  nodata.data = nullptr;
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, &nodata, V_.get()), PQ_ERR_INVALID_ARGUMENT, "data",
                "key");
  EXPECT_EQ(length(1), 0);
}

TEST_F(ApiErrorsCtx, LayerOutOfRange) {
  int64_t n = 555;
  Sel sel(kKvHeads, 64);
  pq_layer_info info = {};
  info.struct_size = sizeof info;
  uint8_t codes[16];
  float cents[64];
  for (int32_t layer : {-1, kLayers, 1000}) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    PQ_EXPECT_ERR(pq_sequence_length(ctx_, kSeq, layer, &n), PQ_ERR_INVALID_ARGUMENT, "layer");
    PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, layer, K_.get(), V_.get()), PQ_ERR_INVALID_ARGUMENT,
                  "layer");
    PQ_EXPECT_ERR(pq_decode_append(ctx_, kSeq, layer, one_k_.get(), one_v_.get()),
                  PQ_ERR_INVALID_ARGUMENT, "layer");
    PQ_EXPECT_ERR(pq_selection_capacity(ctx_, kSeq, layer, &n), PQ_ERR_INVALID_ARGUMENT, "layer");
    PQ_EXPECT_ERR(pq_decode_select(ctx_, kSeq, layer, Q_.get(), sel.get()),
                  PQ_ERR_INVALID_ARGUMENT, "layer");
    PQ_EXPECT_ERR(pq_fetch_kv(ctx_, kSeq, layer, sel.get(), K_.get(), V_.get()),
                  PQ_ERR_INVALID_ARGUMENT, "layer");
    PQ_EXPECT_ERR(pq_layer_info_get(ctx_, kSeq, layer, &info), PQ_ERR_INVALID_ARGUMENT, "layer");
    PQ_EXPECT_ERR(pq_index_codes(ctx_, kSeq, layer, 0, 0, 1, codes), PQ_ERR_INVALID_ARGUMENT,
                  "layer");
    PQ_EXPECT_ERR(pq_index_centroids(ctx_, kSeq, layer, 0, cents, 64), PQ_ERR_INVALID_ARGUMENT,
                  "layer");
  }
  EXPECT_EQ(n, 555);
  EXPECT_EQ(length(0), kTokens);
}

TEST_F(ApiErrorsCtx, UnknownSequence) {
  int64_t n = 555;
  Sel sel(kKvHeads, 64);
  pq_layer_info info = {};
  info.struct_size = sizeof info;
  pq_stats st = {};
  st.struct_size = sizeof st;
  uint8_t codes[16];
  float cents[64];
  Sel empty(kKvHeads, 64);
  for (int32_t& c : empty.counts) c = 0;
  PQ_EXPECT_ERR(pq_sequence_remove(ctx_, kMissing), PQ_ERR_NOT_FOUND, "seq", "987654321");
  PQ_EXPECT_ERR(pq_sequence_length(ctx_, kMissing, 0, &n), PQ_ERR_NOT_FOUND, "seq", "987654321");
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kMissing, 0, K_.get(), V_.get()), PQ_ERR_NOT_FOUND, "seq",
                "987654321");
  PQ_EXPECT_ERR(pq_decode_append(ctx_, kMissing, 0, one_k_.get(), one_v_.get()), PQ_ERR_NOT_FOUND,
                "seq", "987654321");
  PQ_EXPECT_ERR(pq_selection_capacity(ctx_, kMissing, 0, &n), PQ_ERR_NOT_FOUND, "seq",
                "987654321");
  PQ_EXPECT_ERR(pq_decode_select(ctx_, kMissing, 0, Q_.get(), sel.get()), PQ_ERR_NOT_FOUND, "seq",
                "987654321");
  PQ_EXPECT_ERR(pq_fetch_kv(ctx_, kMissing, 0, empty.get(), K_.get(), V_.get()), PQ_ERR_NOT_FOUND,
                "seq", "987654321");
  PQ_EXPECT_ERR(pq_layer_info_get(ctx_, kMissing, 0, &info), PQ_ERR_NOT_FOUND, "seq",
                "987654321");
  PQ_EXPECT_ERR(pq_index_codes(ctx_, kMissing, 0, 0, 0, 1, codes), PQ_ERR_NOT_FOUND, "seq",
                "987654321");
  PQ_EXPECT_ERR(pq_index_centroids(ctx_, kMissing, 0, 0, cents, 64), PQ_ERR_NOT_FOUND, "seq",
                "987654321");
  PQ_EXPECT_ERR(pq_sequence_stats_get(ctx_, kMissing, &st), PQ_ERR_NOT_FOUND, "seq", "987654321");
  EXPECT_EQ(n, 555);
  EXPECT_EQ(sel.counts[0], -1) << "selection written on failure";
}

TEST_F(ApiErrorsCtx, DuplicateSequence) {
  PQ_EXPECT_ERR(pq_sequence_add(ctx_, kSeq), PQ_ERR_INVALID_ARGUMENT, "seq", "77");
  // The existing sequence is intact.
  EXPECT_EQ(length(0), kTokens);
  int64_t count = -1;
  PQ_ASSERT_OK(pq_sequence_count(ctx_, &count));
  EXPECT_EQ(count, 1);
}

TEST_F(ApiErrorsCtx, KvHeadOutOfRange) {
  uint8_t codes[16];
  float cents[2 * 4 * 4];
  PQ_ASSERT_OK(pq_wait_builds(ctx_));
  for (int32_t h : {-1, kKvHeads, 99}) {
    SCOPED_TRACE("kv_head " + std::to_string(h));
    PQ_EXPECT_ERR(pq_index_codes(ctx_, kSeq, 0, h, 0, 1, codes), PQ_ERR_INVALID_ARGUMENT,
                  "kv_head");
    PQ_EXPECT_ERR(pq_index_centroids(ctx_, kSeq, 0, h, cents, 2 * 4 * 4), PQ_ERR_INVALID_ARGUMENT,
                  "kv_head");
  }
}

TEST_F(ApiErrorsCtx, IndexRangesAndBufferSizes) {
  PQ_ASSERT_OK(pq_wait_builds(ctx_));
  std::vector<uint8_t> codes(kTokens * 2 + 16);
  // m = 2, b = 2, sub_dim 4: 2 * 4 * 4 floats.
  std::vector<float> cents(32);
  PQ_EXPECT_OK(pq_index_codes(ctx_, kSeq, 0, 0, 0, kTokens, codes.data()));
  PQ_EXPECT_OK(pq_index_centroids(ctx_, kSeq, 0, 0, cents.data(), 32));
  PQ_EXPECT_ERR(pq_index_centroids(ctx_, kSeq, 0, 0, cents.data(), 31), PQ_ERR_INVALID_ARGUMENT,
                "out_floats");
  PQ_EXPECT_ERR(pq_index_codes(ctx_, kSeq, 0, 0, 0, kTokens + 1, codes.data()),
                PQ_ERR_INVALID_ARGUMENT, "count", "first", "token");
  PQ_EXPECT_ERR(pq_index_codes(ctx_, kSeq, 0, 0, -1, 2, codes.data()), PQ_ERR_INVALID_ARGUMENT,
                "first");
  PQ_EXPECT_ERR(pq_index_codes(ctx_, kSeq, 0, 0, 0, -1, codes.data()), PQ_ERR_INVALID_ARGUMENT,
                "count");
  PQ_EXPECT_ERR(pq_index_codes(ctx_, kSeq, 0, 0, kTokens, 1, codes.data()),
                PQ_ERR_INVALID_ARGUMENT, "first", "count", "token");
}

TEST_F(ApiErrorsCtx, AppendedTokensInLocalWindowAreNotCoded) {
  // local_tokens = 4: after one append, the appended token is in the window.
  PQ_ASSERT_OK(pq_decode_append(ctx_, kSeq, 0, one_k_.get(), one_v_.get()));
  Sel sel(kKvHeads, 64);
  PQ_ASSERT_OK(pq_decode_select(ctx_, kSeq, 0, Q_.get(), sel.get()));
  uint8_t codes[8];
  std::memset(codes, 0xfe, sizeof codes);
  PQ_EXPECT_ERR(pq_index_codes(ctx_, kSeq, 0, 0, kTokens, 1, codes), PQ_ERR_INVALID_ARGUMENT,
                "first", "count", "token", "coded", "local");
  EXPECT_EQ(codes[0], 0xfe);
  EXPECT_EQ(codes[1], 0xfe);
  // The prefill tokens, even those in the local window, are coded.
  PQ_EXPECT_OK(pq_index_codes(ctx_, kSeq, 0, 0, kTokens - 1, 1, codes));
}

TEST_F(ApiErrorsCtx, TensorShapeMismatch) {
  std::vector<float> d3 = random_normal(kTokens * 3 * kDim, 21);
  HostTensor bad_heads = make_tensor(d3, kTokens, 3, kDim, PQ_DTYPE_F32);
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, bad_heads.get(), V_.get()), PQ_ERR_INVALID_ARGUMENT,
                "heads");
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, K_.get(), bad_heads.get()), PQ_ERR_INVALID_ARGUMENT,
                "heads");
  std::vector<float> d16 = random_normal(kTokens * kKvHeads * 16, 22);
  HostTensor bad_dim = make_tensor(d16, kTokens, kKvHeads, 16, PQ_DTYPE_F32);
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, bad_dim.get(), V_.get()), PQ_ERR_INVALID_ARGUMENT,
                "head_dim");
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, K_.get(), bad_dim.get()), PQ_ERR_INVALID_ARGUMENT,
                "head_dim");
  HostTensor f16 = make_tensor(keys_, kTokens, kKvHeads, kDim, PQ_DTYPE_F16);
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, f16.get(), V_.get()), PQ_ERR_INVALID_ARGUMENT,
                "dtype");
  // dtypes by name, as the bindings and pq_config's names write them; no "1 (f16)".
  EXPECT_STREQ(pq_last_error(), "pq_prefill_layer: keys.dtype is f16; the context stores f32");
  HostTensor bf16 = make_tensor(values_, kTokens, kKvHeads, kDim, PQ_DTYPE_BF16);
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, K_.get(), bf16.get()), PQ_ERR_INVALID_ARGUMENT,
                "dtype");
  pq_tensor bad_enum = *K_.get();
  bad_enum.dtype = 9;
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, &bad_enum, V_.get()), PQ_ERR_INVALID_ARGUMENT,
                "dtype");
  EXPECT_STREQ(pq_last_error(),
               "pq_prefill_layer: keys.dtype is 9 (not a pq_dtype; PQ_DTYPE_F32 (0) is f32, "
               "PQ_DTYPE_F16 (1) f16, PQ_DTYPE_BF16 (2) bf16, PQ_DTYPE_FP8_E4M3 (3) fp8_e4m3, "
               "PQ_DTYPE_FP8_E5M2 (4) fp8_e5m2); the context stores f32");
  // Token count of K and V differ.
  HostTensor short_v = make_tensor(values_, kTokens - 1, kKvHeads, kDim, PQ_DTYPE_F32);
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, K_.get(), short_v.get()), PQ_ERR_INVALID_ARGUMENT,
                "tokens");
  HostTensor two_v = make_tensor(values_, 2, kKvHeads, kDim, PQ_DTYPE_F32);
  PQ_EXPECT_ERR(pq_decode_append(ctx_, kSeq, 0, one_k_.get(), two_v.get()), PQ_ERR_INVALID_ARGUMENT,
                "tokens");
  // Negative strides.
  pq_tensor neg = *K_.get();
  neg.token_stride = -static_cast<int64_t>(kKvHeads * kDim);
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, &neg, V_.get()), PQ_ERR_INVALID_ARGUMENT, "stride");
  neg = *K_.get();
  neg.head_stride = -kDim;
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, &neg, V_.get()), PQ_ERR_INVALID_ARGUMENT, "stride");
  // Decode append with the wrong head count.
  HostTensor app3 = make_tensor(random_normal(3 * kDim, 23), 1, 3, kDim, PQ_DTYPE_F32);
  PQ_EXPECT_ERR(pq_decode_append(ctx_, kSeq, 0, app3.get(), one_v_.get()), PQ_ERR_INVALID_ARGUMENT,
                "heads");

  // Nothing was stored by any of these.
  EXPECT_EQ(length(0), kTokens);
  EXPECT_EQ(length(1), 0);
}

TEST_F(ApiErrorsCtx, QueryShape) {
  Sel sel(kKvHeads, 64);
  // kv heads instead of q heads.
  HostTensor q_kv = make_tensor(random_normal(kKvHeads * kDim, 31), 1, kKvHeads, kDim, PQ_DTYPE_F32);
  PQ_EXPECT_ERR(pq_decode_select(ctx_, kSeq, 0, q_kv.get(), sel.get()), PQ_ERR_INVALID_ARGUMENT,
                "heads", "query");
  HostTensor q2 = make_tensor(random_normal(2 * kQHeads * kDim, 32), 2, kQHeads, kDim, PQ_DTYPE_F32);
  PQ_EXPECT_ERR(pq_decode_select(ctx_, kSeq, 0, q2.get(), sel.get()), PQ_ERR_INVALID_ARGUMENT,
                "tokens", "query");
  HostTensor q16 = make_tensor(query_, 1, kQHeads, kDim, PQ_DTYPE_F16);
  PQ_EXPECT_ERR(pq_decode_select(ctx_, kSeq, 0, q16.get(), sel.get()), PQ_ERR_INVALID_ARGUMENT,
                "dtype");
  HostTensor qd = make_tensor(random_normal(kQHeads * 16, 33), 1, kQHeads, 16, PQ_DTYPE_F32);
  PQ_EXPECT_ERR(pq_decode_select(ctx_, kSeq, 0, qd.get(), sel.get()), PQ_ERR_INVALID_ARGUMENT,
                "head_dim");
  EXPECT_EQ(sel.counts[0], -1) << "selection written on failure";
}

TEST_F(ApiErrorsCtx, BeforePrefillIsBadState) {
  Sel sel(kKvHeads, 64);
  PQ_EXPECT_ERR(pq_decode_select(ctx_, kSeq, 1, Q_.get(), sel.get()), PQ_ERR_BAD_STATE, "layer",
                "prefill");
  PQ_EXPECT_ERR(pq_decode_append(ctx_, kSeq, 1, one_k_.get(), one_v_.get()), PQ_ERR_BAD_STATE,
                "layer", "prefill");
  EXPECT_EQ(length(1), 0);
  // A brand-new sequence too.
  PQ_ASSERT_OK(pq_sequence_add(ctx_, 5));
  PQ_EXPECT_ERR(pq_decode_select(ctx_, 5, 0, Q_.get(), sel.get()), PQ_ERR_BAD_STATE, "layer",
                "prefill");
  PQ_EXPECT_ERR(pq_decode_append(ctx_, 5, 0, one_k_.get(), one_v_.get()), PQ_ERR_BAD_STATE, "layer",
                "prefill");
  EXPECT_EQ(sel.counts[0], -1);
}

TEST_F(ApiErrorsCtx, SelectionCapacityTooSmall) {
  int64_t cap = 0;
  PQ_ASSERT_OK(pq_selection_capacity(ctx_, kSeq, 0, &cap));
  // 40 tokens, sink 2 + topk 4 + local 4.
  EXPECT_EQ(cap, 10);
  // Too small: the status says so, counts carry the capacity needed and
  // positions are not touched.
  Sel small(kKvHeads, cap - 1);
  PQ_EXPECT_ERR(pq_decode_select(ctx_, kSeq, 0, Q_.get(), small.get()), PQ_ERR_BUFFER_TOO_SMALL,
                "needs 10 entries");
  for (int32_t h = 0; h < kKvHeads; ++h) EXPECT_EQ(small.counts[h], cap);
  for (int32_t p : small.positions) EXPECT_EQ(p, -1);
  Sel zero(kKvHeads, 0);
  PQ_EXPECT_ERR(pq_decode_select(ctx_, kSeq, 0, Q_.get(), zero.get()), PQ_ERR_BUFFER_TOO_SMALL,
                "capacity");
  EXPECT_EQ(zero.counts[0], cap);
  Sel exact(kKvHeads, cap);
  PQ_EXPECT_OK(pq_decode_select(ctx_, kSeq, 0, Q_.get(), exact.get()));
}

TEST_F(ApiErrorsCtx, SelectionCapacityOverflowingTheAddressSpace) {
  Sel sel(kKvHeads, 10);
  pq_selection huge = *sel.get();
  huge.capacity = INT64_MAX / 2;
  PQ_EXPECT_ERR(pq_decode_select(ctx_, kSeq, 0, Q_.get(), &huge), PQ_ERR_INVALID_ARGUMENT,
                "overflow the address space");
}

TEST_F(ApiErrorsCtx, SelectionCapacityForALength) {
  int64_t cap = -1;
  PQ_ASSERT_OK(pq_selection_capacity_for(ctx_, 0, 40, &cap));
  int64_t current = 0;
  PQ_ASSERT_OK(pq_selection_capacity(ctx_, kSeq, 0, &current));
  EXPECT_EQ(cap, current);  // the sequence holds 40 tokens
  // It never decreases with the length: one size for the longest sequence
  // covers every shorter one.
  int64_t previous = 0;
  for (int64_t tokens = 0; tokens <= 5000; tokens += 7) {
    PQ_ASSERT_OK(pq_selection_capacity_for(ctx_, 0, tokens, &cap));
    EXPECT_GE(cap, previous) << tokens;
    EXPECT_LE(cap, tokens);
    previous = cap;
  }
  PQ_EXPECT_ERR(pq_selection_capacity_for(ctx_, 0, -1, &cap), PQ_ERR_INVALID_ARGUMENT, "tokens");
  PQ_EXPECT_ERR(pq_selection_capacity_for(ctx_, 99, 10, &cap), PQ_ERR_INVALID_ARGUMENT, "layer");
  PQ_EXPECT_ERR(pq_selection_capacity_for(ctx_, 0, 10, nullptr), PQ_ERR_INVALID_ARGUMENT,
                "out_capacity");
  PQ_EXPECT_ERR(pq_selection_capacity_for(nullptr, 0, 10, &cap), PQ_ERR_INVALID_ARGUMENT, "ctx");
}

TEST_F(ApiErrorsCtx, FetchBadSelection) {
  Sel sel(kKvHeads, 10);
  PQ_ASSERT_OK(pq_decode_select(ctx_, kSeq, 0, Q_.get(), sel.get()));
  HostTensor ok = make_tensor(nullptr, 10, kKvHeads, kDim, PQ_DTYPE_F32);
  HostTensor ok2 = make_tensor(nullptr, 10, kKvHeads, kDim, PQ_DTYPE_F32);
  PQ_ASSERT_OK(pq_fetch_kv(ctx_, kSeq, 0, sel.get(), ok.get(), ok2.get()));

  Sel bad(kKvHeads, 10);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    bad.counts[h] = 3;
    bad.positions[h * 10 + 0] = 0;
    bad.positions[h * 10 + 1] = 5;
    bad.positions[h * 10 + 2] = 39;
  }
  PQ_EXPECT_OK(pq_fetch_kv(ctx_, kSeq, 0, bad.get(), ok.get(), ok2.get()));
  bad.positions[1 * 10 + 2] = kTokens;  // one past the end
  PQ_EXPECT_ERR(pq_fetch_kv(ctx_, kSeq, 0, bad.get(), ok.get(), ok2.get()), PQ_ERR_INVALID_ARGUMENT,
                "position");
  bad.positions[1 * 10 + 2] = -1;
  PQ_EXPECT_ERR(pq_fetch_kv(ctx_, kSeq, 0, bad.get(), ok.get(), ok2.get()), PQ_ERR_INVALID_ARGUMENT,
                "position");
  bad.positions[1 * 10 + 2] = 39;
  bad.counts[0] = 11;  // more than capacity
  PQ_EXPECT_ERR(pq_fetch_kv(ctx_, kSeq, 0, bad.get(), ok.get(), ok2.get()), PQ_ERR_INVALID_ARGUMENT,
                "count", "capacity");
  bad.counts[0] = 3;
  // Output tensors too small for max(counts) or with the wrong heads/dtype.
  HostTensor tiny = make_tensor(nullptr, 2, kKvHeads, kDim, PQ_DTYPE_F32);
  PQ_EXPECT_ERR(pq_fetch_kv(ctx_, kSeq, 0, bad.get(), tiny.get(), ok2.get()), PQ_ERR_INVALID_ARGUMENT,
                "tokens", "key");
  HostTensor heads1 = make_tensor(nullptr, 10, 1, kDim, PQ_DTYPE_F32);
  PQ_EXPECT_ERR(pq_fetch_kv(ctx_, kSeq, 0, bad.get(), ok.get(), heads1.get()),
                PQ_ERR_INVALID_ARGUMENT, "heads");
  HostTensor f16 = make_tensor(nullptr, 10, kKvHeads, kDim, PQ_DTYPE_F16);
  PQ_EXPECT_ERR(pq_fetch_kv(ctx_, kSeq, 0, bad.get(), f16.get(), ok2.get()), PQ_ERR_INVALID_ARGUMENT,
                "dtype");
}

// ---------------------------------------------------------------------------
// Non-finite inputs
// ---------------------------------------------------------------------------

TEST_F(ApiErrorsCtx, NonFiniteKeysValuesRejected) {
  const float bads[] = {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()};
  for (float bad : bads) {
    SCOPED_TRACE(std::to_string(bad));
    HostTensor pk = poisoned(keys_, kTokens, kKvHeads, bad, 17, 1, 3);
    PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, pk.get(), V_.get()), PQ_ERR_INVALID_ARGUMENT,
                  "key");
    HostTensor pv = poisoned(values_, kTokens, kKvHeads, bad, 39, 0, 7);
    PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, K_.get(), pv.get()), PQ_ERR_INVALID_ARGUMENT,
                  "value");
    // Appending to an existing layer: nothing stored either.
    PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 0, pk.get(), V_.get()), PQ_ERR_INVALID_ARGUMENT,
                  "key");
    std::vector<float> one = random_normal(kKvHeads * kDim, 41);
    HostTensor ak = poisoned(one, 1, kKvHeads, bad, 0, 1, 0);
    PQ_EXPECT_ERR(pq_decode_append(ctx_, kSeq, 0, ak.get(), one_v_.get()), PQ_ERR_INVALID_ARGUMENT,
                  "key");
    HostTensor av = poisoned(one, 1, kKvHeads, bad, 0, 0, 5);
    PQ_EXPECT_ERR(pq_decode_append(ctx_, kSeq, 0, one_k_.get(), av.get()), PQ_ERR_INVALID_ARGUMENT,
                  "value");
  }
  EXPECT_EQ(length(0), kTokens);
  EXPECT_EQ(length(1), 0);
  pq_layer_info info = layer_info(ctx_, kSeq, 1);
  EXPECT_EQ(info.tokens, 0);
}

TEST_F(ApiErrorsCtx, NonFiniteKeysInF16AndBf16Rejected) {
  for (int32_t dt : {PQ_DTYPE_F16, PQ_DTYPE_BF16}) {
    pq_config c = base_config();
    c.dtype = dt;
    Ctx ctx(c);
    ASSERT_TRUE(ctx.ok());
    PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      std::vector<float> k = keys_;
      k[5 * kKvHeads * kDim + 2] = bad;
      HostTensor pk = make_tensor(k, kTokens, kKvHeads, kDim, dt);
      HostTensor v = make_tensor(values_, kTokens, kKvHeads, kDim, dt);
      PQ_EXPECT_ERR(pq_prefill_layer(ctx, 1, 0, pk.get(), v.get()), PQ_ERR_INVALID_ARGUMENT, "key");
      HostTensor pv = make_tensor(k, kTokens, kKvHeads, kDim, dt);
      HostTensor kk = make_tensor(keys_, kTokens, kKvHeads, kDim, dt);
      PQ_EXPECT_ERR(pq_prefill_layer(ctx, 1, 0, kk.get(), pv.get()), PQ_ERR_INVALID_ARGUMENT,
                    "value");
    }
    int64_t n = -1;
    PQ_ASSERT_OK(pq_sequence_length(ctx, 1, 0, &n));
    EXPECT_EQ(n, 0);
  }
}

TEST_F(ApiErrorsCtx, NonFiniteQueryRejected) {
  Sel sel(kKvHeads, 64);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> q = query_;
    q[3 * kDim + 1] = bad;
    HostTensor Q = make_tensor(q, 1, kQHeads, kDim, PQ_DTYPE_F32);
    PQ_EXPECT_ERR(pq_decode_select(ctx_, kSeq, 0, Q.get(), sel.get()), PQ_ERR_INVALID_ARGUMENT,
                  "query");
    EXPECT_EQ(sel.counts[0], -1);
  }
  PQ_EXPECT_OK(pq_decode_select(ctx_, kSeq, 0, Q_.get(), sel.get()));
}

// ---------------------------------------------------------------------------
// Device memory on the CPU backend
// ---------------------------------------------------------------------------

TEST_F(ApiErrorsCtx, DeviceMemoryUnsupportedOnCpu) {
  pq_tensor dk = *K_.get();
  dk.memory = PQ_MEMORY_DEVICE;
  pq_tensor dv = *V_.get();
  dv.memory = PQ_MEMORY_DEVICE;
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, &dk, V_.get()), PQ_ERR_UNSUPPORTED, "memory",
                "device", "key");
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, K_.get(), &dv), PQ_ERR_UNSUPPORTED, "memory",
                "device", "value");
  pq_tensor ak = *one_k_.get();
  ak.memory = PQ_MEMORY_DEVICE;
  PQ_EXPECT_ERR(pq_decode_append(ctx_, kSeq, 0, &ak, one_v_.get()), PQ_ERR_UNSUPPORTED, "memory",
                "device", "key");
  EXPECT_EQ(length(0), kTokens);
  EXPECT_EQ(length(1), 0);

  Sel sel(kKvHeads, 10);
  PQ_ASSERT_OK(pq_decode_select(ctx_, kSeq, 0, Q_.get(), sel.get()));
  HostTensor ok = make_tensor(nullptr, 10, kKvHeads, kDim, PQ_DTYPE_F32);
  HostTensor ok2 = make_tensor(nullptr, 10, kKvHeads, kDim, PQ_DTYPE_F32);
  pq_tensor dout = *ok.get();
  dout.memory = PQ_MEMORY_DEVICE;
  PQ_EXPECT_ERR(pq_fetch_kv(ctx_, kSeq, 0, sel.get(), &dout, ok2.get()), PQ_ERR_UNSUPPORTED,
                "memory", "device", "key");
  pq_tensor bad_mem = *K_.get();
  bad_mem.memory = 7;
  PQ_EXPECT_ERR(pq_prefill_layer(ctx_, kSeq, 1, &bad_mem, V_.get()), PQ_ERR_INVALID_ARGUMENT,
                "memory");
}

// ---------------------------------------------------------------------------
// Host memory limit
// ---------------------------------------------------------------------------

TEST(ApiErrors, MemoryLimitThenContextStillWorks) {
  pq_config c = base_config();
  // K+V bytes per token: 2 heads * 8 dims * 4 bytes * 2 = 128. A 256-token
  // chunk per (sequence, layer) is 32 KiB; allow 4 chunks' worth.
  c.host_memory_limit = 4 * 256 * 128;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();
  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  const int64_t big = 4000;  // 500 KiB
  std::vector<float> k = random_normal(big * kKvHeads * kDim, 51);
  HostTensor K = make_tensor(k, big, kKvHeads, kDim, PQ_DTYPE_F32);
  HostTensor V = make_tensor(k, big, kKvHeads, kDim, PQ_DTYPE_F32);
  PQ_EXPECT_ERR(pq_prefill_layer(ctx, 1, 0, K.get(), V.get()), PQ_ERR_OUT_OF_MEMORY, "memory",
                "limit", "host_memory_limit");
  int64_t n = -1;
  PQ_ASSERT_OK(pq_sequence_length(ctx, 1, 0, &n));
  EXPECT_EQ(n, 0) << "nothing stored after OOM";
  pq_stats s = stats(ctx);
  EXPECT_EQ(s.tokens, 0);
  EXPECT_LE(s.kv_bytes, c.host_memory_limit);

  // A smaller prefill still fits, and selection works on it.
  const int64_t small = 200;
  HostTensor Ks = make_tensor(k, small, kKvHeads, kDim, PQ_DTYPE_F32);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 1, 0, Ks.get(), Ks.get()));
  PQ_ASSERT_OK(pq_sequence_length(ctx, 1, 0, &n));
  EXPECT_EQ(n, small);
  HostTensor Q = make_tensor(random_normal(kQHeads * kDim, 52), 1, kQHeads, kDim, PQ_DTYPE_F32);
  Sel sel(kKvHeads, 10);
  PQ_EXPECT_OK(pq_decode_select(ctx, 1, 0, Q.get(), sel.get()));
  EXPECT_EQ(sel.counts[0], 10);

  // Appending beyond the limit through decode_append fails the same way.
  PQ_EXPECT_ERR(pq_decode_append(ctx, 1, 0, K.get(), V.get()), PQ_ERR_OUT_OF_MEMORY, "memory",
                "limit", "host_memory_limit");
  PQ_ASSERT_OK(pq_sequence_length(ctx, 1, 0, &n));
  EXPECT_EQ(n, small);
  // A one-token append is fine.
  HostTensor K1 = make_tensor(k, 1, kKvHeads, kDim, PQ_DTYPE_F32);
  PQ_EXPECT_OK(pq_decode_append(ctx, 1, 0, K1.get(), K1.get()));
  PQ_EXPECT_OK(pq_decode_select(ctx, 1, 0, Q.get(), sel.get()));
  // Another sequence also gets a clean OOM, not a crash.
  PQ_ASSERT_OK(pq_sequence_add(ctx, 2));
  PQ_EXPECT_ERR(pq_prefill_layer(ctx, 2, 1, K.get(), V.get()), PQ_ERR_OUT_OF_MEMORY, "memory",
                "limit", "host_memory_limit");
  PQ_EXPECT_OK(pq_prefill_layer(ctx, 2, 1, Ks.get(), Ks.get()));
}

// ---------------------------------------------------------------------------
// Thread-local messages
// ---------------------------------------------------------------------------

TEST_F(ApiErrorsCtx, LastErrorIsPerThread) {
  // Thread B fails with a "layer" message; then thread A fails with a NULL
  // ctx message; B's message must be unchanged.
  std::atomic<int> phase{0};
  std::string b_before, b_after;
  pq_status b_status = PQ_OK;
  std::thread b([&] {
    int64_t n;
    b_status = pq_sequence_length(ctx_, kSeq, 99, &n);
    b_before = pq_last_error();
    phase = 1;
    while (phase.load() != 2) std::this_thread::yield();
    b_after = pq_last_error();
  });
  while (phase.load() != 1) std::this_thread::yield();
  std::string a_before = pq_last_error();
  PQ_EXPECT_ERR(pq_sequence_add(nullptr, 1), PQ_ERR_INVALID_ARGUMENT, "ctx", "context");
  std::string a_msg = pq_last_error();
  phase = 2;
  b.join();
  EXPECT_EQ(b_status, PQ_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains_ci(b_before, "layer")) << b_before;
  EXPECT_EQ(b_after, b_before) << "thread A's failure changed thread B's pq_last_error()";
  EXPECT_NE(a_msg, b_before);
  // A successful call does not clear the thread's message.
  int64_t count;
  PQ_EXPECT_OK(pq_sequence_count(ctx_, &count));
  EXPECT_EQ(std::string(pq_last_error()), a_msg);
}

}  // namespace
