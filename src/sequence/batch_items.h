// What the calls over a batch of sequences share (context_batch.cpp,
// context_device.cpp): an item's outcome caught as the C API boundary
// catches it, the checks of the items array and of outputs shared between
// items, and the statuses written back with the first failure thrown.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "base/call_args.h"
#include "base/error.h"
#include "base/tensor.h"
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

// The bytes an item writes, for the check that items do not share outputs.
struct OutputSpan {
  uintptr_t begin, end;
  int32_t memory;
  int64_t item;             // kItemsArray for the caller's items array
  const pq_tensor* tensor;  // null for a plain array
  std::string name;
};
inline constexpr int64_t kItemsArray = -1;

// The caller's items array: the call writes every item's status there
// after the items ran, so no output may lie in it.
template <typename Item>
inline OutputSpan items_span(const Item* items, int64_t count) {
  const auto begin = reinterpret_cast<uintptr_t>(items);
  return {begin, begin + sizeof(Item) * static_cast<uint64_t>(count), PQ_MEMORY_HOST, kItemsArray,
          nullptr, "the items array"};
}

// Items run concurrently, so no two may write the same bytes. Spans that
// overlap are allowed only for two tensors whose rows interleave without
// touching (require_disjoint_outputs).
inline void require_disjoint_items(std::vector<OutputSpan>& spans) {
  std::sort(spans.begin(), spans.end(),
            [](const OutputSpan& a, const OutputSpan& b) { return a.begin < b.begin; });
  std::vector<const OutputSpan*> active;
  for (const OutputSpan& s : spans) {
    active.erase(std::remove_if(active.begin(), active.end(),
                                [&](const OutputSpan* a) { return a->end <= s.begin; }),
                 active.end());
    for (const OutputSpan* a : active) {
      if (a->item == s.item || a->memory != s.memory) continue;
      if (a->item == kItemsArray || s.item == kItemsArray)
        invalid((a->item == kItemsArray ? s.name : a->name) +
                " overlaps the items array, where the call writes every item's status");
      if (a->tensor == nullptr || s.tensor == nullptr)
        invalid(a->name + " and " + s.name + " overlap; items of a batch run concurrently and "
                "must not share outputs");
      require_disjoint_outputs(*a->tensor, a->name.c_str(), *s.tensor, s.name.c_str());
    }
    active.push_back(&s);
  }
}

inline std::string item_name(int64_t i, const char* field) {
  return "items[" + str(i) + "]." + field;
}

// The spans item i writes: a selection's positions and counts (`out`), or
// a fetch's two output tensors (checked to fit their span by then).

inline void add_selection_spans(std::vector<OutputSpan>& spans, const pq_selection& out,
                                int32_t kv_heads, int32_t memory, int64_t i) {
  const auto positions = reinterpret_cast<uintptr_t>(out.positions);
  const auto counts = reinterpret_cast<uintptr_t>(out.counts);
  spans.push_back({positions, positions + sizeof(int32_t) * kv_heads * out.capacity, memory, i,
                   nullptr, item_name(i, "out.positions")});
  spans.push_back({counts, counts + sizeof(int32_t) * kv_heads, memory, i, nullptr,
                   item_name(i, "out.counts")});
}
inline void add_output_spans(std::vector<OutputSpan>& spans, const pq_tensor& keys,
                             const pq_tensor& values, int64_t i) {
  for (const pq_tensor* t : {&keys, &values}) {
    int64_t bytes = 0;
    tensor_span_bytes(*t, &bytes);
    const auto begin = reinterpret_cast<uintptr_t>(t->data);
    spans.push_back({begin, begin + static_cast<uintptr_t>(bytes), t->memory, i, t,
                     item_name(i, t == &keys ? "out_keys" : "out_values")});
  }
}

}  // namespace pq
