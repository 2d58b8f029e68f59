// The host memory limit of a context (pq_config.host_memory_limit): what its
// sequences' state holds, counted against one budget. A reservation is all
// or nothing and happens in one atomic step, so a refused request never
// holds bytes that another thread's request could see, and what a refusal
// reports as held was held.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace pq {

class MemoryBudget;

// Bytes held against a budget; released when destroyed (move-only).
class Reservation {
 public:
  Reservation() = default;
  Reservation(Reservation&& o) noexcept : budget_(o.budget_), bytes_(o.bytes_) { o.bytes_ = 0; }
  Reservation& operator=(Reservation&& o) noexcept;
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation() { release(); }

  uint64_t bytes() const { return bytes_; }
  // Moves `bytes` of this reservation into a new one (bytes <= this->bytes()).
  Reservation split(uint64_t bytes);
  // Takes over what `other` holds (of the same budget, or this one empty).
  void absorb(Reservation&& other);

 private:
  friend class MemoryBudget;
  Reservation(MemoryBudget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
  void release();
  MemoryBudget* budget_ = nullptr;
  uint64_t bytes_ = 0;
};

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit) : limit_(limit) {}

  // Holds `bytes` more, or throws PQ_ERR_OUT_OF_MEMORY (holding nothing)
  // when that would pass the limit; `what` and `how` complete the message:
  // "<what> needs N bytes, ... <how>".
  Reservation reserve(uint64_t bytes, const std::string& what, const std::string& how = "");
  // reserve() for calls that run at every decode step: the message is made
  // (describe() returns {what, how}) only when the bytes are refused.
  template <typename Describe>
  Reservation reserve_or_describe(uint64_t bytes, Describe&& describe) {
    Reservation held;
    if (try_reserve(bytes, &held)) return held;
    const auto message = describe();
    return reserve(bytes, message.first, message.second);
  }
  // Holds `bytes` more whatever the limit: for bytes already held that move
  // from one charge to another (a released block back to its slab's slack).
  Reservation hold(uint64_t bytes) {
    used_.fetch_add(bytes);
    return Reservation(this, bytes);
  }
  uint64_t used() const { return used_.load(); }
  uint64_t limit() const { return limit_; }  // 0 = unlimited

 private:
  friend class Reservation;
  // Holds `bytes` more in *out and returns true, or returns false (holding
  // nothing) when that would pass the limit.
  bool try_reserve(uint64_t bytes, Reservation* out);
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

}  // namespace pq
