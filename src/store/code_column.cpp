// CodeColumn: one kv head's PQ codes as shared frozen runs and a tail.
#include "store/code_column.h"

#include <algorithm>
#include <cstring>

#include "base/cut_to.h"

namespace pq {

const uint8_t* CodeColumn::at(int64_t t) const {
  if (t >= tail_first_) return tail_.data() + (t - tail_first_) * m_;
  // The run holding t: the last whose first token is <= t.
  auto r = std::upper_bound(frozen_.begin(), frozen_.end(), t,
                            [](int64_t v, const Run& run) { return v < run.first; });
  --r;
  return r->data->data() + (t - r->first) * m_;
}

uint8_t* CodeColumn::grow(int64_t tokens, int64_t reserve_tokens) {
  const int64_t old = tail_tokens();
  const size_t want = static_cast<size_t>(std::max(tokens, reserve_tokens) - tail_first_) * m_;
  if (want > tail_.capacity()) tail_.reserve(want);
  tail_.resize(static_cast<size_t>(tokens - tail_first_) * m_);
  return tail_.data() + old * m_;
}

void CodeColumn::shrink(int64_t tokens) {
  if (tokens >= tail_first_) {
    cut_to(tail_, static_cast<size_t>(tokens - tail_first_) * m_);
    return;
  }
  // The cut falls in the frozen runs: the tail goes, the run holding the
  // cut is used only up to it (its storage is immutable and stays whole
  // while a fork shares it; held alone, the part used is copied out once
  // the run is more than twice that, as cut_to keeps a tail).
  std::vector<uint8_t>().swap(tail_);
  while (!frozen_.empty() && frozen_.back().first >= tokens) frozen_.pop_back();
  if (!frozen_.empty()) {
    Run& last = frozen_.back();
    last.tokens = std::min(last.tokens, tokens - last.first);
    const size_t used = static_cast<size_t>(last.tokens) * m_;
    if (last.data.use_count() == 1 && last.data->size() > 2 * used)
      last.data = std::make_shared<const std::vector<uint8_t>>(
          last.data->begin(), last.data->begin() + static_cast<std::ptrdiff_t>(used));
  }
  tail_first_ = tokens;
}

CodeColumn CodeColumn::fork() {
  CodeColumn child(m_);
  const int64_t tail = tail_tokens();
  if (tail >= kMinFrozenTokens) {
    // Freeze the tail: the vector moves, so pointers into it stay valid.
    auto frozen = std::make_shared<std::vector<uint8_t>>(std::move(tail_));
    frozen_.push_back(Run{std::move(frozen), tail_first_, tail});
    tail_ = std::vector<uint8_t>();
    tail_first_ += tail;
  }
  child.frozen_ = frozen_;
  child.tail_first_ = tail_first_;
  child.tail_ = tail_;  // a short tail, copied (empty if just frozen)
  return child;
}

void CodeColumn::copy_out(int64_t first, int64_t count, uint8_t* out) const {
  for_each_run(first, first + count, [&](int64_t b, int64_t n, const uint8_t* data) {
    std::memcpy(out + (b - first) * m_, data, static_cast<size_t>(n) * m_);
  });
}

uint64_t CodeColumn::shared_bytes() const {
  uint64_t b = 0;
  for (const Run& r : frozen_) b += r.data->capacity();
  return b;
}

}  // namespace pq
