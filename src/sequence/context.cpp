#include "sequence/context.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "backend/staging.h"
#include "base/call_args.h"
#include "base/dtype.h"
#include "base/error.h"
#include "base/tensor.h"

namespace pq {

// ---------------------------------------------------------------------------
// Context and sequences
// ---------------------------------------------------------------------------

Sequence::Sequence(uint64_t seq_id, ContextShared& shared, Reservation fixed_state)
    : id(seq_id), fixed(std::move(fixed_state)) {
  layers.reserve(static_cast<size_t>(shared.config.num_layers));
  for (int32_t l = 0; l < shared.config.num_layers; ++l)
    layers.push_back(std::make_unique<Layer>(shared, l));
}

Context::Context(const pq_config& c, const CallerPaths& paths, const Hooks& hooks,
                 std::shared_ptr<ThreadPool> pool)
    : shared_(c, paths, hooks, std::move(pool)) {
  if (shared_.logs(PQ_LOG_INFO))
    shared_.log(PQ_LOG_INFO,
                std::string("context created: ") + (backend().kind() == PQ_BACKEND_CUDA ? "CUDA" : "CPU") +
                    " backend, " + std::to_string(shared_.pool->size()) + " worker threads (" +
                    (shared_.owns_pool ? "its own pool" : "a shared pool") + "), " +
                    std::to_string(c.num_layers) + " layers of " + std::to_string(c.num_kv_heads) +
                    " kv heads x " + std::to_string(c.head_dim));
}

Context::~Context() {
  // Let asynchronous prefills land (they schedule builds on the pool), then
  // cancel every build, then join the workers while everything they use is
  // alive (a cancelled build may still be inside an iteration). The map is
  // taken out first and its lock not held while layers are locked: a
  // build_done hook still running may take it (pq_stats_get), and every
  // other path takes a layer's lock before the map's (a pq_write_fn's calls
  // on other sequences), never after.
  std::unordered_map<uint64_t, std::shared_ptr<Sequence>> sequences;
  {
    std::unique_lock<std::shared_mutex> lock(sequences_mutex_);
    sequences.swap(sequences_);
  }
  for (auto& entry : sequences)
    for (auto& layer : entry.second->layers) layer->wait_ingests();
  for (auto& entry : sequences)
    for (auto& layer : entry.second->layers) layer->cancel_build();
  // Builds of removed sequences may still run too: wait for every task of
  // this context (a shared pool goes on serving other contexts).
  shared_.wait_tasks();
  if (shared_.owns_pool) shared_.pool->shutdown();
}

void Context::check_layer(int32_t layer) const {
  if (layer < 0 || layer >= shared_.config.num_layers)
    invalid("layer is " + str(layer) + "; expected 0.." + str(shared_.config.num_layers - 1));
}

void Context::check_kv_head(int32_t kv_head) const {
  if (kv_head < 0 || kv_head >= shared_.config.num_kv_heads)
    invalid("kv_head is " + str(kv_head) + "; expected 0.." +
            str(shared_.config.num_kv_heads - 1));
}

std::shared_ptr<Sequence> Context::find(uint64_t id) const {
  require_not_saving(id);
  std::shared_lock<std::shared_mutex> lock(sequences_mutex_);
  auto it = sequences_.find(id);
  if (it == sequences_.end())
    fail(PQ_ERR_NOT_FOUND, "seq_id " + std::to_string(id) + " is not a sequence of this context");
  return it->second;
}

std::shared_ptr<Sequence> Context::new_sequence(uint64_t id, const std::string& what) {
  const pq_config& c = shared_.config;
  Reservation fixed = shared_.budget.reserve(
      shared_.cost.sequence_fixed(c.num_layers),
      what + " (the fixed state of a sequence: " + shared_.cost.explain(c) + ")");
  return std::make_shared<Sequence>(id, shared_, std::move(fixed));
}

void Context::insert(std::shared_ptr<Sequence> seq) {
  const uint64_t id = seq->id;
  std::unique_lock<std::shared_mutex> lock(sequences_mutex_);
  if (!sequences_.emplace(id, std::move(seq)).second)
    invalid("seq_id " + std::to_string(id) + " already exists in this context");
}

void Context::require_absent(uint64_t id) const {
  std::shared_lock<std::shared_mutex> lock(sequences_mutex_);
  if (sequences_.count(id) != 0)
    invalid("seq_id " + std::to_string(id) + " already exists in this context");
}

void Context::sequence_add(uint64_t id) {
  insert(new_sequence(id, "pq_sequence_add"));
  debug([&] { return "sequence added: seq_id " + std::to_string(id); });
}

void Context::sequence_remove(uint64_t id) {
  require_not_saving(id);
  std::shared_ptr<Sequence> seq;
  {
    std::unique_lock<std::shared_mutex> lock(sequences_mutex_);
    auto it = sequences_.find(id);
    if (it == sequences_.end())
      fail(PQ_ERR_NOT_FOUND, "seq_id " + std::to_string(id) + " is not a sequence of this context");
    seq = std::move(it->second);
    sequences_.erase(it);
  }
  // A queued build drops its snapshot of the K/V now, so the sequence's
  // memory leaves the limit with this call (or with a racing call that
  // still holds it); a running build stops at its next iteration, and
  // pq_wait_builds waits for that.
  for (auto& layer : seq->layers) layer->cancel_build();
  debug([&] { return "sequence removed: seq_id " + std::to_string(id); });
}

int64_t Context::sequence_length(uint64_t id, int32_t layer) const {
  check_layer(layer);
  // Hold the sequence: a racing pq_sequence_remove may drop the map's reference.
  const std::shared_ptr<Sequence> seq = find(id);
  Layer& l = *seq->layers[static_cast<size_t>(layer)];
  l.settle();
  return l.tokens();
}

int64_t Context::sequence_count() const {
  std::shared_lock<std::shared_mutex> lock(sequences_mutex_);
  return static_cast<int64_t>(sequences_.size());
}

void Context::sequence_set_stream(uint64_t id, void* stream) {
  std::shared_ptr<Sequence> s = find(id);
  // Streams order device work: only a backend with DeviceMemory has them.
  if (stream != nullptr && shared_.backend->device_memory() == nullptr)
    fail(PQ_ERR_UNSUPPORTED, std::string("cuda_stream is non-NULL but the context uses the ") +
                                 shared_.backend->name() + " backend, which has no streams");
  s->stream.store(stream);
}

// ---------------------------------------------------------------------------
// Prefill and append
// ---------------------------------------------------------------------------

void Context::prefill(uint64_t id, int32_t layer, const pq_tensor* keys, const pq_tensor* values) {
  append(id, layer, keys, values, true);
}

void Context::decode_append(uint64_t id, int32_t layer, const pq_tensor* keys,
                            const pq_tensor* values) {
  append(id, layer, keys, values, false);
}

void Context::append(uint64_t id, int32_t layer_index, const pq_tensor* keys_arg,
                     const pq_tensor* values_arg, bool is_prefill) {
  const pq_config& c = shared_.config;
  Backend& backend = *shared_.backend;
  check_layer(layer_index);
  // The descriptors are read once: what was checked is what is used.
  const pq_tensor key_copy = copy_descriptor(keys_arg, "keys");
  // An index-only context reads no value: values may be NULL there.
  const pq_tensor value_copy =
      values_arg == nullptr && c.kv_tier == PQ_KV_TIER_CALLER ? key_copy : copy_descriptor(values_arg, "values");
  const pq_tensor* keys = &key_copy;
  const pq_tensor* values = &value_copy;
  validate_tensor(keys, {"keys", c.num_kv_heads, c.head_dim, c.dtype, 1, -1});
  validate_tensor(values, {"values", c.num_kv_heads, c.head_dim, c.dtype, 1, -1});
  if (keys->tokens != values->tokens)
    invalid("keys.tokens is " + str(keys->tokens) + " but values.tokens is " +
            str(values->tokens) + "; they must match");
  require_memory_access(backend, *keys, "keys", "read");
  require_memory_access(backend, *values, "values", "read");
  std::shared_ptr<Sequence> seq = find(id);
  Layer& layer = *seq->layers[static_cast<size_t>(layer_index)];
  // A prefill from device memory lands asynchronously where the backend
  // can (paper Algorithm 1); the ingest holds the sequence until then.
  if (is_prefill && keys->memory == PQ_MEMORY_DEVICE && values->memory == PQ_MEMORY_DEVICE &&
      layer.append_async(*keys, *values, seq->info(), seq))
    return;
  // A decode token's K/V on the device go into the store and the window
  // with no host round trip, where the backend can.
  if (!is_prefill && keys->memory == PQ_MEMORY_DEVICE && values->memory == PQ_MEMORY_DEVICE &&
      layer.append_from_device(*keys, *values, seq->info()))
    return;
  StagedTensor k = stage_input(backend, *keys, seq->info().stream);
  // Index-only: values are not read (not even staged); the keys stand in.
  const bool index_only = c.kv_tier == PQ_KV_TIER_CALLER;
  StagedTensor v = index_only ? StagedTensor{k.view, {}} : stage_input(backend, *values, seq->info().stream);
  layer.append(k.view, v.view, is_prefill, seq->info());
}

// ---------------------------------------------------------------------------
// Selection and fetch
// ---------------------------------------------------------------------------

int64_t Context::selection_capacity(uint64_t id, int32_t layer) const {
  check_layer(layer);
  // Hold the sequence: a racing pq_sequence_remove may drop the map's reference.
  const std::shared_ptr<Sequence> seq = find(id);
  Layer& l = *seq->layers[static_cast<size_t>(layer)];
  l.settle();
  return l.capacity();
}

int64_t Context::selection_capacity_for(int32_t layer, int64_t tokens) const {
  check_layer(layer);
  if (tokens < 0) invalid("tokens is " + str(tokens) + "; expected >= 0");
  return shared_.regions(tokens, layer).count();
}

pq_tensor Context::select_args(const pq_tensor* query_arg, const pq_selection* out,
                               pq_selection* copy) const {
  const pq_config& c = shared_.config;
  const pq_tensor query = copy_descriptor(query_arg, "query");
  validate_tensor(&query,
                  {"query", c.num_q_heads, c.head_dim, query_dtype(c.dtype, query, "query"), 1, 1});
  if (out == nullptr) invalid("out is NULL");
  // The descriptor is read once: the positions written may cover it.
  *copy = *out;
  if (copy->capacity < 0) invalid("out->capacity is " + str(copy->capacity) + "; expected >= 0");
  // positions may be NULL with capacity 0: the capacity check names it.
  if (copy->positions == nullptr && copy->capacity > 0) invalid("out->positions is NULL");
  if (copy->counts == nullptr) invalid("out->counts is NULL");
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(copy->capacity),
                             static_cast<uint64_t>(c.num_kv_heads) * sizeof(int32_t), &bytes) ||
      reinterpret_cast<uintptr_t>(copy->positions) > UINTPTR_MAX - bytes)
    invalid("out->capacity is " + str(copy->capacity) + "; num_kv_heads x capacity positions "
            "from out->positions overflow the address space");
  require_apart(copy->positions, bytes, "out->positions", copy->counts,
                static_cast<uint64_t>(c.num_kv_heads) * sizeof(int32_t), "out->counts");
  require_memory_access(*shared_.backend, query, "query", "read");
  return query;
}

