// The context's calls of a decode step kept on the device
// (pq_decode_select_device, pq_fetch_kv_device): the checks that need no
// layer, on copies of the descriptors; the selection's arrays are device
// memory, so only their addresses are checked here, never their contents.
#include <string>

#include "base/call_args.h"
#include "sequence/context.h"
#include "base/error.h"
#include "base/tensor.h"

namespace pq {

namespace {

// A device selection's descriptor, read once: capacity >= 0, arrays given,
// positions and counts apart.
pq_selection device_selection(const pq_selection* sel, const char* name, int32_t kv_heads) {
  if (sel == nullptr) invalid(std::string(name) + " is NULL");
  const pq_selection copy = *sel;
  if (copy.capacity < 0)
    invalid(std::string(name) + "->capacity is " + str(copy.capacity) + "; expected >= 0");
  if (copy.positions == nullptr && copy.capacity > 0) invalid(std::string(name) + "->positions is NULL");
  if (copy.counts == nullptr) invalid(std::string(name) + "->counts is NULL");
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(copy.capacity),
                             static_cast<uint64_t>(kv_heads) * sizeof(int32_t), &bytes) ||
      reinterpret_cast<uintptr_t>(copy.positions) > UINTPTR_MAX - bytes)
    invalid(std::string(name) + "->capacity is " + str(copy.capacity) +
            "; num_kv_heads x capacity positions overflow the address space");
  require_apart(copy.positions, bytes, (std::string(name) + "->positions").c_str(), copy.counts,
                static_cast<uint64_t>(kv_heads) * sizeof(int32_t),
                (std::string(name) + "->counts").c_str());
  return copy;
}

}  // namespace

void Context::require_device_step(const char* call, const pq_tensor& t, const char* name) const {
  if (shared_.backend->kind() != PQ_BACKEND_CUDA)
    fail(PQ_ERR_UNSUPPORTED, std::string(call) + " needs the CUDA backend; this context runs on the " +
                                 shared_.backend->name() + " backend (use the host-positions call)");
  if (t.memory != PQ_MEMORY_DEVICE)
    fail(PQ_ERR_UNSUPPORTED, std::string(call) + ": " + name +
                                 ".memory is PQ_MEMORY_HOST; this call reads and writes device "
                                 "memory only");
}

void Context::decode_select_device(uint64_t id, int32_t layer, const pq_tensor* query_arg,
                                   pq_selection* out) {
  check_layer(layer);
  const pq_config& c = shared_.config;
  const pq_tensor query = copy_descriptor(query_arg, "query");
  validate_tensor(&query, {"query", c.num_q_heads, c.head_dim, c.dtype, 1, 1});
  const pq_selection sel = device_selection(out, "out", c.num_kv_heads);
  require_device_step("pq_decode_select_device", query, "query");
  if (!shared_.selector->needs_index())
    fail(PQ_ERR_UNSUPPORTED, std::string("pq_decode_select_device chooses on the device with the "
                                         "PQ selector only; this context's selector is ") +
                                 shared_.selector->name());
  // The device builds the lookup table dimension by dimension from the
  // caller's query: it knows neither the rotate-half pairing nor the keys
  // an exact re-ranking reads on the host.
  if (c.key_rotary == PQ_ROTARY_HALF)
    fail(PQ_ERR_UNSUPPORTED, "pq_decode_select_device: config.key_rotary is PQ_ROTARY_HALF, which "
                             "the device lookup table does not reorder; use pq_decode_select");
  if (c.pq_rerank > 0.f)
    fail(PQ_ERR_UNSUPPORTED, "pq_decode_select_device: config.pq_rerank is " +
                                 number_text(c.pq_rerank) +
                                 "; exact re-ranking reads the host keys: use pq_decode_select");
  std::shared_ptr<Sequence> seq = find(id);
  ScopedTimer timer(&shared_.counters.select_ns, &seq->counters->select_ns);
  seq->layers[static_cast<size_t>(layer)]->select_to_device(query, sel, seq->info());
}

void Context::fetch_kv_device(uint64_t id, int32_t layer, const pq_selection* selection,
                              const pq_tensor* out_keys, const pq_tensor* out_values) {
  check_layer(layer);
  const pq_config& c = shared_.config;
  const pq_selection sel = device_selection(selection, "selection", c.num_kv_heads);
  const pq_tensor keys = copy_descriptor(out_keys, "out_keys");
  const pq_tensor values = copy_descriptor(out_values, "out_values");
  // The counts are on the device: the outputs must hold a whole capacity.
  validate_tensor(&keys, {"out_keys", c.num_kv_heads, c.head_dim, c.dtype, sel.capacity, -1});
  validate_tensor(&values, {"out_values", c.num_kv_heads, c.head_dim, c.dtype, sel.capacity, -1});
  require_device_step("pq_fetch_kv_device", keys, "out_keys");
  require_device_step("pq_fetch_kv_device", values, "out_values");
  require_disjoint_rows(keys, "out_keys");
  require_disjoint_rows(values, "out_values");
  require_disjoint_outputs(keys, "out_keys", values, "out_values");
  std::shared_ptr<Sequence> seq = find(id);
  ScopedTimer timer(&shared_.counters.fetch_ns, &seq->counters->fetch_ns);
  seq->layers[static_cast<size_t>(layer)]->fetch_device_selection(sel, keys, values, seq->info());
}

}  // namespace pq
