// A layer's storing, its asynchronous ingests and its introspection.
#include "layer/layer.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "base/tensor.h"
#include "store/disk_tier.h"
#include "store/index_only_tier.h"
#include "selectors/selector_capabilities.h"

namespace pq {

namespace {

// The caller's host_alloc hook, else the host tier's 2 MiB slabs (the CPU
// backend, store/host_slabs.h), else the memory the backend's device reads
// (the CUDA backend's pinned pool), else operator new.
HostAllocator store_allocator(const ContextShared& shared) {
  if (shared.hooks.allocator.alloc) return shared.hooks.allocator;
  if (shared.host_slabs) return shared.host_slabs->allocator();  // the host tier, CPU backend
  const DeviceMemory* device = shared.backend->device_memory();
  return device ? device->store_allocator() : HostAllocator{};
}

// The tier config.kv_tier names (kv_tier.h).
std::unique_ptr<KvTier> make_kv_tier(ContextShared& shared, const HostAllocator& allocator,
                                     int32_t layer) {
  const pq_config& c = shared.config;
  std::unique_ptr<KvTier> tier;
  if (c.kv_tier == PQ_KV_TIER_CALLER)
    tier = std::make_unique<IndexOnlyTier>(
        IndexOnlyTier::Geometry{c.num_kv_heads, c.head_dim, c.dtype}, &shared.budget,
        shared.cost.chunk, shared.cost.chunk_kv);
  else if (c.kv_tier == PQ_KV_TIER_DISK)
    tier = std::make_unique<DiskKvTier>(
        DiskKvTier::Geometry{c.num_kv_heads, c.head_dim, c.dtype, c.sink_tokens, c.local_tokens},
        &shared.budget, shared.cost.chunk, shared.cost.chunk_kv, shared.chunk_file, allocator);
  else
    tier = std::make_unique<KvStore>(c.num_kv_heads, c.head_dim, c.dtype, &shared.budget,
                                     shared.cost.chunk, allocator);
  tier->set_scales(shared.layer_scales(layer), c.num_kv_heads);
  return tier;
}
}  // namespace

Layer::Layer(ContextShared& shared, int32_t index)
    : shared_(shared),
      layer_index_(index),
      store_(make_kv_tier(shared, store_allocator(shared), index)),
      build_(shared, index) {
  const pq_config& c = shared.config;
  if (c.cache_tokens > 0)
    cache_ = std::make_unique<BlockCache>(c.cache_tokens, c.cache_block_tokens, c.cache_policy,
                                          c.cache_update_blocks);
  if (const DeviceMemory* device = shared.backend->device_memory())
    device_ = device->make_device_layer(c);
}

Layer::~Layer() { cancel_build(); }

void Layer::require_prefill(uint64_t seq_id, const char* call) const {
  if (prefill_tokens_ == 0)
    fail(PQ_ERR_BAD_STATE, "layer " + str(layer_index_) + " of seq_id " + std::to_string(seq_id) +
                               " has no prefill yet; call pq_prefill_layer before " + call);
}

// ---------------------------------------------------------------------------
// Storing
// ---------------------------------------------------------------------------

void Layer::append(const pq_tensor& keys, const pq_tensor& values, bool is_prefill,
                   const SequenceInfo& seq) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!is_prefill) require_prefill(seq.id, "pq_decode_append");
  store_tokens(keys, values, is_prefill, seq);
}

// Appends checked host K/V and, for a prefill, schedules the index build
// over all the layer's tokens; as a whole or not at all.
void Layer::store_tokens(const pq_tensor& keys, const pq_tensor& values, bool is_prefill,
                         const SequenceInfo& seq) {
  require_kv(seq.id, is_prefill ? "pq_prefill_layer" : "pq_decode_append");
  if (!selector_state_) selector_state_ = shared_.selector->make_state(shared_.config, layer_index_);
  const int64_t first = store_->tokens();
  const int64_t prefill_before = prefill_tokens_;
  store_->append(keys, values, shared_.pool.get());  // all or nothing, values checked
  try {
    if (const DeviceMemory* device = shared_.backend->device_memory()) {
      const uint64_t staged =
          device->store_window(device_.get(), *store_, first, keys.tokens, seq.stream);
      for (Counters* c : {&shared_.counters, seq.counters.get()}) c->bytes_staged.fetch_add(staged);
    }
    if (is_prefill) prefill_tokens_ += keys.tokens;
    // The lengths are published before the build is queued: its build_done
    // hook may ask for them as soon as it finishes.
    update_mirrors();
    // Selectors that read no index (EXACT, WINDOW) spend no CPU on one.
    if (is_prefill && shared_.selector->needs_index() && prefill_builds()) {
      build_.schedule(*store_, store_->tokens(), seq);
      build_.set_background(false);  // a prompt's build is waited for
    }
    if (!is_prefill) refresh_device_step(seq);
  } catch (...) {
    prefill_tokens_ = prefill_before;
    store_->truncate(first);  // the call fails as a whole: as if it never came
    update_mirrors();
    throw;
  }
}

