// The inside of libpqcache_redis shared by its files: the errors, the
// manifest that lists a stored state's blocks (docs/redis.md) and the CRC-32C.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "pqcache.h"

namespace pqr {

// Errors are the library's own pq::Error and pq::fail (src/base/error.h), and
// pq::guarded at the C API; src/base/error.cpp is compiled into this library too,
// so its thread-local message is this library's (pq_redis_last_error).
using pq::Error;
using pq::fail;

// A library call failed: its status passes through, its message is kept.
[[noreturn]] inline void library_failed(pq_status status, const char* call,
                                        const std::string& key) {
  const char* msg = pq_last_error();
  fail(status, call + std::string(" (key \"") + key + "\"): " + (msg ? msg : ""));
}

// "<key>:manifest": what a reader needs to fetch and check the blocks.
struct Manifest {
  uint32_t version = 0;        // PQ_REDIS_MANIFEST_VERSION when written
  uint32_t writer_version = 0; // pq_version_number() of the library that wrote it
  uint64_t state_bytes = 0;    // pq_sequence_save's size
  uint64_t block_bytes = 0;    // every block but the last holds this many
  uint64_t block_count = 0;    // ceil(state_bytes / block_bytes)
  std::vector<uint32_t> crcs;  // CRC-32C of each block
};

// The manifest's bytes (version and writer_version filled in here).
std::string encode_manifest(const Manifest& m);

// Parses and checks a manifest read from `name`: PQ_ERR_CORRUPT for a bad
// magic, size, field or CRC, PQ_ERR_INCOMPATIBLE for another version.
Manifest parse_manifest(const char* data, size_t size, const std::string& name);

// CRC-32C of one block (the library's own CRC-32C, src/format/crc32c.cpp).
uint32_t block_crc(const void* data, size_t size);

// "0x1234abcd".
std::string hex32(uint32_t v);

}  // namespace pqr
