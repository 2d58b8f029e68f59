#include "context.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "dtype.h"
#include "error.h"
#include "tensor.h"

namespace pq {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

[[noreturn]] void invalid(const std::string& message) { fail(PQ_ERR_INVALID_ARGUMENT, message); }

void require_range(const char* field, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi)
    invalid(std::string("config.") + field + " is " + str(value) + "; expected " + str(lo) +
            ".." + str(hi));
}

void require_finite_nonneg(const char* field, double value) {
  if (!std::isfinite(value) || value < 0)
    invalid(std::string("config.") + field + " is " + std::to_string(value) +
            "; expected a finite value >= 0");
}

// Host copy of a caller tensor that may live in device memory. For host
// tensors it is a plain view; the copy covers the tensor's whole span.
struct StagedTensor {
  pq_tensor view;
  std::vector<uint8_t> buffer;
};

StagedTensor stage_input(Backend& backend, const pq_tensor& t) {
  StagedTensor s;
  s.view = t;
  if (t.memory == PQ_MEMORY_HOST) return s;
  size_t bytes = static_cast<size_t>(tensor_span_elements(t)) * dtype_size(t.dtype);
  s.buffer.resize(bytes);
  backend.copy_to_host(s.buffer.data(), t.data, bytes, t.memory);
  s.view.data = s.buffer.data();
  s.view.memory = PQ_MEMORY_HOST;
  return s;
}

// Checks a caller's selection (pointers, capacity, counts) and returns its
// largest count. positions may be NULL only when capacity is 0.
int64_t check_selection(const pq_selection* sel, int32_t kv_heads) {
  if (sel == nullptr) invalid("selection is NULL");
  if (sel->counts == nullptr) invalid("selection->counts is NULL");
  if (sel->capacity < 0) invalid("selection->capacity is " + str(sel->capacity));
  if (sel->positions == nullptr && sel->capacity > 0) invalid("selection->positions is NULL");
  int64_t max_count = 0;
  for (int32_t h = 0; h < kv_heads; ++h) {
    if (sel->counts[h] < 0 || sel->counts[h] > sel->capacity)
      invalid("selection->counts[" + str(h) + "] is " + str(sel->counts[h]) + "; expected 0.." +
              str(sel->capacity));
    max_count = std::max<int64_t>(max_count, sel->counts[h]);
  }
  return max_count;
}

// Checks every selected position against the layer's n tokens.
void check_positions(const pq_selection* sel, int32_t kv_heads, int64_t n, int32_t layer) {
  for (int32_t h = 0; h < kv_heads; ++h)
    for (int32_t i = 0; i < sel->counts[h]; ++i) {
      int32_t p = sel->positions[h * sel->capacity + i];
      if (p < 0 || p >= n)
        invalid("selection->positions[" + str(h) + " * capacity + " + str(i) + "] is " + str(p) +
                "; layer " + str(layer) + " holds " + str(n) + " tokens");
    }
}

// PQ_ERR_BAD_STATE unless the layer has been prefilled; `call` needs it.
void require_prefill(const Layer& layer, uint64_t id, int32_t layer_index, const char* call) {
  if (layer.prefill_tokens == 0)
    fail(PQ_ERR_BAD_STATE, "layer " + str(layer_index) + " of seq_id " + std::to_string(id) +
                               " has no prefill yet; call pq_prefill_layer before " + call);
}

}  // namespace

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

