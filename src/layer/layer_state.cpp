// A layer's sequence state: truncate, fork, save and restore
// (pq_sequence_truncate, pq_sequence_fork, pq_sequence_save,
// pq_sequence_restore; the format is docs/state-format.md).
#include <cmath>
#include <cstring>
#include <string>

#include "config/config.h"
#include "base/dtype.h"
#include "base/error.h"
#include "layer/layer.h"
#include "pq/pq_tuple_select.h"
#include "base/tensor.h"

namespace pq {

namespace {

// Layer meta flags.
constexpr uint8_t kHasIndex = 1;
constexpr uint8_t kHasSelectorState = 2;

// The facts of a build a state records, held to what a build can produce
// as resolve_config holds the configuration to its table: a state whose
// checksums hold but whose numbers do not is corrupt, not restored (and
// then reported by pq_layer_info_get).
void check_build_facts(const ByteReader& in, int32_t iterations, int32_t budget, double seconds) {
  if (budget < 0 || budget > kMaxKmeansIterations)
    in.corrupt("iteration budget is " + str(budget) + "; expected 0.." +
               str(kMaxKmeansIterations));
  if (iterations < 0 || iterations > budget)
    in.corrupt("iterations is " + str(iterations) + "; expected 0.." + str(budget) +
               " (the iteration budget)");
  if (!(seconds >= 0.0 && seconds <= kMaxReal))
    in.corrupt("build seconds is " + number_text(seconds) + "; expected a finite value in [0, " +
               number_text(kMaxReal) + "]");
}
}  // namespace

void Layer::reset_cache_and_device(void* stream) {
  const pq_config& c = shared_.config;
  std::unique_ptr<BlockCache> cache;
  if (c.cache_tokens > 0)
    cache = std::make_unique<BlockCache>(c.cache_tokens, c.cache_block_tokens, c.cache_policy,
                                         c.cache_update_blocks);
  std::unique_ptr<DeviceLayer> device;
  if (const DeviceMemory* memory = shared_.backend->device_memory()) {
    device = memory->make_device_layer(c);
    memory->store_window(device.get(), *store_, 0, store_->tokens(), stream);
  }
  cache_ = std::move(cache);
  device_ = std::move(device);
  build_.bump_generation();  // device-resident codes are gone with the old state
}

// ---------------------------------------------------------------------------
// Truncate
// ---------------------------------------------------------------------------

void Layer::truncate(int64_t tokens, const SequenceInfo& seq) {
  // K/V the device is still appending are not waited for: a truncate reads
  // no row (unless it rebuilds, below), and speculative decoding truncates
  // every step.
  settle_device();
  std::lock_guard<std::mutex> lock(mutex_);
  require_kv(seq.id, "pq_sequence_truncate");
  if (tokens >= store_->tokens()) return;
  if (device_appends_.first.load() >= tokens) device_appends_.first.store(-1);  // all dropped
  hint_ = Hint{};  // made for tokens that go
  // An index trained on tokens that go is rebuilt over those that stay, as
  // a prefill of them would build it. Queued first: it is the only step
  // that can fail, and until it is queued nothing has changed.
  // An index-only layer that let keys go cannot rebuild: its index stays,
  // with the codes of the tokens that stay.
  const bool index_covers_dropped =
      !store_->dropped_keys() && (tokens < prefill_tokens_ || build_.pending_tokens() > tokens);
  const bool rebuild = index_covers_dropped && tokens > 0 && shared_.selector->needs_index();
  if (rebuild && device_appends_.first.load() >= 0) land_device_writes(/*wait=*/true);
  if (rebuild) build_.schedule(*store_, tokens, seq);
  build_.set_background(build_.background() && !rebuild);
  PqIndex* index = build_.index();
  if (index_covers_dropped) {
    if (!rebuild) build_.forget();
    build_.set(nullptr, build_.facts());
  } else if (index && index->coded_tokens > tokens) {
    for (auto& codes : index->codes) codes.shrink(tokens);
    index->coded_tokens = tokens;
    index->built_tokens = std::min(index->built_tokens, tokens);
    pq_index_count_tuples(*index, 0, tokens);
    shrink_outliers(*index, tokens);
  }
  prefill_tokens_ = std::min(prefill_tokens_, tokens);
  store_->truncate_under_readers(tokens);
  if (selector_state_) selector_state_->truncate(tokens);
  // The tail estimate's sums are made again at the next attend: appends
  // after a truncate can bring the same length back with other tokens.
  tail_.sums.clear();
  tail_.charge = Reservation{};
  charge_caller_state(nullptr);  // gives back only
  // The device state of the tokens kept stays (their codes, their window
  // rows): a truncate every step (speculative decoding) re-uploads nothing
  // and never waits for the device. The block cache starts empty.
  if (cache_)
    cache_ = std::make_unique<BlockCache>(shared_.config.cache_tokens,
                                          shared_.config.cache_block_tokens,
                                          shared_.config.cache_policy,
                                          shared_.config.cache_update_blocks);
  if (const DeviceMemory* device = shared_.backend->device_memory())
    device->truncate_device(device_.get(), *store_, tokens, seq.stream);
  if (index_covers_dropped) build_.bump_generation();  // the device's codes are of the old index
  update_mirrors();
  publish_share();
  refresh_device_step(seq);
}

// ---------------------------------------------------------------------------
// Fork
// ---------------------------------------------------------------------------

void Layer::fork_from(Layer& parent, uint64_t parent_id) {
  parent.settle();
  std::lock_guard<std::mutex> parent_lock(parent.mutex_);
  parent.require_kv(parent_id, "pq_sequence_fork");
  parent.install_build();  // the child gets the finished index, or the error
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t full_chunks = parent.store_->tokens() / KvStore::kChunkTokens;
  const MemoryCost& cost = shared_.cost;
  Reservation state = shared_.budget.reserve(
      static_cast<uint64_t>(full_chunks) * (cost.chunk - cost.chunk_kv),
      "forking layer " + str(layer_index_) + " (the fork's own codes, selector and cache state "
                                             "for " + str(full_chunks) + " shared chunks)");
  Reservation caller;  // the copy of the parent's token classes (a bound)
  if (parent.selector_state_)
    caller = shared_.budget.reserve(parent.selector_state_->caller_bytes(),
                                    "forking layer " + str(layer_index_) + " (its token classes)");
  std::unique_ptr<PqIndex> index;
  if (parent.build_.index()) index = std::make_unique<PqIndex>(parent.build_.index()->fork());
  std::unique_ptr<SelectorState> selector_state;
  if (parent.selector_state_) selector_state = parent.selector_state_->clone();
  store_->fork_from(*parent.store_);  // the last step that can fail
  charges_.fork_state = std::move(state);
  build_.set(std::move(index), parent.build_.facts());
  selector_state_ = std::move(selector_state);
  charges_.caller_state.absorb(std::move(caller));
  charge_caller_state(nullptr);  // a copy holds no more than its parent: gives back only
  prefill_tokens_ = parent.prefill_tokens_;
  reset_cache_and_device(nullptr);
  update_mirrors();
  publish_share();
}

// ---------------------------------------------------------------------------
// Save
// ---------------------------------------------------------------------------

int64_t Layer::save_index(StateWriter& out, uint64_t seq_id) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  require_kv(seq_id, "pq_sequence_save");
  if (build_.pending()) {
    try {
      install_build();
    } catch (const Error&) {
      // Saved without an index; a restore rebuilds it.
    }
  }
  const int64_t n = store_->tokens();
  // Every middle token coded, as the next selection would code it: a
  // restore can then select before the K/V arrive.
  if (build_.index()) code_tokens(shared_.regions(n, layer_index_).mid_end);
  const PqIndex* index = build_.index();
  ByteWriter meta;
  meta.put<int64_t>(n);
  meta.put<int64_t>(prefill_tokens_);
  meta.put<uint8_t>(static_cast<uint8_t>((index ? kHasIndex : 0) |
                                         (selector_state_ ? kHasSelectorState : 0)));
  meta.put<int32_t>(build_.facts().iterations);
  meta.put<int32_t>(build_.facts().budget);
  meta.put<double>(build_.facts().seconds);
  out.section(state::kLayerMeta, layer_index_, meta.bytes());

