// The disk tier's writes: appends, restores, truncates and forks, and the
// chunks leaving memory for the file (disk_tier.h).
#include "store/disk_tier.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "base/tensor.h"

namespace pq {

namespace {

// Chunks in memory come and go all the time in this tier (one per 256
// tokens appended). From the C heap they fragment it: small allocations
// land in a freed chunk's place and the next chunk takes fresh pages, so a
// 1M-token prefill grew the resident set by 2 GiB while the tier held 2 MiB
// (bench_disk_tier). Pages of their own go back to the system at once.
void* map_pages(void*, size_t bytes, size_t) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}
void unmap_pages(void*, void* p, size_t bytes) { ::munmap(p, bytes); }

HostAllocator rows_allocator(const HostAllocator& caller) {
  if (caller.alloc != nullptr) return caller;
  HostAllocator pages;
  pages.alloc = map_pages;
  pages.free = unmap_pages;
  pages.name = "mmap";
  return pages;
}

}  // namespace

DiskKvTier::DiskKvTier(const Geometry& g, MemoryBudget* budget, uint64_t chunk_charge,
                       uint64_t chunk_kv, std::shared_ptr<ChunkFile> file,
                       const HostAllocator& allocator)
    : g_(g),
      element_size_(dtype_size(g.dtype)),
      row_bytes_(static_cast<size_t>(g.head_dim) * element_size_),
      budget_(budget),
      chunk_charge_(chunk_charge),
      chunk_kv_(std::min(chunk_kv, chunk_charge)),
      file_(std::move(file)),
      allocator_(rows_allocator(allocator)) {
  if (file_ == nullptr || file_->slot_bytes() != 2 * block_bytes())
    fail(PQ_ERR_INTERNAL, "the disk tier's file does not fit its chunks");
}

uint64_t DiskKvTier::bytes_held() const { return in_memory_ * 2 * block_bytes(); }

// Every chunk holds state_part() (open, expect, copy_chunk); a kept one
// chunk_kv_ more.
uint64_t DiskKvTier::bytes_charged() const {
  return chunks_.size() * state_part() + static_cast<uint64_t>(kept_) * chunk_kv_;
}

void DiskKvTier::recount() {
  in_memory_ = kept_ = 0;
  for (const auto& c : chunks_) tally(*c, 1);
}

int64_t DiskKvTier::shared_chunks() const {
  int64_t n = 0;
  for (const auto& c : chunks_) n += c->shared.load() ? 1 : 0;
  return n;
}

bool DiskKvTier::stays(int64_t c, int64_t tokens) const {
  const int64_t begin = c * kChunkTokens, end = begin + kChunkTokens;
  return begin < g_.sink_tokens || end > tokens - g_.local_tokens;  // local_tokens >= 0
}

void DiskKvTier::check_room(int64_t count) const {
  if (tokens_ + count > INT32_MAX)
    fail(PQ_ERR_INVALID_ARGUMENT, "a sequence holds at most 2147483647 tokens per layer; " +
                                      std::to_string(tokens_) + " stored, " +
                                      std::to_string(count) + " more given");
}

bool DiskKvTier::open_copies_last_chunk() const {
  return tokens_ % kChunkTokens > 0 &&
         (chunks_.back()->shared.load() || chunks_.back()->rows == nullptr);
}

std::shared_ptr<DiskKvTier::Chunk> DiskKvTier::copy_chunk(const Chunk& from, int64_t rows,
                                                          Reservation charge) const {
  auto copy = std::make_shared<Chunk>();
  copy->rows = std::make_shared<Rows>(allocator_, block_bytes());
  copy->state_charge = charge.split(state_part());
  copy->rows_charge = std::move(charge);
  const size_t head_bytes = static_cast<size_t>(kChunkTokens) * row_bytes_;
  const size_t used = static_cast<size_t>(rows) * row_bytes_;
  for (int32_t h = 0; h < g_.heads; ++h) {
    for (const bool key : {true, false}) {
      uint8_t* dst = (key ? copy->rows->keys.get() : copy->rows->values.get()) + h * head_bytes;
      const size_t offset = h * head_bytes;
      if (from.rows != nullptr)
        std::memcpy(dst, (key ? from.rows->keys.get() : from.rows->values.get()) + offset, used);
      else if (from.slot != nullptr)
        from.slot->file().read(from.slot->index(), (key ? 0 : block_bytes()) + offset, dst, used);
      else
        fail(PQ_ERR_INTERNAL, "the disk tier copies a chunk whose rows never came");
    }
  }
  return copy;
}

