#include "store/block_cache.h"

#include <algorithm>
#include <utility>

#include "pqcache.h"

namespace pq {

const size_t BlockCache::kSlotBytes = sizeof(BlockCache::Slot);
const size_t BlockCache::kBlockBytes = sizeof(int32_t) + sizeof(int64_t) + sizeof(int64_t);

BlockCache::BlockCache(int64_t capacity_tokens, int32_t block_tokens, int32_t policy,
                       int32_t update_blocks)
    : block_tokens_(block_tokens), policy_(policy) {
  const int64_t slots = block_tokens > 0 ? capacity_tokens / block_tokens : 0;
  slots_.resize(static_cast<size_t>(std::max<int64_t>(0, slots)));
  update_blocks_ = update_blocks > 0 ? std::min(slots_.size(), static_cast<size_t>(update_blocks))
                                     : slots_.size();
}

int32_t BlockCache::lookup(int64_t position) const {
  if (position < 0) return -1;
  const int64_t block = position / block_tokens_;
  return block < static_cast<int64_t>(slot_of_block_.size())
             ? slot_of_block_[static_cast<size_t>(block)]
             : -1;
}

// The slot to give up at `step`: a free one first, else the policy's choice
// among the blocks this step did not rank. -1 when every block was ranked.
int32_t BlockCache::victim(uint64_t step) const {
  int32_t best = -1;
  for (int32_t s = 0; s < slot_count(); ++s) {
    const Slot& slot = slots_[static_cast<size_t>(s)];
    if (slot.block < 0) return s;
    if (slot.last_use == step) continue;
    if (best < 0) {
      best = s;
      continue;
    }
    const Slot& b = slots_[static_cast<size_t>(best)];
    const bool older = slot.last_use < b.last_use;
    if (policy_ == PQ_CACHE_LFU) {
      if (slot.uses < b.uses || (slot.uses == b.uses && older)) best = s;
    } else if (older) {
      best = s;
    }
  }
  return best;
}

void BlockCache::reserve(int64_t tokens) {
  const size_t blocks = static_cast<size_t>((tokens + block_tokens_ - 1) / block_tokens_);
  if (fetched_.size() < blocks) fetched_.resize(blocks, 0);
  if (slot_of_block_.size() < blocks) slot_of_block_.resize(blocks, -1);
  touched_.reserve(blocks);
  ranked_.reserve(blocks);
  admissions_.reserve(std::min(blocks, slots_.size()));
}

bool BlockCache::record(int64_t position) {
  if (position < 0) return false;
  const size_t block = static_cast<size_t>(position / block_tokens_);
  if (block >= fetched_.size()) fetched_.resize(block + 1, 0);
  if (fetched_[block]++ == 0) touched_.push_back(static_cast<int64_t>(block));
  return lookup(position) >= 0;
}

std::vector<BlockCache::Admission> BlockCache::update(const std::vector<int64_t>& positions,
                                                      int64_t complete_tokens) {
  for (int64_t p : positions) record(p);
  return commit(complete_tokens);
}

const std::vector<BlockCache::Admission>& BlockCache::commit(int64_t complete_tokens) {
  // (tokens of the fetch in the block, block), ranked: most tokens, then
  // later block. Counting by block keeps this linear in the fetch.
  std::vector<std::pair<int64_t, int64_t>>& ranked = ranked_;
  ranked.clear();
  ranked.reserve(touched_.size());
  for (int64_t block : touched_) {
    ranked.emplace_back(fetched_[static_cast<size_t>(block)], block);
    fetched_[static_cast<size_t>(block)] = 0;
  }
  touched_.clear();
  std::vector<Admission>& admissions = admissions_;
  admissions.clear();
  if (slots_.empty()) return admissions;
  const uint64_t step = ++step_;
  const size_t keep = std::min(ranked.size(), update_blocks_);
  std::partial_sort(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(keep),
                    ranked.end(), [](const auto& a, const auto& b) { return a > b; });
  ranked.resize(keep);

  // Touch the ranked blocks already cached first, so that none of them can
  // be chosen as a victim for a newcomer of the same step.
  for (const auto& entry : ranked) {
    const int32_t s = lookup(entry.second * block_tokens_);
    if (s < 0) continue;
    slots_[static_cast<size_t>(s)].last_use = step;
    slots_[static_cast<size_t>(s)].uses += 1;
  }
  for (const auto& entry : ranked) {
    const int64_t block = entry.second;
    if (lookup(block * block_tokens_) >= 0) continue;
    if ((block + 1) * block_tokens_ > complete_tokens) continue;
    const int32_t s = victim(step);
    if (s < 0) break;  // every slot holds a block ranked at this step
    Slot& slot = slots_[static_cast<size_t>(s)];
    const int64_t evicted = slot.block;
    if (evicted >= 0) slot_of_block_[static_cast<size_t>(evicted)] = -1;
    if (block >= static_cast<int64_t>(slot_of_block_.size()))
      slot_of_block_.resize(static_cast<size_t>(block) + 1, -1);
    slot_of_block_[static_cast<size_t>(block)] = s;
    slot = Slot{block, step, 1};
    admissions.push_back(Admission{block, s, evicted});
  }
  return admissions;
}

}  // namespace pq