  if (index) {
    const PqCodebook& cb = *index->codebook;
    ByteWriter head;
    head.put<int64_t>(index->coded_tokens);
    head.put<int32_t>(index->iterations);
    head.put<int32_t>(index->budget);
    head.put<int64_t>(index->training_points);
    head.put<double>(index->seconds);
    const uint64_t codes = static_cast<uint64_t>(index->coded_tokens) * cb.subspaces;
    out.begin(state::kIndex, layer_index_,
              head.bytes().size() + cb.data.size() * sizeof(float) + codes * index->codes.size());
    out.payload(head.bytes().data(), head.bytes().size());
    out.payload(cb.data.data(), cb.data.size() * sizeof(float));
    for (const auto& c : index->codes)
      c.for_each_run(0, index->coded_tokens, [&](int64_t, int64_t count, const uint8_t* data) {
        out.payload(data, static_cast<size_t>(count) * cb.subspaces);
      });
    out.end_section();
  }
  if (selector_state_) {
    ByteWriter s;
    selector_state_->save(s);
    out.section(state::kSelector, layer_index_, s.bytes());
  }
  return n;
}

void Layer::save_kv(StateWriter& out, int64_t n) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  if (store_->tokens() < n)
    fail(PQ_ERR_BAD_STATE, "layer " + str(layer_index_) + " lost tokens while it was saved (" +
                               str(n) + " described, " + str(store_->tokens()) +
                               " left); pq_sequence_save must not race with calls that change "
                               "the sequence");
  const int32_t heads = shared_.config.num_kv_heads;
  const size_t row = store_->row_bytes();
  out.begin(state::kKeysValues, layer_index_, 2 * static_cast<uint64_t>(n) * heads * row);
  for (bool keys : {true, false})
    for (int32_t h = 0; h < heads; ++h)
      store_->for_each_run(keys, h, 0, n, [&](const uint8_t* rows, int64_t count) {
        out.payload(rows, static_cast<size_t>(count) * row);
      });
  out.end_section();
}