void DiskKvTier::open(int64_t count) {
  if (count <= 0) return;
  check_room(count);
  const int64_t end = tokens_ + count;
  const size_t needed = static_cast<size_t>((end + kChunkTokens - 1) / kChunkTokens);
  const size_t opening = needed > chunks_.size() ? needed - chunks_.size() : 0;
  const int64_t partial_rows = tokens_ % kChunkTokens;
  const bool copy_last = open_copies_last_chunk();
  uint64_t staying = copy_last ? 1 : 0;
  for (size_t c = chunks_.size(); c < needed; ++c) staying += stays(c, end) ? 1 : 0;
  const uint64_t bytes = (opening + (copy_last ? 1 : 0)) * state_part() + staying * chunk_kv_;
  Reservation charge;
  if (bytes > 0)
    charge = budget_->reserve(
        bytes,
        "storing " + std::to_string(count) + " more tokens on the disk tier (" +
            std::to_string(opening) + " new chunks, " + std::to_string(staying) + " in memory)",
        "; per 256-token chunk the disk tier counts " + std::to_string(state_part()) +
            " bytes of state, and " + std::to_string(chunk_kv_) +
            " of K/V for a chunk kept in memory (sinks, local window)");
  // Everything that can fail, before anything changes.
  std::shared_ptr<Chunk> last_copy;
  if (copy_last)
    last_copy = copy_chunk(*chunks_.back(), partial_rows, charge.split(chunk_charge_));
  std::vector<std::shared_ptr<Chunk>> fresh;
  fresh.reserve(opening);
  for (size_t c = chunks_.size(); c < needed; ++c) {
    auto chunk = std::make_shared<Chunk>();
    chunk->state_charge = charge.split(state_part());
    if (stays(c, end)) {  // kept: its rows now, so that a failure happens here
      chunk->rows = std::make_shared<Rows>(allocator_, block_bytes());
      chunk->rows_charge = charge.split(chunk_kv_);
    }
    fresh.push_back(std::move(chunk));
  }
  chunks_.reserve(needed);
  if (last_copy) {
    tally(*chunks_.back(), -1);
    tally(*last_copy, 1);
    chunks_.back() = std::move(last_copy);
  }
  for (auto& c : fresh) {
    tally(*c, 1);
    chunks_.push_back(std::move(c));
  }
  tokens_ = end;
}

void DiskKvTier::expect(int64_t count) {
  if (count <= 0) return;
  if (tokens_ != 0 || !chunks_.empty())
    fail(PQ_ERR_INTERNAL, "K/V can be expected only in an empty tier");
  check_room(count);
  const size_t n = static_cast<size_t>((count + kChunkTokens - 1) / kChunkTokens);
  uint64_t staying = 0;
  for (size_t c = 0; c < n; ++c) staying += stays(c, count) ? 1 : 0;
  Reservation charge = budget_->reserve(
      n * state_part() + staying * chunk_kv_,
      "restoring " + std::to_string(count) + " tokens on the disk tier (" + std::to_string(n) +
          " chunks, " + std::to_string(staying) + " in memory)");
  std::vector<std::shared_ptr<Chunk>> chunks(n);
  for (size_t c = 0; c < n; ++c) {  // rows come with copy_in
    chunks[c] = std::make_shared<Chunk>();
    chunks[c]->state_charge = charge.split(state_part());
    if (stays(c, count)) chunks[c]->rows_charge = charge.split(chunk_kv_);
  }
  chunks_ = std::move(chunks);
  recount();
  tokens_ = count;
}

