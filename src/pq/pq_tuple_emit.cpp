#include "pq/pq_tuple_emit.h"

#include "store/code_column.h"

namespace pq {

PairClassTable::PairClassTable(std::vector<uint8_t>& classes) : classes_(classes) {
  if (classes_.size() != 65536) classes_.assign(65536, kBelow);
}

namespace {

// A forward walk over the middle: seen_ties counts the tie tokens passed,
// the first skip_ties of which are left out.
struct Emitter {
  const uint8_t* cls;
  int64_t skip_ties;
  int32_t* out;
  int64_t k;
  int64_t seen_ties = 0;
  int64_t w = 0;

  // The position is written at out[w] whatever the class; w moves past it
  // when the token is taken.
  inline void token(int64_t position, const uint8_t* code_pair) {
    const uint8_t c = cls[code_pair[0] | code_pair[1] << 8];
    out[w] = static_cast<int32_t>(position);
    if (__builtin_expect(c == PairClassTable::kTie, 0))
      w += seen_ties++ >= skip_ties;
    else
      w += c >> 1;
  }

  void run(int64_t run_first, int64_t count, const uint8_t* p) {
    int64_t i = 0;
    // Eight tokens between checks while eight more positions fit below k.
    for (; i + 8 <= count && w + 8 <= k; i += 8)
      for (int j = 0; j < 8; ++j) token(run_first + i + j, p + 2 * (i + j));
    for (; i < count && w < k; ++i) token(run_first + i, p + 2 * i);
  }
};

}  // namespace

void emit_chosen_pairs(const CodeColumn& codes, int64_t first, int64_t n,
                       const PairClassTable& classes, int64_t tie_tokens, int64_t ties_taken,
                       int64_t k, int32_t* out) {
  Emitter e{classes.data(), tie_tokens - ties_taken, out, k};
  codes.for_each_run(first, first + n, [&](int64_t run_first, int64_t count, const uint8_t* p) {
    if (e.w < k) e.run(run_first, count, p);
  });
}

}  // namespace pq
