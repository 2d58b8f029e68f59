// A layer's selection (paper section 3.4: sinks, the top-k of the middle,
// the local window) and the inputs that selectors learn from.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "base/call_args.h"
#include "base/error.h"
#include "layer/layer.h"
#include "selectors/selector_capabilities.h"

namespace pq {

int64_t Layer::select(const std::vector<float>& queries, pq_selection* out,
                      const SequenceInfo& seq, bool speculate) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  PreparedSelect prepared;
  select_prepare(queries, out, seq, prepared);
  Reservation hint_charge;  // a speculation's rows are kept: charged first
  if (speculate) {
    hint_ = Hint{};
    hint_charge = shared_.budget.reserve_or_describe(
        (prepared.middle.size() + prepared.head_counts.size()) * sizeof(int32_t), [&] {
          return std::make_pair("keeping layer " + str(layer_index_) +
                                    "'s speculation (pq_decode_speculate)",
                                std::string("; it is held until the layer's next select"));
        });
  }
  // A speculation changes a copy of what a select would change (drop
  // marks, step counts, clusters), which is then dropped.
  std::unique_ptr<SelectorState> copy;
  if (speculate && selector_state_ && !shared_.selector->selects_without_changing_state()) {
    copy = selector_state_->clone();
    prepared.request->state = copy.get();
  }
  prepared.bytes = shared_.selector->select_layer(*prepared.request, prepared.middle.data());
  if (!speculate) {
    count_hint(prepared, seq);
    return select_finish(prepared, out, seq);
  }
  const int64_t count = select_finish(prepared, out, seq, /*counted=*/false);
  hint_.tokens = prepared.regions.n;
  hint_.local_begin = prepared.regions.mid_end;
  hint_.k = prepared.regions.k;
  hint_.middle.swap(prepared.middle);
  hint_.counts.swap(prepared.head_counts);
  hint_.charge = std::move(hint_charge);
  return count;
}

void Layer::count_hint(const PreparedSelect& prepared, const SequenceInfo& seq) {
  if (hint_.tokens < 0) return;
  // A hint is for this length, or for one token less: a caller speculates
  // for layer l before layer l has the step's token (its K needs layer l's
  // input), and that token is in the local window, not the middle.
  if (hint_.tokens != prepared.regions.n && hint_.tokens != prepared.regions.n - 1) {
    hint_ = Hint{};  // made at another length: not a hint for this select
    return;
  }
  uint64_t chosen = 0, covered = 0;
  const int64_t k = prepared.regions.k;
  for (size_t h = 0; h < prepared.head_counts.size(); ++h) {
    const int32_t* got = prepared.middle.data() + h * k;
    const int32_t* hint = hint_.middle.data() + h * hint_.k;
    const int32_t n_got = prepared.head_counts[h], n_hint = hint_.counts[h];
    chosen += static_cast<uint64_t>(n_got);
    // Covered: in the hint's middle, or in its local window (rows a caller
    // fetching the hint has too). Both rows ascending.
    for (int32_t i = 0, j = 0; i < n_got;) {
      if (got[i] >= hint_.local_begin) {
        covered += static_cast<uint64_t>(n_got - i);
        break;
      }
      if (j < n_hint && got[i] == hint[j]) {
        ++covered, ++i, ++j;
      } else if (j < n_hint && got[i] > hint[j]) {
        ++j;
      } else {
        ++i;
      }
    }
  }
  for (Counters* c : {&shared_.counters, seq.counters.get()}) {
    c->hint_tokens.fetch_add(chosen);
    c->hint_covered.fetch_add(covered);
  }
  hint_ = Hint{};  // used: its rows and their charge go
}

