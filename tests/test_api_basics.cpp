// Public API basics: versions, status strings, defaults, tensor descriptors,
// context lifetime, sequences and struct_size versioning.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api_test_util.h"
#include "pqcache.h"

using namespace pqt;

namespace {

TEST(ApiBasics, VersionMacrosMatchRuntime) {
  EXPECT_EQ(PQ_VERSION_NUMBER, PQ_VERSION_MAJOR * 10000 + PQ_VERSION_MINOR * 100 + PQ_VERSION_PATCH);
  EXPECT_EQ(pq_version_number(), PQ_VERSION_NUMBER);
  ASSERT_NE(pq_version_string(), nullptr);
  EXPECT_STREQ(pq_version_string(), PQ_VERSION_STRING);
  std::string expected = std::to_string(PQ_VERSION_MAJOR) + "." + std::to_string(PQ_VERSION_MINOR) +
                         "." + std::to_string(PQ_VERSION_PATCH);
  EXPECT_EQ(std::string(PQ_VERSION_STRING), expected);
  // The same static string every time.
  EXPECT_EQ(pq_version_string(), pq_version_string());
}

TEST(ApiBasics, StatusStringForEveryCode) {
  struct Case {
    pq_status s;
    const char* name;
  } cases[] = {
      {PQ_OK, "PQ_OK"},
      {PQ_ERR_INVALID_ARGUMENT, "PQ_ERR_INVALID_ARGUMENT"},
      {PQ_ERR_OUT_OF_MEMORY, "PQ_ERR_OUT_OF_MEMORY"},
      {PQ_ERR_BAD_STATE, "PQ_ERR_BAD_STATE"},
      {PQ_ERR_NOT_FOUND, "PQ_ERR_NOT_FOUND"},
      {PQ_ERR_UNSUPPORTED, "PQ_ERR_UNSUPPORTED"},
      {PQ_ERR_BACKEND, "PQ_ERR_BACKEND"},
      {PQ_ERR_INTERNAL, "PQ_ERR_INTERNAL"},
      {PQ_ERR_BUFFER_TOO_SMALL, "PQ_ERR_BUFFER_TOO_SMALL"},
      {PQ_ERR_CORRUPT, "PQ_ERR_CORRUPT"},
      {PQ_ERR_INCOMPATIBLE, "PQ_ERR_INCOMPATIBLE"},
  };
  std::set<std::string> seen;
  for (const Case& c : cases) {
    const char* s = pq_status_string(c.s);
    ASSERT_NE(s, nullptr) << c.name;
    std::string str(s);
    // "PQ_ERR_INVALID_ARGUMENT: ..." - starts with the enumerator's name,
    // followed by the end of the string or a non-identifier character.
    EXPECT_EQ(str.compare(0, std::strlen(c.name), c.name), 0) << str;
    if (str.size() > std::strlen(c.name)) {
      char next = str[std::strlen(c.name)];
      EXPECT_FALSE(next == '_' || std::isalnum(static_cast<unsigned char>(next))) << str;
    }
    EXPECT_TRUE(seen.insert(str).second) << "duplicate status string " << str;
    EXPECT_EQ(pq_status_string(c.s), s) << "not a static string";
  }
  for (int unknown : {1, 2, -11, -100, 42, 1 << 30}) {
    const char* s = pq_status_string(static_cast<pq_status>(unknown));
    ASSERT_NE(s, nullptr);
    EXPECT_STREQ(s, "unknown pq_status") << unknown;
  }
}

// Issue 39: a status string describes every use of its status, not one
// (the Redis tier's refused connection read "the compute backend failed",
// a missing key "no such sequence, plug-in or device").
TEST(ApiBasics, StatusStringsFitEveryUseOfTheirStatus) {
  struct Use {
    pq_status s;
    const char* word;  // what the string must name
    const char* where;  // a call that returns the status for it
  } uses[] = {
      {PQ_ERR_NOT_FOUND, "sequence", "pq_sequence_remove of an unknown id"},
      {PQ_ERR_NOT_FOUND, "file", "pq_sequence_restore_file of a missing path"},
      {PQ_ERR_NOT_FOUND, "key", "pq_redis_get of a missing key"},
      {PQ_ERR_NOT_FOUND, "plug-in", "pq_create with the CUDA backend and no plug-in"},
      {PQ_ERR_NOT_FOUND, "device", "pq_create with the CUDA backend and no device"},
      {PQ_ERR_BACKEND, "CUDA", "a CUDA call of the plug-in"},
      {PQ_ERR_BACKEND, "file", "pq_sequence_save_file into an unwritable folder"},
      {PQ_ERR_BACKEND, "Redis", "pq_redis_connect to a port nobody listens on"},
      {PQ_ERR_BACKEND, "callback", "pq_sequence_save whose pq_write_fn returns non-zero"},
      {PQ_ERR_CORRUPT, "Redis", "pq_redis_get of a damaged block"},
      {PQ_ERR_CORRUPT, "file", "pq_sequence_restore_file of a damaged file"},
  };
  for (const Use& u : uses)
    EXPECT_NE(std::string(pq_status_string(u.s)).find(u.word), std::string::npos)
        << pq_status_string(u.s) << " does not fit " << u.where;
  EXPECT_EQ(std::string(pq_status_string(PQ_ERR_BACKEND)).find("compute backend failed"),
            std::string::npos);
}

TEST(ApiBasics, LastErrorIsEmptyOnAFreshThread) {
  std::string msg = "unset";
  std::thread t([&] { msg = pq_last_error() ? pq_last_error() : "(null)"; });
  t.join();
  EXPECT_EQ(msg, "");
}

TEST(ApiBasics, ConfigDefaults) {
  pq_config c;
  std::memset(&c, 0x7b, sizeof c);
  pq_config_default(&c);
  EXPECT_EQ(c.struct_size, sizeof(pq_config));
  EXPECT_EQ(c.num_layers, 0);
  EXPECT_EQ(c.num_q_heads, 0);
  EXPECT_EQ(c.num_kv_heads, 0);
  EXPECT_EQ(c.head_dim, 0);
  EXPECT_EQ(c.dtype, PQ_DTYPE_F16);
  EXPECT_EQ(c.pq_subspaces, 0);  // chosen from head_dim at pq_create (0.7)
  EXPECT_EQ(c.pq_bits, 0);
  EXPECT_EQ(c.kmeans_iterations, 0);
  EXPECT_EQ(c.kmeans_min_iterations, 2);
  EXPECT_EQ(c.kmeans_max_iterations, 25);
  EXPECT_FLOAT_EQ(c.kmeans_tolerance, 1e-4f);
  EXPECT_EQ(c.kmeans_init, PQ_KMEANS_INIT_KMEANSPP);
  EXPECT_EQ(c.kmeans_max_points_per_centroid, 256);
  EXPECT_EQ(c.seed, 0x5eedu);
  EXPECT_EQ(c.compute_alpha, 0.0);
  EXPECT_EQ(c.compute_beta, 0.0);
  EXPECT_EQ(c.compute_gamma, 0.0);
  EXPECT_EQ(c.layer_time_budget, 0.0);
  EXPECT_EQ(c.worker_threads, 0);
  EXPECT_EQ(c.selector, PQ_SELECTOR_PQ);
  EXPECT_EQ(c.sink_tokens, 4);
  EXPECT_EQ(c.local_tokens, 128);
  EXPECT_EQ(c.topk_tokens, 0);
  EXPECT_FLOAT_EQ(c.topk_fraction, 0.2f);
  EXPECT_EQ(c.gqa_combine, PQ_GQA_SUM_SOFTMAX);
  EXPECT_EQ(c.host_memory_limit, 0u);
  EXPECT_EQ(c.backend, PQ_BACKEND_CPU);
  EXPECT_EQ(c.device_id, 0);
  EXPECT_EQ(c.cuda_plugin_path, nullptr);

  pq_config_default(nullptr);  // ignored, must not crash
}

TEST(ApiBasics, TensorInitTokenMajor) {
  std::vector<float> buf(5 * 3 * 8);
  pq_tensor t;
  std::memset(&t, 0x5a, sizeof t);
  PQ_ASSERT_OK(pq_tensor_init(&t, buf.data(), PQ_DTYPE_F32, PQ_LAYOUT_TOKEN_MAJOR, 5, 3, 8));
  EXPECT_EQ(t.data, buf.data());
  EXPECT_EQ(t.dtype, PQ_DTYPE_F32);
  EXPECT_EQ(t.memory, PQ_MEMORY_HOST);
  EXPECT_EQ(t.tokens, 5);
  EXPECT_EQ(t.heads, 3);
  EXPECT_EQ(t.head_dim, 8);
  EXPECT_EQ(t.token_stride, 3 * 8);
  EXPECT_EQ(t.head_stride, 8);
}

TEST(ApiBasics, TensorInitHeadMajor) {
  std::vector<uint16_t> buf(5 * 3 * 8);
  pq_tensor t;
  std::memset(&t, 0x5a, sizeof t);
  PQ_ASSERT_OK(pq_tensor_init(&t, buf.data(), PQ_DTYPE_BF16, PQ_LAYOUT_HEAD_MAJOR, 5, 3, 8));
  EXPECT_EQ(t.data, buf.data());
  EXPECT_EQ(t.dtype, PQ_DTYPE_BF16);
  EXPECT_EQ(t.memory, PQ_MEMORY_HOST);
  EXPECT_EQ(t.tokens, 5);
  EXPECT_EQ(t.heads, 3);
  EXPECT_EQ(t.head_dim, 8);
  EXPECT_EQ(t.token_stride, 8);
  EXPECT_EQ(t.head_stride, 5 * 8);
}

TEST(ApiBasics, TensorInitEmptyWithNullData) {
  pq_tensor t;
  PQ_EXPECT_OK(pq_tensor_init(&t, nullptr, PQ_DTYPE_F16, PQ_LAYOUT_TOKEN_MAJOR, 0, 2, 16));
  EXPECT_EQ(t.tokens, 0);
  EXPECT_EQ(t.dtype, PQ_DTYPE_F16);
}

TEST(ApiBasics, CreateAndDestroy) {
  pq_config c = make_config(2, 4, 2, 16);
  pq_context* ctx = nullptr;
  PQ_ASSERT_OK(pq_create(&c, &ctx));
  ASSERT_NE(ctx, nullptr);
  int32_t backend = -1;
  PQ_EXPECT_OK(pq_get_backend(ctx, &backend));
  EXPECT_EQ(backend, PQ_BACKEND_CPU);
  int64_t count = -1;
  PQ_EXPECT_OK(pq_sequence_count(ctx, &count));
  EXPECT_EQ(count, 0);
  pq_destroy(ctx);
  pq_destroy(nullptr);  // no-op
}

TEST(ApiBasics, ConfigIsCopiedAndEffectiveConfigReadBack) {
  pq_config c = make_config(3, 8, 2, 32, PQ_DTYPE_BF16);
  c.pq_bits = 5;
  c.pq_subspaces = 4;
  c.sink_tokens = 7;
  c.local_tokens = 33;
  c.topk_tokens = 17;
  c.seed = 1234;
  c.worker_threads = 0;
  c.selector = PQ_SELECTOR_EXACT;
  c.gqa_combine = PQ_GQA_MEAN;
  pq_config copy = c;
  pq_context* ctx = nullptr;
  PQ_ASSERT_OK(pq_create(&c, &ctx));
  // The library copied the config: changing ours has no effect.
  std::memset(&c, 0, sizeof c);

  pq_config out;
  pq_config_default(&out);
  PQ_ASSERT_OK(pq_get_config(ctx, &out));
  EXPECT_EQ(out.struct_size, sizeof(pq_config));
  EXPECT_EQ(out.num_layers, copy.num_layers);
  EXPECT_EQ(out.num_q_heads, copy.num_q_heads);
  EXPECT_EQ(out.num_kv_heads, copy.num_kv_heads);
  EXPECT_EQ(out.head_dim, copy.head_dim);
  EXPECT_EQ(out.dtype, copy.dtype);
  EXPECT_EQ(out.pq_bits, 5);
  EXPECT_EQ(out.pq_subspaces, 4);
  EXPECT_EQ(out.sink_tokens, 7);
  EXPECT_EQ(out.local_tokens, 33);
  EXPECT_EQ(out.topk_tokens, 17);
  EXPECT_EQ(out.seed, 1234u);
  EXPECT_EQ(out.selector, PQ_SELECTOR_EXACT);
  EXPECT_EQ(out.gqa_combine, PQ_GQA_MEAN);
  EXPECT_GE(out.worker_threads, 1) << "worker_threads 0 should resolve to the hardware threads";
  pq_destroy(ctx);
}

TEST(ApiBasics, SequencesAddRemoveCountLength) {
  pq_config c = make_config(2, 2, 2, 8);
  c.pq_bits = 2;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok()) << pq_last_error();