std::vector<float> Context::read_query(const pq_tensor& query, const Sequence& seq) const {
  const pq_config& c = shared_.config;
  return query_floats(*shared_.backend, query, c.num_q_heads, c.head_dim, query.dtype,
                      seq.info().stream);
}

void Context::decode_select(uint64_t id, int32_t layer, const pq_tensor* query_arg,
                            pq_selection* out, bool speculate) {
  check_layer(layer);
  pq_selection copy;
  const pq_tensor query = select_args(query_arg, out, &copy);
  std::shared_ptr<Sequence> seq = find(id);
  ScopedTimer timer(&shared_.counters.select_ns, &seq->counters->select_ns);
  seq->layers[static_cast<size_t>(layer)]->select(read_query(query, *seq), &copy, seq->info(),
                                                   speculate);
}

Context::FetchArgs Context::fetch_args(const pq_selection* sel, const pq_tensor* out_keys,
                                       const pq_tensor* out_values) const {
  const pq_config& c = shared_.config;
  FetchArgs a{copy_selection(sel, c.num_kv_heads), copy_descriptor(out_keys, "out_keys"),
              copy_descriptor(out_values, "out_values")};
  const int64_t max_count = a.selection.max_count;
  validate_tensor(&a.keys, {"out_keys", c.num_kv_heads, c.head_dim, c.dtype, max_count, -1});
  validate_tensor(&a.values, {"out_values", c.num_kv_heads, c.head_dim, c.dtype, max_count, -1});
  require_memory_access(*shared_.backend, a.keys, "out_keys", "write");
  require_memory_access(*shared_.backend, a.values, "out_values", "write");
  require_disjoint_rows(a.keys, "out_keys");
  require_disjoint_rows(a.values, "out_values");
  require_disjoint_outputs(a.keys, "out_keys", a.values, "out_values");
  return a;
}