void Layer::select_prepare(const std::vector<float>& queries, pq_selection* out,
                           const SequenceInfo& seq, PreparedSelect& prepared, bool host_out,
                           const KvTier* exact_keys) {
  const Selector& selector = *shared_.selector;
  if (selector.needs_index()) {
    require_index(seq.id);
  } else {
    require_prefill(seq.id, "pq_decode_select");
    poll_build();
  }
  const Regions r = shared_.regions(store_->tokens(), layer_index_);
  // Before a restore's K/V arrive, only what the index already holds can be
  // selected: codes of the whole middle, scored without a key.
  if (awaiting_kv_ && selector.needs_index() && shared_.config.pq_rerank > 0.f)
    require_kv(seq.id, "pq_decode_select with config.pq_rerank (it reads the keys)");
  if (awaiting_kv_ && !(selector.needs_index() && build_.index()->coded_tokens >= r.mid_end))
    require_kv(seq.id, selector.needs_index()
                           ? "pq_decode_select (tokens not coded at save time must be coded)"
                           : "pq_decode_select with a selector other than PQ");
  const int64_t count = r.count();
  const int32_t kv_heads = shared_.config.num_kv_heads;
  if (out->capacity < count) {
    // As snprintf does: the caller learns the size it needs, and nothing
    // else is written (device counts are not written at all).
    if (host_out)
      for (int32_t h = 0; h < kv_heads; ++h) out->counts[h] = static_cast<int32_t>(count);
    fail(PQ_ERR_BUFFER_TOO_SMALL, "out->capacity is " + str(out->capacity) +
                                      "; this selection needs " + str(count) +
                                      " entries per kv head (" +
                                      (host_out ? "written to out->counts; " : "") +
                                      "see pq_selection_capacity_for)");
  }
  if (!store_->keeps_values() && selector.needs_index() && shared_.config.pq_rerank > 0.f &&
      exact_keys == nullptr)
    fail(PQ_ERR_BAD_STATE,
         "config.pq_rerank reads exact keys, which an index-only context (PQ_KV_TIER_CALLER) "
         "does not keep; pass them from your pool: pq_decode_select_multi's keys");
  if (selector.needs_index()) {
    code_tokens(r.mid_end);
    rebuild_for_long_output(seq);
    // An index-only layer selects from codes from now on: the keys they
    // stand for go (PQ_KV_TIER_CALLER in pqcache.h).
    if (!store_->keeps_values()) store_->drop_coded_keys(build_.index()->coded_tokens);
  }
  selector.update_state(selector_state_.get(), *store_, r.n, r.sink_end, r.mid_end,
                        shared_.config);

  // The middle is chosen aside and the rows written only when every head
  // succeeded: outputs are written only on success.
  prepared.regions = r;
  // Written on the device, the middle needs no host array: the step's host
  // work stays O(kv heads), whatever k.
  if (host_out)
    prepared.middle.assign(static_cast<size_t>(kv_heads) * static_cast<size_t>(r.k), 0);
  prepared.head_counts.assign(static_cast<size_t>(kv_heads), static_cast<int32_t>(r.k));
  LayerSelection& s = prepared.request.emplace(
      LayerSelection{context(seq), exact_keys != nullptr ? *exact_keys : *store_,
                     *shared_.backend, shared_.scratch});
  s.index = build_.index();
  s.state = selector_state_.get();
  s.queries = queries.data();
  s.middle = {r.sink_end, r.mid_end};
  s.k = r.k;
  s.k_mean = r.k_mean;
  s.head_counts = prepared.head_counts.data();
  s.prefill_tokens = prefill_tokens_;
  if (selector.cross_layer_shares() != nullptr) {
    if (seq.layers == nullptr ||
        static_cast<int32_t>(seq.layers->size()) != shared_.config.num_layers)
      fail(PQ_ERR_INTERNAL, std::string("selector ") + selector.name() +
                                " reads every layer's share, and the call did not pass the "
                                "sequence's layers");
    prepared.layer_shares.resize(seq.layers->size());
    for (size_t l = 0; l < seq.layers->size(); ++l)
      prepared.layer_shares[l] = (*seq.layers)[l]->share();
    s.layer_shares = &prepared.layer_shares;
  }
}

