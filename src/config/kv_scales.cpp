#include "config/kv_scales.h"

#include <cmath>
#include <string>

#include "base/dtype.h"
#include "base/error.h"

namespace pq {

std::vector<float> read_kv_scales(const pq_config& c) {
  const int32_t count = c.kv_scale_count;
  if (count != 0 && !dtype_is_fp8(c.dtype))
    invalid("config.kv_scale_count is " + str(count) + " with dtype " + dtype_name(c.dtype) +
            "; kv_scales apply to fp8 dtypes only (PQ_DTYPE_FP8_E4M3, PQ_DTYPE_FP8_E5M2)");
  if (count != 0 && count != 1 && count != c.num_kv_heads)
    invalid("config.kv_scale_count is " + str(count) + "; expected 0 (every scale 1), 1 (one "
            "per layer for K and for V) or num_kv_heads " + str(c.num_kv_heads) + " (one per "
            "kv head)");
  if (count == 0) {
    if (c.kv_scales != nullptr)
      invalid("config.kv_scales is not NULL with kv_scale_count 0; set the count (1 or "
              "num_kv_heads) or leave kv_scales NULL");
    return {};
  }
  if (c.kv_scales == nullptr)
    invalid("config.kv_scales is NULL with kv_scale_count " + str(count) + "; expected " +
            str(int64_t{c.num_layers} * 2 * count) + " floats ([num_layers][2][kv_scale_count])");
  const size_t n = static_cast<size_t>(c.num_layers) * 2 * static_cast<size_t>(count);
  std::vector<float> scales(c.kv_scales, c.kv_scales + n);  // read once, then checked
  for (size_t i = 0; i < n; ++i) {
    const float s = scales[i];
    if (std::isfinite(s) && s > 0.f) continue;
    const size_t per_layer = 2 * static_cast<size_t>(count);
    const size_t in_layer = i % per_layer;
    invalid("config.kv_scales[" + str(static_cast<int64_t>(i)) + "] is " + number_text(s) +
            " (layer " + str(static_cast<int64_t>(i / per_layer)) + ", " +
            (in_layer < static_cast<size_t>(count) ? "K" : "V") +
            (count > 1 ? ", kv head " + str(static_cast<int64_t>(in_layer % count)) : "") +
            "); expected a finite value > 0");
  }
  return scales;
}

std::vector<float> head_scales(const pq_config& c, const std::vector<float>& given) {
  if (!dtype_is_fp8(c.dtype)) return {};
  const int32_t heads = c.num_kv_heads, count = c.kv_scale_count;
  std::vector<float> out(static_cast<size_t>(c.num_layers) * 2 * heads, 1.f);
  if (count == 0 || given.empty()) return out;  // (an internal caller without the copy)
  for (int64_t lk = 0; lk < int64_t{c.num_layers} * 2; ++lk)  // (layer, K or V) pairs
    for (int32_t h = 0; h < heads; ++h)
      out[static_cast<size_t>(lk * heads + h)] =
          given[static_cast<size_t>(lk * count + (count == 1 ? 0 : h))];
  return out;
}

}  // namespace pq
