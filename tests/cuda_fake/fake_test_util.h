// What the tests of the CUDA backend through the host fake of its plug-in
// share: the fake itself (dlopened from the same file libpqcache opens, so
// there is one instance and one set of counters), its "device" memory, and
// the configuration and context the tests start from.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "api_test_util.h"
#include "backend/cuda/cuda_plugin_abi.h"
#include "fake_cuda_plugin.h"

namespace {

using namespace pqt;

struct Fake {
  const pq_cuda_plugin* table = nullptr;
  pq_fake_cuda_counters_get_fn counters_get = nullptr;
  pq_fake_cuda_pending_fn pending = nullptr;
  pq_fake_cuda_synchronize_all_fn synchronize_all = nullptr;
  pq_fake_cuda_capture_begin_fn capture_begin = nullptr;
  pq_fake_cuda_capture_end_fn capture_end = nullptr;
  pq_fake_cuda_graph_replay_fn graph_replay = nullptr;

  static Fake& get() {
    static Fake fake = [] {
      Fake f;
      // The same file libpqcache opens: one instance, one set of counters.
      void* h = dlopen(PQ_FAKE_CUDA_PLUGIN_FILE, RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) return f;
      auto entry = reinterpret_cast<pq_cuda_plugin_entry_fn>(dlsym(h, PQ_CUDA_PLUGIN_ENTRY));
      f.table = entry ? entry(0) : nullptr;  // whatever it speaks (PQ_FAKE_CUDA_ABI)
      f.counters_get =
          reinterpret_cast<pq_fake_cuda_counters_get_fn>(dlsym(h, "pq_fake_cuda_counters_get"));
      f.pending = reinterpret_cast<pq_fake_cuda_pending_fn>(dlsym(h, "pq_fake_cuda_pending"));
      f.synchronize_all = reinterpret_cast<pq_fake_cuda_synchronize_all_fn>(
          dlsym(h, "pq_fake_cuda_synchronize_all"));
      f.capture_begin = reinterpret_cast<pq_fake_cuda_capture_begin_fn>(
          dlsym(h, "pq_fake_cuda_capture_begin"));
      f.capture_end =
          reinterpret_cast<pq_fake_cuda_capture_end_fn>(dlsym(h, "pq_fake_cuda_capture_end"));
      f.graph_replay =
          reinterpret_cast<pq_fake_cuda_graph_replay_fn>(dlsym(h, "pq_fake_cuda_graph_replay"));
      return f;
    }();
    return fake;
  }
  pq_fake_cuda_counters counters() const {
    pq_fake_cuda_counters c{};
    counters_get(&c);
    return c;
  }
};

// What the fake counted since `before` (waits, launches, bytes up).
pq_fake_cuda_counters counters_since(const pq_fake_cuda_counters& before) {
  const pq_fake_cuda_counters after = Fake::get().counters();
  pq_fake_cuda_counters d{};
  d.host_waits = after.host_waits - before.host_waits;
  d.kernel_launches = after.kernel_launches - before.kernel_launches;
  d.bytes_to_device = after.bytes_to_device - before.bytes_to_device;
  d.bytes_to_host = after.bytes_to_host - before.bytes_to_host;
  d.device_bytes_live = after.device_bytes_live - before.device_bytes_live;
  d.device_allocs = after.device_allocs - before.device_allocs;
  d.device_frees = after.device_frees - before.device_frees;
  d.host_allocs = after.host_allocs - before.host_allocs;
  d.host_frees = after.host_frees - before.host_frees;
  d.pageable_copies = after.pageable_copies - before.pageable_copies;
  d.capture_refusals = after.capture_refusals - before.capture_refusals;
  d.event_records = after.event_records - before.event_records;
  d.inline_copies = after.inline_copies - before.inline_copies;
  d.rows_copied = after.rows_copied - before.rows_copied;
  return d;
}

// "Device" memory of the fake, filled from / read back to the host.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    char err[256] = {0};
    EXPECT_EQ(Fake::get().table->device_alloc(&ptr_, bytes, err, sizeof err), 0) << err;
  }
  ~DeviceBuffer() {
    char err[256] = {0};
    Fake::get().table->device_free(ptr_, err, sizeof err);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  void upload(const void* src, size_t bytes) {
    char err[256] = {0};
    ASSERT_EQ(Fake::get().table->copy(ptr_, src, bytes, PQ_COPY_HOST_TO_DEVICE, err, sizeof err),
              0)
        << err;
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(bytes_);
    char err[256] = {0};
    EXPECT_EQ(Fake::get().table->copy(out.data(), ptr_, bytes_, PQ_COPY_DEVICE_TO_HOST, err,
                                      sizeof err),
              0)
        << err;
    return out;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// A host tensor's bytes in device memory, with the same strides.
struct DeviceTensor {
  DeviceBuffer buffer;
  pq_tensor t;
  explicit DeviceTensor(const HostTensor& host)
      : buffer(std::max<size_t>(host.bytes.size(), 1)), t(host.t) {
    if (!host.bytes.empty()) buffer.upload(host.bytes.data(), host.bytes.size());
    t.data = buffer.get();
    t.memory = PQ_MEMORY_DEVICE;
  }
};

constexpr int32_t kLayers = 2, kQHeads = 8, kKvHeads = 2, kDim = 32;

pq_config base_config(int32_t dtype) {
  pq_config c = make_config(kLayers, kQHeads, kKvHeads, kDim, dtype);
  c.sink_tokens = 4;
  c.local_tokens = 16;
  c.topk_tokens = 24;
  c.pq_subspaces = 4;
  c.pq_bits = 6;
  c.kmeans_iterations = 6;
  c.worker_threads = 2;
  c.cache_tokens = 64;
  c.cache_block_tokens = 8;
  return c;
}

Ctx make_fake_cuda_ctx(pq_config c) {
  c.backend = PQ_BACKEND_CUDA;
  c.cuda_plugin_path = PQ_FAKE_CUDA_PLUGIN_FILE;
  return Ctx(c);
}

std::vector<uint8_t> host_bytes(const HostTensor& t) { return t.bytes; }

// One decode step's data for (layer, step): a token's K/V and its query.
struct Step {
  HostTensor k, v, q;
};
Step step_data(int32_t layer, int64_t step, int32_t dtype, uint64_t seq) {
  const uint64_t seed = 1000003 * seq + 7919 * layer + step;
  return Step{make_tensor(random_normal(kKvHeads * kDim, seed), 1, kKvHeads, kDim, dtype),
              make_tensor(random_normal(kKvHeads * kDim, seed + 1), 1, kKvHeads, kDim, dtype),
              make_tensor(random_normal(kQHeads * kDim, seed + 2), 1, kQHeads, kDim, dtype)};
}

// A selection whose arrays are fake device memory.
struct DeviceSel {
  DeviceBuffer positions, counts;
  pq_selection s{};
  int64_t capacity;
  explicit DeviceSel(int64_t cap)
      : positions(std::max<size_t>(static_cast<size_t>(kKvHeads * cap) * 4, 4)),
        counts(kKvHeads * 4),
        capacity(cap) {
    s.positions = static_cast<int32_t*>(positions.get());
    s.counts = static_cast<int32_t*>(counts.get());
    s.capacity = cap;
  }
  // Row h as the host sees it once the stream ran (a download: a wait).
  std::vector<int32_t> row(int32_t h) const {
    const std::vector<uint8_t> p = positions.download(), c = counts.download();
    int32_t count = 0;
    std::memcpy(&count, c.data() + 4 * h, 4);
    std::vector<int32_t> out(static_cast<size_t>(std::max(count, 0)));
    std::memcpy(out.data(), p.data() + 4 * h * capacity, 4 * out.size());
    return out;
  }
};

// A prompt's random K/V for layer l (seeds seed + 3l and seed + 3l + 1).
struct PromptKv {
  HostTensor k, v;
};
PromptKv prompt_kv(int32_t l, int64_t tokens, int32_t dtype, uint64_t seed) {
  return PromptKv{make_tensor(random_normal(tokens * kKvHeads * kDim, seed + 3 * l), tokens,
                              kKvHeads, kDim, dtype),
                  make_tensor(random_normal(tokens * kKvHeads * kDim, seed + 3 * l + 1), tokens,
                              kKvHeads, kDim, dtype)};
}

// A sequence added and prefilled on every layer with prompt_kv, its index
// built.
void add_prefilled(pq_context* ctx, uint64_t id, int64_t tokens, int32_t dtype, uint64_t seed) {
  ASSERT_EQ(pq_sequence_add(ctx, id), PQ_OK);
  for (int32_t l = 0; l < kLayers; ++l) {
    PromptKv kv = prompt_kv(l, tokens, dtype, seed);
    ASSERT_EQ(pq_prefill_layer(ctx, id, l, kv.k.get(), kv.v.get()), PQ_OK) << pq_last_error();
  }
  ASSERT_EQ(pq_wait_builds(ctx), PQ_OK);
}

// The items of a batch: sequences 5..8 of 700, 333, 40 and 512 tokens (40:
// a middle shorter than k), prefilled alike on every context given.
const std::vector<uint64_t> kBatchIds{5, 6, 7, 8};
void add_batch_sequences(const std::vector<pq_context*>& ctxs, int32_t dtype) {
  const int64_t lengths[] = {700, 333, 40, 512};
  for (size_t i = 0; i < kBatchIds.size(); ++i)
    for (pq_context* ctx : ctxs) add_prefilled(ctx, kBatchIds[i], lengths[i], dtype, 3 * kBatchIds[i]);
}

// A captured step's replay for `token` of sequence 1, layer 0: the token's
// K/V appended on both contexts, the engine's query written where the graph
// reads it, the graph replayed on `stream` and waited for. Returns the
// token's data (the CPU selects with its query).
Step replay_token(pq_context* cpu, pq_context* cuda, void* stream, int64_t token, DeviceTensor& dq) {
  Step d = step_data(0, token, PQ_DTYPE_F32, 1);
  for (pq_context* ctx : {cpu, cuda})
    EXPECT_EQ(pq_decode_append(ctx, 1, 0, d.k.get(), d.v.get()), PQ_OK) << pq_last_error();
  Fake::get().synchronize_all();
  std::memcpy(dq.buffer.get(), d.q.bytes.data(), d.q.bytes.size());  // the engine's query
  EXPECT_EQ(Fake::get().graph_replay(stream), 0);
  char err[256] = {0};
  EXPECT_EQ(Fake::get().table->stream_synchronize(stream, err, sizeof err), 0)
      << "the replay faulted: " << err;
  return d;
}

}  // namespace
