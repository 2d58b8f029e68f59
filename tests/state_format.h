// The saved-state format as docs/state-format.md describes it, read
// independently of the library: a bitwise CRC-32C and the walk over the
// sections. Shared by the state tests and the fuzz harness.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace pqt_state {

inline uint32_t reference_crc32c(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

struct SectionAt {
  size_t offset;  // of the section header
  uint32_t type;
  int32_t layer;
  uint64_t payload;
};

// The sections after the 56-byte header, up to the first one that does not
// fit in the bytes.
inline std::vector<SectionAt> walk(const std::vector<uint8_t>& b) {
  std::vector<SectionAt> out;
  size_t at = 56;
  while (at + 16 <= b.size()) {
    SectionAt s{at, 0, 0, 0};
    std::memcpy(&s.type, &b[at], 4);
    std::memcpy(&s.layer, &b[at + 4], 4);
    std::memcpy(&s.payload, &b[at + 8], 8);
    if (s.payload > b.size() - at - 16) break;
    out.push_back(s);
    at += 16 + s.payload + 4;
  }
  return out;
}

// Recomputes a section's CRC (after its header or payload changed).
inline void reseal(std::vector<uint8_t>& b, const SectionAt& s) {
  const uint32_t crc = reference_crc32c(&b[s.offset], 16 + s.payload);
  std::memcpy(&b[s.offset + 16 + s.payload], &crc, 4);
}

// Recomputes the header's CRC.
inline void reseal_header(std::vector<uint8_t>& b) {
  const uint32_t crc = reference_crc32c(b.data(), 52);
  std::memcpy(&b[52], &crc, 4);
}

}  // namespace pqt_state