void Context::fetch(uint64_t id, int32_t layer, const pq_selection* sel,
                    const pq_tensor* out_keys, const pq_tensor* out_values) {
  require_kv_kept();
  check_layer(layer);
  const FetchArgs a = fetch_args(sel, out_keys, out_values);
  std::shared_ptr<Sequence> seq = find(id);
  ScopedTimer timer(&shared_.counters.fetch_ns, &seq->counters->fetch_ns);
  seq->layers[static_cast<size_t>(layer)]->fetch(&a.selection.view, a.selection.max_count, a.keys,
                                                 a.values, seq->info());
}

void Context::decode_attend(uint64_t id, int32_t layer, const pq_tensor* query_arg, const pq_selection* sel,
                            float scale, float* out, float* out_lse, bool tail_only) {
  require_kv_kept();
  const pq_config& c = shared_.config;
  check_layer(layer);
  const pq_tensor query = copy_descriptor(query_arg, "query");
  validate_tensor(&query,
                  {"query", c.num_q_heads, c.head_dim, query_dtype(c.dtype, query, "query"), 1, 1});
  const SelectionCopy selection = copy_selection(sel, c.num_kv_heads);
  if (!std::isfinite(scale) || scale < 0.f)
    invalid("scale is " + number_text(scale) + "; expected a finite value >= 0 (0: "
            "1 / sqrt(head_dim))");
  if (out == nullptr) invalid("out is NULL");
  const uint64_t heads = static_cast<uint64_t>(c.num_q_heads);
  if (out_lse != nullptr)
    require_apart(out, heads * c.head_dim * sizeof(float), "out", out_lse, heads * sizeof(float),
                  "out_lse");
  require_memory_access(*shared_.backend, query, "query", "read");
  std::shared_ptr<Sequence> seq = find(id);
  const std::vector<float> queries = read_query(query, *seq);
  ScopedTimer timer(&shared_.counters.fetch_ns, &seq->counters->fetch_ns);
  seq->layers[static_cast<size_t>(layer)]->attend(queries, &selection.view,
                                                  scale == 0.f ? shared_.scale : scale, out,
                                                  out_lse, id, tail_only);
}

