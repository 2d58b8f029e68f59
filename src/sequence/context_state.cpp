// The sequence state calls of a context: truncate, fork, save and restore.
// Each layer does its part (layer_state.cpp); here are the checks that need
// no layer, the framing and the all-or-nothing insertion of a new sequence.
#include <algorithm>
#include <cstdint>
#include <new>
#include <string>

#include "sequence/context.h"
#include "base/dtype.h"
#include "base/error.h"

namespace pq {

namespace {
// The saves in progress on this thread, innermost first. A pq_write_fn runs
// while its save holds a layer's lock: a call from it on the sequence being
// saved would wait for that lock, held by its own thread, for ever.
struct SaveFrame {
  const Context* context;
  uint64_t id;
  const SaveFrame* outer;
};
thread_local const SaveFrame* t_saves = nullptr;

struct SaveScope {
  SaveFrame frame;
  SaveScope(const Context* context, uint64_t id) : frame{context, id, t_saves} {
    t_saves = &frame;
  }
  ~SaveScope() { t_saves = frame.outer; }
};

[[noreturn]] void fail_in_write_fn(uint64_t id, const char* what) {
  fail(PQ_ERR_BAD_STATE, "seq_id " + std::to_string(id) + " is being saved on this thread: " +
                             what + " from inside its pq_write_fn would wait for that save "
                             "to end; make the call after pq_sequence_save returns");
}
}  // namespace

void Context::require_not_saving(uint64_t id) const {
  for (const SaveFrame* f = t_saves; f != nullptr; f = f->outer)
    if (f->context == this && f->id == id) fail_in_write_fn(id, "a call on it");
}

void Context::require_no_save_on_this_thread() const {
  for (const SaveFrame* f = t_saves; f != nullptr; f = f->outer)
    if (f->context == this) fail_in_write_fn(f->id, "pq_wait_builds");
}

void Context::sequence_truncate(uint64_t id, int64_t tokens) {
  std::shared_ptr<Sequence> seq = find(id);
  int64_t longest = 0;
  for (auto& layer : seq->layers) {
    layer->settle_device();  // reads the lengths only
    longest = std::max(longest, layer->tokens());
  }
  if (tokens < 0 || tokens > longest)
    fail(PQ_ERR_INVALID_ARGUMENT, "tokens is " + std::to_string(tokens) + "; seq_id " +
                                      std::to_string(id) + " holds at most " +
                                      std::to_string(longest) + " tokens in a layer (expected 0.." +
                                      std::to_string(longest) + ")");
  for (auto& layer : seq->layers) layer->truncate(tokens, seq->info());
  debug([&] { return "sequence truncated: seq_id " + std::to_string(id) + " to " + std::to_string(tokens) + " tokens"; });
}

void Context::sequence_reserve(uint64_t id, int64_t tokens) {
  if (tokens < 0 || tokens > INT32_MAX)
    fail(PQ_ERR_INVALID_ARGUMENT, "tokens is " + std::to_string(tokens) +
                                      "; expected 0..2147483647 (a layer's most tokens)");
  std::shared_ptr<Sequence> seq = find(id);
  // Pinned memory cut ahead is not counted until tokens are stored, so it
  // is held to what the memory limit could still admit: a reserve never
  // pins more than the limit would let the sequence store.
  const MemoryBudget& budget = shared_.budget;
  const uint64_t chunk = shared_.cost.chunk;
  uint64_t room_tokens = UINT64_MAX;
  if (budget.limit() > 0 && chunk > 0)
    room_tokens = (budget.limit() > budget.used() ? budget.limit() - budget.used() : 0) /
                  (chunk * static_cast<uint64_t>(shared_.config.num_layers)) *
                  KvStore::kChunkTokens;
  int64_t longest = 0;
  for (auto& layer : seq->layers) longest = std::max(longest, layer->tokens());
  if (tokens > longest && static_cast<uint64_t>(tokens - longest) > room_tokens)
    fail(PQ_ERR_OUT_OF_MEMORY, "reserving " + std::to_string(tokens) + " tokens for seq_id " +
                                   std::to_string(id) + ": config.host_memory_limit (" +
                                   std::to_string(budget.limit()) + " bytes, " +
                                   std::to_string(budget.used()) + " used) admits about " +
                                   std::to_string(room_tokens) + " more tokens per layer");
  int64_t blocks = 0;
  for (auto& layer : seq->layers) blocks += layer->reserve(tokens, seq->info());
  // A backend without DeviceMemory allocates store blocks as they come.
  const DeviceMemory* device = shared_.backend->device_memory();
  if (blocks > 0 && !seq->layers.empty() && device != nullptr &&
      !device->reserve_store(seq->layers.front()->store_block_bytes(),
                             static_cast<size_t>(blocks)))
    fail(PQ_ERR_OUT_OF_MEMORY, "reserving " + std::to_string(blocks) + " K/V blocks of " +
                                   std::to_string(seq->layers.front()->store_block_bytes()) +
                                   " bytes for seq_id " + std::to_string(id) + " (" +
                                   std::to_string(tokens) + " tokens): the " +
                                   shared_.backend->name() + " backend could not allocate them");
}

void Context::sequence_fork(uint64_t parent_id, uint64_t child_id) {
  std::shared_ptr<Sequence> parent = find(parent_id);
  require_absent(child_id);
  std::shared_ptr<Sequence> child = new_sequence(child_id, "pq_sequence_fork");
  for (size_t l = 0; l < child->layers.size(); ++l) child->layers[l]->fork_from(*parent->layers[l], parent_id);
  insert(std::move(child));
  debug([&] {
    return "sequence forked: seq_id " + std::to_string(child_id) + " from " + std::to_string(parent_id);
  });
}

uint64_t Context::sequence_save(uint64_t id, pq_write_fn write, void* user) {
  require_kv_kept();
  std::shared_ptr<Sequence> seq = find(id);
  const SaveScope saving(this, id);
  StateWriter out(write, user);
  out.header(shared_.config);
  if (dtype_is_fp8(shared_.config.dtype)) {  // what the K/V bytes mean (docs/state-format.md)
    const std::vector<float>& scales = shared_.kv_head_scales;
    out.begin(state::kKvScales, -1, scales.size() * sizeof(float));
    out.payload(scales.data(), scales.size() * sizeof(float));
    out.end_section();
  }
  std::vector<int64_t> tokens;
  for (auto& layer : seq->layers) tokens.push_back(layer->save_index(out, id));
  for (size_t l = 0; l < seq->layers.size(); ++l) seq->layers[l]->save_kv(out, tokens[l]);
  const uint64_t bytes = out.finish();
  if (write != nullptr)  // not a count of the bytes
    debug([&] { return "sequence saved: seq_id " + std::to_string(id) + ", " + std::to_string(bytes) + " bytes"; });
  return bytes;
}

void Context::sequence_restore(uint64_t id, const uint8_t* data, uint64_t size) {
  require_kv_kept();
  if (data == nullptr && size > 0) fail(PQ_ERR_INVALID_ARGUMENT, "data is NULL");
  require_absent(id);
  const std::vector<LayerImage> images = parse_state(data, size, shared_.config, shared_.kv_head_scales);
  std::shared_ptr<Sequence> seq = new_sequence(id, "pq_sequence_restore");
  for (size_t l = 0; l < images.size(); ++l) seq->layers[l]->restore(images[l], seq->info());
  insert(std::move(seq));
  debug([&] { return "sequence restored: seq_id " + std::to_string(id) + " from " + std::to_string(size) + " bytes"; });
}

uint64_t Context::sequence_restore_begin(uint64_t id, const uint8_t* data, uint64_t size) {
  require_kv_kept();
  if (data == nullptr && size > 0) fail(PQ_ERR_INVALID_ARGUMENT, "data is NULL");
  require_absent(id);
  auto progress = std::make_unique<RestoreProgress>();
  std::vector<LayerImage> images;
  const uint64_t described = parse_description(data, size, shared_.config, shared_.kv_head_scales,
                                               progress->order, images);
  std::shared_ptr<Sequence> seq = new_sequence(id, "pq_sequence_restore_begin");
  for (size_t l = 0; l < images.size(); ++l) seq->layers[l]->restore(images[l], seq->info());
  progress->offset = described;
  seq->restoring = std::move(progress);
  insert(std::move(seq));
  return described;
}

uint64_t Context::sequence_restore_kv(uint64_t id, const uint8_t* data, uint64_t size) {
  if (data == nullptr && size > 0) fail(PQ_ERR_INVALID_ARGUMENT, "data is NULL");
  std::shared_ptr<Sequence> seq = find(id);
  const std::string who = "seq_id " + std::to_string(id);
  if (!seq->restoring)
    fail(PQ_ERR_BAD_STATE, who + " is not being restored; start with pq_sequence_restore_begin");
  RestoreProgress& p = *seq->restoring;
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.order.done()) fail(PQ_ERR_BAD_STATE, who + " is restored completely");
  if (!p.failure.empty())
    fail(PQ_ERR_BAD_STATE, who + " cannot be completed: an earlier pq_sequence_restore_kv failed (" +
                               p.failure + "); remove it");
  Frame f;
  uint64_t needed = 0;
  if (!read_frame(data, size, p.offset, &f, &needed)) throw NeedMore{needed};
  std::vector<LayerImage> images(seq->layers.size());
  const SectionOrder before = p.order;
  p.order.accept(f, images);  // checks before it changes anything
  if (f.type == state::kKeysValues) {
    try {
      seq->layers[static_cast<size_t>(f.layer)]->restore_kv(f.payload, seq->info());
    } catch (const std::exception& e) {
      // Out of memory (host_alloc's bad_alloc, or the limit): the layer's
      // chunks come before its rows, so the section may come again. Any
      // other failure ends the restore.
      const auto* error = dynamic_cast<const Error*>(&e);
      if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
          (error != nullptr && error->status() == PQ_ERR_OUT_OF_MEMORY))
        p.order = before;
      else
        p.failure = e.what();
      throw;
    }
  }
  p.offset += f.bytes;
  return f.bytes;
}

}  // namespace pq
