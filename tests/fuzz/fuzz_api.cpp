// libFuzzer target for the whole C API: the input bytes become a context
// configuration and a sequence of up to 64 calls (sequences added and
// removed, prefills and appends with ordinary and hostile tensors, selects,
// fetches, observations, index reads, statistics), then pq_destroy with
// builds in flight. Built with ASan + UBSan (scripts/fuzz.sh); any crash,
// sanitizer report or broken promise below is a finding:
//  - every call returns a known pq_status, and a message when it fails;
//  - a tensor whose span overflows is refused (the harness gives it a
//    one-element buffer, so accepting it would read out of bounds);
//  - a selection that succeeded is ascending, in range, within capacity;
//  - outputs are written only inside the buffers the harness allocated to
//    the exact span of their tensors (ASan checks every byte);
//  - outputs that overlap each other (a selection's counts inside its
//    positions, an output over a batch's items) are refused, and outputs
//    laid over the call's own inputs (a selection inside the fetch's
//    outputs, across batch items, a descriptor inside its positions) never
//    make it read what it did not check;
//  - a restored state whose numbers were changed under valid checksums
//    never reports impossible build facts;
//  - anything the library saved (huge finite attention observed included)
//    restores;
//  - with a host memory limit, pq_stats.host_bytes never passes it (huge
//    token-class ranges included);
//  - handles that outlive their context: every pq_watch_destroy watch not
//    ended runs exactly once at pq_destroy, an ended one never.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_state.h"
#include "pqcache.h"

namespace {

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_api: %s (last error: %s)\n", what, pq_last_error());
  std::abort();
}

void check(pq_status st) {
  if (st > PQ_OK || st < PQ_ERR_INCOMPATIBLE) finding("unknown pq_status");
  if (st == PQ_ERR_INTERNAL) finding("PQ_ERR_INTERNAL");
  if (st != PQ_OK && pq_last_error()[0] == '\0') finding("an error without a message");
}

int64_t element_size(int32_t dtype) { return dtype == PQ_DTYPE_F32 ? 4 : 2; }

// The span in bytes a tensor addresses, or -1 when it overflows.
int64_t span_bytes(const pq_tensor& t) {
  if (t.tokens <= 0 || t.heads <= 0) return 0;
  int64_t a, b, s, bytes;
  if (__builtin_mul_overflow(t.tokens - 1, t.token_stride, &a) ||
      __builtin_mul_overflow(static_cast<int64_t>(t.heads) - 1, t.head_stride, &b) ||
      __builtin_add_overflow(a, b, &s) || __builtin_add_overflow(s, int64_t{t.head_dim}, &s) ||
      __builtin_mul_overflow(s, element_size(t.dtype), &bytes))
    return -1;
  return bytes;
}

// A tensor and the buffer behind it, sized to its exact span (so ASan sees
// every read or write outside it), or one element when the span overflows.
struct Tensor {
  pq_tensor t{};
  std::vector<unsigned char> bytes;
  bool overflows = false;
};

constexpr int64_t kMaxSpan = int64_t{1} << 22;  // bytes the harness will allocate

Tensor make_tensor(FuzzedDataProvider& in, int32_t dtype, int64_t tokens, int32_t heads,
                   int32_t head_dim, bool allow_hostile) {
  Tensor x;
  x.t.dtype = dtype;
  x.t.memory = PQ_MEMORY_HOST;
  x.t.tokens = tokens;
  x.t.heads = heads;
  x.t.head_dim = head_dim;
  const int32_t shape = allow_hostile ? in.ConsumeIntegralInRange(0, 9) : in.ConsumeIntegralInRange(0, 3);
  switch (shape) {
    case 0:  // token-major
      x.t.token_stride = int64_t{heads} * head_dim;
      x.t.head_stride = head_dim;
      break;
    case 1:  // head-major
      x.t.token_stride = head_dim;
      x.t.head_stride = tokens * head_dim;
      break;
    case 2:  // padded token-major
      x.t.head_stride = head_dim + in.ConsumeIntegralInRange(0, 3);
      x.t.token_stride = heads * x.t.head_stride + in.ConsumeIntegralInRange(0, 5);
      break;
    case 3:  // broadcast: every token the same rows
      x.t.token_stride = 0;
      x.t.head_stride = head_dim;
      break;
    case 4:  // overlapping rows
      x.t.token_stride = in.ConsumeIntegralInRange<int64_t>(0, 2);
      x.t.head_stride = in.ConsumeIntegralInRange<int64_t>(0, 2);
      break;
    case 5:  // strides past INT64_MAX / 2: with two or more tokens the span overflows
      x.t.token_stride = std::numeric_limits<int64_t>::max() / 2 + in.ConsumeIntegralInRange(1, 64);
      x.t.head_stride = head_dim;
      break;
    case 6:
      x.t.token_stride = int64_t{heads} * head_dim;
      x.t.head_stride = std::numeric_limits<int64_t>::max() / 2 + in.ConsumeIntegralInRange(1, 64);
      break;
    case 7:  // negative strides
      x.t.token_stride = -in.ConsumeIntegralInRange<int64_t>(1, 64);
      x.t.head_stride = head_dim;
      break;
    case 8:  // a wrong shape field
      x.t.token_stride = int64_t{heads} * head_dim;
      x.t.head_stride = head_dim;
      x.t.heads = in.ConsumeIntegralInRange(-1, 5);
      x.t.head_dim = in.ConsumeIntegralInRange(-1, 20);
      x.t.dtype = in.ConsumeIntegralInRange(-1, 3);
      break;
    default:  // anything small
      x.t.token_stride = in.ConsumeIntegralInRange<int64_t>(0, 64);
      x.t.head_stride = in.ConsumeIntegralInRange<int64_t>(0, 64);
      break;
  }
  const bool valid_shape = x.t.heads > 0 && x.t.head_dim > 0 && x.t.dtype >= 0 && x.t.dtype <= 2 &&
                           x.t.token_stride >= 0 && x.t.head_stride >= 0;
  int64_t bytes = valid_shape ? span_bytes(x.t) : -1;
  if (bytes > kMaxSpan) {  // valid, but more than the harness can back: token-major
    x.t.token_stride = int64_t{x.t.heads} * x.t.head_dim;
    x.t.head_stride = x.t.head_dim;
    bytes = span_bytes(x.t);
  }
  // The library must refuse a span that overflows: the harness backs it
  // with 4 bytes, which it would read past otherwise.
  x.overflows = valid_shape && bytes < 0;
  x.bytes.assign(static_cast<size_t>(bytes >= 0 ? std::max<int64_t>(bytes, 1) : 4), 0);
  // Values: mostly small numbers, sometimes NaN or Inf.
  const float special = in.ConsumeBool() ? NAN : (in.ConsumeBool() ? INFINITY : 0.f);
  const bool poison = in.ConsumeIntegralInRange(0, 15) == 0;
  for (size_t i = 0; i + 1 < x.bytes.size(); i += 2) {
    const float v = poison && i == 0 ? special : static_cast<float>((i * 2654435761u) % 97) / 13.f;
    if (x.t.dtype == PQ_DTYPE_F32) {
      if (i % 4 == 0 && i + 4 <= x.bytes.size()) std::memcpy(&x.bytes[i], &v, 4);
    } else {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      const uint16_t h = static_cast<uint16_t>(u >> 16);  // a bf16-like pattern for both
      std::memcpy(&x.bytes[i], &h, 2);
    }
  }
  x.t.data = x.bytes.data();
  return x;
}

