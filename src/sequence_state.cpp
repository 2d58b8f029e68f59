#include "sequence_state.h"

#include <cstring>
#include <string>

#include "error.h"

namespace pq {

namespace state {
const char* section_name(uint32_t type) {
  switch (type) {
    case kLayerMeta: return "layer";
    case kKeysValues: return "keys and values";
    case kIndex: return "index";
    case kSelector: return "selector state";
    case kEnd: return "end";
  }
  return "unknown";
}
}  // namespace state

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// The header's geometry fields, in file order, with the config field each
// must equal.
struct GeometryField {
  const char* name;
  int32_t pq_config::*field;
};
constexpr GeometryField kGeometry[] = {
    {"num_layers", &pq_config::num_layers},   {"num_kv_heads", &pq_config::num_kv_heads},
    {"head_dim", &pq_config::head_dim},       {"dtype", &pq_config::dtype},
    {"pq_subspaces", &pq_config::pq_subspaces}, {"pq_bits", &pq_config::pq_bits},
    {"selector", &pq_config::selector},
};
constexpr size_t kGeometryOffset = 20;
static_assert(kGeometryOffset + sizeof kGeometry / sizeof kGeometry[0] * 4 + 8 ==
                  state::kHeaderBytes,
              "header layout: geometry, a reserved word, the header CRC");

[[noreturn]] void corrupt(const std::string& why) {
  fail(PQ_ERR_CORRUPT, "the saved state is not intact: " + why + "; nothing was restored");
}

}  // namespace

// ---------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------

void StateWriter::emit(const void* data, size_t size) {
  if (size == 0) return;
  if (write_ != nullptr && write_(user_, data, size) != 0)
    fail(PQ_ERR_BACKEND, "the write callback returned non-zero after " + str(written_) +
                             " bytes; the save stopped there");
  written_ += size;
}

void StateWriter::header(const pq_config& c) {
  uint8_t h[state::kHeaderBytes] = {};
  std::memcpy(h, state::kMagic, 8);
  const uint32_t words[3] = {state::kFormatVersion, state::kHeaderBytes, PQ_VERSION_NUMBER};
  std::memcpy(h + 8, words, sizeof words);
  size_t at = kGeometryOffset;
  for (const GeometryField& g : kGeometry) {
    std::memcpy(h + at, &(c.*g.field), 4);
    at += 4;
  }
  at += 4;  // reserved, 0
  const uint32_t crc = crc32c(h, at);
  std::memcpy(h + at, &crc, 4);
  emit(h, sizeof h);
}

void StateWriter::begin(uint32_t type, int32_t layer, uint64_t payload_bytes) {
  uint8_t h[state::kSectionHeaderBytes];
  std::memcpy(h, &type, 4);
  std::memcpy(h + 4, &layer, 4);
  std::memcpy(h + 8, &payload_bytes, 8);
  crc_ = crc32c(h, sizeof h);
  emit(h, sizeof h);
  left_ = payload_bytes;
  open_ = true;
}

void StateWriter::payload(const void* data, size_t size) {
  if (!open_ || size > left_)
    fail(PQ_ERR_INTERNAL, "a state section got more payload than its header announced");
  crc_ = crc32c(data, size, crc_);
  emit(data, size);
  left_ -= size;
}

void StateWriter::end_section() {
  if (!open_ || left_ != 0)
    fail(PQ_ERR_INTERNAL, "a state section got less payload than its header announced");
  emit(&crc_, 4);
  open_ = false;
  ++sections_;
}

uint64_t StateWriter::finish() {
  const uint64_t sections = sections_;
  begin(state::kEnd, -1, 8);
  payload(&sections, 8);
  end_section();
  return written_;
}

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

