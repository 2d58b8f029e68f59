// Every row's address in a few instructions, for loops over thousands of
// scattered rows (pq_decode_attend): chunk bases copied out once, so a row
// costs a shift, a mask and a multiply-add instead of a call. A tier whose
// rows are in host memory keeps one; one that reads rows elsewhere builds
// one over the rows it read (head_bytes 0: every head's rows in one run).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pq {

struct RowTable {
  static constexpr int64_t kChunkTokens = 256;
  static constexpr int kChunkShift = 8;
  static_assert(kChunkTokens == int64_t{1} << kChunkShift, "chunks hold a power of two tokens");

  std::vector<const uint8_t*> keys, values;  // chunk c's K and V blocks
  size_t row_bytes = 0;
  size_t head_bytes = 0;  // one head's rows in a chunk
  int32_t head_dim = 0;
  int32_t dtype = 0;
  const uint8_t* key_row(int32_t token, int32_t head) const {
    return keys[static_cast<size_t>(token) >> kChunkShift] + offset(token, head);
  }
  const uint8_t* value_row(int32_t token, int32_t head) const {
    return values[static_cast<size_t>(token) >> kChunkShift] + offset(token, head);
  }
  size_t offset(int32_t token, int32_t head) const {
    return static_cast<size_t>(head) * head_bytes +
           static_cast<size_t>(token & (kChunkTokens - 1)) * row_bytes;
  }
};

}  // namespace pq