LayerContext Layer::context(const SequenceInfo& seq) const {
  LayerContext c{shared_.config};
  c.layer = layer_index_;
  c.device = device_.get();
  c.index_generation = build_.generation();
  c.stream = seq.stream;
  c.pool = shared_.pool.get();
  return c;
}

int64_t Layer::select_finish(const PreparedSelect& prepared, pq_selection* out,
                             const SequenceInfo& seq, bool counted) {
  if (out == nullptr) {  // written on the device (select_to_device): count it only
    count_selection(prepared.bytes, seq);
    return prepared.regions.count();
  }
  const Regions& r = prepared.regions;
  const int64_t count = r.count();
  for (int32_t h = 0; h < shared_.config.num_kv_heads; ++h) {  // before anything is written
    const int32_t taken = prepared.head_counts[static_cast<size_t>(h)];
    if (taken < 0 || taken > r.k)
      fail(PQ_ERR_INTERNAL, std::string("selector ") + shared_.selector->name() + " took " +
                                str(taken) + " middle tokens of kv head " + str(h) +
                                "; a head may take 0 to " + str(r.k));
  }
  for (int32_t h = 0; h < shared_.config.num_kv_heads; ++h) {
    int32_t* row = out->positions + h * out->capacity;
    const int32_t taken = prepared.head_counts[static_cast<size_t>(h)];
    int64_t w = 0;
    for (int64_t p = 0; p < r.sink_end; ++p) row[w++] = static_cast<int32_t>(p);
    if (taken > 0)  // middle may be empty, and memcpy from its null data() is undefined
      std::memcpy(row + w, prepared.middle.data() + h * r.k,
                  static_cast<size_t>(taken) * sizeof(int32_t));
    w += taken;
    for (int64_t p = r.mid_end; p < r.n; ++p) row[w++] = static_cast<int32_t>(p);
    out->counts[h] = static_cast<int32_t>(w);
  }
  if (counted) count_selection(prepared.bytes, seq);
  return count;
}

void Layer::count_selection(uint64_t bytes, const SequenceInfo& seq) {
  mirrors_.set_last_select_bytes(bytes);
  for (Counters* c : {&shared_.counters, seq.counters.get()}) {
    c->select_calls.fetch_add(1);
    c->bytes_scored.fetch_add(bytes);
  }
}

void Layer::prefill_queries(const std::vector<float>& queries, int64_t w, uint64_t seq_id) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  require_prefill(seq_id, "pq_prefill_queries");
  require_kv(seq_id, "pq_prefill_queries");
  shared_.selector->observe_queries(selector_state_.get(), *store_, queries.data(), w,
                                    shared_.config);
  publish_share();
}

void Layer::observe(const pq_selection* sel, const float* probs, uint64_t seq_id) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  require_prefill(seq_id, "pq_observe_attention");
  const int32_t kv_heads = shared_.config.num_kv_heads;
  check_positions(sel, kv_heads, store_->tokens(), layer_index_);
  for (int32_t h = 0; h < kv_heads; ++h)
    shared_.selector->observe_attention(selector_state_.get(), h,
                                        sel->positions + h * sel->capacity,
                                        probs + h * sel->capacity, sel->counts[h]);
}

uint64_t Layer::token_classes_room(int64_t end) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  // Classes may come before the layer's first K/V.
  if (!selector_state_) selector_state_ = shared_.selector->make_state(shared_.config, layer_index_);
  if (!selector_state_) return 0;
  const uint64_t after = selector_state_->caller_bytes_after_classes(end);
  return after > charges_.caller_state.bytes() ? after - charges_.caller_state.bytes() : 0;
}

void Layer::token_classes(int64_t first, int64_t count, const uint8_t* classes,
                          Reservation& room) {
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!selector_state_) selector_state_ = shared_.selector->make_state(shared_.config, layer_index_);
  if (const TokenClassObserver* observer = shared_.selector->token_class_observer())
    observer->observe_token_classes(selector_state_.get(), first, count, classes);
  charge_caller_state(&room);
  update_mirrors();
}

}  // namespace pq