bool DiskKvTier::copy_in(int64_t first, const pq_tensor& keys, const pq_tensor& values,
                         ThreadPool*) {
  // Chunk by chunk: a chunk that does not stay goes to the file as soon as
  // it is full, so a long prefill or restore holds one such chunk at a time.
  const int64_t count = keys.tokens;
  const size_t head_bytes = static_cast<size_t>(kChunkTokens) * row_bytes_;
  for (int64_t t = 0; t < count;) {
    const int64_t pos = first + t;
    const size_t c = static_cast<size_t>(pos / kChunkTokens);
    const int64_t in_chunk = pos % kChunkTokens;
    const int64_t run = std::min(count - t, kChunkTokens - in_chunk);
    Chunk& chunk = *chunks_[c];
    if (chunk.rows == nullptr) {
      chunk.rows = std::make_shared<Rows>(allocator_, block_bytes());
      ++in_memory_;
    }
    for (int64_t i = 0; i < run; ++i)
      for (int32_t h = 0; h < g_.heads; ++h) {
        const size_t offset = h * head_bytes + static_cast<size_t>(in_chunk + i) * row_bytes_;
        if (!copy_if_finite(chunk.rows->keys.get() + offset,
                            tensor_row(keys, t + i, h, element_size_), g_.head_dim, g_.dtype) ||
            !copy_if_finite(chunk.rows->values.get() + offset,
                            tensor_row(values, t + i, h, element_size_), g_.head_dim, g_.dtype))
          return false;
      }
    t += run;
    if (in_chunk + run == kChunkTokens && !stays(static_cast<int64_t>(c), tokens_) &&
        !chunk.shared.load())
      write_out(c);
  }
  write_out_leavers();
  return true;
}

void DiskKvTier::write_out(size_t c) {
  Chunk& chunk = *chunks_[c];
  if (chunk.rows == nullptr || chunk.slot != nullptr) return;
  auto slot = std::make_shared<const DiskSlot>(file_, file_->acquire());
  file_->write(slot->index(), 0, chunk.rows->keys.get(), block_bytes());
  file_->write(slot->index(), block_bytes(), chunk.rows->values.get(), block_bytes());
  tally(chunk, -1);
  chunk.slot = std::move(slot);
  chunk.rows.reset();
  chunk.rows_charge = Reservation{};
  tally(chunk, 1);
}

void DiskKvTier::write_out_leavers() {
  // Chunks past the sinks and wholly before the window, in order; the scan
  // resumes where it stopped (chunks shared with a fork stay where they are).
  const int64_t sink_chunks = (g_.sink_tokens + kChunkTokens - 1) / kChunkTokens;
  size_t c = std::max(leavers_from_, static_cast<size_t>(sink_chunks));
  for (; c < chunks_.size() && !stays(static_cast<int64_t>(c), tokens_); ++c)
    if (!chunks_[c]->shared.load()) write_out(c);
  leavers_from_ = c;
}

void DiskKvTier::truncate(int64_t tokens) noexcept {
  if (tokens >= tokens_) return;
  const size_t keep = static_cast<size_t>((tokens + kChunkTokens - 1) / kChunkTokens);
  for (size_t c = keep; c < chunks_.size(); ++c) tally(*chunks_[c], -1);
  chunks_.resize(keep);
  tokens_ = tokens;
  leavers_from_ = std::min(leavers_from_, chunks_.size());
}

void DiskKvTier::truncate_under_readers(int64_t tokens) noexcept {
  truncate(tokens);
  if (tokens_ % kChunkTokens != 0) chunks_.back()->shared.store(true);
}

int64_t DiskKvTier::fork_from(const KvTier& parent_tier) {
  const auto* parent = dynamic_cast<const DiskKvTier*>(&parent_tier);
  if (parent == nullptr) fail(PQ_ERR_INTERNAL, "a disk tier forks only from a disk tier");
  const size_t full = static_cast<size_t>(parent->tokens_ / kChunkTokens);
  const int64_t partial_rows = parent->tokens_ % kChunkTokens;
  std::shared_ptr<Chunk> last;
  if (partial_rows > 0)
    last = copy_chunk(*parent->chunks_[full], partial_rows,
                      budget_->reserve(chunk_charge_, "forking (a copy of the partial last chunk)",
                                       "; each layer of a fork copies its partial last chunk of "
                                       "256 tokens and shares the full ones"));
  std::vector<std::shared_ptr<Chunk>> chunks(parent->chunks_.begin(),
                                             parent->chunks_.begin() + full);
  if (last) chunks.push_back(std::move(last));
  for (size_t i = 0; i < full; ++i) chunks[i]->shared.store(true);
  chunks_ = std::move(chunks);
  recount();
  tokens_ = parent->tokens_;
  leavers_from_ = full;  // the shared chunks stay where they are
  return static_cast<int64_t>(full);
}

}  // namespace pq
