// A state's manifest and blocks on the server, and the whole put and get
// (store.cpp), over the connection of connection.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "connection.h"
#include "internal.h"

namespace pqr {

// "<key>:manifest", the manifest's name.
std::string manifest_key(const std::string& key);

// The manifest under key, or false when there is none.
bool read_manifest(pq_redis& r, const std::string& key, Manifest* out);

// Deletes blocks [first, end). end == kUnknownEnd: blocks from first on
// until a batch finds none (a manifest that did not parse).
constexpr uint64_t kUnknownEnd = ~uint64_t{0};
void delete_blocks(pq_redis& r, const std::string& key, uint64_t first, uint64_t end);

void put(pq_redis& r, pq_context* ctx, uint64_t seq_id, const std::string& key,
         uint64_t block_bytes);

// Fetches blocks [first, end) of m in one pipeline and hands each, checked
// against the manifest (present, a string, its size, its CRC-32C), to
// `take` in block order. A failure of `take` (a pq::Error) is reported after
// the outstanding replies are read, as any handler failure.
using BlockSink = std::function<void(uint64_t n, const uint8_t* data, size_t size)>;
void fetch_blocks(pq_redis& r, const std::string& key, const Manifest& m, uint64_t first,
                  uint64_t end, const BlockSink& take);

// PQ_ERR_INVALID_ARGUMENT when seq_id already exists in ctx.
void require_absent(pq_context* ctx, uint64_t seq_id);

// The manifest under key; PQ_ERR_NOT_FOUND when there is none.
Manifest require_manifest(pq_redis& r, const std::string& key);

void get(pq_redis& r, pq_context* ctx, uint64_t seq_id, const std::string& key);

}  // namespace pqr
