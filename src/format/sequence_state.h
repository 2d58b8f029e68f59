// The framing of saved sequence state (docs/state-format.md): a fixed
// header with the geometry, then checksummed sections, then an end
// section. StateWriter frames what the layers write through a pq_write_fn;
// parse_state checks a whole buffer (every checksum, every section's place
// and size) before anything is loaded, and hands each layer its sections.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pqcache.h"
#include "format/state_io.h"

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
  kKvScales = 5,   // fp8 states only, first: the scales per (layer, K or V, kv head)
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

// Checks the header against the context's configuration: PQ_ERR_CORRUPT or
// PQ_ERR_INCOMPATIBLE naming the check.
void check_header(const uint8_t* data, uint64_t size, const pq_config& c);


// One framed section.
struct Frame {
  uint32_t type = 0;
  int32_t layer = 0;
  SectionView payload;
  uint64_t bytes = 0;  // the whole frame: header, payload, CRC
  std::string name;    // "the index section at byte N", for messages
};

// Reads the frame at the start of [data, data + size); `offset` places it
// in messages. False, with *needed the bytes it needs, when size is short
// of it; PQ_ERR_CORRUPT when its checksum does not match.
bool read_frame(const uint8_t* data, uint64_t size, uint64_t offset, Frame* out,
                uint64_t* needed);

// The order of the sections (docs/state-format.md), fed one frame at a time.
class SectionOrder {
 public:
  // Checks that `f` may come next (PQ_ERR_CORRUPT naming why) and records
  // its payload into images (one per layer).
  void accept(const Frame& f, std::vector<LayerImage>& images);
  // PQ_ERR_CORRUPT unless every layer of `layers` was described.
  void require_described(int32_t layers, uint64_t offset) const;
  bool done() const { return done_; }  // the end section was accepted
  int32_t next_kv_layer() const { return kv_next_; }

 private:
  int32_t current_ = -1;  // the last layer whose layer section was read
  int32_t kv_next_ = 0;   // the layer whose keys and values come next
  uint32_t last_ = 0;     // the type of the section before
  uint64_t sections_ = 0;
  bool done_ = false;
};

// Checks a whole saved state (every checksum, every section's place and
// size) and returns one image per layer.
// kv_scales: the context's fp8 scales per (layer, K or V, kv head), empty
// unless its dtype is fp8; an fp8 state's scales section must hold them
// (PQ_ERR_INCOMPATIBLE naming the first that differs).
std::vector<LayerImage> parse_state(const uint8_t* data, uint64_t size, const pq_config& c,
                                    const std::vector<float>& kv_scales);

// Thrown by parse_description when the bytes end before it could finish:
// `needed` bytes from the start of the state are needed.
struct NeedMore {
  uint64_t needed;
};

// Checks the header and every layer's description (layer, index and
// selector state sections), recording them into `layers`; returns the
// offset of the first keys-and-values section. Throws NeedMore when `size`
// is short of it.
uint64_t parse_description(const uint8_t* data, uint64_t size, const pq_config& c,
                           const std::vector<float>& kv_scales,
                           SectionOrder& order, std::vector<LayerImage>& layers);

}  // namespace pq
