// Files for saved sequence state: an atomic write (temporary file beside
// the target, fsync, rename, fsync of the directory) and a whole-file read,
// with errors that name the path and errno's text.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "pqcache.h"

namespace pq {

// Calls produce(write, user) with a pq_write_fn appending to a temporary
// file, then makes it `path`. On any failure (produce's or the file
// system's) `path` is left as it was and the temporary file is removed.
void write_file_atomically(const char* path,
                           const std::function<void(pq_write_fn, void*)>& produce);

// Calls use(data, size) with the file at `path` mapped read-only (no copy:
// the page cache's pages are mapped, populated in the kernel);
// PQ_ERR_NOT_FOUND if it does not exist, PQ_ERR_BACKEND for other errors.
void with_mapped_file(const char* path,
                      const std::function<void(const uint8_t*, uint64_t)>& use);

}  // namespace pq