  int64_t count = -1;
  for (uint64_t id : {1ull, 42ull, 0xffffffffffffffffull, 0ull}) PQ_ASSERT_OK(pq_sequence_add(ctx, id));
  PQ_ASSERT_OK(pq_sequence_count(ctx, &count));
  EXPECT_EQ(count, 4);

  int64_t len = -1;
  PQ_ASSERT_OK(pq_sequence_length(ctx, 42, 0, &len));
  EXPECT_EQ(len, 0);
  PQ_ASSERT_OK(pq_sequence_length(ctx, 42, 1, &len));
  EXPECT_EQ(len, 0);

  // Prefill layer 1 only: the layers differ.
  std::vector<float> k = random_normal(10 * 2 * 8, 1), v = random_normal(10 * 2 * 8, 2);
  HostTensor K = make_tensor(k, 10, 2, 8, PQ_DTYPE_F32), V = make_tensor(v, 10, 2, 8, PQ_DTYPE_F32);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 42, 1, K.get(), V.get()));
  PQ_ASSERT_OK(pq_sequence_length(ctx, 42, 1, &len));
  EXPECT_EQ(len, 10);
  PQ_ASSERT_OK(pq_sequence_length(ctx, 42, 0, &len));
  EXPECT_EQ(len, 0);
  // A second prefill appends.
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 42, 1, K.get(), V.get()));
  PQ_ASSERT_OK(pq_sequence_length(ctx, 42, 1, &len));
  EXPECT_EQ(len, 20);
  // Other sequences are untouched.
  PQ_ASSERT_OK(pq_sequence_length(ctx, 1, 1, &len));
  EXPECT_EQ(len, 0);

  PQ_ASSERT_OK(pq_sequence_remove(ctx, 42));
  PQ_ASSERT_OK(pq_sequence_count(ctx, &count));
  EXPECT_EQ(count, 3);
  len = 12345;
  PQ_EXPECT_ERR(pq_sequence_length(ctx, 42, 1, &len), PQ_ERR_NOT_FOUND, "seq", "42");
  EXPECT_EQ(len, 12345) << "output written on failure";
  PQ_EXPECT_ERR(pq_sequence_remove(ctx, 42), PQ_ERR_NOT_FOUND, "seq", "42");

  // The id can be reused and starts empty.
  PQ_ASSERT_OK(pq_sequence_add(ctx, 42));
  PQ_ASSERT_OK(pq_sequence_length(ctx, 42, 1, &len));
  EXPECT_EQ(len, 0);
  PQ_ASSERT_OK(pq_sequence_count(ctx, &count));
  EXPECT_EQ(count, 4);

  for (uint64_t id : {1ull, 42ull, 0xffffffffffffffffull, 0ull}) PQ_ASSERT_OK(pq_sequence_remove(ctx, id));
  PQ_ASSERT_OK(pq_sequence_count(ctx, &count));
  EXPECT_EQ(count, 0);
}

