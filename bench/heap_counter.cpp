// Replaces every form of operator new and delete with malloc'd blocks that
// carry their size in a header, and counts the live bytes (heap_counter.h).
#include "heap_counter.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {

std::atomic<uint64_t> g_live{0};

// Header, just before the returned pointer: [offset to the block][size].
void* allocate(std::size_t size, std::size_t align) {
  const std::size_t header = align > 16 ? align : 16;
  std::size_t total = size + header;
  void* block = nullptr;
  if (align > 16) {
    total = (total + align - 1) / align * align;
    block = std::aligned_alloc(align, total);
  } else {
    block = std::malloc(total);
  }
  if (!block) return nullptr;
  auto* p = static_cast<unsigned char*>(block) + header;
  reinterpret_cast<std::size_t*>(p)[-1] = size;
  reinterpret_cast<std::size_t*>(p)[-2] = header;
  g_live.fetch_add(size, std::memory_order_relaxed);
  return p;
}

void release(void* ptr) noexcept {
  if (!ptr) return;
  auto* p = static_cast<unsigned char*>(ptr);
  const std::size_t size = reinterpret_cast<std::size_t*>(p)[-1];
  const std::size_t header = reinterpret_cast<std::size_t*>(p)[-2];
  g_live.fetch_sub(size, std::memory_order_relaxed);
  std::free(p - header);
}

void* allocate_or_throw(std::size_t size, std::size_t align) {
  void* p = allocate(size, align);
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace

uint64_t bench::heap_bytes_live() { return g_live.load(); }

void* operator new(std::size_t n) { return allocate_or_throw(n, 16); }
void* operator new[](std::size_t n) { return allocate_or_throw(n, 16); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, 16); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, 16); }
void* operator new(std::size_t n, std::align_val_t a) {
  return allocate_or_throw(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return allocate_or_throw(n, static_cast<std::size_t>(a));
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return allocate(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return allocate(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete(void* p, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { release(p); }
