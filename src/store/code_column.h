// One kv head's PQ codes: `code_bytes` (m) bytes per token, token-major,
// held as runs of contiguous storage. A fork (pq_sequence_fork) shares the
// runs of the parent's prefix, frozen, and each side appends to a tail of
// its own, so the codes of a shared prefix are held once. A column that
// was never forked is one run: the tail.
//
// Readers walk the runs (for_each_run); the run count stays small: a fork
// freezes the parent's tail into a run only when it holds at least
// kMinFrozenTokens tokens, and copies a shorter tail into the child.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace pq {

class CodeColumn {
 public:
  static constexpr int64_t kMinFrozenTokens = 4096;

  explicit CodeColumn(int32_t code_bytes = 0) : m_(code_bytes) {}

  int32_t code_bytes() const { return m_; }
  int64_t tokens() const { return tail_first_ + tail_tokens(); }
  // The m bytes of token t < tokens().
  const uint8_t* at(int64_t t) const;

  // Grows to `tokens` tokens (>= tokens()), the new ones' codes unwritten,
  // and returns where the first new token's codes go: the new tokens are
  // contiguous. Reserves room for `reserve_tokens` tokens (0: just enough).
  uint8_t* grow(int64_t tokens, int64_t reserve_tokens = 0);
  // Keeps the first `tokens` tokens (<= tokens()). Frozen runs stay shared.
  void shrink(int64_t tokens);

  // A column holding the same codes for a fork: the frozen runs shared, and
  // this column's tail frozen and shared too when it is long, else copied.
  CodeColumn fork();

  // Calls f(first, count, data) for the runs that cover tokens
  // [first, end), in order (for_each_run) or last run first
  // (for_each_run_reverse); data points at token `first`'s codes.
  template <class F>
  void for_each_run(int64_t first, int64_t end, F&& f) const;
  template <class F>
  void for_each_run_reverse(int64_t first, int64_t end, F&& f) const;

  // Copies the codes of tokens [first, first + count) into out.
  void copy_out(int64_t first, int64_t count, uint8_t* out) const;

  // Bytes this column holds alone (its tail), and bytes it shares.
  uint64_t own_bytes() const { return tail_.capacity(); }
  uint64_t shared_bytes() const;
  // Runs, frozen ones and the tail if not empty (tests).
  size_t runs() const { return frozen_.size() + (tail_tokens() > 0 ? 1 : 0); }

 private:
  struct Run {
    std::shared_ptr<const std::vector<uint8_t>> data;
    int64_t first = 0;   // first token
    int64_t tokens = 0;  // tokens of data this column uses (a truncate may use fewer)
  };
  int64_t tail_tokens() const {
    return m_ == 0 ? 0 : static_cast<int64_t>(tail_.size()) / m_;
  }
  // Calls f(first, count, data) for the run [run_first, run_first + run_tokens)
  // starting at run_data, clipped to [first, end), if they overlap.
  template <class F>
  void clip(int64_t run_first, int64_t run_tokens, const uint8_t* run_data, int64_t first,
            int64_t end, F& f) const {
    const int64_t b = run_first > first ? run_first : first;
    const int64_t e = run_first + run_tokens < end ? run_first + run_tokens : end;
    if (b < e) f(b, e - b, run_data + (b - run_first) * m_);
  }

  int32_t m_;
  std::vector<Run> frozen_;     // tokens [0, tail_first_), ascending
  int64_t tail_first_ = 0;
  std::vector<uint8_t> tail_;   // tokens [tail_first_, tokens())
};

template <class F>
void CodeColumn::for_each_run(int64_t first, int64_t end, F&& f) const {
  for (const Run& r : frozen_) clip(r.first, r.tokens, r.data->data(), first, end, f);
  clip(tail_first_, tail_tokens(), tail_.data(), first, end, f);
}

template <class F>
void CodeColumn::for_each_run_reverse(int64_t first, int64_t end, F&& f) const {
  clip(tail_first_, tail_tokens(), tail_.data(), first, end, f);
  for (auto r = frozen_.rbegin(); r != frozen_.rend(); ++r)
    clip(r->first, r->tokens, r->data->data(), first, end, f);
}

}  // namespace pq