// A handle kept by another library into the context (pq_watch_destroy).
struct Watch {
  pq_context* ctx = nullptr;
  uint64_t id = 0;
  int runs = 0;
  bool ended = false;      // pq_unwatch_destroy returned PQ_OK
  bool ends_itself = false;  // calls pq_unwatch_destroy from its own fn
};

void watch_ran(void* user) {
  Watch& w = *static_cast<Watch*>(user);
  ++w.runs;
  if (w.ends_itself && pq_unwatch_destroy(w.ctx, w.id) != PQ_ERR_NOT_FOUND)
    finding("a watch could still be ended from inside pq_destroy");
}

struct State {
  pq_context* ctx = nullptr;
  pq_config config{};
  std::vector<int32_t> positions, counts;
  int64_t capacity = 0;
  std::vector<std::unique_ptr<Watch>> watches;
};

uint64_t seq_id(FuzzedDataProvider& in) { return in.ConsumeIntegralInRange<uint64_t>(0, 3); }
int32_t layer_of(FuzzedDataProvider& in, const pq_config& c) {
  return in.ConsumeIntegralInRange(-1, c.num_layers);
}

void prefill_or_append(FuzzedDataProvider& in, State& s, bool append) {
  const pq_config& c = s.config;
  const int64_t tokens = append ? in.ConsumeIntegralInRange<int64_t>(0, 3)
                                : in.ConsumeIntegralInRange<int64_t>(0, 300);
  Tensor k = make_tensor(in, c.dtype, tokens, c.num_kv_heads, c.head_dim, true);
  Tensor v = make_tensor(in, c.dtype, tokens, c.num_kv_heads, c.head_dim, false);
  const uint64_t seq = seq_id(in);
  const int32_t layer = layer_of(in, c);
  const pq_status st = append ? pq_decode_append(s.ctx, seq, layer, &k.t, &v.t)
                              : pq_prefill_layer(s.ctx, seq, layer, &k.t, &v.t);
  check(st);
  if (st == PQ_OK && k.overflows) finding("an overflowing span was accepted");
}

// 0.10: keys through a paged map (block table, slot map or dense) with
// entries in and out of the pool; values NULL half the time.
void paged(FuzzedDataProvider& in, State& s) {
  const pq_config& c = s.config;
  const int64_t slots = in.ConsumeIntegralInRange<int64_t>(0, 400);
  Tensor pool = make_tensor(in, c.dtype, slots, c.num_kv_heads, c.head_dim, in.ConsumeBool());
  pq_paged_keys k{};
  k.pool = pool.t;
  k.tokens = in.ConsumeIntegralInRange<int64_t>(-1, 300);
  k.map_length = in.ConsumeIntegralInRange<int64_t>(-1, 600);
  std::vector<int64_t> slot_map(static_cast<size_t>(std::max<int64_t>(k.map_length, 0)));
  std::vector<int32_t> table(slot_map.size());
  for (auto& x : slot_map) x = in.ConsumeIntegralInRange<int64_t>(-2, slots + 1);
  for (auto& x : table) x = in.ConsumeIntegralInRange<int32_t>(-2, 50);
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0: k.slots = slot_map.data(); break;
    case 1: k.block_table = table.data(); break;
    case 2: k.slots = slot_map.data(), k.block_table = table.data(); break;
    default: break;  // dense
  }
  k.block_size = in.ConsumeIntegralInRange(-1, 32);
  const uint64_t seq = seq_id(in);
  const int32_t layer = layer_of(in, c);
  check(in.ConsumeBool() ? pq_prefill_layer_paged(s.ctx, seq, layer, &k)
                         : pq_decode_append_paged(s.ctx, seq, layer, &k));
  if (in.ConsumeBool()) {  // dense keys with no values
    Tensor keys = make_tensor(in, c.dtype, in.ConsumeIntegralInRange<int64_t>(0, 40),
                              c.num_kv_heads, c.head_dim, false);
    check(pq_decode_append(s.ctx, seq, layer, &keys.t, nullptr));
  }
}

