// HostBlock and the log emission of the caller's hooks (hooks.h).
#include "base/hooks.h"

#include <new>

#include "base/error.h"

namespace pq {

HostBlock::HostBlock(const HostAllocator& allocator, size_t bytes)
    : allocator_(allocator), bytes_(bytes) {
  if (allocator_.alloc) {
    data_ = static_cast<uint8_t*>(allocator_.alloc(allocator_.user, bytes, HostAllocator::kAlignment));
    if (data_ == nullptr)
      fail(PQ_ERR_OUT_OF_MEMORY, std::string(allocator_.name) + " returned NULL for " +
                                     std::to_string(bytes) + " bytes of K/V");
    if (reinterpret_cast<uintptr_t>(data_) % HostAllocator::kAlignment != 0) {
      allocator_.free(allocator_.user, data_, bytes);
      data_ = nullptr;
      fail(PQ_ERR_BACKEND, "the host_alloc hook returned memory aligned to less than the " +
                               std::to_string(HostAllocator::kAlignment) + " bytes asked (" +
                               std::to_string(bytes) + " bytes of K/V)");
    }
    return;
  }
  // The throwing form, paired with the delete below: a program (or a
  // sanitizer) that replaces some forms of operator new and not the nothrow
  // aligned one would otherwise allocate with one family and free with
  // another.
  try {
    data_ = static_cast<uint8_t*>(::operator new(bytes, std::align_val_t{HostAllocator::kAlignment}));
  } catch (const std::bad_alloc&) {
    fail(PQ_ERR_OUT_OF_MEMORY, "allocating " + std::to_string(bytes) + " bytes of K/V failed");
  }
}

HostBlock::~HostBlock() {
  if (data_ == nullptr) return;
  if (allocator_.free)
    allocator_.free(allocator_.user, data_, bytes_);
  else
    ::operator delete(data_, std::align_val_t{HostAllocator::kAlignment});
}

void Hooks::emit(int32_t level, const std::string& message) const noexcept {
  if (logs(level)) log(log_user, level, message.c_str());
}

}  // namespace pq