pq_config resolve_config(const pq_config* in) {
  if (in == nullptr) invalid("config is NULL");
  const uint32_t min_size = offsetof(pq_config, pq_subspaces);
  if (in->struct_size < min_size || in->struct_size > sizeof(pq_config))
    invalid("config->struct_size is " + str(in->struct_size) + "; expected " + str(min_size) +
            ".." + str(sizeof(pq_config)) +
            " (initialise the struct with pq_config_default; a larger size means the caller was "
            "built against a newer pqcache.h than this library)");
  pq_config c;
  pq_config_default(&c);
  std::memcpy(&c, in, in->struct_size);  // an older caller's struct: the rest stays default
  c.struct_size = sizeof(pq_config);

  require_range("num_layers", c.num_layers, 1, 1 << 20);
  require_range("num_kv_heads", c.num_kv_heads, 1, 1 << 16);
  require_range("num_q_heads", c.num_q_heads, 1, 1 << 16);
  if (c.num_q_heads % c.num_kv_heads != 0)
    invalid("config.num_q_heads is " + str(c.num_q_heads) + ", not a multiple of num_kv_heads " +
            str(c.num_kv_heads) + " (GQA groups query heads evenly)");
  require_range("head_dim", c.head_dim, 1, 1 << 16);
  if (!dtype_valid(c.dtype))
    invalid("config.dtype is " + str(c.dtype) + "; expected PQ_DTYPE_F32, _F16 or _BF16");
  require_range("pq_subspaces", c.pq_subspaces, 1, c.head_dim);
  if (c.head_dim % c.pq_subspaces != 0)
    invalid("config.head_dim " + str(c.head_dim) + " is not divisible by pq_subspaces " +
            str(c.pq_subspaces));
  if (c.pq_bits > 8)
    fail(PQ_ERR_UNSUPPORTED, "config.pq_bits is " + str(c.pq_bits) +
                                 "; codes are one byte per subspace, so at most 8 bits");
  require_range("pq_bits", c.pq_bits, 1, 8);
  require_range("kmeans_iterations", c.kmeans_iterations, 0, 100000);
  require_range("kmeans_min_iterations", c.kmeans_min_iterations, 0, 100000);
  require_range("kmeans_max_iterations", c.kmeans_max_iterations, c.kmeans_min_iterations,
                100000);
  require_finite_nonneg("kmeans_tolerance", c.kmeans_tolerance);
  if (c.kmeans_init != PQ_KMEANS_INIT_RANDOM && c.kmeans_init != PQ_KMEANS_INIT_KMEANSPP)
    invalid("config.kmeans_init is " + str(c.kmeans_init) +
            "; expected PQ_KMEANS_INIT_RANDOM (0) or PQ_KMEANS_INIT_KMEANSPP (1)");
  require_range("kmeans_max_points_per_centroid", c.kmeans_max_points_per_centroid, 1,
                1 << 24);
  require_finite_nonneg("compute_alpha", c.compute_alpha);
  require_finite_nonneg("compute_beta", c.compute_beta);
  require_finite_nonneg("compute_gamma", c.compute_gamma);
  require_finite_nonneg("layer_time_budget", c.layer_time_budget);
  require_range("worker_threads", c.worker_threads, 0, 1024);
  if (c.worker_threads == 0)
    c.worker_threads = std::max(1, static_cast<int32_t>(std::thread::hardware_concurrency()));
  if (c.selector < PQ_SELECTOR_PQ || c.selector > PQ_SELECTOR_PYRAMIDKV)
    invalid("config.selector is " + str(c.selector) +
            "; expected a pq_selector value, PQ_SELECTOR_PQ (0) .. PQ_SELECTOR_PYRAMIDKV (10)");
  require_range("sink_tokens", c.sink_tokens, 0, INT32_MAX);
  require_range("local_tokens", c.local_tokens, 0, INT32_MAX);
  require_range("topk_tokens", c.topk_tokens, 0, INT32_MAX);
  if (c.topk_tokens == 0 && !(c.topk_fraction > 0.f && c.topk_fraction <= 1.f))
    invalid("config.topk_fraction is " + std::to_string(c.topk_fraction) +
            "; expected a value in (0, 1] when topk_tokens is 0");
  if (c.gqa_combine != PQ_GQA_SUM_SOFTMAX && c.gqa_combine != PQ_GQA_MAX &&
      c.gqa_combine != PQ_GQA_MEAN)
    invalid("config.gqa_combine is " + str(c.gqa_combine) +
            "; expected PQ_GQA_SUM_SOFTMAX (0), _MAX (1) or _MEAN (2)");
  if (c.backend != PQ_BACKEND_CPU && c.backend != PQ_BACKEND_CUDA && c.backend != PQ_BACKEND_AUTO)
    invalid("config.backend is " + str(c.backend) +
            "; expected PQ_BACKEND_CPU (0), _CUDA (1) or _AUTO (2)");
  require_range("device_id", c.device_id, 0, 1 << 16);
  require_range("sparq_dims", c.sparq_dims, 0, c.head_dim);
  require_range("block_tokens", c.block_tokens, 1, 1 << 20);
  require_range("block_representatives", c.block_representatives, 1, c.block_tokens);
  require_range("observation_window", c.observation_window, 1, 1 << 20);
  require_range("pooling_kernel", c.pooling_kernel, 1, 1025);
  if (c.pooling_kernel % 2 == 0)
    invalid("config.pooling_kernel is " + str(c.pooling_kernel) + "; expected an odd size");
  if (!(c.pyramid_ratio > 0.f && c.pyramid_ratio <= 1.f))
    invalid("config.pyramid_ratio is " + std::to_string(c.pyramid_ratio) +
            "; expected a value in (0, 1]");
  if (!(c.scope_decode_share >= 0.f && c.scope_decode_share <= 1.f))
    invalid("config.scope_decode_share is " + std::to_string(c.scope_decode_share) +
            "; expected a value in [0, 1]");
  require_range("cache_tokens", c.cache_tokens, int64_t{0}, int64_t{1} << 40);
  require_range("cache_block_tokens", c.cache_block_tokens, 1, 1 << 20);
  if (c.cache_policy != PQ_CACHE_LRU && c.cache_policy != PQ_CACHE_LFU)
    invalid("config.cache_policy is " + str(c.cache_policy) +
            "; expected PQ_CACHE_LRU (0) or PQ_CACHE_LFU (1)");
  require_range("cache_update_blocks", c.cache_update_blocks, 0, INT32_MAX);
  c.cuda_plugin_path = nullptr;  // read during pq_create only; never kept
  return c;
}

// ---------------------------------------------------------------------------
// Context and sequences
// ---------------------------------------------------------------------------

Sequence::Sequence(uint64_t seq_id, const pq_config& c, MemoryBudget* budget,
                   const MemoryCost& cost, Reservation fixed_state, const Backend& backend)
    : id(seq_id), fixed(std::move(fixed_state)) {
  layers.reserve(static_cast<size_t>(c.num_layers));
  for (int32_t l = 0; l < c.num_layers; ++l) {
    layers.push_back(
        std::make_unique<Layer>(c.num_kv_heads, c.head_dim, c.dtype, budget, cost.chunk));
    if (c.cache_tokens > 0)
      layers.back()->cache =
          std::make_unique<BlockCache>(c.cache_tokens, c.cache_block_tokens, c.cache_policy,
                                       c.cache_update_blocks);
    layers.back()->device = backend.make_device_layer(c);
  }
}

namespace {
std::unique_ptr<Backend> make_backend(const pq_config& c, const char* plugin_path) {
  switch (c.backend) {
    case PQ_BACKEND_CUDA:
      return load_cuda_backend(plugin_path, c.device_id);
    case PQ_BACKEND_AUTO:
      try {
        return load_cuda_backend(plugin_path, c.device_id);
      } catch (const Error&) {
        return make_cpu_backend();  // no plug-in or no device: the host does the work
      }
    default:
      return make_cpu_backend();
  }
}
}  // namespace

Context::Context(const pq_config& c, const char* plugin_path)
    : config_(c),
      group_size_(c.num_q_heads / c.num_kv_heads),
      scale_(1.0f / std::sqrt(static_cast<float>(c.head_dim))),
      budget_(c.host_memory_limit),
      backend_(make_backend(c, plugin_path)),
      selector_(make_selector(c.selector)),
      cost_(selector_ ? memory_cost(c, *selector_) : MemoryCost{}),
      pool_(std::make_unique<ThreadPool>(c.worker_threads)) {
  if (!selector_)
    fail(PQ_ERR_UNSUPPORTED, "config.selector " + str(c.selector) + " is not built into this library");
  const uint64_t fixed = cost_.sequence_fixed(c.num_layers);
  if (c.host_memory_limit != 0 && fixed > c.host_memory_limit)
    invalid("config.host_memory_limit is " + std::to_string(c.host_memory_limit) +
            " bytes, but one sequence's fixed state alone takes " + std::to_string(fixed) +
            " (" + cost_.explain(c) + "); raise the limit or shrink the configuration");
}

