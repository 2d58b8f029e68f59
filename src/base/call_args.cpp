#include "base/call_args.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "base/tensor.h"

namespace pq {

SelectionCopy copy_selection(const pq_selection* caller, int32_t kv_heads) {
  if (caller == nullptr) invalid("selection is NULL");
  const pq_selection sel = *caller;
  if (sel.counts == nullptr) invalid("selection->counts is NULL");
  if (sel.capacity < 0) invalid("selection->capacity is " + str(sel.capacity));
  if (sel.positions == nullptr && sel.capacity > 0) invalid("selection->positions is NULL");
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(sel.capacity),
                             static_cast<uint64_t>(kv_heads) * sizeof(int32_t), &bytes) ||
      reinterpret_cast<uintptr_t>(sel.positions) > UINTPTR_MAX - bytes)
    invalid("selection->capacity is " + str(sel.capacity) + "; num_kv_heads x capacity "
            "positions from selection->positions overflow the address space");
  SelectionCopy copy;
  copy.counts.assign(sel.counts, sel.counts + kv_heads);
  for (int32_t h = 0; h < kv_heads; ++h) {
    const int32_t count = copy.counts[static_cast<size_t>(h)];
    if (count < 0 || count > sel.capacity)
      invalid("selection->counts[" + str(h) + "] is " + str(count) + "; expected 0.." +
              str(sel.capacity));
    copy.max_count = std::max<int64_t>(copy.max_count, count);
  }
  // At least one element: the view's positions are never NULL.
  copy.positions.resize(std::max<size_t>(1, static_cast<size_t>(kv_heads * copy.max_count)));
  for (int32_t h = 0; h < kv_heads; ++h)
    if (const int32_t count = copy.counts[static_cast<size_t>(h)]; count > 0)
      std::memcpy(copy.positions.data() + h * copy.max_count, sel.positions + h * sel.capacity,
                  static_cast<size_t>(count) * sizeof(int32_t));
  copy.view = pq_selection{copy.positions.data(), copy.counts.data(), copy.max_count};
  copy.caller_capacity = sel.capacity;
  return copy;
}

pq_tensor copy_descriptor(const pq_tensor* t, const char* name) {
  if (t == nullptr) invalid(std::string(name) + " is NULL");
  return *t;
}

void require_apart(const void* a, uint64_t a_bytes, const char* a_name, const void* b,
                   uint64_t b_bytes, const char* b_name) {
  const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  // Differences, not sums: a hostile pointer near the end of the address
  // space must not wrap.
  const bool b_later = b0 >= a0;
  const uint64_t gap = b_later ? b0 - a0 : a0 - b0;
  if (a_bytes == 0 || b_bytes == 0 || gap >= (b_later ? a_bytes : b_bytes)) return;
  const char* inner = b_later ? b_name : a_name;
  const char* outer = b_later ? a_name : b_name;
  invalid(std::string(inner) + " starts at byte " + str(static_cast<int64_t>(gap)) + " of the " +
          str(static_cast<int64_t>(b_later ? a_bytes : b_bytes)) + " bytes of " + outer +
          ": outputs of one call must not overlap (they would overwrite each other)");
}

// A pass that vectorises (the largest position as unsigned: a negative one
// is huge) runs before each attend or fetch over every selected row; the
// element-wise search for the message only once that finds one out of range.
void check_positions(const pq_selection* sel, int32_t kv_heads, int64_t n, int32_t layer) {
  const uint32_t limit = static_cast<uint32_t>(std::min<int64_t>(n, INT32_MAX));
  for (int32_t h = 0; h < kv_heads; ++h) {
    const int32_t* row = sel->positions + static_cast<int64_t>(h) * sel->capacity;
    uint32_t largest = 0;
    for (int32_t i = 0; i < sel->counts[h]; ++i)
      largest = std::max(largest, static_cast<uint32_t>(row[i]));
    if (sel->counts[h] == 0 || largest < limit) continue;
    for (int32_t i = 0; i < sel->counts[h]; ++i)
      if (row[i] < 0 || row[i] >= n)
        invalid("selection->positions[" + str(h) + " * capacity + " + str(i) + "] is " +
                str(row[i]) + "; layer " + str(layer) + " holds " + str(n) + " tokens");
  }
}

}  // namespace pq
