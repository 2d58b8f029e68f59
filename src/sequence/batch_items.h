// What the calls over a batch of sequences share (context_batch.cpp,
// context_device.cpp): an item's outcome caught as the C API boundary
// catches it, the checks of the items array, and the statuses written back
// with the first failure thrown.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "base/call_args.h"
#include "base/error.h"
#include "sequence/context.h"

namespace pq {

using Outcome = BatchOutcome;

// Runs fn, its exception becoming the item's outcome as at the C API
// boundary (the batch call names the function when it reports the item).
template <typename Fn>
inline void run_item(Outcome& outcome, Fn&& fn) noexcept {
  outcome.status = catch_status(std::forward<Fn>(fn), [&outcome](const char* what,
                                                                   const char* prefix) {
    try {
      outcome.message = std::string(prefix) + what;
    } catch (...) {  // no memory for the text: the status still says what happened
    }
  });
}

inline void check_batch(const void* items, int64_t count) {
  if (count < 0) invalid("count is " + str(count) + "; expected >= 0");
  if (items == nullptr && count > 0) invalid("items is NULL with count " + str(count));
}

// A seq_id may appear once: its items would race on one layer's state.
template <typename Item>
inline void require_unique_ids(const Item* items, int64_t count) {
  std::unordered_set<uint64_t> seen;
  seen.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    if (!seen.insert(items[i].seq_id).second) {
      int64_t first = 0;
      while (items[first].seq_id != items[i].seq_id) ++first;
      invalid("items[" + str(i) + "].seq_id " + std::to_string(items[i].seq_id) +
              " repeats items[" + str(first) + "]'s; a sequence may appear once per batch");
    }
}

// Writes every item's status and throws the first failure, naming it
// (local: the items as the call read them).
template <typename Item>
inline void finish_batch(Item* items, const std::vector<Item>& local,
                  const std::vector<Outcome>& outcomes) {
  const Outcome* first = nullptr;
  int64_t first_index = 0;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    items[i].status = outcomes[i].status;
    if (outcomes[i].status != PQ_OK && first == nullptr) {
      first = &outcomes[i];
      first_index = static_cast<int64_t>(i);
    }
  }
  if (first != nullptr)
    fail(first->status, "items[" + str(first_index) + "] (seq_id " +
                            std::to_string(local[static_cast<size_t>(first_index)].seq_id) +
                            "): " + first->message);
}

}  // namespace pq
