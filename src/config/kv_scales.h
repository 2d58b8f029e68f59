// fp8 K/V scales (pq_config.kv_scale_count and kv_scales): checked and
// copied once at pq_create, then held per (layer, K or V, kv head), the
// form every reader of keys and values takes them in.
#pragma once

#include <cstdint>
#include <vector>

#include "pqcache.h"

namespace pq {

// Checks config.kv_scale_count and the kv_scales it points to (read once)
// against the geometry and dtype of `c` and returns their copy,
// [num_layers][2][kv_scale_count]. Throws PQ_ERR_INVALID_ARGUMENT naming
// the field, and for a bad value its index, layer, K or V and kv head.
std::vector<float> read_kv_scales(const pq_config& c);

// The scales per kv head, [num_layers][2][num_kv_heads] (every one 1 when
// kv_scale_count is 0); empty for a dtype that is not fp8.
std::vector<float> head_scales(const pq_config& c, const std::vector<float>& given);

}  // namespace pq
