// InfLLM (Xiao et al., "InfLLM: Training-Free Long-Context Extrapolation for
// LLMs with an Efficient Context Memory"): the middle is cut into blocks of
// config.block_tokens tokens aligned to absolute positions (block b = tokens
// [b*B, (b+1)*B), clipped to the middle). Each block keeps R =
// config.block_representatives representative keys; a query head scores a
// block with the largest q.k over its representatives. The group's block
// scores are combined like token scores (config.gqa_combine over the blocks),
// whole blocks are taken in score order (ties: the later block) until k
// tokens are chosen, and the last block taken is cut to its highest positions
// (the most recent tokens, which costs no read).
//
// Representatives. InfLLM picks the tokens of a block that received the most
// attention from the queries of the tokens around them (sum_j q_j . k_i over
// the local window when the block was formed). Those queries never reach the
// library (pq_prefill_queries carries only the last observation_window), so
// the proxy replaces sum_j q_j by the block's own mean key: the
// representatives are the R keys with the largest k_i . mean(k) (ties: the
// earlier token). They are the keys most aligned with what the block as a
// whole contains, so a query that matches the block's content scores high on
// them; evenly spaced tokens would instead represent a block by arbitrary
// members. With R >= the block's tokens every token is a representative and
// the block score is the exact max of q.k over the block.
//
// The partial block at the end of the middle (fewer than B tokens so far) is
// scored like the others, with min(R, its tokens) representatives chosen
// among the tokens it has; it is re-summarised whenever it grows.
//
// The representatives (positions) live in the per-(sequence, layer) state;
// update_state() re-summarises only the blocks that gained tokens since the
// last call. Bytes read per selection and kv head: sum over the blocks of
// min(R, block tokens) * head_dim * element_size (the representative keys;
// blocks * R * head_dim * element_size when every block has >= R tokens).
// k == 0 or k == middle reads nothing.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/dtype.h"
#include "selectors/blocks.h"
#include "base/error.h"
#include "selectors/selection_request.h"
#include "selectors/selector.h"
#include "base/topk.h"
#include "base/vector_math.h"

namespace pq {

namespace {

// Representatives of the middle [mid_begin, covered_end) of every kv head.
struct InfllmState final : CopyableState<InfllmState>, BlockCoverage {
  // per kv head: [block][R] positions, ascending, -1 past the block's count;
  // block j is the absolute block mid_begin / B + j.
  std::vector<std::vector<int32_t>> reps;
  // Rebuilt from the keys at the next select; the summaries' memory goes now.
  void truncate(int64_t) override {
    forget();
    std::vector<std::vector<int32_t>>().swap(reps);
  }
  void save(ByteWriter&) const override {}
  void load(ByteReader&, int64_t, const pq_config&) override { forget(); }
};

// Working memory of summarise().
struct SummaryScratch {
  std::vector<float> keys;   // tokens x d
  std::vector<float> mean;   // d
  std::vector<float> score;  // tokens
  std::vector<int32_t> order;
};

// Chooses the representatives of tokens [begin, end) of one head (see the
// file comment) into reps[0, R), ascending, -1 for the slots past end-begin.
void summarise(const KvTier& store, int32_t dtype, int32_t d, int32_t head, int64_t begin,
               int64_t end, int32_t R, int32_t* reps, SummaryScratch& s) {
  const int32_t len = static_cast<int32_t>(end - begin);
  std::fill(reps, reps + R, -1);
  if (len <= R) {
    for (int32_t i = 0; i < len; ++i) reps[i] = static_cast<int32_t>(begin + i);
    return;
  }
  s.keys.resize(static_cast<size_t>(len) * d);
  s.mean.assign(static_cast<size_t>(d), 0.f);
  store.keys_as_float(head, begin, len, s.keys.data());
  for (int32_t i = 0; i < len; ++i) {
    const float* k = s.keys.data() + static_cast<size_t>(i) * d;
    for (int32_t x = 0; x < d; ++x) s.mean[static_cast<size_t>(x)] += k[x];
  }
  for (float& v : s.mean) v /= static_cast<float>(len);
  s.score.resize(static_cast<size_t>(len));
  s.order.resize(static_cast<size_t>(len));
  for (int32_t i = 0; i < len; ++i) {
    s.score[static_cast<size_t>(i)] = dot(s.keys.data() + static_cast<size_t>(i) * d,
                                          s.mean.data(), d);
    s.order[static_cast<size_t>(i)] = i;
  }
  std::partial_sort(s.order.begin(), s.order.begin() + R, s.order.end(),
                    [&s](int32_t a, int32_t b) {
                      float sa = s.score[static_cast<size_t>(a)];
                      float sb = s.score[static_cast<size_t>(b)];
                      return sa != sb ? sa > sb : a < b;
                    });
  std::sort(s.order.begin(), s.order.begin() + R);
  for (int32_t i = 0; i < R; ++i)
    reps[i] = static_cast<int32_t>(begin + s.order[static_cast<size_t>(i)]);
}

// Re-summarises one head's blocks that contain tokens [from, to) of the
// middle [mid_begin, to); reps grows to the block count.
void extend_head(const KvTier& store, int32_t dtype, int32_t d, int32_t head, int64_t mid_begin,
                 int64_t from, int64_t to, int32_t B, int32_t R, std::vector<int32_t>& reps,
                 SummaryScratch& s) {
  if (to <= from) return;
  const int64_t first_block = mid_begin / B;
  const int64_t nb = block_count(mid_begin, to, B);
  reps.resize(static_cast<size_t>(nb) * R, -1);
  for (int64_t j = from / B - first_block; j < nb; ++j) {
    int64_t begin = std::max((first_block + j) * B, mid_begin);
    int64_t end = std::min((first_block + j + 1) * B, to);
    summarise(store, dtype, d, head, begin, end, R, reps.data() + static_cast<size_t>(j) * R, s);
  }
}

class InfllmSelector final : public Selector {
 public:
  const char* name() const override { return "infllm"; }