// 0.10: several query tokens, every row form and a capacity near the need.
void select_multi(FuzzedDataProvider& in, State& s) {
  const pq_config& c = s.config;
  const uint64_t seq = seq_id(in);
  const int32_t layer = layer_of(in, c);
  const int64_t q_tokens = in.ConsumeIntegralInRange<int64_t>(0, 5);
  const int32_t rows = in.ConsumeIntegralInRange(-1, 3);
  int64_t out_rows = 0, needed = 0;
  check(pq_selection_capacity_multi(s.ctx, seq, layer, q_tokens, rows, &out_rows, &needed));
  const int64_t capacity =
      std::max<int64_t>(0, std::min<int64_t>(needed + in.ConsumeIntegralInRange(-2, 2), 4096));
  const int64_t n_rows = std::max<int64_t>(1, std::min<int64_t>(out_rows, 64));
  std::vector<int32_t> positions(static_cast<size_t>(std::max<int64_t>(1, n_rows * capacity)));
  std::vector<int32_t> counts(static_cast<size_t>(n_rows));
  // Fewer rows than needed must not be written past: only give the arrays
  // when they hold every row.
  if (n_rows < out_rows) return;
  Tensor q = make_tensor(in, c.dtype, q_tokens, c.num_q_heads, c.head_dim, in.ConsumeBool());
  pq_selection sel{positions.data(), counts.data(), capacity};
  check(pq_decode_select_multi(s.ctx, seq, layer, &q.t, rows, nullptr, &sel));
}

void select(FuzzedDataProvider& in, State& s) {
  const pq_config& c = s.config;
  const uint64_t seq = seq_id(in);
  const int32_t layer = layer_of(in, c);
  int64_t needed = 0;
  check(pq_selection_capacity(s.ctx, seq, layer, &needed));
  s.capacity = std::max<int64_t>(0, std::min<int64_t>(needed + in.ConsumeIntegralInRange(-2, 2), 4096));
  s.positions.assign(static_cast<size_t>(std::max<int64_t>(1, c.num_kv_heads * s.capacity)), -1);
  s.counts.assign(static_cast<size_t>(c.num_kv_heads), -1);
  Tensor q = make_tensor(in, c.dtype, 1, c.num_q_heads, c.head_dim, in.ConsumeBool());
  pq_selection sel{s.positions.data(), s.counts.data(), s.capacity};
  pq_selection* out = &sel;
  const int shape = in.ConsumeIntegralInRange(0, 7);
  if (shape == 1 && s.positions.size() > static_cast<size_t>(c.num_kv_heads)) {
    // The counts inside the positions: two outputs over each other.
    std::vector<int32_t> both = s.positions;
    pq_selection inside{both.data(), both.data() + in.ConsumeIntegralInRange<size_t>(
                                                        0, both.size() - c.num_kv_heads),
                        s.capacity};
    const pq_status st = pq_decode_select(s.ctx, seq, layer, &q.t, &inside);
    check(st);
    if (st == PQ_OK && s.capacity > 0) finding("a selection's counts inside its positions were accepted");
    return;
  }
  if (shape == 2 && s.positions.size() * sizeof(int32_t) >= sizeof(pq_selection)) {
    // The descriptor inside its own positions (the vector's storage is
    // aligned for it): the first row written replaces it.
    out = reinterpret_cast<pq_selection*>(s.positions.data());
    *out = sel;
  }
  // A speculation writes what a select would, and must be as safe.
  const pq_status st = in.ConsumeBool() ? pq_decode_speculate(s.ctx, seq, layer, &q.t, out)
                                        : pq_decode_select(s.ctx, seq, layer, &q.t, out);
  check(st);
  if (st != PQ_OK) return;
  int64_t length = 0;
  check(pq_sequence_length(s.ctx, seq, layer, &length));
  for (int32_t h = 0; h < c.num_kv_heads; ++h) {
    if (s.counts[static_cast<size_t>(h)] < 0 || s.counts[static_cast<size_t>(h)] > s.capacity)
      finding("a count outside the capacity");
    for (int32_t i = 0; i < s.counts[static_cast<size_t>(h)]; ++i) {
      const int32_t p = s.positions[static_cast<size_t>(h * s.capacity + i)];
      if (p < 0 || p >= length) finding("a selected position outside the sequence");
      if (i > 0 && p <= s.positions[static_cast<size_t>(h * s.capacity + i - 1)])
        finding("a selection not strictly ascending");
    }
  }
}

