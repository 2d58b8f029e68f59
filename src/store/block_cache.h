// Bookkeeping of the block-level cache of one (sequence, layer), paper
// section 3.4. Token positions are grouped in blocks of block_tokens; the
// cache holds up to capacity_tokens / block_tokens whole blocks (all kv
// heads' K and V of those positions) in numbered slots. After each fetch it
// is updated with the blocks that hold the most of the fetched tokens (the
// paper's top-k_cache blocks; by default k_cache = the number of slots, the
// setting the paper found best): blocks already cached are touched, the
// others replace the least recently (LRU) or least frequently (LFU) used
// block that was not among them.
//
// This class only decides; it holds no K/V. The CUDA backend copies each
// admitted block into its slot in device memory; the CPU backend keeps the
// bookkeeping alone so that hit rates can be measured without a GPU. Not
// thread-safe: the owner serialises calls (the layer's mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pq {

class BlockCache {
 public:
  // policy: pq_cache_policy. update_blocks: k_cache, the blocks ranked per
  // update; 0 or more than the slots means the number of slots.
  // capacity_tokens < block_tokens gives no slots (a disabled cache: every
  // lookup misses, update admits nothing).
  BlockCache(int64_t capacity_tokens, int32_t block_tokens, int32_t policy,
             int32_t update_blocks = 0);

  int32_t slot_count() const { return static_cast<int32_t>(slots_.size()); }
  int32_t block_tokens() const { return block_tokens_; }

  // The slot holding the block of `position`, or -1.
  int32_t lookup(int64_t position) const;

  // Makes room for the blocks of positions [0, tokens), so that record()
  // and commit() of those positions allocate nothing: a fetch reserves
  // before it writes any output, and a failing allocation then changes
  // nothing. Throws std::bad_alloc; the cache stays as it was.
  void reserve(int64_t tokens);

  // The block held by `slot`, or -1 for a free slot.
  int64_t block_in(int32_t slot) const { return slots_[static_cast<size_t>(slot)].block; }

  struct Admission {
    int64_t block;  // positions [block * block_tokens, (block + 1) * block_tokens)
    int32_t slot;
    int64_t evicted;  // the block it replaced, or -1
  };

  // Records one fetched middle token (of any kv head; a token fetched for
  // several heads is recorded once per head) for the next commit(); returns
  // whether its block is cached, i.e. whether the fetch hit.
  bool record(int64_t position);

  // One update after a fetch whose middle tokens were record()ed. Blocks are
  // ranked by how many of the positions they hold (ties: the later block
  // first); the top k_cache are kept. Only blocks whose every position
  // is below complete_tokens are admitted (a partial block would miss the
  // tokens appended later). Returns the admissions, in rank order (valid
  // until the next commit).
  const std::vector<Admission>& commit(int64_t complete_tokens);

  // record() of every position, then commit().
  std::vector<Admission> update(const std::vector<int64_t>& positions, int64_t complete_tokens);

  // Updates so far (the clock of LRU).
  uint64_t steps() const { return step_; }

  // Host bytes per slot (allocated with the cache) and per block of
  // positions (the block map and fetch counts grow with the tokens), for
  // the host memory limit (memory_cost.h).
  static const size_t kSlotBytes;
  static const size_t kBlockBytes;

 private:
  struct Slot {
    int64_t block = -1;
    uint64_t last_use = 0;  // step of the last update that ranked it
    uint64_t uses = 0;      // updates that ranked it while cached (LFU)
  };
  int32_t victim(uint64_t step) const;

  int32_t block_tokens_;
  int32_t policy_;
  size_t update_blocks_;  // k_cache
  uint64_t step_ = 0;
  std::vector<Slot> slots_;
  std::vector<int32_t> slot_of_block_;  // indexed by block; -1 when not cached
  std::vector<int64_t> fetched_;        // recorded tokens per block, since the last commit
  std::vector<int64_t> touched_;        // blocks with a non-zero fetched_ entry
  std::vector<std::pair<int64_t, int64_t>> ranked_;  // commit's working list
  std::vector<Admission> admissions_;                // commit's result
};

}  // namespace pq
