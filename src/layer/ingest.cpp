// Ingest (ingest.h).
#include "layer/ingest.h"

#include <exception>
#include <utility>

#include "base/error.h"

namespace pq {

void Ingest::chain(ContextShared& shared, std::function<void()> work, std::string what) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_future<void> previous = done_;
  done_ = shared
              .submit([this, previous, work = std::move(work), what = std::move(what)]() mutable {
                try {
                  if (previous.valid()) previous.wait();
                  work();
                } catch (const Error& e) {
                  std::lock_guard<std::mutex> failed(mutex_);
                  status_ = e.status();
                  error_ = what + "; nothing was stored: " + e.what();
                } catch (const std::exception& e) {
                  std::lock_guard<std::mutex> failed(mutex_);
                  status_ = PQ_ERR_INTERNAL;
                  error_ = what + ": " + e.what();
                }
                // The future's shared state keeps this callable (libstdc++
                // stores it there) and the layer keeps that future, so what
                // the callable holds must go now: otherwise the sequence
                // owns itself and is never freed. `work` goes last (it may
                // hold the sequence's last reference), and `this` is not
                // touched after it.
                previous = std::shared_future<void>();
                work = nullptr;
              })
              .share();
}

void Ingest::wait() {
  std::shared_future<void> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done = done_;
  }
  if (done.valid()) done.wait();
}

void Ingest::settle() {
  wait();
  std::lock_guard<std::mutex> lock(mutex_);
  if (status_ != PQ_OK) {
    const pq_status status = status_;
    const std::string message = std::move(error_);
    status_ = PQ_OK;
    error_.clear();
    fail(status, message);
  }
}

}  // namespace pq