Context::~Context() {
  // Let asynchronous prefills land (they schedule builds on the pool), then
  // cancel every build, then join the workers before anything they use goes.
  {
    std::shared_lock<std::shared_mutex> lock(sequences_mutex_);
    for (auto& entry : sequences_)
      for (auto& layer : entry.second->layers) wait_ingests(*layer);
  }
  {
    std::unique_lock<std::shared_mutex> lock(sequences_mutex_);
    for (auto& entry : sequences_)
      for (auto& layer : entry.second->layers) {
        std::lock_guard<std::mutex> layer_lock(layer->mutex);
        if (layer->pending) layer->pending->cancel.store(true);
      }
  }
  // Join while every member is alive: a cancelled build may still be inside
  // an iteration that uses pool_ (resetting the pointer first raced with it).
  pool_->shutdown();
}

void Context::check_layer(int32_t layer) const {
  if (layer < 0 || layer >= config_.num_layers)
    invalid("layer is " + str(layer) + "; expected 0.." + str(config_.num_layers - 1));
}

std::shared_ptr<Sequence> Context::find(uint64_t id) const {
  std::shared_lock<std::shared_mutex> lock(sequences_mutex_);
  auto it = sequences_.find(id);
  if (it == sequences_.end())
    fail(PQ_ERR_NOT_FOUND, "seq_id " + std::to_string(id) + " is not a sequence of this context");
  return it->second;
}

// The layer, once its asynchronous prefills (if any) have been stored; the
// error of one that failed is thrown here, once. Call without the layer's
// mutex: an ingest in flight needs it.
Layer& Context::layer_of(Sequence& s, int32_t layer) const {
  Layer& l = *s.layers[static_cast<size_t>(layer)];
  wait_ingests(l);
  std::lock_guard<std::mutex> lock(l.ingest_mutex);
  if (l.ingest_status != PQ_OK) {
    const pq_status status = l.ingest_status;
    const std::string message = std::move(l.ingest_error);
    l.ingest_status = PQ_OK;
    l.ingest_error.clear();
    fail(status, message);
  }
  return l;
}

void Context::wait_ingests(Layer& layer) {
  std::shared_future<void> done;
  {
    std::lock_guard<std::mutex> lock(layer.ingest_mutex);
    done = layer.ingest_done;
  }
  if (done.valid()) done.wait();
}

void Context::sequence_add(uint64_t id) {
  Reservation fixed = budget_.reserve(cost_.sequence_fixed(config_.num_layers),
                                      "pq_sequence_add (the fixed state of a sequence: " +
                                          cost_.explain(config_) + ")");
  auto seq =
      std::make_shared<Sequence>(id, config_, &budget_, cost_, std::move(fixed), *backend_);
  std::unique_lock<std::shared_mutex> lock(sequences_mutex_);
  if (!sequences_.emplace(id, std::move(seq)).second)
    invalid("seq_id " + std::to_string(id) + " already exists in this context");
}

void Context::sequence_remove(uint64_t id) {
  std::shared_ptr<Sequence> seq;
  {
    std::unique_lock<std::shared_mutex> lock(sequences_mutex_);
    auto it = sequences_.find(id);
    if (it == sequences_.end())
      fail(PQ_ERR_NOT_FOUND, "seq_id " + std::to_string(id) + " is not a sequence of this context");
    seq = std::move(it->second);
    sequences_.erase(it);
  }
  // Builds in flight stop at their next iteration; their data is freed when
  // the last reference (the build or a racing call) lets go.
  for (auto& layer : seq->layers) {
    std::lock_guard<std::mutex> layer_lock(layer->mutex);
    if (layer->pending) layer->pending->cancel.store(true);
  }
}

int64_t Context::sequence_length(uint64_t id, int32_t layer) const {
  check_layer(layer);
  auto seq = find(id);
  return layer_of(*seq, layer).tokens_mirror.load();
}

int64_t Context::sequence_count() const {
  std::shared_lock<std::shared_mutex> lock(sequences_mutex_);
  return static_cast<int64_t>(sequences_.size());
}

void Context::sequence_set_stream(uint64_t id, void* stream) {
  std::shared_ptr<Sequence> s = find(id);
  if (stream != nullptr && !backend_->supports_streams())
    fail(PQ_ERR_UNSUPPORTED, std::string("cuda_stream is non-NULL but the context uses the ") +
                                 backend_->name() + " backend, which has no streams");
  s->stream.store(stream);
}

// ---------------------------------------------------------------------------
// Prefill, append and builds
// ---------------------------------------------------------------------------

void Context::prefill(uint64_t id, int32_t layer, const pq_tensor* keys, const pq_tensor* values) {
  append(id, layer, keys, values, true);
}

void Context::decode_append(uint64_t id, int32_t layer, const pq_tensor* keys,
                            const pq_tensor* values) {
  append(id, layer, keys, values, false);
}

void Context::append(uint64_t id, int32_t layer_index, const pq_tensor* keys,
                     const pq_tensor* values, bool is_prefill) {
  check_layer(layer_index);
  validate_tensor(keys, {"keys", config_.num_kv_heads, config_.head_dim, config_.dtype, 1, -1});
  validate_tensor(values,
                  {"values", config_.num_kv_heads, config_.head_dim, config_.dtype, 1, -1});
  if (keys->tokens != values->tokens)
    invalid("keys.tokens is " + str(keys->tokens) + " but values.tokens is " +
            str(values->tokens) + "; they must match");
  for (const pq_tensor* t : {keys, values})
    if (!backend_->supports_memory(t->memory))
      fail(PQ_ERR_UNSUPPORTED, std::string(t == keys ? "keys" : "values") +
                                   ".memory is PQ_MEMORY_DEVICE, which the " + backend_->name() +
                                   " backend cannot read (use PQ_BACKEND_CUDA or AUTO)");
  auto seq = find(id);
  if (is_prefill && keys->memory == PQ_MEMORY_DEVICE && values->memory == PQ_MEMORY_DEVICE &&
      prefill_async(seq, layer_index, *keys, *values))
    return;
  StagedTensor k = stage_input(*backend_, *keys);
  StagedTensor v = stage_input(*backend_, *values);
  reject_non_finite(k.view, "keys");
  reject_non_finite(v.view, "values");

  Layer& layer = layer_of(*seq, layer_index);
  std::lock_guard<std::mutex> lock(layer.mutex);
  if (!is_prefill) require_prefill(layer, id, layer_index, "pq_decode_append");
  store_tokens(layer, layer_index, seq, k.view, v.view, is_prefill);
}

