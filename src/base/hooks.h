// The caller's hooks of a context (pq_hooks in pqcache.h): the log, the
// host allocator of the K/V store and the build notification, checked and
// copied at pq_create_with_hooks. The shared worker pool travels separately
// (ContextShared::pool).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "pqcache.h"

namespace pq {

// Allocates the K/V store's blocks: the caller's hooks, or operator new.
struct HostAllocator {
  pq_alloc_fn alloc = nullptr;
  pq_free_fn free = nullptr;
  void* user = nullptr;
  const char* name = "the host_alloc hook";  // who returned NULL, in messages
  static constexpr size_t kAlignment = 64;
};

// One block of a HostAllocator, freed by it when it goes. Holds the
// allocator by value: a block may outlive the store that made it (a fork,
// a build's snapshot).
class HostBlock {
 public:
  HostBlock() = default;
  // Throws PQ_ERR_OUT_OF_MEMORY when the allocation fails.
  HostBlock(const HostAllocator& allocator, size_t bytes);
  ~HostBlock();
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
  uint8_t* get() const { return data_; }

 private:
  HostAllocator allocator_;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

// The disk tier's file transfers (pq_hooks.disk_read, disk_write).
struct DiskIo {
  pq_disk_read_fn read = nullptr;    // null: pread
  pq_disk_write_fn write = nullptr;  // null: pwrite
  void* user = nullptr;
};

struct Hooks {
  pq_log_fn log = nullptr;
  void* log_user = nullptr;
  int32_t log_level = PQ_LOG_WARN;
  HostAllocator allocator;
  pq_build_done_fn build_done = nullptr;
  void* build_done_user = nullptr;
  pq_build_progress_fn build_progress = nullptr;
  void* build_progress_user = nullptr;
  DiskIo disk_io;  // the disk tier's reads and writes

  bool logs(int32_t level) const { return log != nullptr && level <= log_level; }
  // Never throws: a log hook cannot make a call fail.
  void emit(int32_t level, const std::string& message) const noexcept;
};

}  // namespace pq
