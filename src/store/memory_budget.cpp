#include "store/memory_budget.h"

#include "base/error.h"

namespace pq {

Reservation& Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    release();
    budget_ = o.budget_;
    bytes_ = o.bytes_;
    o.bytes_ = 0;
  }
  return *this;
}

Reservation Reservation::split(uint64_t bytes) {
  if (bytes > bytes_) fail(PQ_ERR_INTERNAL, "Reservation::split: more than held");
  bytes_ -= bytes;
  return Reservation(budget_, bytes);
}

void Reservation::absorb(Reservation&& other) {
  if (other.bytes_ == 0) return;
  if (bytes_ != 0 && budget_ != other.budget_)
    fail(PQ_ERR_INTERNAL, "Reservation::absorb: another budget's bytes");
  budget_ = other.budget_;
  bytes_ += other.bytes_;
  other.bytes_ = 0;
}

void Reservation::release() {
  if (budget_ != nullptr && bytes_ != 0) budget_->used_.fetch_sub(bytes_);
  bytes_ = 0;
}

bool MemoryBudget::try_reserve(uint64_t bytes, Reservation* out) {
  uint64_t held = used_.load();
  do {
    if (limit_ != 0 && (bytes > limit_ || held > limit_ - bytes)) return false;
  } while (!used_.compare_exchange_weak(held, held + bytes));
  *out = Reservation(this, bytes);
  return true;
}

Reservation MemoryBudget::reserve(uint64_t bytes, const std::string& what,
                                  const std::string& how) {
  Reservation held;
  if (!try_reserve(bytes, &held))
    fail(PQ_ERR_OUT_OF_MEMORY, what + " needs " + std::to_string(bytes) +
                                   " bytes, which would pass the host memory limit of " +
                                   std::to_string(limit_) + " bytes: " +
                                   std::to_string(used_.load()) + " held" + how);
  return held;
}

}  // namespace pq