TEST(ApiBasics, TwoContextsShareNothing) {
  pq_config c = make_config(1, 2, 2, 8);
  Ctx a(c), b(c);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  PQ_ASSERT_OK(pq_sequence_add(a, 7));
  PQ_ASSERT_OK(pq_sequence_add(b, 7));  // same id in another context is fine
  PQ_ASSERT_OK(pq_sequence_remove(a, 7));
  int64_t count = -1;
  PQ_ASSERT_OK(pq_sequence_count(b, &count));
  EXPECT_EQ(count, 1);
}

// An older caller: its pq_config ends before host_memory_limit. Fields past
// its struct_size take their defaults, whatever bytes follow in memory.
TEST(ApiBasics, OlderSmallerStructSizeAccepted) {
  pq_config c = make_config(1, 2, 2, 8);
  c.pq_bits = 2;
  c.sink_tokens = 1;
  c.local_tokens = 2;
  c.struct_size = static_cast<uint32_t>(offsetof(pq_config, host_memory_limit));
  // Garbage where the old caller's struct has no fields: would be a 1-byte
  // limit (every prefill fails) and an invalid backend if read.
  c.host_memory_limit = 1;
  c.backend = 99;
  c.device_id = -5;
  c.cuda_plugin_path = nullptr;
  pq_context* ctx = nullptr;
  PQ_ASSERT_OK(pq_create(&c, &ctx));
  ASSERT_NE(ctx, nullptr);

  pq_config out;
  pq_config_default(&out);
  PQ_EXPECT_OK(pq_get_config(ctx, &out));
  EXPECT_EQ(out.host_memory_limit, 0u);
  EXPECT_EQ(out.backend, PQ_BACKEND_CPU);
  EXPECT_EQ(out.device_id, 0);
  EXPECT_EQ(out.num_layers, 1);
  EXPECT_EQ(out.sink_tokens, 1);

  int32_t backend = -1;
  PQ_EXPECT_OK(pq_get_backend(ctx, &backend));
  EXPECT_EQ(backend, PQ_BACKEND_CPU);

  PQ_ASSERT_OK(pq_sequence_add(ctx, 1));
  std::vector<float> k = random_normal(20 * 2 * 8, 3);
  HostTensor K = make_tensor(k, 20, 2, 8, PQ_DTYPE_F32), V = make_tensor(k, 20, 2, 8, PQ_DTYPE_F32);
  PQ_EXPECT_OK(pq_prefill_layer(ctx, 1, 0, K.get(), V.get()));
  pq_destroy(ctx);
}

