#include "format/sequence_state.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/dtype.h"
#include "base/error.h"

namespace pq {

namespace state {
const char* section_name(uint32_t type) {
  switch (type) {
    case kLayerMeta: return "layer";
    case kKeysValues: return "keys and values";
    case kIndex: return "index";
    case kSelector: return "selector state";
    case kKvScales: return "fp8 scales";
    case kEnd: return "end";
  }
  return "unknown";
}
}  // namespace state

namespace {

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
              "header layout: geometry, key_rotary, the header CRC");

[[noreturn]] void corrupt(const std::string& why) {
  fail(PQ_ERR_CORRUPT, "the saved state is not intact: " + why + "; nothing was restored");
}

// An fp8 state's first section holds the scales its K/V bytes were stored
// with: they must be the context's, or its keys and values would read as
// other numbers (PQ_ERR_INCOMPATIBLE, as the header's geometry).
void check_scales(const Frame& f, bool first, const pq_config& c, const std::vector<float>& mine) {
  const bool fp8 = dtype_is_fp8(c.dtype);
  if (f.type != state::kKvScales) {
    if (first && fp8)
      corrupt(f.name + " comes first; a state of dtype " + std::string(dtype_name(c.dtype)) +
              " starts with its fp8 scales section");
    return;
  }
  if (!fp8) corrupt(f.name + " is in a state of dtype " + dtype_name(c.dtype) + ", which has no scales");
  if (f.payload.size != mine.size() * sizeof(float))
    corrupt(f.name + " holds " + str(static_cast<int64_t>(f.payload.size)) + " bytes; " +
            str(static_cast<int64_t>(mine.size() * sizeof(float))) +
            " expected (num_layers x 2 x num_kv_heads floats)");
  const int64_t heads = c.num_kv_heads;
  for (size_t i = 0; i < mine.size(); ++i) {
    float saved;
    std::memcpy(&saved, f.payload.data + i * sizeof(float), sizeof saved);
    if (saved == mine[i]) continue;
    const int64_t at = static_cast<int64_t>(i);
    fail(PQ_ERR_INCOMPATIBLE,
         "the saved state has kv scale " + number_text(saved) + " for layer " +
             str(at / (2 * heads)) + ", " + (at / heads % 2 == 0 ? "K" : "V") + ", kv head " +
             str(at % heads) + "; this context has " + number_text(mine[i]) +
             " (config.kv_scales); nothing was restored");
  }
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
  // Bytes 48-51: key_rotary (0.7; the word was reserved as 0 before, which
  // is PQ_ROTARY_NONE, what those libraries did).
  std::memcpy(h + at, &c.key_rotary, 4);
  at += 4;
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
  if (write_ != nullptr) crc_ = crc32c(data, size, crc_);  // a count needs no checksum
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

void check_header(const uint8_t* data, uint64_t size, const pq_config& c) {
  if (size < 8 || std::memcmp(data, state::kMagic, 8) != 0)
    corrupt("it does not start with the magic bytes \"PQCSTATE\" (" +
            str(static_cast<int64_t>(size)) + " bytes given)");
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
  int32_t key_rotary;
  std::memcpy(&key_rotary, data + state::kHeaderBytes - 8, 4);
  if (key_rotary < PQ_ROTARY_NONE || key_rotary > PQ_ROTARY_INTERLEAVED)
    corrupt("the header's key_rotary (bytes 48-51) is " + str(key_rotary) +
            "; expected 0, 1 or 2");
  if (key_rotary != c.key_rotary)
    fail(PQ_ERR_INCOMPATIBLE, "the saved state has key_rotary " + str(key_rotary) +
                                  " (its codes group the dimensions so); this context has " +
                                  str(c.key_rotary) + "; nothing was restored");
  size_t at = kGeometryOffset;
  for (const GeometryField& g : kGeometry) {
    int32_t v;
    std::memcpy(&v, data + at, 4);
    at += 4;
    if (v == c.*g.field) continue;
    // dtype by name ("f16"), the other geometry fields are counts.
    const bool is_dtype = g.field == &pq_config::dtype;
    fail(PQ_ERR_INCOMPATIBLE, "the saved state has " + std::string(g.name) + " " +
                                  (is_dtype ? dtype_text(v) : str(v)) + "; this context has " +
                                  (is_dtype ? dtype_text(c.*g.field) : str(c.*g.field)) +
                                  "; nothing was restored");
  }
}

bool read_frame(const uint8_t* data, uint64_t size, uint64_t offset, Frame* out,
                uint64_t* needed) {
  if (size < state::kSectionHeaderBytes) {
    *needed = state::kSectionHeaderBytes;
    return false;
  }
  uint64_t bytes;
  std::memcpy(&out->type, data, 4);
  std::memcpy(&out->layer, data + 4, 4);
  std::memcpy(&bytes, data + 8, 8);
  const std::string name = std::string("the ") + state::section_name(out->type) +
                           " section at byte " + str(static_cast<int64_t>(offset));
  const uint64_t most = (uint64_t{1} << 62);  // no section is longer; keeps the sum below in range
  if (bytes > most)
    corrupt(name + " announces " + str(static_cast<int64_t>(bytes)) + " bytes");
  const uint64_t frame = state::kSectionHeaderBytes + bytes + state::kSectionTrailerBytes;
  if (size < frame) {
    *needed = frame;
    return false;
  }
  uint32_t crc;
  std::memcpy(&crc, data + state::kSectionHeaderBytes + bytes, 4);
  if (crc32c(data, state::kSectionHeaderBytes + bytes) != crc)
    corrupt("the checksum of " + name + " (layer " + str(out->layer) + ") does not match");
  out->payload = SectionView{data + state::kSectionHeaderBytes, bytes};
  out->bytes = frame;
  out->name = name;
  return true;
}

void SectionOrder::accept(const Frame& f, std::vector<LayerImage>& images) {
  const int32_t layers = static_cast<int32_t>(images.size());
  const bool describing = kv_next_ == 0;  // still in the layers' descriptions
  const bool same_layer = describing && f.layer == current_ && current_ >= 0;
  const std::string& name = f.name;
  switch (f.type) {
    case state::kLayerMeta:
      if (!describing || f.layer != current_ + 1 || f.layer >= layers)
        corrupt(name + " is for layer " + str(f.layer) + " where " +
                (describing ? "layer " + str(current_ + 1) + "'s" : "no layer section") +
                " was expected");
      current_ = f.layer;
      images[static_cast<size_t>(f.layer)].meta = f.payload;
      break;
    case state::kIndex:
      if (!same_layer || last_ != state::kLayerMeta)
        corrupt(name + " (layer " + str(f.layer) + ") is out of place");
      images[static_cast<size_t>(f.layer)].index = f.payload;
      break;
    case state::kSelector:
      if (!same_layer || (last_ != state::kLayerMeta && last_ != state::kIndex))
        corrupt(name + " (layer " + str(f.layer) + ") is out of place");
      images[static_cast<size_t>(f.layer)].selector = f.payload;
      break;
    case state::kKvScales:
      if (sections_ != 0 || f.layer != -1)
        corrupt(name + " (layer " + str(f.layer) + ") is out of place; it comes first, for "
                "layer -1");
      break;
    case state::kKeysValues:
      if (current_ != layers - 1 || f.layer != kv_next_)
        corrupt(name + " is for layer " + str(f.layer) + " where " +
                (current_ != layers - 1 ? "layer " + str(current_ + 1) + "'s layer section"
                                        : "the keys and values of layer " + str(kv_next_)) +
                " was expected");
      images[static_cast<size_t>(f.layer)].keys_values = f.payload;
      ++kv_next_;
      break;
    case state::kEnd: {
      if (f.layer != -1)
        corrupt(name + " is for layer " + str(f.layer) + "; the end section belongs to no "
                "layer (-1)");
      if (kv_next_ != layers)
        corrupt(name + " comes before every layer was complete (the keys and values of " +
                str(kv_next_) + " of " + str(layers) + " layers were read)");
      uint64_t counted = 0;
      if (f.payload.size == 8) std::memcpy(&counted, f.payload.data, 8);
      if (f.payload.size != 8 || counted != sections_)
        corrupt(name + " counts " + str(static_cast<int64_t>(counted)) + " sections; " +
                str(static_cast<int64_t>(sections_)) + " were read");
      done_ = true;
      return;
    }
    default:
      corrupt(name + " has the unknown type " + str(f.type));
  }
  last_ = f.type;
  ++sections_;
}

void SectionOrder::require_described(int32_t layers, uint64_t offset) const {
  if (current_ != layers - 1 || last_ == 0)
    corrupt("the keys and values at byte " + str(static_cast<int64_t>(offset)) +
            " come before every layer was described (layer " + str(current_ + 1) + " of " +
            str(layers) + " is missing)");
}

std::vector<LayerImage> parse_state(const uint8_t* data, uint64_t size, const pq_config& c,
                                    const std::vector<float>& kv_scales) {
  check_header(data, size, c);
  std::vector<LayerImage> layers(static_cast<size_t>(c.num_layers));
  SectionOrder order;
  uint64_t pos = state::kHeaderBytes;
  while (!order.done()) {
    Frame f;
    uint64_t needed = 0;
    if (!read_frame(data + pos, size - pos, pos, &f, &needed))
      corrupt("it is truncated at byte " + str(static_cast<int64_t>(size)) + ": the section at byte " +
              str(static_cast<int64_t>(pos)) + " needs " + str(static_cast<int64_t>(needed)) +
              " bytes, " + str(static_cast<int64_t>(size - pos)) + " are left");
    order.accept(f, layers);
    check_scales(f, pos == state::kHeaderBytes, c, kv_scales);
    pos += f.bytes;
  }
  if (pos != size) corrupt(str(static_cast<int64_t>(size - pos)) + " bytes follow the end section");
  return layers;
}

uint64_t parse_description(const uint8_t* data, uint64_t size, const pq_config& c,
                           const std::vector<float>& kv_scales,
                           SectionOrder& order, std::vector<LayerImage>& layers) {
  // No bytes yet (data may then be NULL: no memcmp of it), a beginning of
  // the magic, or a magic without the rest of the header.
  if (size < state::kHeaderBytes &&
      (size == 0 || std::memcmp(data, state::kMagic, std::min<uint64_t>(size, 8)) == 0))
    throw NeedMore{state::kHeaderBytes};
  check_header(data, size, c);
  layers.assign(static_cast<size_t>(c.num_layers), LayerImage{});
  uint64_t pos = state::kHeaderBytes;
  for (;;) {
    Frame f;
    uint64_t needed = 0;
    if (size - pos < state::kSectionHeaderBytes) throw NeedMore{pos + state::kSectionHeaderBytes};
    uint32_t type;
    std::memcpy(&type, data + pos, 4);
    if (type == state::kKeysValues) {
      order.require_described(c.num_layers, pos);
      return pos;
    }
    if (!read_frame(data + pos, size - pos, pos, &f, &needed)) throw NeedMore{pos + needed};
    order.accept(f, layers);
    check_scales(f, pos == state::kHeaderBytes, c, kv_scales);
    if (order.done()) corrupt(f.name + " comes before any keys and values");
    pos += f.bytes;
  }
}

}  // namespace pq