// Appends checked host K/V to the layer and, for a prefill, schedules the
// index build over all its tokens. Layer mutex held.
void Context::store_tokens(Layer& layer, int32_t layer_index, const std::shared_ptr<Sequence>& seq,
                           const pq_tensor& keys, const pq_tensor& values, bool is_prefill) {
  if (!layer.selector_state) layer.selector_state = selector_->make_state(config_, layer_index);
  const int64_t first = layer.store.tokens();
  layer.store.append(keys, values);  // all or nothing
  try {
    backend_->store_window(layer.device.get(), layer.store, first, keys.tokens,
                           seq->stream.load());
    // Selectors that read no index (EXACT, WINDOW) spend no CPU on one.
    if (is_prefill && selector_->needs_index()) schedule_build(layer, layer_index, seq);
  } catch (...) {
    layer.store.truncate(first);  // the call fails as a whole: as if it never came
    throw;
  }
  if (is_prefill) layer.prefill_tokens += keys.tokens;
  layer.update_mirrors();
}

// Prefill from device memory on a backend that copies asynchronously (paper
// Algorithm 1): the copies into pinned memory are enqueued on the
// sequence's stream and the call returns. A pool task waits for them (and
// for the layer's previous ingest, to keep the order), checks the values,
// stores them and schedules the build, so K-Means starts once the copy has
// landed. Calls on the layer wait for the ingest first (layer_of); an
// ingest that fails is reported by the next one. Returns false when the
// backend has no asynchronous copy (the caller copies synchronously).
bool Context::prefill_async(const std::shared_ptr<Sequence>& seq, int32_t layer_index,
                            const pq_tensor& keys, const pq_tensor& values) {
  void* stream = seq->stream.load();
  const size_t es = dtype_size(keys.dtype);
  std::shared_ptr<HostCopy> k_copy = backend_->copy_to_host_async(
      keys.data, static_cast<size_t>(tensor_span_elements(keys)) * es, stream);
  if (!k_copy) return false;
  std::shared_ptr<HostCopy> v_copy = backend_->copy_to_host_async(
      values.data, static_cast<size_t>(tensor_span_elements(values)) * es, stream);
  Layer& layer = *seq->layers[static_cast<size_t>(layer_index)];
  std::lock_guard<std::mutex> chain(layer.ingest_mutex);
  std::shared_future<void> previous = layer.ingest_done;
  pq_tensor k_view = keys, v_view = values;
  layer.ingest_done =
      pool_->submit([this, seq, layer_index, k_copy, v_copy, k_view, v_view, previous]() mutable {
        Layer& l = *seq->layers[static_cast<size_t>(layer_index)];
        try {
          if (previous.valid()) previous.wait();
          k_copy->wait();
          v_copy->wait();
          k_view.data = const_cast<void*>(k_copy->data());
          v_view.data = const_cast<void*>(v_copy->data());
          k_view.memory = v_view.memory = PQ_MEMORY_HOST;
          reject_non_finite(k_view, "keys");
          reject_non_finite(v_view, "values");
          std::lock_guard<std::mutex> lock(l.mutex);
          store_tokens(l, layer_index, seq, k_view, v_view, true);
        } catch (const Error& e) {
          std::lock_guard<std::mutex> lock(l.ingest_mutex);
          l.ingest_status = e.status();
          l.ingest_error = "the asynchronous pq_prefill_layer of layer " +
                           std::to_string(layer_index) + " failed; nothing was stored: " + e.what();
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(l.ingest_mutex);
          l.ingest_status = PQ_ERR_INTERNAL;
          l.ingest_error = "the asynchronous pq_prefill_layer of layer " +
                           std::to_string(layer_index) + " failed: " + e.what();
        }
      }).share();
  return true;
}

int32_t Context::iteration_budget(int64_t tokens, int64_t training_points) {
  if (config_.kmeans_iterations > 0) return config_.kmeans_iterations;
  ComputeTimeModel compute{config_.compute_alpha, config_.compute_beta, config_.compute_gamma,
                           config_.layer_time_budget};
  bool has_model = compute.alpha2 > 0 || compute.beta2 > 0 || compute.gamma2 > 0 ||
                   compute.layer_budget > 0;
  if (has_model) {
    std::call_once(profile_once_, [&] {
      KMeansParams p;
      p.subspaces = config_.pq_subspaces;
      p.bits = config_.pq_bits;
      p.init = config_.kmeans_init;
      p.seed = config_.seed;
      cluster_model_ = profile_cluster_time(config_.num_kv_heads, config_.head_dim, p, *pool_);
    });
  }
  return adaptive_iterations(cluster_model_, compute, tokens, training_points,
                             config_.kmeans_min_iterations, config_.kmeans_max_iterations);
}

void Context::schedule_build(Layer& layer, int32_t layer_index,
                             const std::shared_ptr<Sequence>& seq) {
  auto task = std::make_shared<BuildTask>();
  auto snapshot = std::make_shared<KvStore::Snapshot>(layer.store.snapshot());
  task->tokens = snapshot->tokens;
  std::shared_ptr<Counters> seq_counters = seq->counters;
  std::future<void> done = pool_->submit([this, task, snapshot, layer_index, seq_counters] {
    run_build(*task, *snapshot, layer_index, *seq_counters);
  });
  // Only now, with the new build queued, is the old one superseded (it
  // covers fewer tokens): nothing below can fail.
  if (layer.pending) layer.pending->cancel.store(true);
  layer.pending_done = std::move(done);
  layer.pending = std::move(task);
}