TEST(ApiBasics, GetConfigWritesOnlyUpToCallersStructSize) {
  pq_config c = make_config(1, 2, 2, 8);
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  pq_config out;
  std::memset(&out, 0xee, sizeof out);
  const size_t small = offsetof(pq_config, host_memory_limit);
  out.struct_size = static_cast<uint32_t>(small);
  PQ_ASSERT_OK(pq_get_config(ctx, &out));
  EXPECT_EQ(out.num_layers, 1);
  EXPECT_EQ(out.head_dim, 8);
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(&out);
  for (size_t i = small; i < sizeof out; ++i) {
    ASSERT_EQ(bytes[i], 0xee) << "byte " << i << " past struct_size was written";
  }
}

TEST(ApiBasics, ZeroOrTooLargeStructSizeRejected) {
  pq_config c = make_config(1, 2, 2, 8);
  pq_context* ctx = reinterpret_cast<pq_context*>(0x1);
  c.struct_size = 0;
  PQ_EXPECT_ERR(pq_create(&c, &ctx), PQ_ERR_INVALID_ARGUMENT, "struct_size");
  EXPECT_EQ(ctx, reinterpret_cast<pq_context*>(0x1)) << "*out written on failure";

  // A "newer" caller whose struct is larger than this library knows.
  struct Bigger {
    pq_config c;
    unsigned char extra[64];
  } big;
  std::memset(&big, 0, sizeof big);
  big.c = make_config(1, 2, 2, 8);
  big.c.struct_size = static_cast<uint32_t>(sizeof(pq_config) + 64);
  std::memset(big.extra, 0x11, sizeof big.extra);
  PQ_EXPECT_ERR(pq_create(&big.c, &ctx), PQ_ERR_INVALID_ARGUMENT, "struct_size");
  EXPECT_EQ(ctx, reinterpret_cast<pq_context*>(0x1));
}

