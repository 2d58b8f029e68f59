// What a layer publishes for readers that do not take its lock: its sizes
// for statistics (pq_stats, pq_selection_capacity), the bytes its last
// select read (pq_layer_info), and what its selector's state shares with
// the sequence's other layers (layer_share.h). Written under the layer's
// lock, read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "pqcache.h"
#include "selectors/layer_share.h"

namespace pq {

class LayerMirrors {
 public:
  struct Sizes {
    int64_t tokens = 0;
    uint64_t kv_bytes = 0;       // K/V held
    uint64_t charged_bytes = 0;  // counted in config.host_memory_limit
    uint64_t index_bytes = 0;
  };
  void publish(const Sizes& s) {
    tokens_.store(s.tokens);
    kv_bytes_.store(s.kv_bytes);
    charged_bytes_.store(s.charged_bytes);
    index_bytes_.store(s.index_bytes);
  }
  int64_t tokens() const { return tokens_.load(); }
  // Adds the sizes to statistics.
  void add_to(pq_stats* out) const {
    out->tokens += tokens_.load();
    out->kv_bytes += kv_bytes_.load();
    out->index_bytes += index_bytes_.load();
    out->host_bytes += charged_bytes_.load();
  }

  void set_last_select_bytes(uint64_t bytes) { last_select_bytes_.store(bytes); }
  uint64_t last_select_bytes() const { return last_select_bytes_.load(); }

  void publish_share(std::shared_ptr<const LayerShare> share) {
    std::atomic_store(&share_, std::move(share));
  }
  // Null until the state has something to share.
  std::shared_ptr<const LayerShare> share() const { return std::atomic_load(&share_); }

 private:
  std::atomic<int64_t> tokens_{0};
  std::atomic<uint64_t> kv_bytes_{0};
  std::atomic<uint64_t> charged_bytes_{0};
  std::atomic<uint64_t> index_bytes_{0};
  std::atomic<uint64_t> last_select_bytes_{0};
  std::shared_ptr<const LayerShare> share_;  // std::atomic_load/store only
};

}  // namespace pq