// ---------------------------------------------------------------------------
// Restore
// ---------------------------------------------------------------------------

namespace {

// The index of a layer of `tokens` tokens, read and checked.
std::unique_ptr<PqIndex> read_index(const SectionView& v, int64_t tokens, const pq_config& c,
                                    int32_t layer) {
  ByteReader in(v.data, v.size, "the index section of layer " + str(layer));
  auto index = std::make_unique<PqIndex>();
  index->coded_tokens = in.get<int64_t>("coded tokens");
  index->built_tokens = index->coded_tokens;  // the state does not say more
  index->iterations = in.get<int32_t>("iterations");
  index->budget = in.get<int32_t>("iteration budget");
  index->training_points = in.get<int64_t>("training points");
  index->seconds = in.get<double>("build seconds");
  if (index->coded_tokens < 0 || index->coded_tokens > tokens)
    in.corrupt("it codes " + str(index->coded_tokens) + " tokens; the layer holds " + str(tokens));
  check_build_facts(in, index->iterations, index->budget, index->seconds);
  // A build trains on at most the tokens it covers, all of them the layer's.
  if (index->training_points < 0 || index->training_points > tokens)
    in.corrupt("training points is " + str(index->training_points) + "; expected 0.." +
               str(tokens) + " (the layer's tokens)");
  auto codebook = std::make_shared<PqCodebook>();
  PqCodebook& cb = *codebook;
  cb.heads = c.num_kv_heads;
  cb.subspaces = c.pq_subspaces;
  cb.centroids = 1 << c.pq_bits;
  cb.sub_dim = c.head_dim / c.pq_subspaces;
  cb.dim_order = rotary_dim_order(c.head_dim, c.key_rotary);
  const uint64_t floats = static_cast<uint64_t>(cb.heads) * cb.subspaces * cb.centroids * cb.sub_dim;
  const uint64_t codes = static_cast<uint64_t>(index->coded_tokens) * cb.subspaces;
  if (in.left() != floats * sizeof(float) + codes * cb.heads)
    in.corrupt(str(static_cast<int64_t>(in.left())) + " bytes of centroids and codes; " +
               str(static_cast<int64_t>(floats * sizeof(float) + codes * cb.heads)) +
               " expected for " + str(index->coded_tokens) + " coded tokens");
  cb.data.resize(floats);
  std::memcpy(cb.data.data(), in.take(floats * sizeof(float), "centroids"), floats * sizeof(float));
  for (float f : cb.data)
    if (!std::isfinite(f)) in.corrupt("a centroid is not finite");
  index->codebook = std::move(codebook);
  index->codes.assign(static_cast<size_t>(cb.heads), CodeColumn(cb.subspaces));
  // Room for the coded tokens only: `tokens` comes from the description,
  // not from bytes given, and the column grows as decode codes more.
  const int64_t chunked = (index->coded_tokens + KvStore::kChunkTokens - 1) /
                          KvStore::kChunkTokens * KvStore::kChunkTokens;
  for (auto& head : index->codes) {
    const uint8_t* p = in.take(codes, "codes");
    uint8_t* dst = head.grow(index->coded_tokens, chunked);
    if (codes > 0) std::memcpy(dst, p, codes);
    if (c.pq_bits < 8)  // the copy is checked: it is what the index keeps
      for (uint64_t i = 0; i < codes; ++i)
        if (const uint8_t code = dst[i]; code >= cb.centroids)
          in.corrupt("a code is " + str(code) + "; pq_bits " + str(c.pq_bits) + " allows < " +
                     str(cb.centroids));
  }
  in.finish();
  pq_index_count_tuples(*index, 0, index->coded_tokens);
  return index;
}

}  // namespace