// ---------------------------------------------------------------------------
// Inputs some selectors need
// ---------------------------------------------------------------------------

void Context::prefill_queries(uint64_t id, int32_t layer, const pq_tensor* queries_arg) {
  const pq_config& c = shared_.config;
  check_layer(layer);
  const pq_tensor query_copy = copy_descriptor(queries_arg, "queries");
  const pq_tensor* queries = &query_copy;
  validate_tensor(queries, {"queries", c.num_q_heads, c.head_dim,
                            query_dtype(c.dtype, *queries, "queries"), 1, -1});
  require_memory_access(*shared_.backend, *queries, "queries", "read");
  std::shared_ptr<Sequence> seq = find(id);
  StagedTensor q = stage_input(*shared_.backend, *queries, seq->info().stream);
  reject_non_finite(q.view, "queries");
  // Only the last observation_window queries matter.
  const int64_t w = std::min<int64_t>(queries->tokens, c.observation_window);
  const int64_t first = queries->tokens - w;
  const int32_t hd = c.head_dim, heads = c.num_q_heads;
  std::vector<float> f(static_cast<size_t>(w) * heads * hd);
  for (int64_t t = 0; t < w; ++t)
    for (int32_t h = 0; h < heads; ++h)
      to_float(tensor_row(q.view, first + t, h, dtype_size(queries->dtype)), queries->dtype, hd,
               f.data() + (static_cast<size_t>(t) * heads + h) * hd);
  seq->layers[static_cast<size_t>(layer)]->prefill_queries(f, w, id);
}

