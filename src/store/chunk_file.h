// The disk tier's file (disk_tier.h): fixed-size slots of one context's
// K/V chunks in one unlinked file on local disk, so nothing is left behind
// when the process dies. A slot holds one chunk's K block then its V block,
// each [head][token in chunk][dim]. Slots are written once, read any number
// of times and given back when the last chunk holding them goes; a slot
// given back is reused.
//
// Reads and writes go through the caller's disk_read / disk_write hooks
// (pq_hooks) or pread / pwrite. A failed or short transfer (a full disk, an
// I/O error) throws PQ_ERR_BACKEND naming the file, the slot and errno's
// text; nothing the file already held is touched by a failed write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/hooks.h"
#include "pqcache.h"

namespace pq {

class ChunkFile {
 public:
  // Opens an unnamed file in `directory` (O_TMPFILE, else a unique name
  // unlinked at once). Throws PQ_ERR_INVALID_ARGUMENT naming the directory
  // when it cannot.
  ChunkFile(const std::string& directory, size_t slot_bytes, DiskIo io);
  ~ChunkFile();
  ChunkFile(const ChunkFile&) = delete;
  ChunkFile& operator=(const ChunkFile&) = delete;

  size_t slot_bytes() const { return slot_bytes_; }
  const std::string& directory() const { return directory_; }

  // A slot to write; give it back with release() (Slot does).
  int64_t acquire();
  void release(int64_t slot) noexcept;
  // Writes `bytes` at `offset` within `slot`; all or a thrown error.
  void write(int64_t slot, size_t offset, const void* data, size_t bytes) const;
  // Reads `bytes` at `offset` within `slot` into `out`; all or a thrown error.
  void read(int64_t slot, size_t offset, void* out, size_t bytes) const;
  // Slots in use and the file's size in slots (its high-water mark).
  int64_t slots_used() const;
  int64_t slots_made() const;

 private:
  std::string directory_;
  size_t slot_bytes_;
  DiskIo io_;
  int fd_ = -1;
  mutable std::mutex mutex_;  // over the two below
  std::vector<int64_t> free_;
  int64_t made_ = 0;
};

// A slot held by chunks (shared by a fork's chunks); given back when the
// last holder goes.
class DiskSlot {
 public:
  DiskSlot(std::shared_ptr<ChunkFile> file, int64_t index)
      : file_(std::move(file)), index_(index) {}
  ~DiskSlot() { file_->release(index_); }
  DiskSlot(const DiskSlot&) = delete;
  DiskSlot& operator=(const DiskSlot&) = delete;
  const ChunkFile& file() const { return *file_; }
  int64_t index() const { return index_; }

 private:
  std::shared_ptr<ChunkFile> file_;
  int64_t index_;
};

}  // namespace pq
