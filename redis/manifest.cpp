// The manifest of a stored state (docs/redis.md, "Manifest"): little-endian,
//   0  char[4] magic "PQRM"
//   4  u32     format version (1)
//   8  u32     pq_version_number() of the writer (informative)
//  12  u32     reserved, 0
//  16  u64     state bytes
//  24  u64     block bytes
//  32  u64     block count = ceil(state bytes / block bytes)
//  40  u32[n]  CRC-32C of each block
//  40+4n u32   CRC-32C of bytes [0, 40+4n)
#include <cstdio>
#include <cstring>

#include "internal.h"
#include "pqcache_redis.h"
#include "format/state_io.h"  // pq::crc32c

namespace pqr {

namespace {

constexpr char kMagic[4] = {'P', 'Q', 'R', 'M'};
constexpr size_t kHeader = 40;

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <typename T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

uint32_t block_crc(const void* data, size_t size) { return pq::crc32c(data, size); }

std::string hex32(uint32_t v) {
  char buf[11];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string encode_manifest(const Manifest& m) {
  std::string out;
  out.reserve(kHeader + 4 * m.crcs.size() + 4);
  out.append(kMagic, sizeof kMagic);
  put<uint32_t>(out, PQ_REDIS_MANIFEST_VERSION);
  put<uint32_t>(out, static_cast<uint32_t>(pq_version_number()));
  put<uint32_t>(out, 0);
  put<uint64_t>(out, m.state_bytes);
  put<uint64_t>(out, m.block_bytes);
  put<uint64_t>(out, m.block_count);
  for (uint32_t crc : m.crcs) put<uint32_t>(out, crc);
  put<uint32_t>(out, pq::crc32c(out.data(), out.size()));
  return out;
}

Manifest parse_manifest(const char* data, size_t size, const std::string& name) {
  auto corrupt = [&](const std::string& why) { fail(PQ_ERR_CORRUPT, name + ": " + why); };
  if (size < 8 || std::memcmp(data, kMagic, sizeof kMagic) != 0)
    corrupt("not a pqcache manifest (bad magic or " + std::to_string(size) + " bytes)");
  Manifest m;
  m.version = get<uint32_t>(data + 4);
  if (m.version != PQ_REDIS_MANIFEST_VERSION)
    fail(PQ_ERR_INCOMPATIBLE, name + ": manifest format version " + std::to_string(m.version) +
                                  "; this library reads version " +
                                  std::to_string(PQ_REDIS_MANIFEST_VERSION));
  if (size < kHeader + 4) corrupt(std::to_string(size) + " bytes is shorter than the header");
  m.writer_version = get<uint32_t>(data + 8);
  m.state_bytes = get<uint64_t>(data + 16);
  m.block_bytes = get<uint64_t>(data + 24);
  m.block_count = get<uint64_t>(data + 32);
  if (m.block_count > (size - kHeader - 4) / 4 || size != kHeader + 4 * m.block_count + 4)
    corrupt(std::to_string(size) + " bytes do not hold the " + std::to_string(m.block_count) +
            " block checksums the header announces");
  const uint32_t stored = get<uint32_t>(data + size - 4);
  const uint32_t actual = pq::crc32c(data, size - 4);
  if (stored != actual)
    corrupt("CRC-32C " + hex32(actual) + " does not match the stored " + hex32(stored));
  if (m.block_bytes == 0 || m.block_bytes > PQ_REDIS_MAX_BLOCK_BYTES)
    corrupt("block size " + std::to_string(m.block_bytes) + " is out of range");
  const uint64_t need = m.state_bytes / m.block_bytes + (m.state_bytes % m.block_bytes != 0);
  if (m.block_count != need)
    corrupt(std::to_string(m.block_count) + " blocks of " + std::to_string(m.block_bytes) +
            " bytes cannot hold " + std::to_string(m.state_bytes) + " bytes");
  m.crcs.resize(static_cast<size_t>(m.block_count));
  if (m.block_count > 0) std::memcpy(m.crcs.data(), data + kHeader, 4 * m.block_count);
  return m;
}

}  // namespace pqr