void Context::run_build(BuildTask& task, const KvStore::Snapshot& snap, int32_t layer_index,
                        Counters& seq_counters) {
  if (task.cancel.load()) {
    counters_.builds_cancelled.fetch_add(1);
    seq_counters.builds_cancelled.fetch_add(1);
    return;
  }
  auto start = std::chrono::steady_clock::now();
  const int32_t dtype = config_.dtype;
  const int32_t head_dim = config_.head_dim;
  KeyGather gather = [&snap, dtype, head_dim](int32_t head, const int64_t* rows, int64_t count,
                                              float* out) {
    for (int64_t i = 0; i < count; ++i)
      to_float(snap.key_row(rows[i], head), dtype, head_dim, out + i * head_dim);
  };
  KMeansParams params;
  params.subspaces = config_.pq_subspaces;
  params.bits = config_.pq_bits;
  params.tolerance = config_.kmeans_tolerance;
  params.init = config_.kmeans_init;
  params.max_points_per_centroid = config_.kmeans_max_points_per_centroid;
  params.seed = config_.seed;
  params.layer = layer_index;
  int64_t centroids = int64_t{1} << config_.pq_bits;
  int64_t training = std::min<int64_t>(snap.tokens, centroids * params.max_points_per_centroid);
  params.max_iterations = iteration_budget(snap.tokens, training);

  auto index = std::make_unique<PqIndex>();
  KMeansReport report = train_codebook(config_.num_kv_heads, head_dim, snap.tokens, gather,
                                       params, *pool_, &task.cancel, &index->codebook);
  if (report.cancelled || task.cancel.load()) {
    counters_.builds_cancelled.fetch_add(1);
    seq_counters.builds_cancelled.fetch_add(1);
    return;
  }
  const int32_t m = config_.pq_subspaces;
  index->codes.resize(static_cast<size_t>(config_.num_kv_heads));
  std::vector<uint8_t*> heads(index->codes.size());
  for (size_t h = 0; h < heads.size(); ++h) {
    index->codes[h].resize(static_cast<size_t>(snap.tokens) * m);
    heads[h] = index->codes[h].data();
  }
  encode_tokens(index->codebook, head_dim, 0, snap.tokens, gather, pool_.get(), heads.data());
  index->coded_tokens = snap.tokens;
  index->iterations = report.iterations;
  index->budget = params.max_iterations;
  index->training_points = report.training_points;
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::steady_clock::now() - start)
                .count();
  index->seconds = ns * 1e-9;
  task.result = std::move(index);
  for (Counters* c : {&counters_, &seq_counters}) {
    c->builds_finished.fetch_add(1);
    c->kmeans_iterations.fetch_add(static_cast<uint64_t>(report.iterations));
    c->build_ns.fetch_add(static_cast<uint64_t>(ns));
  }
}

void Context::require_index(Layer& layer, uint64_t id, int32_t layer_index) {
  require_prefill(layer, id, layer_index, "reading the index");
  layer.finish_build();
  if (!layer.index)
    fail(PQ_ERR_BAD_STATE, "layer " + str(layer_index) + " of seq_id " + std::to_string(id) +
                               " has no index: " +
                               (layer.build_error.empty() ? "no build finished"
                                                          : layer.build_error) +
                               "; call pq_prefill_layer again to rebuild");
}

void Context::code_tokens(Layer& layer, int64_t end) {
  PqIndex& index = *layer.index;
  if (index.coded_tokens >= end) return;
  const int32_t m = config_.pq_subspaces;
  const int32_t dtype = config_.dtype;
  const int32_t head_dim = config_.head_dim;
  const KvStore& store = layer.store;
  KeyGather gather = [&store, dtype, head_dim](int32_t head, const int64_t* rows, int64_t count,
                                               float* out) {
    for (int64_t i = 0; i < count; ++i)
      to_float(store.key_row(rows[i], head), dtype, head_dim, out + i * head_dim);
  };
  std::vector<uint8_t*> heads(index.codes.size());
  // Capacity in whole chunks, never more: the memory limit counts the codes
  // per chunk of the store (memory_cost.h), which resize's doubling passes.
  const size_t chunked = static_cast<size_t>((end + KvStore::kChunkTokens - 1) /
                                             KvStore::kChunkTokens * KvStore::kChunkTokens) * m;
  for (size_t h = 0; h < heads.size(); ++h) {
    index.codes[h].reserve(chunked);
    index.codes[h].resize(static_cast<size_t>(end) * m);
    heads[h] = index.codes[h].data() + index.coded_tokens * m;
  }
  int64_t count = end - index.coded_tokens;
  // A decode step codes one token: not worth waking the pool.
  encode_tokens(index.codebook, head_dim, index.coded_tokens, count, gather,
                count >= 4096 ? pool_.get() : nullptr, heads.data());
  index.coded_tokens = end;
  layer.update_mirrors();
}

// ---------------------------------------------------------------------------
// Selection and fetch
// ---------------------------------------------------------------------------

Regions Context::regions(int64_t n, int32_t layer) const {
  Regions r;
  r.n = n;
  r.sink_end = std::min<int64_t>(config_.sink_tokens, n);
  r.mid_end = std::max(r.sink_end, n - static_cast<int64_t>(config_.local_tokens));
  int64_t middle = r.mid_end - r.sink_end;
  if (config_.topk_tokens > 0) {
    r.k = std::min<int64_t>(config_.topk_tokens, middle);
  } else {
    // ceil, forgiving the float representation of the fraction (0.2f is a
    // hair above 0.2, and 0.2 * 1000 must give 200, not 201).
    double want = std::ceil(static_cast<double>(config_.topk_fraction) * middle * (1.0 - 1e-6));
    r.k = std::min<int64_t>(middle, static_cast<int64_t>(want));
  }
  r.k = std::max<int64_t>(0, std::min<int64_t>(middle, selector_->budget(r.k, middle, layer, config_)));
  return r;
}

int64_t Context::selection_capacity(uint64_t id, int32_t layer) const {
  check_layer(layer);
  auto seq = find(id);
  return regions(layer_of(*seq, layer).tokens_mirror.load(), layer).count();
}

