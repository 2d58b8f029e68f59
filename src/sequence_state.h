// The framing of saved sequence state (docs/state-format.md): a fixed
// header with the geometry, then checksummed sections, then an end
// section. StateWriter frames what the layers write through a pq_write_fn;
// parse_state checks a whole buffer (every checksum, every section's place
// and size) before anything is loaded, and hands each layer its sections.
#pragma once

#include <cstdint>
#include <vector>

#include "pqcache.h"
#include "state_io.h"

namespace pq {

namespace state {
constexpr char kMagic[8] = {'P', 'Q', 'C', 'S', 'T', 'A', 'T', 'E'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kHeaderBytes = 56;
constexpr uint64_t kSectionHeaderBytes = 16;  // type, layer, payload bytes
constexpr uint64_t kSectionTrailerBytes = 4;  // CRC-32C of header and payload

enum Section : uint32_t {
  kLayerMeta = 1,  // tokens, prefill tokens, what follows, build facts
  kKeysValues = 2, // keys then values, [kv head][token][head_dim] each
  kIndex = 3,      // centroids and codes
  kSelector = 4,   // the selector's own state
  kEnd = 0xFFFFFFFFu,
};
const char* section_name(uint32_t type);
}  // namespace state

// Frames sections onto a pq_write_fn, counting and checksumming as it goes.
class StateWriter {
 public:
  // write may be null: then only the size is counted (pq_sequence_state_size).
  StateWriter(pq_write_fn write, void* user) : write_(write), user_(user) {}

  void header(const pq_config& c);
  // A section of exactly payload_bytes bytes, written by payload() calls.
  void begin(uint32_t type, int32_t layer, uint64_t payload_bytes);
  void payload(const void* data, size_t size);
  void end_section();
  void section(uint32_t type, int32_t layer, const std::vector<uint8_t>& bytes) {
    begin(type, layer, bytes.size());
    payload(bytes.data(), bytes.size());
    end_section();
  }
  // The end section; returns the bytes written in all.
  uint64_t finish();

 private:
  void emit(const void* data, size_t size);
  pq_write_fn write_;
  void* user_;
  uint64_t written_ = 0;
  uint64_t sections_ = 0;
  uint32_t crc_ = 0;
  uint64_t left_ = 0;  // payload bytes the open section still expects
  bool open_ = false;
};

// One section's payload inside the caller's buffer.
struct SectionView {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  bool present() const { return data != nullptr; }
};

// The sections of one layer.
struct LayerImage {
  SectionView meta, keys_values, index, selector;
};

// Checks the header against the context's configuration and every section
// (framing, order, checksums) of a saved state. Throws PQ_ERR_CORRUPT or
// PQ_ERR_INCOMPATIBLE naming the check; returns one image per layer.
std::vector<LayerImage> parse_state(const uint8_t* data, uint64_t size, const pq_config& c);

}  // namespace pq
