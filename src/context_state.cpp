// The sequence state calls of a context: truncate, fork, save and restore.
// Each layer does its part (layer_state.cpp); here are the checks that need
// no layer, the framing and the all-or-nothing insertion of a new sequence.
#include <algorithm>
#include <string>

#include "context.h"
#include "error.h"

namespace pq {

void Context::sequence_truncate(uint64_t id, int64_t tokens) {
  std::shared_ptr<Sequence> seq = find(id);
  int64_t longest = 0;
  for (auto& layer : seq->layers) {
    layer->settle();
    longest = std::max(longest, layer->tokens());
  }
  if (tokens < 0 || tokens > longest)
    fail(PQ_ERR_INVALID_ARGUMENT, "tokens is " + std::to_string(tokens) + "; seq_id " +
                                      std::to_string(id) + " holds at most " +
                                      std::to_string(longest) + " tokens in a layer (expected 0.." +
                                      std::to_string(longest) + ")");
  for (auto& layer : seq->layers) layer->truncate(tokens, seq->info());
}

void Context::sequence_fork(uint64_t parent_id, uint64_t child_id) {
  std::shared_ptr<Sequence> parent = find(parent_id);
  require_absent(child_id);
  std::shared_ptr<Sequence> child = new_sequence(child_id, "pq_sequence_fork");
  for (size_t l = 0; l < child->layers.size(); ++l) child->layers[l]->fork_from(*parent->layers[l]);
  insert(std::move(child));
}

uint64_t Context::sequence_save(uint64_t id, pq_write_fn write, void* user) {
  std::shared_ptr<Sequence> seq = find(id);
  StateWriter out(write, user);
  out.header(shared_.config);
  std::vector<int64_t> tokens;
  for (auto& layer : seq->layers) tokens.push_back(layer->save_index(out));
  for (size_t l = 0; l < seq->layers.size(); ++l) seq->layers[l]->save_kv(out, tokens[l]);
  return out.finish();
}

void Context::sequence_restore(uint64_t id, const uint8_t* data, uint64_t size) {
  if (data == nullptr && size > 0) fail(PQ_ERR_INVALID_ARGUMENT, "data is NULL");
  require_absent(id);
  const std::vector<LayerImage> images = parse_state(data, size, shared_.config);
  std::shared_ptr<Sequence> seq = new_sequence(id, "pq_sequence_restore");
  for (size_t l = 0; l < images.size(); ++l) seq->layers[l]->restore(images[l], seq->info());
  insert(std::move(seq));
}

}  // namespace pq