void Context::decode_select(uint64_t id, int32_t layer_index, const pq_tensor* query,
                            pq_selection* out) {
  check_layer(layer_index);
  validate_tensor(query, {"query", config_.num_q_heads, config_.head_dim, config_.dtype, 1, 1});
  if (out == nullptr) invalid("out is NULL");
  if (out->capacity < 0) invalid("out->capacity is " + str(out->capacity) + "; expected >= 0");
  // positions may be NULL with capacity 0: the capacity check below names it.
  if (out->positions == nullptr && out->capacity > 0) invalid("out->positions is NULL");
  if (out->counts == nullptr) invalid("out->counts is NULL");
  if (!backend_->supports_memory(query->memory))
    fail(PQ_ERR_UNSUPPORTED, std::string("query.memory is PQ_MEMORY_DEVICE, which the ") +
                                 backend_->name() + " backend cannot read");
  auto seq = find(id);
  ScopedTimer timer(&counters_.select_ns, &seq->counters->select_ns);
  StagedTensor q = stage_input(*backend_, *query);
  reject_non_finite(q.view, "query");
  const int32_t hd = config_.head_dim;
  std::vector<float> queries(static_cast<size_t>(config_.num_q_heads) * hd);
  for (int32_t h = 0; h < config_.num_q_heads; ++h)
    to_float(tensor_row(q.view, 0, h, dtype_size(config_.dtype)), config_.dtype, hd,
             queries.data() + static_cast<size_t>(h) * hd);

  Layer& layer = layer_of(*seq, layer_index);
  std::lock_guard<std::mutex> lock(layer.mutex);
  if (selector_->needs_index()) {
    require_index(layer, id, layer_index);
  } else {
    require_prefill(layer, id, layer_index, "pq_decode_select");
    layer.poll_build();
  }
  Regions r = regions(layer.store.tokens(), layer_index);
  if (out->capacity < r.count())
    invalid("out->capacity is " + str(out->capacity) + "; this selection needs " +
            str(r.count()) + " entries per kv head (see pq_selection_capacity)");
  if (selector_->needs_index()) code_tokens(layer, r.mid_end);
  selector_->update_state(layer.selector_state.get(), layer.store, r.n, r.sink_end, r.mid_end,
                          config_);

  const int32_t kv_heads = config_.num_kv_heads;
  std::vector<uint64_t> bytes(static_cast<size_t>(kv_heads), 0);
  // Rows are built aside and copied out only when every head succeeded:
  // outputs are written only on success.
  const int64_t count = r.count();
  std::vector<int32_t> rows(static_cast<size_t>(kv_heads) * static_cast<size_t>(count));
  auto select_head = [&](int64_t h) {
    ScratchLease scratch(scratch_pool_);
    int32_t* row = rows.data() + h * count;
    int64_t w = 0;
    for (int64_t p = 0; p < r.sink_end; ++p) row[w++] = static_cast<int32_t>(p);
    SelectionRequest req{layer.store, layer.index.get(), *backend_, static_cast<int32_t>(h),
                         group_size_, hd, config_.dtype,
                         queries.data() + static_cast<size_t>(h) * group_size_ * hd,
                         r.sink_end, r.mid_end, r.k, config_.gqa_combine, scale_, *scratch,
                         layer.selector_state.get(), config_, layer_index,
                         layer.device.get(), layer.index_generation, seq->stream.load()};
    bytes[static_cast<size_t>(h)] = selector_->select_middle(req, row + w);
    w += r.k;
    for (int64_t p = r.mid_end; p < r.n; ++p) row[w++] = static_cast<int32_t>(p);
  };
  // Large layers: kv heads in parallel (the caller's thread works too, so a
  // pool busy with builds cannot stall the decode step).
  if (kv_heads > 1 && r.mid_end - r.sink_end >= 4096)
    pool_->parallel_for(kv_heads, select_head);
  else
    for (int32_t h = 0; h < kv_heads; ++h) select_head(h);

  for (int32_t h = 0; h < kv_heads; ++h) {
    std::memcpy(out->positions + h * out->capacity, rows.data() + h * count,
                static_cast<size_t>(count) * sizeof(int32_t));
    out->counts[h] = static_cast<int32_t>(count);
  }
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  layer.last_select_bytes = total;
  for (Counters* c : {&counters_, seq->counters.get()}) {
    c->select_calls.fetch_add(1);
    c->bytes_scored.fetch_add(total);
  }
}

void Context::fetch(uint64_t id, int32_t layer_index, const pq_selection* sel,
                    const pq_tensor* out_keys, const pq_tensor* out_values) {
  check_layer(layer_index);
  const int32_t kv_heads = config_.num_kv_heads;
  const int64_t max_count = check_selection(sel, kv_heads);
  validate_tensor(out_keys,
                  {"out_keys", kv_heads, config_.head_dim, config_.dtype, max_count, -1});
  validate_tensor(out_values,
                  {"out_values", kv_heads, config_.head_dim, config_.dtype, max_count, -1});
  for (const pq_tensor* t : {out_keys, out_values})
    if (!backend_->supports_memory(t->memory))
      fail(PQ_ERR_UNSUPPORTED, std::string(t == out_keys ? "out_keys" : "out_values") +
                                   ".memory is PQ_MEMORY_DEVICE, which the " +
                                   backend_->name() + " backend cannot write");
  require_disjoint_rows(*out_keys, "out_keys");
  require_disjoint_rows(*out_values, "out_values");
  require_disjoint_outputs(*out_keys, "out_keys", *out_values, "out_values");
  auto seq = find(id);
  ScopedTimer timer(&counters_.fetch_ns, &seq->counters->fetch_ns);
  Layer& layer = layer_of(*seq, layer_index);
  std::lock_guard<std::mutex> lock(layer.mutex);
  require_prefill(layer, id, layer_index, "pq_fetch_kv");
  check_positions(sel, kv_heads, layer.store.tokens(), layer_index);
  const Regions r = regions(layer.store.tokens(), layer_index);
  const size_t rb = layer.store.row_bytes();
  uint64_t rows = 0;
  for (int32_t h = 0; h < kv_heads; ++h) rows += static_cast<uint64_t>(sel->counts[h]);
  void* stream = seq->stream.load();
  // Every allocation the cache's update needs happens here, before any
  // output is written: past this point the fetch cannot fail halfway.
  std::vector<int32_t> sorted_scratch;
  if (layer.cache) {
    layer.cache->reserve(r.n);
    sorted_scratch.reserve(static_cast<size_t>(max_count));
  }
  const bool on_device =
      out_keys->memory == PQ_MEMORY_DEVICE && out_values->memory == PQ_MEMORY_DEVICE &&
      backend_->fetch_to_device(DeviceFetchArgs{layer.device.get(), layer.store, *sel, *out_keys,
                                                *out_values, layer.cache.get(), r.sink_end,
                                                r.mid_end, stream});
  if (!on_device) gather_on_host(layer, sel, out_keys, out_values, rows);
  // Device slots are filled only for device fetches: a host fetch never
  // reads them, so it should not pay their PCIe traffic.
  const CacheCount cached =
      layer.cache ? update_cache(layer, r, sel, on_device ? stream : nullptr, on_device,
                                 sorted_scratch)
                  : CacheCount{};
  for (Counters* c : {&counters_, seq->counters.get()}) {
    c->fetch_calls.fetch_add(1);
    c->bytes_fetched.fetch_add(rows * rb * 2);
    c->cache_hits.fetch_add(cached.hits);
    c->cache_misses.fetch_add(cached.misses);
  }
}