void mangle_selection(FuzzedDataProvider& in, State& s) {
  if (s.positions.empty() || !in.ConsumeBool()) return;
  const size_t i = in.ConsumeIntegralInRange<size_t>(0, s.positions.size() - 1);
  s.positions[i] = in.ConsumeIntegralInRange<int32_t>(-3, 400);
  if (!s.counts.empty() && in.ConsumeBool())
    s.counts[in.ConsumeIntegralInRange<size_t>(0, s.counts.size() - 1)] =
        in.ConsumeIntegralInRange<int32_t>(-1, static_cast<int32_t>(s.capacity) + 1);
}

// A copy of the harness's selection inside an output tensor's buffer, at a
// 4-byte aligned offset: positions, or counts, or both (when they fit).
void place_selection(FuzzedDataProvider& in, const State& s, Tensor& out, pq_selection* sel) {
  const size_t pos_bytes = s.positions.size() * sizeof(int32_t);
  const size_t count_bytes = s.counts.size() * sizeof(int32_t);
  const size_t room = out.bytes.size() & ~size_t{3};
  const int what = in.ConsumeIntegralInRange(0, 2);
  if (what != 1 && pos_bytes <= room) {
    const size_t at = in.ConsumeIntegralInRange<size_t>(0, (room - pos_bytes) / 4) * 4;
    std::memcpy(out.bytes.data() + at, s.positions.data(), pos_bytes);
    sel->positions = reinterpret_cast<int32_t*>(out.bytes.data() + at);
  }
  if (what != 0 && count_bytes <= room) {
    const size_t at = in.ConsumeIntegralInRange<size_t>(0, (room - count_bytes) / 4) * 4;
    std::memcpy(out.bytes.data() + at, s.counts.data(), count_bytes);
    sel->counts = reinterpret_cast<int32_t*>(out.bytes.data() + at);
  }
}

// pq_decode_select_batch over 0..4 items (seq_ids may repeat: a call-level
// error), each with its own query and buffer, some too small.
void select_batch(FuzzedDataProvider& in, State& s) {
  const pq_config& c = s.config;
  const int32_t layer = layer_of(in, c);
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 4);
  std::vector<Tensor> queries;
  std::vector<std::vector<int32_t>> positions(n), counts(n);
  std::vector<pq_select_item> items(n);
  for (size_t i = 0; i < n; ++i) {
    queries.push_back(make_tensor(in, c.dtype, 1, c.num_q_heads, c.head_dim, in.ConsumeBool()));
    const int64_t cap = in.ConsumeIntegralInRange<int64_t>(0, 400);
    positions[i].assign(static_cast<size_t>(std::max<int64_t>(1, c.num_kv_heads * cap)), -1);
    counts[i].assign(static_cast<size_t>(c.num_kv_heads), -1);
    items[i].seq_id = seq_id(in);
    items[i].out = pq_selection{positions[i].data(), counts[i].data(), cap};
    items[i].status = static_cast<pq_status>(1);  // not a status: must be overwritten or kept
  }
  const pq_status st = pq_decode_select_batch(s.ctx, layer, items.data(), static_cast<int64_t>(n));
  check(st);
  bool any_failed = false;
  for (size_t i = 0; i < n; ++i) {
    if (items[i].status == 1) continue;  // a call-level error writes no status
    check(items[i].status);
    any_failed |= items[i].status != PQ_OK;
    if (items[i].status != PQ_OK) continue;
    for (int32_t h = 0; h < c.num_kv_heads; ++h)
      if (counts[i][static_cast<size_t>(h)] < 0 ||
          counts[i][static_cast<size_t>(h)] > items[i].out.capacity)
        finding("a batch item's count outside its capacity");
  }
  if (st == PQ_OK && any_failed) finding("a batch returned PQ_OK with a failed item");
}

// pq_fetch_kv_batch of the last selection for 0..4 sequences.
void fetch_batch(FuzzedDataProvider& in, State& s) {
  const pq_config& c = s.config;
  if (s.counts.empty()) return;
  mangle_selection(in, s);
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 4);
  const int64_t rows = std::max<int64_t>(1, s.capacity);
  std::vector<Tensor> outs;
  std::vector<pq_fetch_item> items(n);
  for (size_t i = 0; i < n; ++i) {
    outs.push_back(make_tensor(in, c.dtype, rows, c.num_kv_heads, c.head_dim, true));
    outs.push_back(make_tensor(in, c.dtype, rows, c.num_kv_heads, c.head_dim, in.ConsumeBool()));
  }
  for (size_t i = 0; i < n; ++i) {
    items[i].seq_id = seq_id(in);
    items[i].selection = pq_selection{s.positions.data(), s.counts.data(), s.capacity};
    // Sometimes a copy of the selection inside another item's (or its
    // own) output, which that item overwrites while this one reads it.
    if (in.ConsumeBool()) place_selection(in, s, outs[in.ConsumeIntegralInRange<size_t>(0, 2 * n - 1)],
                                          &items[i].selection);
    items[i].out_keys = outs[2 * i].t;
    items[i].out_values = outs[2 * i + 1].t;
  }
  // Rarely an output over the items array, where the statuses go.
  bool over_items = false;
  if (n > 0 && in.ConsumeIntegralInRange(0, 15) == 0) {
    items[0].out_values.data = items.data();
    over_items = items[0].out_values.tokens > 0;
  }
  const pq_status st = pq_fetch_kv_batch(s.ctx, layer_of(in, c), items.data(),
                                         static_cast<int64_t>(n));
  check(st);
  if (st == PQ_OK && over_items) finding("a batch output over the items array was accepted");
  for (size_t i = 0; st == PQ_OK && i < n; ++i)
    if (outs[2 * i].overflows || outs[2 * i + 1].overflows)
      finding("an overflowing batch output was accepted");
}