TEST(ApiBasics, SequenceStatsOfOneSequence) {
  pq_config c = make_config(1, 2, 2, 8);
  c.pq_bits = 2;
  Ctx ctx(c);
  ASSERT_TRUE(ctx.ok());
  PQ_ASSERT_OK(pq_sequence_add(ctx, 5));
  PQ_ASSERT_OK(pq_sequence_add(ctx, 6));
  std::vector<float> k = random_normal(30 * 2 * 8, 4);
  HostTensor K = make_tensor(k, 30, 2, 8, PQ_DTYPE_F32);
  PQ_ASSERT_OK(pq_prefill_layer(ctx, 5, 0, K.get(), K.get()));
  PQ_ASSERT_OK(pq_wait_builds(ctx));
  pq_stats s5, s6;
  std::memset(&s5, 0, sizeof s5);
  std::memset(&s6, 0, sizeof s6);
  s5.struct_size = s6.struct_size = sizeof(pq_stats);
  PQ_ASSERT_OK(pq_sequence_stats_get(ctx, 5, &s5));
  PQ_ASSERT_OK(pq_sequence_stats_get(ctx, 6, &s6));
  EXPECT_EQ(s5.tokens, 30);
  EXPECT_EQ(s6.tokens, 0);
  EXPECT_GE(s5.kv_bytes, 30u * 2 * 8 * 4 * 2);
  EXPECT_EQ(s6.kv_bytes, 0u);
  EXPECT_EQ(s5.builds_finished, 1u);
  pq_stats all = stats(ctx);
  EXPECT_EQ(all.sequences, 2);
  EXPECT_EQ(all.tokens, 30);
}

}  // namespace