// pq_fetch_kv's gather into host memory; device outputs are staged through
// host memory (the span is read first so that bytes between the rows the
// caller did not ask for are preserved). Layer mutex held.
void Context::gather_on_host(Layer& layer, const pq_selection* sel, const pq_tensor* out_keys,
                             const pq_tensor* out_values, uint64_t rows) {
  const int32_t kv_heads = config_.num_kv_heads;
  StagedTensor k = stage_input(*backend_, *out_keys);
  StagedTensor v = stage_input(*backend_, *out_values);
  const size_t es = dtype_size(config_.dtype);
  const size_t rb = layer.store.row_bytes();
  // A gather of scattered rows is bound by memory latency, not bandwidth:
  // prefetch a few rows ahead, and split large gathers across the pool.
  constexpr int32_t kPrefetchAhead = 8;
  auto gather_head = [&](int64_t h64) {
    const int32_t h = static_cast<int32_t>(h64);
    const int32_t* pos = sel->positions + h * sel->capacity;
    const int32_t count = sel->counts[h];
    for (int32_t i = 0; i < count; ++i) {
      if (i + kPrefetchAhead < count) {
        __builtin_prefetch(layer.store.key_row(pos[i + kPrefetchAhead], h));
        __builtin_prefetch(layer.store.value_row(pos[i + kPrefetchAhead], h));
      }
      std::memcpy(tensor_row_mut(k.view, i, h, es), layer.store.key_row(pos[i], h), rb);
      std::memcpy(tensor_row_mut(v.view, i, h, es), layer.store.value_row(pos[i], h), rb);
    }
  };
  if (kv_heads > 1 && rows >= 4096)
    pool_->parallel_for(kv_heads, gather_head);
  else
    for (int32_t h = 0; h < kv_heads; ++h) gather_head(h);
  if (out_keys->memory != PQ_MEMORY_HOST) {
    backend_->copy_from_host(out_keys->data, k.buffer.data(), k.buffer.size(), out_keys->memory);
    backend_->copy_from_host(out_values->data, v.buffer.data(), v.buffer.size(),
                             out_values->memory);
  }
}

// Counts the fetched middle tokens the block cache held, then updates it
// with them (paper section 3.4: after the fetch, off its critical path).
// Sinks and the local window are resident anyway and not counted.
Context::CacheCount Context::update_cache(Layer& layer, const Regions& r,
                                          const pq_selection* sel, void* stream,
                                          bool fill_device, std::vector<int32_t>& sorted) {
  CacheCount count;
  for (int32_t h = 0; h < config_.num_kv_heads; ++h) {
    const int32_t* pos = sel->positions + h * sel->capacity;
    const int32_t n = sel->counts[h];
    // A caller's selection may repeat a position: a token is fetched (and
    // counted) once per kv head. pq_decode_select's are ascending already.
    if (std::adjacent_find(pos, pos + n, std::greater_equal<int32_t>()) != pos + n) {
      sorted.assign(pos, pos + n);
      std::sort(sorted.begin(), sorted.end());
      pos = sorted.data();
    }
    for (int32_t i = 0; i < n; ++i) {
      if (pos[i] < r.sink_end || pos[i] >= r.mid_end || (i > 0 && pos[i] == pos[i - 1])) continue;
      if (layer.cache->record(pos[i]))
        ++count.hits;
      else
        ++count.misses;
    }
  }
  const std::vector<BlockCache::Admission>& admitted = layer.cache->commit(r.n);
  if (fill_device)
    backend_->fill_cache_blocks(layer.device.get(), layer.store, admitted,
                                layer.cache->block_tokens(), stream);
  return count;
}

// ---------------------------------------------------------------------------
// Inputs some selectors need
// ---------------------------------------------------------------------------

void Context::prefill_queries(uint64_t id, int32_t layer_index, const pq_tensor* queries) {
  check_layer(layer_index);
  validate_tensor(queries,
                  {"queries", config_.num_q_heads, config_.head_dim, config_.dtype, 1, -1});
  if (!backend_->supports_memory(queries->memory))
    fail(PQ_ERR_UNSUPPORTED, std::string("queries.memory is PQ_MEMORY_DEVICE, which the ") +
                                 backend_->name() + " backend cannot read");
  auto seq = find(id);
  StagedTensor q = stage_input(*backend_, *queries);
  reject_non_finite(q.view, "queries");
  // Only the last observation_window queries matter.
  const int64_t w = std::min<int64_t>(queries->tokens, config_.observation_window);
  const int64_t first = queries->tokens - w;
  const int32_t hd = config_.head_dim, heads = config_.num_q_heads;
  std::vector<float> f(static_cast<size_t>(w) * heads * hd);
  for (int64_t t = 0; t < w; ++t)
    for (int32_t h = 0; h < heads; ++h)
      to_float(tensor_row(q.view, first + t, h, dtype_size(config_.dtype)), config_.dtype, hd,
               f.data() + (static_cast<size_t>(t) * heads + h) * hd);
  Layer& layer = layer_of(*seq, layer_index);
  std::lock_guard<std::mutex> lock(layer.mutex);
  require_prefill(layer, id, layer_index, "pq_prefill_queries");
  selector_->observe_queries(layer.selector_state.get(), layer.store, f.data(), w, config_);
}

void Context::observe_attention(uint64_t id, int32_t layer_index, const pq_selection* sel,
                                const float* probs) {
  check_layer(layer_index);
  const int32_t kv_heads = config_.num_kv_heads;
  check_selection(sel, kv_heads);
  if (probs == nullptr && sel->capacity > 0) invalid("probs is NULL");
  for (int32_t h = 0; h < kv_heads; ++h) {
    for (int32_t i = 0; i < sel->counts[h]; ++i) {
      float p = probs[h * sel->capacity + i];
      if (!std::isfinite(p) || p < 0.f)
        invalid("probs[" + str(h) + " * capacity + " + str(i) + "] is " + std::to_string(p) +
                "; attention probabilities must be finite and >= 0");
    }
  }
  auto seq = find(id);
  Layer& layer = layer_of(*seq, layer_index);
  std::lock_guard<std::mutex> lock(layer.mutex);
  require_prefill(layer, id, layer_index, "pq_observe_attention");
  check_positions(sel, kv_heads, layer.store.tokens(), layer_index);
  for (int32_t h = 0; h < kv_heads; ++h)
    selector_->observe_attention(layer.selector_state.get(), h,
                                 sel->positions + h * sel->capacity,
                                 probs + h * sel->capacity, sel->counts[h]);
}

// ---------------------------------------------------------------------------
// Introspection and statistics
// ---------------------------------------------------------------------------