void Layer::restore(const LayerImage& image, const SequenceInfo& seq) {
  const pq_config& c = shared_.config;
  std::lock_guard<std::mutex> lock(mutex_);
  ByteReader meta(image.meta.data, image.meta.size, "the layer section of layer " + str(layer_index_));
  const int64_t n = meta.get<int64_t>("tokens");
  const int64_t prefill = meta.get<int64_t>("prefill tokens");
  const uint8_t flags = meta.get<uint8_t>("flags");
  const int32_t iterations = meta.get<int32_t>("iterations");
  const int32_t budget = meta.get<int32_t>("iteration budget");
  const double seconds = meta.get<double>("build seconds");
  meta.finish();
  check_build_facts(meta, iterations, budget, seconds);
  if (n < 0 || n > INT32_MAX || prefill < 0 || prefill > n)
    meta.corrupt("it holds " + str(n) + " tokens of which " + str(prefill) +
                 " are prefill; expected 0 <= prefill <= tokens <= 2147483647");
  if ((flags & ~(kHasIndex | kHasSelectorState)) != 0 ||
      ((flags & kHasIndex) != 0) != image.index.present() ||
      ((flags & kHasSelectorState) != 0) != image.selector.present())
    meta.corrupt("its flags " + str(flags) + " do not match the sections that follow it");
  if (image.index.present() && !shared_.selector->needs_index())
    meta.corrupt("it has an index, which the selector does not use");

  std::unique_ptr<PqIndex> index;
  if (image.index.present()) index = read_index(image.index, n, c, layer_index_);
  std::unique_ptr<SelectorState> selector_state = shared_.selector->make_state(c, layer_index_);
  if (image.selector.present()) {
    if (!selector_state)
      meta.corrupt("it has a selector state, which the selector does not keep");
    ByteReader in(image.selector.data, image.selector.size,
                  "the selector state section of layer " + str(layer_index_));
    selector_state->load(in, n, c);
    in.finish();
  }

  // The tokens' room in the memory limit now; their chunks with their K/V,
  // now or, for a restore that starts before they arrive, at restore_kv.
  Reservation caller;
  if (selector_state)
    caller = shared_.budget.reserve(selector_state->caller_bytes(),
                                    "restoring layer " + str(layer_index_) + "'s token classes");
  store_->expect(n);
  prefill_tokens_ = prefill;
  build_.set(std::move(index), IndexBuild::Facts{"", iterations, budget, seconds});
  selector_state_ = std::move(selector_state);
  charges_.caller_state = std::move(caller);
  awaiting_kv_ = n > 0;
  update_mirrors();
  publish_share();
  if (image.keys_values.present()) fill_kv(image.keys_values, seq);
}