void fetch(FuzzedDataProvider& in, State& s) {
  const pq_config& c = s.config;
  if (s.counts.empty()) return;
  mangle_selection(in, s);
  pq_selection sel{s.positions.data(), s.counts.data(), s.capacity};
  const int64_t rows = std::max<int64_t>(1, s.capacity);
  Tensor k = make_tensor(in, c.dtype, rows, c.num_kv_heads, c.head_dim, true);
  Tensor v = make_tensor(in, c.dtype, rows, c.num_kv_heads, c.head_dim, in.ConsumeBool());
  // Sometimes the selection inside the outputs it fills.
  if (in.ConsumeBool()) place_selection(in, s, in.ConsumeBool() ? k : v, &sel);
  const pq_status st = pq_fetch_kv(s.ctx, seq_id(in), layer_of(in, c), &sel,
                                   in.ConsumeBool() ? &k.t : &v.t, &v.t);
  check(st);
  if (st == PQ_OK && (k.overflows || v.overflows)) finding("an overflowing output was accepted");
}

// pq_decode_attend, or pq_decode_tail (the tail estimate alone), over the
// last selection (mangled): outputs of the query heads, log-sum-exp or not.
void attend(FuzzedDataProvider& in, State& s) {
  const pq_config& c = s.config;
  if (s.counts.empty()) return;
  mangle_selection(in, s);
  pq_selection sel{s.positions.data(), s.counts.data(), s.capacity};
  Tensor q = make_tensor(in, c.dtype, 1, c.num_q_heads, c.head_dim, in.ConsumeBool());
  const float scales[] = {0.f, 0.125f, 1e30f, -1.f, NAN};
  const float scale = scales[in.ConsumeIntegralInRange(0, 4)];
  std::vector<float> out(static_cast<size_t>(c.num_q_heads) * c.head_dim), lse(c.num_q_heads);
  float* lse_out = in.ConsumeBool() ? lse.data() : nullptr;
  check(in.ConsumeBool() ? pq_decode_tail(s.ctx, seq_id(in), layer_of(in, c), &q.t, &sel, scale,
                                          out.data(), lse_out)
                         : pq_decode_attend(s.ctx, seq_id(in), layer_of(in, c), &q.t, &sel,
                                            scale, out.data(), lse_out));
}

void observe(FuzzedDataProvider& in, State& s) {
  if (s.counts.empty()) return;
  mangle_selection(in, s);
  // Ordinary probabilities, or huge and tiny finite ones (accumulated, they
  // must stay restorable: issue 39 R3).
  const float extremes[] = {3e38f, std::numeric_limits<float>::max(), 1e30f,
                            std::numeric_limits<float>::denorm_min(), 0.f};
  const float p = in.ConsumeBool() ? in.ConsumeFloatingPointInRange<float>(-1.f, 2.f)
                                   : extremes[in.ConsumeIntegralInRange(0, 4)];
  std::vector<float> probs(s.positions.size(), p);
  if (in.ConsumeBool() && !probs.empty()) probs[0] = NAN;
  pq_selection sel{s.positions.data(), s.counts.data(), s.capacity};
  check(pq_observe_attention(s.ctx, seq_id(in), layer_of(in, s.config), &sel, probs.data()));
}

// pq_sequence_token_classes: any first (the extremes too), a buffer of
// count classes with some bits no class has.
void token_classes(FuzzedDataProvider& in, State& s) {
  const int64_t extremes[] = {0, 1, 80, std::numeric_limits<int64_t>::max(), -1};
  const int64_t first = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 200)
                                         : extremes[in.ConsumeIntegralInRange(0, 4)];
  // Now and then a range far past the stored tokens (issue 39 R2: charged
  // to the host memory limit, never past it).
  const bool huge = in.ConsumeIntegralInRange(0, 7) == 0;
  const int64_t count = huge ? int64_t{1} << in.ConsumeIntegralInRange(16, 22)
                             : in.ConsumeIntegralInRange<int64_t>(-1, 200);
  const uint64_t seq = seq_id(in);
  const bool null = in.ConsumeIntegralInRange(0, 7) == 0;
  // Each class from the input; a huge range repeats one (consuming the
  // input per position would leave nothing for the calls after it).
  std::vector<uint8_t> classes(static_cast<size_t>(std::max<int64_t>(count, 1)));
  if (huge)
    std::fill(classes.begin(), classes.end(), in.ConsumeIntegralInRange<uint8_t>(0, 3));
  else
    for (uint8_t& c : classes) c = in.ConsumeIntegralInRange<uint8_t>(0, in.ConsumeBool() ? 3 : 255);
  check(pq_sequence_token_classes(s.ctx, seq, first, count, null ? nullptr : classes.data()));
}

