// Reading and writing saved sequence state (docs/state-format.md): CRC-32C,
// a little-endian writer of plain values and a bounds-checked reader whose
// every failure is PQ_ERR_CORRUPT naming what it was reading. The layers and
// selector states serialise themselves with these; the format's framing
// (header, sections, checksums) lives in sequence_state.cpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "base/error.h"

namespace pq {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the state format is little-endian and written as the host stores it");

// CRC-32C (Castagnoli, reflected, as iSCSI and ext4 use it): crc32c(b, n) of
// a whole buffer, or crc32c(b2, n2, crc32c(b1, n1)) over pieces.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// Appends plain values to a byte vector.
class ByteWriter {
 public:
  template <typename T>
  void put(T v) {
    static_assert(std::is_arithmetic<T>::value, "plain values only");
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof v);
    std::memcpy(bytes_.data() + at, &v, sizeof v);
  }
  void put_bytes(const void* data, size_t size) {
    const size_t at = bytes_.size();
    bytes_.resize(at + size);
    if (size > 0) std::memcpy(bytes_.data() + at, data, size);
  }
  // A count (uint64) followed by the elements.
  template <typename T>
  void put_vector(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    put_bytes(v.data(), v.size() * sizeof(T));
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// Reads plain values from [data, data + size); `what` names the section in
// messages. Reading past the end, or a count past what is left, throws
// PQ_ERR_CORRUPT.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, uint64_t size, std::string what)
      : data_(data), size_(size), what_(std::move(what)) {}

  template <typename T>
  T get(const char* field) {
    T v;
    std::memcpy(&v, take(sizeof v, field), sizeof v);
    return v;
  }
  const uint8_t* take(uint64_t size, const char* field) {
    if (size > size_ - at_)
      corrupt(std::string(field) + " needs " + std::to_string(size) + " bytes at offset " +
              std::to_string(at_) + " but only " + std::to_string(size_ - at_) + " are left");
    const uint8_t* p = data_ + at_;
    at_ += size;
    return p;
  }
  // A vector written by ByteWriter::put_vector, of at most max_count elements.
  template <typename T>
  std::vector<T> get_vector(const char* field, uint64_t max_count) {
    const uint64_t n = get<uint64_t>(field);
    if (n > max_count)
      corrupt(std::string(field) + " has " + std::to_string(n) + " elements; at most " +
              std::to_string(max_count) + " fit this sequence");
    std::vector<T> v(static_cast<size_t>(n));
    if (n > 0) std::memcpy(v.data(), take(n * sizeof(T), field), n * sizeof(T));
    return v;
  }
  uint64_t left() const { return size_ - at_; }
  // Every byte must have been read.
  void finish() const {
    if (at_ != size_)
      corrupt(std::to_string(size_ - at_) + " bytes are left over after the last field");
  }
  [[noreturn]] void corrupt(const std::string& why) const {
    fail(PQ_ERR_CORRUPT, what_ + ": " + why);
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t at_ = 0;
  std::string what_;
};

}  // namespace pq