void Context::observe_attention(uint64_t id, int32_t layer, const pq_selection* sel,
                                const float* probs) {
  check_layer(layer);
  const int32_t kv_heads = shared_.config.num_kv_heads;
  const SelectionCopy s = copy_selection(sel, kv_heads);
  if (probs == nullptr && s.caller_capacity > 0) invalid("probs is NULL");
  // Read once, laid out as the copied positions, and checked on the copy.
  std::vector<float> p(s.positions.size());
  for (int32_t h = 0; h < kv_heads; ++h) {
    for (int32_t i = 0; i < s.counts[static_cast<size_t>(h)]; ++i) {
      const float v = probs[h * s.caller_capacity + i];
      if (!std::isfinite(v) || v < 0.f)
        invalid("probs[" + str(h) + " * capacity + " + str(i) + "] is " + number_text(v) +
                "; attention probabilities must be finite and >= 0");
      p[static_cast<size_t>(h * s.max_count + i)] = v;
    }
  }
  find(id)->layers[static_cast<size_t>(layer)]->observe(&s.view, p.data(), id);
}

void Context::token_classes(uint64_t id, int64_t first, int64_t count, const uint8_t* classes) {
  if (first < 0) invalid("first is " + str(first) + "; positions start at 0");
  if (count < 0) invalid("count is " + str(count) + "; expected >= 0");
  if (classes == nullptr && count > 0) invalid("classes is NULL with count " + str(count));
  if (count > INT32_MAX - first)
    invalid("first + count is " + str(first) + " + " + str(count) +
            "; a sequence holds at most 2147483647 tokens per layer");
  std::shared_ptr<Sequence> seq = find(id);
  int64_t stored = 0;
  for (const auto& layer : seq->layers) stored = std::max(stored, layer->tokens());
  if (first > stored)
    invalid("first is " + str(first) + "; seq_id " + std::to_string(id) + " stores " +
            str(stored) + " tokens in its fullest layer, and classes may describe those and "
            "the tokens right after them, with no gap");
  // Every layer's room first, in one reservation, before anything is
  // copied or changed: a refusal changes nothing.
  uint64_t room = 0;
  for (const auto& layer : seq->layers) {
    const uint64_t more = layer->token_classes_room(first + count);
    room = more > UINT64_MAX - room ? UINT64_MAX : room + more;
  }
  Reservation reserved = shared_.budget.reserve(
      room,
      "the classes of positions " + str(first) + " .. " + str(first + count - 1) + " in " +
          str(static_cast<int64_t>(seq->layers.size())) + " layers",
      "; the selector keeps one byte per described position in every layer, charged as held");
  // Read once: the layers all get the bytes that were checked.
  constexpr uint8_t kKnown = PQ_TOKEN_SPECIAL | PQ_TOKEN_PUNCTUATION;
  std::vector<uint8_t> copy(classes, classes + count);
  for (int64_t i = 0; i < count; ++i)
    if (copy[static_cast<size_t>(i)] & ~kKnown)
      invalid("classes[" + str(i) + "] is " + str(static_cast<int>(copy[static_cast<size_t>(i)])) +
              "; a class is PQ_TOKEN_PLAIN (0) or the flags PQ_TOKEN_SPECIAL (1) and "
              "PQ_TOKEN_PUNCTUATION (2)");
  for (const auto& layer : seq->layers) layer->token_classes(first, count, copy.data(), reserved);
}