// pq_watch_destroy / pq_unwatch_destroy: a new watch, or the end of one
// (ended ones again, and ids never made).
void watch(FuzzedDataProvider& in, State& s) {
  if (s.watches.empty() || in.ConsumeBool()) {
    auto w = std::make_unique<Watch>();
    w->ctx = s.ctx;
    w->ends_itself = in.ConsumeBool();
    const pq_status st = pq_watch_destroy(s.ctx, watch_ran, w.get(), &w->id);
    check(st);
    if (st == PQ_OK) s.watches.push_back(std::move(w));
    return;
  }
  if (in.ConsumeIntegralInRange(0, 7) == 0) {
    const pq_status st = pq_unwatch_destroy(s.ctx, in.ConsumeIntegral<uint64_t>() | (uint64_t{1} << 63));
    check(st);
    if (st != PQ_ERR_NOT_FOUND) finding("pq_unwatch_destroy ended a watch never made");
    return;
  }
  Watch& w = *s.watches[in.ConsumeIntegralInRange<size_t>(0, s.watches.size() - 1)];
  const pq_status st = pq_unwatch_destroy(s.ctx, w.id);
  check(st);
  if (st != (w.ended ? PQ_ERR_NOT_FOUND : PQ_OK))
    finding("pq_unwatch_destroy answered other than its watch's state says");
  w.ended = true;
}

// With a limit, what the library holds never passes it.
void check_limit(const State& s) {
  if (s.config.host_memory_limit == 0) return;
  pq_stats stats;
  stats.struct_size = sizeof stats;
  check(pq_stats_get(s.ctx, &stats));
  if (stats.host_bytes > s.config.host_memory_limit) finding("host_bytes passed the limit");
}

void read_index(FuzzedDataProvider& in, State& s) {
  const pq_config& c = s.config;
  const int64_t extremes[] = {0, 1, 2, 255, std::numeric_limits<int64_t>::max(),
                              std::numeric_limits<int64_t>::max() / 2, -1};
  const int64_t first = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 400)
                                         : extremes[in.ConsumeIntegralInRange(0, 6)];
  const int64_t count = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 400)
                                         : extremes[in.ConsumeIntegralInRange(0, 6)];
  // A buffer for count codes when count is reasonable; else one byte, which
  // is fine as long as the library refuses (it has far fewer tokens).
  std::vector<uint8_t> out(static_cast<size_t>(
      count >= 0 && count <= 400 ? std::max<int64_t>(1, count * c.pq_subspaces) : 1));
  const uint64_t seq = seq_id(in);
  const int32_t layer = layer_of(in, c);
  const int32_t head = in.ConsumeIntegralInRange(-1, c.num_kv_heads);
  const pq_status st = pq_index_codes(s.ctx, seq, layer, head, first, count, out.data());
  check(st);
  if (st == PQ_OK && (count < 0 || count > 400)) finding("pq_index_codes took an absurd count");
  std::vector<float> centroids(static_cast<size_t>(c.head_dim) << std::max(c.pq_bits, 0));
  const int64_t floats = static_cast<int64_t>(centroids.size()) - in.ConsumeIntegralInRange(0, 1);
  check(pq_index_centroids(s.ctx, seq, layer, head, centroids.data(), floats));
}

void introspect(FuzzedDataProvider& in, State& s) {
  const uint64_t seq = seq_id(in);
  const int32_t layer = layer_of(in, s.config);
  pq_layer_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = in.ConsumeBool() ? sizeof info : in.ConsumeIntegralInRange<uint32_t>(0, 200);
  check(pq_layer_info_get(s.ctx, seq, layer, &info));
  pq_stats st;
  std::memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  check(pq_stats_get(s.ctx, &st));
  check(pq_sequence_stats_get(s.ctx, seq, &st));
  int64_t n = 0;
  check(pq_sequence_length(s.ctx, seq, layer, &n));
  check(pq_sequence_count(s.ctx, &n));
}

// What pq_layer_info_get reports of a restored sequence's builds must be
// what a build can produce, whatever the state said.
void check_build_facts(State& s, uint64_t seq) {
  for (int32_t layer = 0; layer < s.config.num_layers; ++layer)
    if (!build_facts_possible(s.ctx, seq, layer))
      finding("a restored state reports impossible build facts");
}

// Save a sequence, damage the bytes or not, restore them into a sequence at
// once or in pieces: a damaged state must be refused with a status, never
// crash or load.
void save_and_restore(FuzzedDataProvider& in, State& s) {
  const uint64_t from = seq_id(in), to = seq_id(in);
  uint64_t size = 0;
  pq_status st = pq_sequence_state_size(s.ctx, from, &size);
  check(st);
  if (st != PQ_OK || size > (uint64_t{1} << 24)) return;
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  uint64_t written = 0;
  st = pq_sequence_save_buffer(s.ctx, from, bytes.data(), size, &written);
  check(st);
  if (st != PQ_OK) return;
  int damage = in.ConsumeIntegralInRange(0, 4);
  if (damage == 4 && !reseal_a_number(in, bytes)) damage = 0;
  if (damage == 1) {
    bytes.resize(in.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1));
  } else if (damage == 2) {
    bytes[in.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1)] ^=
        in.ConsumeIntegralInRange<uint8_t>(1, 255);
  } else if (damage == 3) {
    const size_t at = in.ConsumeIntegralInRange<size_t>(0, bytes.size() - 1);
    std::vector<uint8_t> junk = in.ConsumeBytes<uint8_t>(bytes.size() - at);
    std::copy(junk.begin(), junk.end(), bytes.begin() + static_cast<std::ptrdiff_t>(at));
  }
  if (in.ConsumeBool()) {
    st = pq_sequence_restore(s.ctx, to, bytes.data(), bytes.size());
    check(st);
    if (damage == 0 && st != PQ_OK && st != PQ_ERR_OUT_OF_MEMORY && st != PQ_ERR_INVALID_ARGUMENT)
      finding("an intact saved state was refused");
    if (st == PQ_OK) check_build_facts(s, to);
    return;
  }
  // In pieces: the description, then one section a call, with selections
  // in between; a short piece must say how much it needs, and never more
  // than the state holds when the state is intact.
  uint64_t at = 0, used = 0;
  uint64_t given = in.ConsumeIntegralInRange<uint64_t>(0, bytes.size());
  for (int i = 0; i < 64; ++i) {
    // No bytes at all may come as NULL.
    const uint8_t* data = given == 0 && in.ConsumeBool() ? nullptr : bytes.data();
    st = pq_sequence_restore_begin(s.ctx, to, data, given, &used);
    check(st);
    if (st != PQ_ERR_BUFFER_TOO_SMALL) break;
    if (used <= given) finding("restore_begin asked for no more bytes than it had");
    if (used > bytes.size()) {
      if (damage == 0) finding("restore_begin asked for more bytes than an intact state holds");
      return;
    }
    given = used;
  }
  if (st != PQ_OK) return;
  check_build_facts(s, to);
  at = used;
  for (int i = 0; i < 16 && at < bytes.size(); ++i) {
    select(in, s);
    st = pq_sequence_restore_kv(s.ctx, to, bytes.data() + at, bytes.size() - at, &used);
    check(st);
    if (st != PQ_OK) {
      if (damage == 0 && st != PQ_ERR_NOT_FOUND) finding("an intact K/V section was refused");
      return;
    }
    at += used;
  }
}

}  // namespace