  std::unique_ptr<SelectorState> make_state(const pq_config& c, int32_t layer) const override {
    return std::make_unique<InfllmState>();
  }
  StateCost state_cost(const pq_config& c) const override {  // representatives per block
    return {sizeof(InfllmState),
            per_block_cost(c, c.block_tokens,
                           static_cast<uint64_t>(c.block_representatives) * sizeof(int32_t))};
  }

  void update_state(SelectorState* state, const KvTier& store, int64_t, int64_t mid_begin,
                    int64_t mid_end, const pq_config& c) const override {
    InfllmState* s = &state_of<InfllmState>(state, "infllm");
    if (mid_end == mid_begin) return;
    if (s->restart_if_stale(mid_begin, mid_end, c.block_tokens, c.block_representatives))
      s->reps.assign(static_cast<size_t>(c.num_kv_heads), {});
    SummaryScratch scratch;
    for (int32_t h = 0; h < c.num_kv_heads; ++h)
      extend_head(store, c.dtype, c.head_dim, h, mid_begin, s->covered_end, mid_end,
                  c.block_tokens, c.block_representatives, s->reps[static_cast<size_t>(h)],
                  scratch);
    s->covered_end = mid_end;
  }

  uint64_t select_middle(const SelectionRequest& r, int32_t* out) const override {
    if (select_without_scoring(r, out)) return 0;
    const int32_t B = r.config().block_tokens, R = r.config().block_representatives;
    const int32_t d = r.head_dim(), G = r.group_size();
    const int64_t nb = block_count(r.mid_begin(), r.mid_end(), B);
    const InfllmState* s = &state_of<const InfllmState>(r.state(), "infllm");
    // The core calls update_state with this very middle just before.
    if (!s->covers(r.mid_begin(), r.mid_end()))
      fail(PQ_ERR_INTERNAL, "infllm: block summaries do not cover the middle being selected");
    const int32_t* reps = s->reps[static_cast<size_t>(r.kv_head)].data();

    std::vector<float>& raw = r.scratch.raw;
    raw.assign(static_cast<size_t>(G) * nb, -std::numeric_limits<float>::infinity());
    std::vector<float> key(static_cast<size_t>(d));
    uint64_t read = 0;
    for (int64_t j = 0; j < nb; ++j) {
      for (int32_t i = 0; i < R; ++i) {
        const int32_t p = reps[static_cast<size_t>(j) * R + i];
        if (p < 0) break;
        r.store().keys_as_float(r.kv_head, &p, 1, key.data());
        ++read;
        for (int32_t g = 0; g < G; ++g) {
          float& best = raw[static_cast<size_t>(g) * nb + j];
          best = std::max(best, dot(r.queries() + static_cast<size_t>(g) * d, key.data(), d));
        }
      }
    }
    std::vector<float>& combined = r.scratch.combined;
    combined.resize(static_cast<size_t>(nb));
    combine_group_scores(raw.data(), G, nb, r.combine(), r.scale(), combined.data(), r.scratch);
    take_blocks(r, B, combined.data(), nb, out);
    return read * r.store().row_bytes();
  }
};

}  // namespace

std::unique_ptr<Selector> make_infllm_selector() { return std::make_unique<InfllmSelector>(); }

}  // namespace pq