void Layer::restore_kv(const SectionView& section, const SequenceInfo& seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  fill_kv(section, seq);
}

void Layer::fill_kv(const SectionView& section, const SequenceInfo& seq) {
  const pq_config& c = shared_.config;
  const int64_t n = store_->tokens();
  const int32_t heads = c.num_kv_heads;
  const uint64_t tensor_bytes = static_cast<uint64_t>(n) * heads * store_->row_bytes();
  if (section.size != 2 * tensor_bytes)
    fail(PQ_ERR_CORRUPT, "the keys and values section of layer " + str(layer_index_) + " has " +
                             str(static_cast<int64_t>(section.size)) + " bytes; " +
                             str(static_cast<int64_t>(2 * tensor_bytes)) + " expected for " +
                             str(n) + " tokens");
  // The section is [kv head][token][head_dim] keys, then values: head-major.
  pq_tensor keys, values;
  if (pq_tensor_init(&keys, const_cast<uint8_t*>(section.data), c.dtype, PQ_LAYOUT_HEAD_MAJOR, n,
                     heads, c.head_dim) != PQ_OK ||
      pq_tensor_init(&values, const_cast<uint8_t*>(section.data + tensor_bytes), c.dtype,
                     PQ_LAYOUT_HEAD_MAJOR, n, heads, c.head_dim) != PQ_OK)
    fail(PQ_ERR_INTERNAL, "the K/V views of a restored layer could not be made");
  if (!store_->copy_in(0, keys, values, shared_.pool.get())) {
    try {
      reject_non_finite(keys, "keys");  // names the first bad element
      reject_non_finite(values, "values");
    } catch (const Error& e) {
      fail(PQ_ERR_CORRUPT, "the keys and values of layer " + str(layer_index_) + ": " + e.what());
    }
    fail(PQ_ERR_INTERNAL, "a non-finite value was seen while restoring but not found again");
  }
  awaiting_kv_ = false;
  if (!build_.index() && prefill_tokens_ > 0 && shared_.selector->needs_index())
    build_.schedule(*store_, prefill_tokens_, seq);
  if (const DeviceMemory* device = shared_.backend->device_memory())
    device->store_window(device_.get(), *store_, 0, n, seq.stream);
  update_mirrors();
}

void Layer::require_kv(uint64_t seq_id, const char* call) const {
  if (awaiting_kv_)
    fail(PQ_ERR_BAD_STATE, "layer " + str(layer_index_) + " of seq_id " + std::to_string(seq_id) +
                               " is being restored and its keys and values have not arrived "
                               "(pq_sequence_restore_kv); " + call + " needs them");
}

}  // namespace pq
