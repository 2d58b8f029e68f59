#include "store/chunk_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace pq {

namespace {

std::string errno_text(int64_t err) { return std::strerror(static_cast<int>(err)); }

int open_unnamed(const std::string& directory) {
#ifdef O_TMPFILE
  const int fd = ::open(directory.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  // Some file systems have no O_TMPFILE (EOPNOTSUPP, EISDIR): a named file
  // unlinked at once instead.
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) return -1;
#endif
  std::string name = directory + "/pqcache-kv-XXXXXX";
  const int fd2 = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd2 >= 0) ::unlink(name.c_str());
  return fd2;
}

}  // namespace

ChunkFile::ChunkFile(const std::string& directory, size_t slot_bytes, DiskIo io)
    : directory_(directory), slot_bytes_(slot_bytes), io_(io) {
  fd_ = open_unnamed(directory);
  if (fd_ < 0)
    fail(PQ_ERR_INVALID_ARGUMENT, "kv_disk_path \"" + directory +
                                      "\": cannot make the disk tier's K/V file there (" +
                                      errno_text(errno) + ")");
}

ChunkFile::~ChunkFile() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t ChunkFile::acquire() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!free_.empty()) {
    const int64_t slot = free_.back();
    free_.pop_back();
    return slot;
  }
  return made_++;
}

void ChunkFile::release(int64_t slot) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    free_.push_back(slot);
  } catch (...) {
    // No room to remember it: the slot is lost to reuse, not its data.
  }
}

int64_t ChunkFile::slots_used() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return made_ - static_cast<int64_t>(free_.size());
}

int64_t ChunkFile::slots_made() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return made_;
}

namespace {

// Moves `bytes` at `at` through `step` (one pread/pwrite or hook call:
// bytes moved or -errno) until all moved; `what` and `after` word the error.
template <typename Step>
void transfer(const std::string& directory, const char* what, uint64_t at, size_t bytes,
              const char* eof, const char* after, Step&& step) {
  for (size_t done = 0; done < bytes;) {
    const int64_t n = step(done);
    if (n == -EINTR) continue;
    if (n <= 0)
      fail(PQ_ERR_BACKEND, "the disk tier's K/V file in \"" + directory + "\": " + what + " " +
                               std::to_string(bytes) + " bytes at offset " + std::to_string(at) +
                               " failed (" + (n == 0 ? std::string(eof) : errno_text(-n)) + "); " +
                               after);
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void ChunkFile::write(int64_t slot, size_t offset, const void* data, size_t bytes) const {
  const uint64_t at = static_cast<uint64_t>(slot) * slot_bytes_ + offset;
  const auto* p = static_cast<const uint8_t*>(data);
  transfer(directory_, "writing", at, bytes, "no progress",
           "what the layer held before the call is kept", [&](size_t done) -> int64_t {
             if (io_.write != nullptr) return io_.write(io_.user, fd_, p + done, bytes - done, at + done);
             const ssize_t n = ::pwrite(fd_, p + done, bytes - done, static_cast<off_t>(at + done));
             return n < 0 ? -errno : n;
           });
}

void ChunkFile::read(int64_t slot, size_t offset, void* out, size_t bytes) const {
  const uint64_t at = static_cast<uint64_t>(slot) * slot_bytes_ + offset;
  auto* p = static_cast<uint8_t*>(out);
  transfer(directory_, "reading", at, bytes, "end of file", "the layer keeps every token it held",
           [&](size_t done) -> int64_t {
             if (io_.read != nullptr) return io_.read(io_.user, fd_, p + done, bytes - done, at + done);
             const ssize_t n = ::pread(fd_, p + done, bytes - done, static_cast<off_t>(at + done));
             return n < 0 ? -errno : n;
           });
}

}  // namespace pq