// Every prefill call builds over all the layer's tokens, except in an
// index-only layer (PQ_KV_TIER_CALLER in pqcache.h): there a chunked prompt
// builds at its first call and again only once its tokens have doubled
// since the last build started, and never once keys were let go (from the
// first select on, where later chunks are coded with the index as it is).
bool Layer::prefill_builds() const {
  if (store_->keeps_values()) return true;
  if (store_->dropped_keys()) return false;
  const int64_t last = build_.pending() ? build_.pending_tokens()
                       : build_.index() ? build_.index()->built_tokens
                                        : 0;
  return last == 0 || store_->tokens() >= 2 * last;
}

// Prefill from device memory on a backend that copies asynchronously (paper
// Algorithm 1): the copies into pinned memory are enqueued on the sequence's
// stream and the call returns. A pool task waits for them (and for the
// layer's previous ingest, to keep the order), checks the values, stores
// them and schedules the build, so K-Means starts once the copy has landed.
bool Layer::append_async(const pq_tensor& keys, const pq_tensor& values, const SequenceInfo& seq,
                         std::shared_ptr<void> owner) {
  const DeviceMemory* device = shared_.backend->device_memory();
  if (device == nullptr) return false;
  const size_t es = dtype_size(keys.dtype);
  std::shared_ptr<HostCopy> k_copy = device->copy_to_host_async(
      keys.data, static_cast<size_t>(tensor_span_elements(keys)) * es, seq.stream);
  if (!k_copy) return false;
  // An index-only tier reads no value: the keys stand in for them.
  std::shared_ptr<HostCopy> v_copy =
      !store_->keeps_values() ? k_copy
                               : std::shared_ptr<HostCopy>(device->copy_to_host_async(
                                     values.data,
                                     static_cast<size_t>(tensor_span_elements(values)) * es,
                                     seq.stream));
  ingest_.chain(
      shared_,
      [this, owner, seq, k_copy, v_copy, k_view = keys,
       v_view = store_->keeps_values() ? values : keys]() mutable {
        k_copy->wait();
        v_copy->wait();
        k_view.data = const_cast<void*>(k_copy->data());
        v_view.data = const_cast<void*>(v_copy->data());
        k_view.memory = v_view.memory = PQ_MEMORY_HOST;
        std::lock_guard<std::mutex> lock(mutex_);
        store_tokens(k_view, v_view, true, seq);
      },
      "the asynchronous pq_prefill_layer of layer " + str(layer_index_) + " failed");
  return true;
}

void Layer::wait_ingests() { ingest_.wait(); }

void Layer::settle() {
  ingest_.settle();
  if (device_appends_.first.load() >= 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    land_device_writes(/*wait=*/true);
  }
}

void Layer::settle_device() {
  ingest_.settle();
  if (device_appends_.first.load() >= 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    land_device_writes(/*wait=*/false);
  }
}

bool Layer::append_from_device(const pq_tensor& keys, const pq_tensor& values,
                               const SequenceInfo& seq) {
  settle_device();
  std::lock_guard<std::mutex> lock(mutex_);
  require_prefill(seq.id, "pq_decode_append");
  require_kv(seq.id, "pq_decode_append");
  const DeviceMemory* device = shared_.backend->device_memory();
  // Staged through the host: without a device, and for an index-only tier,
  // whose keys are host memory (it keeps no rows the device writes).
  if (device == nullptr || !store_->keeps_values()) return false;
  // Opening may copy a partial chunk shared with a fork: its rows must be
  // there to be read.
  if (store_->open_copies_last_chunk()) land_device_writes(/*wait=*/true);
  const int64_t first = store_->tokens();
  store_->open(keys.tokens);
  bool written = false;
  try {
    written = device->append_from_device(device_.get(), *store_, first, keys, values, seq.stream);
  } catch (...) {
    store_->truncate(first);
    throw;
  }
  if (!written) {
    store_->truncate(first);
    return false;
  }
  const int64_t pending_before = device_appends_.first.load();
  if (pending_before < 0) device_appends_.first.store(first);
  device_appends_.stream = seq.stream;
  update_mirrors();
  try {
    refresh_device_step(seq);
  } catch (...) {  // the call fails as a whole
    store_->truncate(first);
    device_appends_.first.store(pending_before);
    update_mirrors();
    throw;
  }
  return true;
}