void Context::layer_info(uint64_t id, int32_t layer_index, pq_layer_info* out) const {
  check_layer(layer_index);
  if (out == nullptr) invalid("out is NULL");
  if (out->struct_size < offsetof(pq_layer_info, tokens) + sizeof(int64_t) ||
      out->struct_size > sizeof(pq_layer_info))
    invalid("out->struct_size is " + str(out->struct_size) + "; set it to sizeof(pq_layer_info)");
  auto seq = find(id);
  Layer& layer = layer_of(*seq, layer_index);
  std::lock_guard<std::mutex> lock(layer.mutex);
  try {
    layer.poll_build();
  } catch (const Error&) {
    // A failed build is reported by the next select; info stays readable.
  }
  pq_layer_info info{};
  info.struct_size = out->struct_size;
  info.tokens = layer.store.tokens();
  info.prefill_tokens = layer.prefill_tokens;
  Regions r = regions(info.tokens, layer_index);
  info.middle_tokens = r.mid_end - r.sink_end;
  info.coded_tokens = layer.index ? layer.index->coded_tokens : 0;
  info.build_pending = layer.pending ? 1 : 0;
  info.kmeans_iterations = layer.last_iterations;
  info.kmeans_budget = layer.last_budget;
  info.index_ready = layer.index ? 1 : 0;
  info.build_seconds = layer.last_build_seconds;
  info.last_select_bytes = layer.last_select_bytes;
  std::memcpy(out, &info, out->struct_size);
}

void Context::index_codes(uint64_t id, int32_t layer_index, int32_t kv_head, int64_t first,
                          int64_t count, uint8_t* out) {
  check_layer(layer_index);
  if (kv_head < 0 || kv_head >= config_.num_kv_heads)
    invalid("kv_head is " + str(kv_head) + "; expected 0.." + str(config_.num_kv_heads - 1));
  if (first < 0 || count < 0) invalid("first/count are " + str(first) + "/" + str(count));
  if (out == nullptr && count > 0) invalid("out is NULL");
  auto seq = find(id);
  Layer& layer = layer_of(*seq, layer_index);
  std::lock_guard<std::mutex> lock(layer.mutex);
  require_index(layer, id, layer_index);
  code_tokens(layer, regions(layer.store.tokens(), layer_index).mid_end);
  const int64_t coded = layer.index->coded_tokens;
  if (first > coded || count > coded - first)  // no first + count: it may overflow
    invalid("first " + str(first) + " and count " + str(count) + " reach past the coded tokens: " +
            "tokens [0, " + str(coded) + ") have codes (a build codes every token it covers; "
            "decode tokens are coded when they leave the local window)");
  const int32_t m = config_.pq_subspaces;
  if (count > 0)
    std::memcpy(out, layer.index->codes[static_cast<size_t>(kv_head)].data() + first * m,
                static_cast<size_t>(count) * m);
}

void Context::index_centroids(uint64_t id, int32_t layer_index, int32_t kv_head, float* out,
                              int64_t floats) {
  check_layer(layer_index);
  if (kv_head < 0 || kv_head >= config_.num_kv_heads)
    invalid("kv_head is " + str(kv_head) + "; expected 0.." + str(config_.num_kv_heads - 1));
  if (out == nullptr) invalid("out is NULL");
  const int64_t need = (int64_t{1} << config_.pq_bits) * config_.head_dim;
  if (floats < need)
    invalid("out_floats is " + str(floats) + "; the centroids of one kv head take " + str(need));
  auto seq = find(id);
  Layer& layer = layer_of(*seq, layer_index);
  std::lock_guard<std::mutex> lock(layer.mutex);
  require_index(layer, id, layer_index);
  const PqCodebook& cb = layer.index->codebook;
  std::memcpy(out, cb.at(kv_head, 0), static_cast<size_t>(need) * sizeof(float));
}

void Context::add_sequence_sizes(const Sequence& s, pq_stats* out) const {
  out->sequences += 1;
  out->host_bytes += s.fixed.bytes();
  for (const auto& layer : s.layers) {
    out->tokens += layer->tokens_mirror.load();
    out->kv_bytes += layer->kv_bytes_mirror.load();
    out->index_bytes += layer->index_bytes_mirror.load();
    out->host_bytes += layer->charged_bytes_mirror.load();
  }
}

namespace {
void check_stats_out(pq_stats* out) {
  if (out == nullptr) invalid("out is NULL");
  if (out->struct_size < offsetof(pq_stats, sequences) + sizeof(int64_t) ||
      out->struct_size > sizeof(pq_stats))
    invalid("out->struct_size is " + std::to_string(out->struct_size) +
            "; set it to sizeof(pq_stats)");
}
}  // namespace

void Context::stats(pq_stats* out) const {
  check_stats_out(out);
  pq_stats s{};
  s.struct_size = out->struct_size;
  {
    std::shared_lock<std::shared_mutex> lock(sequences_mutex_);
    for (const auto& entry : sequences_) add_sequence_sizes(*entry.second, &s);
  }
  // Also what removed sequences' builds still hold until they stop.
  s.host_bytes = budget_.used();
  counters_.add_to(&s);
  std::memcpy(out, &s, out->struct_size);
}

void Context::sequence_stats(uint64_t id, pq_stats* out) const {
  check_stats_out(out);
  auto seq = find(id);
  pq_stats s{};
  s.struct_size = out->struct_size;
  add_sequence_sizes(*seq, &s);
  seq->counters->add_to(&s);
  std::memcpy(out, &s, out->struct_size);
}

void Context::wait_builds() {
  std::vector<std::shared_ptr<Sequence>> seqs;
  {
    std::shared_lock<std::shared_mutex> lock(sequences_mutex_);
    for (const auto& entry : sequences_) seqs.push_back(entry.second);
  }
  for (auto& s : seqs)
    for (auto& layer : s->layers) wait_ingests(*layer);  // they schedule builds
  std::string first_error;
  pq_status first_status = PQ_OK;
  for (auto& s : seqs)
    for (auto& layer : s->layers) {
      std::lock_guard<std::mutex> lock(layer->mutex);
      try {
        layer->finish_build();
      } catch (const Error& e) {
        if (first_status == PQ_OK) {
          first_status = e.status();
          first_error = e.what();
        }
      }
    }
  if (first_status != PQ_OK) fail(first_status, first_error);
}

}  // namespace pq