std::vector<LayerImage> parse_state(const uint8_t* data, uint64_t size, const pq_config& c) {
  if (size < 8 || std::memcmp(data, state::kMagic, 8) != 0)
    corrupt("it does not start with the magic bytes \"PQCSTATE\" (" + str(static_cast<int64_t>(size)) +
            " bytes given)");
  if (size < state::kHeaderBytes)
    corrupt("it is truncated inside the header: " + str(static_cast<int64_t>(size)) + " of " +
            str(state::kHeaderBytes) + " bytes");
  uint32_t words[3];
  std::memcpy(words, data + 8, sizeof words);
  if (words[0] != state::kFormatVersion)
    fail(PQ_ERR_INCOMPATIBLE, "the saved state has format version " + str(words[0]) +
                                  " (written by libpqcache " + str(words[2]) +
                                  "); this library reads version " + str(state::kFormatVersion) +
                                  "; nothing was restored");
  if (words[1] != state::kHeaderBytes)
    corrupt("the header says it has " + str(words[1]) + " bytes; version 1 headers have " +
            str(state::kHeaderBytes));
  uint32_t header_crc;
  std::memcpy(&header_crc, data + state::kHeaderBytes - 4, 4);
  if (crc32c(data, state::kHeaderBytes - 4) != header_crc)
    corrupt("the header's checksum does not match");
  size_t at = kGeometryOffset;
  for (const GeometryField& g : kGeometry) {
    int32_t v;
    std::memcpy(&v, data + at, 4);
    at += 4;
    if (v != c.*g.field)
      fail(PQ_ERR_INCOMPATIBLE, "the saved state has " + std::string(g.name) + " " + str(v) +
                                    "; this context has " + str(c.*g.field) +
                                    "; nothing was restored");
  }

  std::vector<LayerImage> layers(static_cast<size_t>(c.num_layers));
  uint64_t pos = state::kHeaderBytes;
  int32_t current = -1;  // the last layer whose layer section was read
  int32_t kv_next = 0;   // the layer whose keys and values come next
  uint32_t last = 0;     // the type of the section before
  uint64_t sections = 0;
  for (;;) {
    const std::string where = "at byte " + str(static_cast<int64_t>(pos));
    if (size - pos < state::kSectionHeaderBytes)
      corrupt("it is truncated " + where + ": a section header needs " +
              str(state::kSectionHeaderBytes) + " bytes, " + str(static_cast<int64_t>(size - pos)) +
              " are left");
    uint32_t type;
    int32_t layer;
    uint64_t bytes;
    std::memcpy(&type, data + pos, 4);
    std::memcpy(&layer, data + pos + 4, 4);
    std::memcpy(&bytes, data + pos + 8, 8);
    const std::string name = std::string("the ") + state::section_name(type) + " section " + where;
    const uint64_t room = size - pos - state::kSectionHeaderBytes;
    if (room < state::kSectionTrailerBytes || bytes > room - state::kSectionTrailerBytes)
      corrupt("it is truncated in " + name + ": it announces " + str(static_cast<int64_t>(bytes)) +
              " bytes, " + str(static_cast<int64_t>(room)) + " are left with its checksum");
    const uint8_t* payload = data + pos + state::kSectionHeaderBytes;
    uint32_t crc;
    std::memcpy(&crc, payload + bytes, 4);
    if (crc32c(data + pos, state::kSectionHeaderBytes + bytes) != crc)
      corrupt("the checksum of " + name + " (layer " + str(layer) + ") does not match");
    pos += state::kSectionHeaderBytes + bytes + state::kSectionTrailerBytes;

    const SectionView view{payload, bytes};
    const bool describing = kv_next == 0;  // still in the layers' descriptions
    const bool same_layer = describing && layer == current && current >= 0;
    switch (type) {
      case state::kLayerMeta:
        if (!describing || layer != current + 1 || layer >= c.num_layers)
          corrupt(name + " is for layer " + str(layer) + " where " +
                  (describing ? "layer " + str(current + 1) + "'s" : "no layer section") +
                  " was expected");
        current = layer;
        layers[static_cast<size_t>(layer)].meta = view;
        break;
      case state::kIndex:
        if (!same_layer || last != state::kLayerMeta)
          corrupt(name + " (layer " + str(layer) + ") is out of place");
        layers[static_cast<size_t>(layer)].index = view;
        break;
      case state::kSelector:
        if (!same_layer || (last != state::kLayerMeta && last != state::kIndex))
          corrupt(name + " (layer " + str(layer) + ") is out of place");
        layers[static_cast<size_t>(layer)].selector = view;
        break;
      case state::kKeysValues:
        if (current != c.num_layers - 1 || layer != kv_next)
          corrupt(name + " is for layer " + str(layer) + " where " +
                  (current != c.num_layers - 1
                       ? "layer " + str(current + 1) + "'s layer section"
                       : "the keys and values of layer " + str(kv_next)) +
                  " was expected");
        layers[static_cast<size_t>(layer)].keys_values = view;
        ++kv_next;
        break;
      case state::kEnd: {
        if (kv_next != c.num_layers)
          corrupt(name + " comes before every layer was complete (the keys and values of " +
                  str(kv_next) + " of " + str(c.num_layers) + " layers were read)");
        uint64_t counted = 0;
        if (bytes == 8) std::memcpy(&counted, payload, 8);
        if (bytes != 8 || counted != sections)
          corrupt(name + " counts " + str(static_cast<int64_t>(counted)) + " sections; " +
                  str(static_cast<int64_t>(sections)) + " were read");
        if (pos != size)
          corrupt(str(static_cast<int64_t>(size - pos)) + " bytes follow the end section");
        return layers;
      }
      default:
        corrupt(name + " has the unknown type " + str(type));
    }
    last = type;
    ++sections;
  }
}

}  // namespace pq
