// A benchmark's buffer on 2 MiB pages where the kernel gives them
// (MADV_HUGEPAGE; "madvise" or "always" in
// /sys/kernel/mm/transparent_hugepage/enabled), as the library's host store
// keeps its K/V (src/store/host_slabs.h): its size rounded up to 2 MiB,
// filled with one byte so every page is there before a timed read. Exits
// with a message when the memory is not there.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace pqbench {

class HugePageBuffer {
 public:
  static constexpr size_t kPage = size_t{2} << 20;

  HugePageBuffer(const char* program, size_t bytes, uint8_t fill)
      : bytes_((bytes + kPage - 1) / kPage * kPage),
        data_(static_cast<uint8_t*>(std::aligned_alloc(kPage, bytes_))) {
    if (data_ == nullptr) {
      std::fprintf(stderr, "%s: out of memory (%zu bytes)\n", program, bytes_);
      std::exit(1);
    }
    madvise(data_, bytes_, MADV_HUGEPAGE);  // advice only: a refusal leaves 4 KiB pages
    std::memset(data_, fill, bytes_);
  }
  ~HugePageBuffer() { std::free(data_); }
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
  uint8_t* data_;
};

}  // namespace pqbench
