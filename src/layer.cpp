#include "layer.h"

#include <chrono>

#include "error.h"

namespace pq {

void Layer::finish_build() {
  if (!pending) return;
  std::shared_ptr<BuildTask> task = std::move(pending);
  std::future<void> done = std::move(pending_done);
  pending.reset();
  try {
    done.get();
  } catch (const Error& e) {
    build_error = e.what();
    throw;
  } catch (const std::bad_alloc&) {
    build_error = "the index build ran out of memory";
    fail(PQ_ERR_OUT_OF_MEMORY, build_error);
  } catch (const std::exception& e) {
    build_error = std::string("the index build failed: ") + e.what();
    fail(PQ_ERR_INTERNAL, build_error);
  }
  if (!task->result) {
    build_error = "the index build was cancelled";
    fail(PQ_ERR_BAD_STATE, build_error);
  }
  index = std::move(task->result);
  ++index_generation;
  build_error.clear();
  last_iterations = index->iterations;
  last_budget = index->budget;
  last_build_seconds = index->seconds;
  update_mirrors();
}

void Layer::poll_build() {
  if (pending && pending_done.wait_for(std::chrono::seconds(0)) == std::future_status::ready)
    finish_build();
}

void Layer::update_mirrors() {
  tokens_mirror.store(store.tokens());
  kv_bytes_mirror.store(store.bytes_held());
  charged_bytes_mirror.store(store.bytes_charged());
  index_bytes_mirror.store(index ? index->bytes() : 0);
}

}  // namespace pq