// ---------------------------------------------------------------------------
// Introspection and statistics
// ---------------------------------------------------------------------------

void Context::layer_info(uint64_t id, int32_t layer, pq_layer_info* out) const {
  check_layer(layer);
  if (out == nullptr) invalid("out is NULL");
  if (out->struct_size < offsetof(pq_layer_info, tokens) + sizeof(int64_t) ||
      out->struct_size > sizeof(pq_layer_info))
    invalid("out->struct_size is " + str(out->struct_size) + "; set it to sizeof(pq_layer_info)");
  find(id)->layers[static_cast<size_t>(layer)]->info(out);
}

void Context::index_codes(uint64_t id, int32_t layer, int32_t kv_head, int64_t first,
                          int64_t count, uint8_t* out) {
  check_layer(layer);
  check_kv_head(kv_head);
  if (first < 0 || count < 0) invalid("first/count are " + str(first) + "/" + str(count));
  if (out == nullptr && count > 0) invalid("out is NULL");
  find(id)->layers[static_cast<size_t>(layer)]->codes(kv_head, first, count, out, id);
}

void Context::index_centroids(uint64_t id, int32_t layer, int32_t kv_head, float* out,
                              int64_t floats) {
  check_layer(layer);
  check_kv_head(kv_head);
  if (out == nullptr) invalid("out is NULL");
  const int64_t need = (int64_t{1} << shared_.config.pq_bits) * shared_.config.head_dim;
  if (floats < need)
    invalid("out_floats is " + str(floats) + "; the centroids of one kv head take " + str(need));
  find(id)->layers[static_cast<size_t>(layer)]->centroids(kv_head, out, id);
}

namespace {
void check_stats_out(pq_stats* out) {
  if (out == nullptr) invalid("out is NULL");
  if (out->struct_size < offsetof(pq_stats, sequences) + sizeof(int64_t) ||
      out->struct_size > sizeof(pq_stats))
    invalid("out->struct_size is " + std::to_string(out->struct_size) +
            "; set it to sizeof(pq_stats)");
}

void add_sequence_sizes(const Sequence& s, pq_stats* out) {
  out->sequences += 1;
  out->host_bytes += s.fixed.bytes();
  for (const auto& layer : s.layers) layer->add_sizes(out);
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
  s.host_bytes = shared_.budget.used();
  shared_.counters.add_to(&s);
  std::memcpy(out, &s, out->struct_size);
}

void Context::sequence_stats(uint64_t id, pq_stats* out) const {
  check_stats_out(out);
  std::shared_ptr<Sequence> seq = find(id);
  pq_stats s{};
  s.struct_size = out->struct_size;
  add_sequence_sizes(*seq, &s);
  seq->counters->add_to(&s);
  std::memcpy(out, &s, out->struct_size);
}

void Context::wait_builds() {
  require_no_save_on_this_thread();
  std::vector<std::shared_ptr<Sequence>> seqs;
  {
    std::shared_lock<std::shared_mutex> lock(sequences_mutex_);
    for (const auto& entry : sequences_) seqs.push_back(entry.second);
  }
  for (auto& s : seqs)
    for (auto& layer : s->layers) layer->wait_ingests();  // they schedule builds
  std::string first_error;
  pq_status first_status = PQ_OK;
  for (auto& s : seqs)
    for (auto& layer : s->layers) {
      try {
        layer->finish_build();
      } catch (const Error& e) {
        if (first_status == PQ_OK) {
          first_status = e.status();
          first_error = e.what();
        }
      }
    }
  // And the cancelled builds still running (removed, truncated or
  // superseded): once they stop, what they held leaves the memory limit.
  shared_.wait_draining_builds();
  if (first_status != PQ_OK) fail(first_status, first_error);
}

}  // namespace pq