void Layer::land_device_writes(bool wait) {
  const int64_t first = device_appends_.first.load();
  if (first < 0) return;
  // Pending device writes come from DeviceMemory::append_from_device alone.
  const DeviceMemory* device = shared_.backend->device_memory();
  if (!device->device_writes_landed(device_.get())) {
    if (!wait) return;
    device->wait_device_writes(device_.get());
  }
  device_appends_.first.store(-1);
  const int64_t end = store_->tokens();
  int64_t t = first;  // where the run holding the first non-finite value starts
  try {
    host_rows(*store_).reject_non_finite_rows(first, end, &t);
  } catch (const Error& e) {
    // Dropped whole, as a host append with a NaN stores nothing.
    store_->truncate(first);
    if (selector_state_) selector_state_->truncate(first);
    device->truncate_device(device_.get(), *store_, first, device_appends_.stream);
    update_mirrors();
    fail(PQ_ERR_INVALID_ARGUMENT,
         "the K/V appended from device memory (pq_decode_append) to layer " +
             str(layer_index_) + " as tokens " + str(first) + ".." + str(end - 1) +
             " hold a non-finite value (" + e.what() + ", counting from token " + str(t) +
             "); those tokens were dropped: the layer holds " + str(first) + " tokens");
  }
}

// ---------------------------------------------------------------------------
// Introspection
// ---------------------------------------------------------------------------

int64_t Layer::capacity() const {
  return shared_.regions(mirrors_.tokens(), layer_index_).count();
}

void Layer::info(pq_layer_info* out) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    poll_build();
  } catch (const Error&) {
    // A failed build is reported by the next select; info stays readable.
  }
  pq_layer_info info{};
  info.struct_size = out->struct_size;
  info.tokens = store_->tokens();
  info.prefill_tokens = prefill_tokens_;
  const Regions r = shared_.regions(info.tokens, layer_index_);
  info.middle_tokens = r.mid_end - r.sink_end;
  const PqIndex* index = build_.index();
  info.coded_tokens = index ? index->coded_tokens : 0;
  info.build_pending = build_.pending() ? 1 : 0;
  info.kmeans_iterations = build_.facts().iterations;
  info.kmeans_budget = build_.facts().budget;
  info.index_ready = index ? 1 : 0;
  info.build_seconds = build_.facts().seconds;
  info.last_select_bytes = mirrors_.last_select_bytes();
  std::memcpy(out, &info, out->struct_size);
}

void Layer::codes(int32_t kv_head, int64_t first, int64_t count, uint8_t* out, uint64_t seq_id) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  require_kv(seq_id, "pq_index_codes");
  require_index(seq_id);
  code_tokens(shared_.regions(store_->tokens(), layer_index_).mid_end);
  const int64_t coded = build_.index()->coded_tokens;
  if (first > coded || count > coded - first)  // no first + count: it may overflow
    fail(PQ_ERR_INVALID_ARGUMENT,
         "first " + str(first) + " and count " + str(count) +
             " reach past the coded tokens: tokens [0, " + str(coded) +
             ") have codes (a build codes every token it covers; decode tokens are coded when "
             "they leave the local window)");
  build_.index()->codes[static_cast<size_t>(kv_head)].copy_out(first, count, out);
}

void Layer::centroids(int32_t kv_head, float* out, uint64_t seq_id) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  require_index(seq_id);
  const int64_t floats = (int64_t{1} << shared_.config.pq_bits) * shared_.config.head_dim;
  std::memcpy(out, build_.index()->codebook->at(kv_head, 0),
              static_cast<size_t>(floats) * sizeof(float));
}

void Layer::add_sizes(pq_stats* out) const { mirrors_.add_to(out); }

void Layer::charge_caller_state(Reservation* room) {
  const uint64_t held = charges_.caller_state.bytes();
  const uint64_t want = selector_state_ ? selector_state_->caller_bytes() : 0;
  if (want < held) {
    charges_.caller_state.split(held - want);  // released as the split goes
  } else if (want > held) {
    const uint64_t more = want - held;
    charges_.caller_state.absorb(room != nullptr && room->bytes() >= more
                             ? room->split(more)
                             : shared_.budget.reserve(more, "layer " + str(layer_index_) +
                                                                "'s token classes"));
  }
}

void Layer::update_mirrors() {
  LayerMirrors::Sizes sizes;
  sizes.tokens = store_->tokens();
  sizes.kv_bytes = store_->bytes_held();
  sizes.charged_bytes =
      store_->bytes_charged() + charges_.fork_state.bytes() + charges_.caller_state.bytes();
  sizes.index_bytes = build_.index() ? build_.index()->bytes() : 0;
  mirrors_.publish(sizes);
}

void Layer::publish_share() {
  const CrossLayerShares* shares = shared_.selector->cross_layer_shares();
  if (shares == nullptr) return;
  std::shared_ptr<LayerShare> share =
      selector_state_ ? shares->layer_share(selector_state_.get(), shared_.config) : nullptr;
  mirrors_.publish_share(std::move(share));
}

}  // namespace pq
