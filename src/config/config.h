// The configuration of a context: defaults, validation and the names of the
// enumerations, all from the one table in config_fields.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pqcache.h"

namespace pq {

// Fills every field with its default (geometry 0), struct_size included.
void fill_config_defaults(pq_config* config);

// Checks a caller's configuration (an older caller's smaller struct gets the
// defaults of the fields it does not know) and returns it with the defaults
// resolved (worker_threads 0 = the hardware's threads) and its paths
// (cuda_plugin_path, kv_disk_path) dropped: read during pq_create only,
// through caller_paths(). Throws PQ_ERR_INVALID_ARGUMENT or
// PQ_ERR_UNSUPPORTED naming the field, its value and what was expected.
// kv_scales, when not null, receives the checked copy of config->kv_scales
// (config/kv_scales.h).
pq_config resolve_config(const pq_config* config, std::vector<float>* kv_scales = nullptr);

// What a caller's configuration points to that pq_create reads and the
// resolved configuration does not hold (null where the caller's struct_size
// predates the field): its strings, and its fp8 scales, copied once by
// resolve_config (checked; [num_layers][2][kv_scale_count]) for the
// context to own.
struct CallerPaths {
  const char* cuda_plugin = nullptr;
  const char* kv_disk = nullptr;
  std::vector<float> kv_scales;
};
CallerPaths caller_paths(const pq_config* config);
// The threads worker_threads = 0 (and pq_pool_create(0)) stand for: the
// hardware threads, at least 1.
int32_t hardware_threads();

// The most K-Means iterations a configuration may ask for; a restored
// state's build facts are held to it too (layer_state.cpp).
constexpr int32_t kMaxKmeansIterations = 100000;
// The bound of the real-valued fields that have no other (config_fields.h).
constexpr double kMaxReal = 1e300;
// pq_rerank's bound: (1 + r) * k candidates; past 64 the re-ranking reads
// more keys than the exact selector would at any budget above 1/65.
constexpr double kMaxRerank = 64.0;
// pq_outliers' bound: past a quarter of the middle, exact scores cost more
// than the codes save (pq_rerank serves that end).
constexpr double kMaxOutlierShare = 0.25;

// The default index, chosen by measurement (docs/quality.md, "The default
// index"): 2^8 centroids, and head_dim / 32 subspaces clipped to [1, 4],
// lowered until they cut the head into equal subspaces (of whole rotary
// pairs under a rotary layout). The paper's setting is 2 x 6 bits.
constexpr int32_t kDefaultBits = 8;
int32_t default_subspaces(int32_t head_dim, int32_t key_rotary);

// "PQ_SELECTOR_H2O" for 7, and so on; "(unknown)" for a value no table has.
std::string selector_value_name(int32_t selector);

}  // namespace pq
