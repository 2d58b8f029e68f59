#include "format/state_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace pq {

namespace {

[[noreturn]] void io_error(pq_status status, const std::string& what, const std::string& path,
                           int err) {
  fail(status, what + " \"" + path + "\" failed: " + std::strerror(err));
}

struct FileSink {
  int fd;
  int err = 0;  // errno of a failed write
};

int write_to_fd(void* user, const void* data, size_t size) {
  auto* sink = static_cast<FileSink*>(user);
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(sink->fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      sink->err = errno;
      return 1;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return 0;
}

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

void write_file_atomically(const char* path,
                           const std::function<void(pq_write_fn, void*)>& produce) {
  if (path == nullptr || *path == '\0') fail(PQ_ERR_INVALID_ARGUMENT, "path is NULL or empty");
  const std::string target(path);
  std::string temp = target + ".tmp.XXXXXX";
  const int fd = ::mkstemp(&temp[0]);
  if (fd < 0) io_error(PQ_ERR_BACKEND, "creating a temporary file beside", target, errno);
  FileSink sink{fd};
  try {
    try {
      produce(&write_to_fd, &sink);
    } catch (const Error& e) {
      if (sink.err != 0) io_error(PQ_ERR_BACKEND, "writing", temp, sink.err);
      throw;
    }
    if (::fsync(fd) != 0) io_error(PQ_ERR_BACKEND, "flushing (fsync)", temp, errno);
    if (::close(fd) != 0) {
      sink.fd = -1;
      io_error(PQ_ERR_BACKEND, "closing", temp, errno);
    }
    sink.fd = -1;
    if (::rename(temp.c_str(), target.c_str()) != 0)
      io_error(PQ_ERR_BACKEND, "renaming the temporary file to", target, errno);
  } catch (...) {
    if (sink.fd >= 0) ::close(sink.fd);
    ::unlink(temp.c_str());
    throw;
  }
  // The rename is durable once the directory is: a failure here leaves the
  // complete file in place, so it is not reported.
  const int dir = ::open(directory_of(target).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

void with_mapped_file(const char* path,
                      const std::function<void(const uint8_t*, uint64_t)>& use) {
  if (path == nullptr || *path == '\0') fail(PQ_ERR_INVALID_ARGUMENT, "path is NULL or empty");
  const int fd = ::open(path, O_RDONLY);
  if (fd < 0) io_error(errno == ENOENT ? PQ_ERR_NOT_FOUND : PQ_ERR_BACKEND, "opening", path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    io_error(PQ_ERR_BACKEND, "reading the size of", path, err);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) {  // mmap refuses an empty mapping; the parse names the problem
    ::close(fd);
    use(nullptr, 0);
    return;
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file
  if (map == MAP_FAILED) io_error(PQ_ERR_BACKEND, "mapping", path, err);
  try {
    use(static_cast<const uint8_t*>(map), size);
  } catch (...) {
    ::munmap(map, size);
    throw;
  }
  ::munmap(map, size);
}

}  // namespace pq
