// The last pass of the tuple path (pq_tuple_select.h) for two subspaces, the
// default PQ setting: the positions of the tokens whose code pair is chosen,
// close to the speed the codes are read at. A token's two code bytes, read
// as one 16-bit value (code0 | code1 << 8), index a byte table of classes
// (2 above the threshold, 1 at it, 0 below), so a token costs two loads, a
// store and an add: no tuple is built from shifted codes, and no branch but
// the rare one for the tokens at the threshold. The pass was 97% of a
// selection at 128K tokens (an AVX2 gather of eight classes at a time was
// no faster: gathers are slow on the Zen cores measured).
#pragma once

#include <cstdint>
#include <vector>

namespace pq {

class CodeColumn;

// The classes of all 65536 code pairs, in memory the caller keeps (a
// selection's scratch). Zero outside a call: set() marks the pairs present,
// clear() unmarks them again, so no call clears 64 KiB.
class PairClassTable {
 public:
  static constexpr uint8_t kBelow = 0, kTie = 1, kAbove = 2;
  explicit PairClassTable(std::vector<uint8_t>& classes);
  void set(uint32_t pair, uint8_t cls) { classes_[pair] = cls; }
  void clear(uint32_t pair) { classes_[pair] = kBelow; }
  const uint8_t* data() const { return classes_.data(); }

 private:
  std::vector<uint8_t>& classes_;
};

// Writes into out[0, k), ascending, the positions of tokens [first, first +
// n) of `codes` (two code bytes per token) whose pair is kAbove, and of the
// tokens whose pair is kTie the last `ties_taken` of `tie_tokens` (ties go
// to the larger position). The classes must choose exactly k tokens so.
void emit_chosen_pairs(const CodeColumn& codes, int64_t first, int64_t n,
                       const PairClassTable& classes, int64_t tie_tokens, int64_t ties_taken,
                       int64_t k, int32_t* out);

}  // namespace pq