// One directory for every run's disk-tier files (each unnamed, gone with
// its context), made on first use and left empty.
static const char* disk_tier_directory() {
  static const std::string dir = [] {
    std::string pattern = "/tmp/pqcache-fuzz-XXXXXX";
    return mkdtemp(pattern.data()) != nullptr ? pattern : std::string("/tmp");
  }();
  return dir.c_str();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  State s;
  pq_config& c = s.config;
  pq_config_default(&c);
  c.num_layers = in.ConsumeIntegralInRange(1, 3);
  c.num_kv_heads = in.ConsumeIntegralInRange(1, 3);
  c.num_q_heads = c.num_kv_heads * in.ConsumeIntegralInRange(1, 3);
  const int32_t dims[] = {1, 2, 3, 4, 8, 16};
  c.head_dim = dims[in.ConsumeIntegralInRange(0, 5)];
  c.dtype = in.ConsumeIntegralInRange(0, 2);
  c.pq_subspaces = in.ConsumeIntegralInRange(0, 4);  // 0: chosen from head_dim
  c.pq_bits = in.ConsumeIntegralInRange(0, 9);        // 0: 8
  c.kmeans_iterations = in.ConsumeIntegralInRange(0, 3);
  c.kmeans_max_iterations = in.ConsumeIntegralInRange(2, 4);
  c.kmeans_init = in.ConsumeIntegralInRange(0, 1);
  c.kmeans_max_points_per_centroid = in.ConsumeIntegralInRange(1, 64);
  c.worker_threads = in.ConsumeIntegralInRange(1, 2);
  c.selector = in.ConsumeIntegralInRange(-1, PQ_SELECTOR_COUNT);  // both ends invalid
  c.sink_tokens = in.ConsumeIntegralInRange(-1, 8);
  c.local_tokens = in.ConsumeIntegralInRange(0, 40);
  c.topk_tokens = in.ConsumeIntegralInRange(0, 40);
  c.topk_fraction = in.ConsumeFloatingPointInRange<float>(-0.1f, 1.2f);
  c.gqa_combine = in.ConsumeIntegralInRange(0, 3);
  c.sparq_dims = in.ConsumeIntegralInRange(0, 4);
  c.block_tokens = in.ConsumeIntegralInRange(0, 64);
  c.block_representatives = in.ConsumeIntegralInRange(1, 3);
  c.observation_window = in.ConsumeIntegralInRange(1, 40);
  c.pooling_kernel = in.ConsumeIntegralInRange(1, 9);
  if (in.ConsumeBool()) {
    c.cache_tokens = in.ConsumeIntegralInRange<int64_t>(0, 512);
    c.cache_block_tokens = in.ConsumeIntegralInRange(0, 64);
    c.cache_policy = in.ConsumeIntegralInRange(0, 2);
    c.cache_update_blocks = in.ConsumeIntegralInRange(0, 8);
  }
  if (in.ConsumeBool()) c.host_memory_limit = in.ConsumeIntegralInRange<uint64_t>(0, 1u << 22);
  if (in.ConsumeBool()) {  // the 0.7 index options
    c.key_rotary = in.ConsumeIntegralInRange(-1, 3);
    const float reranks[] = {0.f, 0.5f, 2.f, -1.f, NAN, 65.f};
    c.pq_rerank = reranks[in.ConsumeIntegralInRange(0, 5)];
    c.pooling = in.ConsumeIntegralInRange(-1, 2);
  }
  if (in.ConsumeBool()) c.history_window = in.ConsumeIntegralInRange(0, 70);  // Scissorhands
  if (in.ConsumeBool()) {  // Keyformer's temperature schedule, in range and not
    const float taus[] = {1.f, 0.f, 1e-30f, -1.f, NAN, 1e30f, 0.5f};
    c.keyformer_tau = taus[in.ConsumeIntegralInRange(0, 6)];
    c.keyformer_tau_step = taus[in.ConsumeIntegralInRange(0, 6)];
  }
  if (in.ConsumeBool()) c.cluster_count = in.ConsumeIntegralInRange(0, 40);  // ClusterKV
  if (in.ConsumeBool()) {  // AdaKV
    const float shares[] = {0.2f, 0.f, 1.f, 0.7f, -0.1f, 1.5f, NAN};
    c.adakv_safeguard = shares[in.ConsumeIntegralInRange(0, 6)];
  }
  if (in.ConsumeBool()) {  // ZigZagKV
    const float shares[] = {0.9f, 0.f, 1.f, 0.2f, -0.1f, 1.5f, NAN};
    c.zigzag_mass = shares[in.ConsumeIntegralInRange(0, 6)];
    c.zigzag_floor = shares[in.ConsumeIntegralInRange(0, 6)];
  }
  if (in.ConsumeBool()) {  // PyramidInfer
    const float ratios[] = {0.9f, 0.f, 1.f, 0.5f, -0.1f, 1.5f, NAN};
    c.pyramidinfer_decay = ratios[in.ConsumeIntegralInRange(0, 6)];
  }
  if (in.ConsumeBool()) {  // FastGen
    const float ratios[] = {0.9f, 0.f, 1.f, 0.3f, -0.1f, 1.5f, NAN};
    c.fastgen_recovery = ratios[in.ConsumeIntegralInRange(0, 6)];
  }
  if (in.ConsumeBool()) {  // InfiniGen
    const float ratios[] = {0.2f, 0.f, 1.f, 0.01f, -0.1f, 1.5f, NAN};
    const float alphas[] = {4.f, 0.f, 1e-3f, 1e6f, -1.f, 2e6f, NAN};
    c.infinigen_partial_ratio = ratios[in.ConsumeIntegralInRange(0, 6)];
    c.infinigen_alpha = alphas[in.ConsumeIntegralInRange(0, 6)];
  }
  if (in.ConsumeBool()) {  // the disk tier (0.9), and tiers that are none
    c.kv_tier = in.ConsumeIntegralInRange(-1, 3);
    c.kv_head_offset = in.ConsumeIntegralInRange(-1, 70000);
    c.kv_disk_path = in.ConsumeBool() ? disk_tier_directory() : nullptr;
  }
  if (in.ConsumeBool()) {  // issue 44: the tail estimate, outliers, top-p (0.12-0.15)
    const float shares[] = {0.f, 0.01f, 0.25f, 0.3f, -0.1f, NAN};
    const float ps[] = {0.f, 0.5f, 1.f, 1e-6f, -0.1f, 1.5f, NAN};
    c.tail_estimate = in.ConsumeIntegralInRange(-1, 2);
    c.pq_outliers = shares[in.ConsumeIntegralInRange(0, 5)];
    c.top_p = ps[in.ConsumeIntegralInRange(0, 6)];
    c.top_p_floor = ps[in.ConsumeIntegralInRange(0, 6)];
  }

  pq_status st = pq_create(&c, &s.ctx);
  check(st);
  if (st != PQ_OK) return 0;
  // The harness sizes buffers from the configuration the library resolved
  // (pq_subspaces and pq_bits 0 are chosen at pq_create).
  check(pq_get_config(s.ctx, &c));
  for (int op = 0; op < 64 && in.remaining_bytes() > 0; ++op) {
    switch (in.ConsumeIntegralInRange(0, 21)) {
      case 0: check(pq_sequence_add(s.ctx, seq_id(in))); break;
      case 1: check(pq_sequence_remove(s.ctx, seq_id(in))); break;
      case 2: prefill_or_append(in, s, false); break;
      case 3: prefill_or_append(in, s, true); break;
      case 4: select(in, s); break;
      case 5: fetch(in, s); break;
      case 6: observe(in, s); break;
      case 7: {
        Tensor q = make_tensor(in, c.dtype, in.ConsumeIntegralInRange<int64_t>(0, 40),
                               c.num_q_heads, c.head_dim, in.ConsumeBool());
        check(pq_prefill_queries(s.ctx, seq_id(in), layer_of(in, c), &q.t));
        break;
      }
      case 8: read_index(in, s); break;
      case 9: introspect(in, s); break;
      case 10: select_batch(in, s); break;
      case 11: fetch_batch(in, s); break;
      case 12:
        check(pq_sequence_truncate(s.ctx, seq_id(in), in.ConsumeIntegralInRange<int64_t>(-1, 80)));
        break;
      case 13: check(pq_sequence_fork(s.ctx, seq_id(in), seq_id(in))); break;
      case 14: save_and_restore(in, s); break;
      case 15: token_classes(in, s); break;
      case 16: watch(in, s); break;
      case 17:  // 0.8: nothing to reserve on the CPU backend, but the checks run
        check(pq_sequence_reserve(s.ctx, seq_id(in),
                                  in.ConsumeIntegralInRange<int64_t>(-2, int64_t{1} << 33)));
        break;
      case 18: paged(in, s); break;
      case 19: select_multi(in, s); break;
      case 20: attend(in, s); break;
      default: check(pq_wait_builds(s.ctx)); break;
    }
    check_limit(s);
  }
  pq_destroy(s.ctx);  // builds may still run
  for (const auto& w : s.watches)
    if (w->runs != (w->ended ? 0 : 1)) finding("a watch ran other than once (or never, if ended)");
  return 0;
}
