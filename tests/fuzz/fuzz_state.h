// The fuzz harness's part of the saved-state format (docs/state-format.md):
// numbers of a saved state changed under valid checksums, and what a
// restored sequence may report of its builds afterwards. Included by
// fuzz_api.cpp only.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../state_format.h"
#include "pqcache.h"

namespace {

// Writes an extreme value over a number of a saved state under a valid
// checksum: in the header's key_rotary word, or in the first 40 payload
// bytes of a layer, index or end section (docs/state-format.md), where
// the build facts and counts are. Returns false when it found no place.
bool reseal_a_number(FuzzedDataProvider& in, std::vector<uint8_t>& b) {
  if (b.size() < 56) return false;
  std::vector<pqt_state::SectionAt> sections;  // the small ones: layer, index, end
  for (const pqt_state::SectionAt& at : pqt_state::walk(b))
    if (at.type == 1 || at.type == 3 || at.type == 0xFFFFFFFFu) sections.push_back(at);
  const int64_t as_int[] = {-1, -5, INT32_MIN, INT32_MAX, 100001, INT64_MIN, INT64_MAX};
  const double as_real[] = {NAN, INFINITY, -INFINITY, -1e300, 1e308, -1.0};
  const int kind = in.ConsumeIntegralInRange(0, 3);
  unsigned char value[8];
  size_t width = 8;
  if (kind == 0) {
    std::memcpy(value, &as_real[in.ConsumeIntegralInRange<size_t>(0, 5)], 8);
  } else {
    const int64_t v = as_int[in.ConsumeIntegralInRange<size_t>(0, 6)];
    width = kind == 1 ? 4 : 8;
    const int32_t v32 = static_cast<int32_t>(v);
    if (width == 4) std::memcpy(value, &v32, 4); else std::memcpy(value, &v, 8);
  }
  if (sections.empty() || in.ConsumeIntegralInRange(0, 7) == 0) {  // the key_rotary word
    std::memcpy(&b[48], value, 4);
    pqt_state::reseal_header(b);
    return true;
  }
  const pqt_state::SectionAt& s = sections[in.ConsumeIntegralInRange<size_t>(0, sections.size() - 1)];
  // The layer field (byte 4) or a number of the payload.
  const size_t span = std::min<uint64_t>(s.payload, 40);
  if (span < width || in.ConsumeIntegralInRange(0, 7) == 0)
    std::memcpy(&b[s.offset + 4], value, 4);
  else
    std::memcpy(&b[s.offset + 16 + in.ConsumeIntegralInRange<size_t>(0, span - width)], value, width);
  pqt_state::reseal(b, s);
  return true;
}

// The build facts pq_layer_info_get reports for (seq, layer), if it has
// them, are ones a build can produce.
bool build_facts_possible(pq_context* ctx, uint64_t seq, int32_t layer) {
  pq_layer_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  if (pq_layer_info_get(ctx, seq, layer, &info) != PQ_OK) return true;
  return info.kmeans_budget >= 0 && info.kmeans_budget <= 100000 &&
         info.kmeans_iterations >= 0 && info.kmeans_iterations <= info.kmeans_budget &&
         info.build_seconds >= 0.0 && std::isfinite(info.build_seconds) &&
         info.prefill_tokens >= 0 && info.prefill_tokens <= info.tokens &&
         info.coded_tokens <= info.tokens;
}

}  // namespace
