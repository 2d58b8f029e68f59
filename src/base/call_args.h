// Checks of a call's arguments that several calls share: the caller's
// selection read once, a descriptor read once, byte ranges kept apart.
#pragma once

#include <cstdint>
#include <vector>

#include "pqcache.h"

namespace pq {

// A caller's selection read once into the library's memory, after checking
// its pointers, capacity and counts (positions may be NULL only when
// capacity is 0). Every later check and read uses the copy, so outputs of
// the same call (or of another item of a batch) written over the caller's
// arrays, or a caller thread rewriting them, cannot change what was
// checked. `view` points into the copy, rows of capacity max_count.
struct SelectionCopy {
  std::vector<int32_t> counts;
  std::vector<int32_t> positions;
  pq_selection view{};
  int64_t max_count = 0;
  int64_t caller_capacity = 0;  // the caller's rows, for arrays laid out like its positions
};
SelectionCopy copy_selection(const pq_selection* sel, int32_t kv_heads);

// *t, read once (the call then checks and uses the copy); `name` names a
// NULL pointer.
pq_tensor copy_descriptor(const pq_tensor* t, const char* name);

// PQ_ERR_INVALID_ARGUMENT when the byte ranges [a, a + a_bytes) and
// [b, b + b_bytes) meet: two outputs of one call, which would overwrite
// each other.
void require_apart(const void* a, uint64_t a_bytes, const char* a_name, const void* b,
                   uint64_t b_bytes, const char* b_name);

// Checks every selected position against a layer of n tokens.
void check_positions(const pq_selection* sel, int32_t kv_heads, int64_t n, int32_t layer);

}  // namespace pq
