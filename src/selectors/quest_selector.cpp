// Quest (Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context
// LLM Inference"): the middle is cut into blocks of config.block_tokens
// tokens aligned to absolute positions (block b = tokens [b*B, (b+1)*B),
// clipped to the middle). Each block keeps the element-wise min and max of
// its keys; a query head scores it with
//   bound = sum_d max(q_d * min_d, q_d * max_d)  >=  q.k for every key k in it.
// The group's bounds are combined like token scores (config.gqa_combine over
// the blocks: with PQ_GQA_MAX the combined score is still an upper bound of
// every token's combined score; SUM_SOFTMAX and MEAN are the same heuristics
// the token selectors use). Whole blocks are taken in score order (ties: the
// later block) until k tokens are chosen; the last block taken is cut to its
// highest positions (the most recent tokens, which costs no read).
//
// The partial block at the end of the middle (fewer than B tokens so far) is
// scored like the others, with the min/max of the tokens it has.
//
// The summaries live in the per-(sequence, layer) state and are extended in
// update_state() with the tokens that joined the middle since the last call,
// so a decode step reads each new key once. Bytes read per selection and kv
// head: blocks * 2 * head_dim * element_size (the min and max rows, counted
// at the stored element size). k == 0 or k == middle reads nothing.
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

namespace pq {

namespace {

// Summaries of the middle [mid_begin, covered_end) of every kv head.
struct QuestState final : CopyableState<QuestState>, BlockCoverage {
  // per kv head: [block][2][head_dim], min row then max row; block j is the
  // absolute block mid_begin / B + j.
  std::vector<std::vector<float>> minmax;
  // Rebuilt from the keys at the next select; the summaries' memory goes now.
  void truncate(int64_t) override {
    forget();
    std::vector<std::vector<float>>().swap(minmax);
  }
  void save(ByteWriter&) const override {}
  void load(ByteReader&, int64_t, const pq_config&) override { forget(); }
};

// Extends one head's summaries with tokens [from, to) of the middle that
// starts at mid_begin. keys is scratch: the keys are read a run of
// kKeyRun tokens at a time (one read per run from a tier that reads files).
constexpr int64_t kKeyRun = 256;
void extend_head(const KvTier& store, int32_t d, int32_t head, int64_t mid_begin, int64_t from,
                 int64_t to, int32_t B, std::vector<float>& mm, std::vector<float>& keys) {
  const int64_t first_block = mid_begin / B;
  keys.resize(static_cast<size_t>(std::min(kKeyRun, std::max<int64_t>(to - from, 0))) * d);
  for (int64_t run = from; run < to; run += kKeyRun) {
    const int64_t n = std::min(kKeyRun, to - run);
    store.keys_as_float(head, run, n, keys.data());
    for (int64_t t = run; t < run + n; ++t) {
      const float* key = keys.data() + (t - run) * d;
      const size_t j = static_cast<size_t>(t / B - first_block);
      const size_t at = j * 2 * static_cast<size_t>(d);
      if (mm.size() <= at) {  // the first token of a new block
        mm.resize(at + 2 * static_cast<size_t>(d));
        std::copy(key, key + d, mm.begin() + static_cast<std::ptrdiff_t>(at));
        std::copy(key, key + d, mm.begin() + static_cast<std::ptrdiff_t>(at + d));
        continue;
      }
      float* mn = mm.data() + at;
      float* mx = mn + d;
      for (int32_t i = 0; i < d; ++i) {
        mn[i] = std::min(mn[i], key[i]);
        mx[i] = std::max(mx[i], key[i]);
      }
    }
  }
}

class QuestSelector final : public Selector {
 public:
  const char* name() const override { return "quest"; }

  std::unique_ptr<SelectorState> make_state(const pq_config& c, int32_t layer) const override {
    return std::make_unique<QuestState>();
  }
  StateCost state_cost(const pq_config& c) const override {  // a min and a max row per block
    return {sizeof(QuestState),
            per_block_cost(c, c.block_tokens, 2 * static_cast<uint64_t>(c.head_dim) * sizeof(float))};
  }

  void update_state(SelectorState* state, const KvTier& store, int64_t, int64_t mid_begin,
                    int64_t mid_end, const pq_config& c) const override {
    QuestState* s = &state_of<QuestState>(state, "quest");
    if (mid_end == mid_begin) return;
    if (s->restart_if_stale(mid_begin, mid_end, c.block_tokens, 0))
      s->minmax.assign(static_cast<size_t>(c.num_kv_heads), {});
    std::vector<float> key;
    for (int32_t h = 0; h < c.num_kv_heads; ++h)
      extend_head(store, c.head_dim, h, mid_begin, s->covered_end, mid_end,
                  c.block_tokens, s->minmax[static_cast<size_t>(h)], key);
    s->covered_end = mid_end;
  }

  uint64_t select_middle(const SelectionRequest& r, int32_t* out) const override {
    if (select_without_scoring(r, out)) return 0;
    const int32_t B = r.config().block_tokens, d = r.head_dim(), G = r.group_size();
    const int64_t nb = block_count(r.mid_begin(), r.mid_end(), B);
    const QuestState* s = &state_of<const QuestState>(r.state(), "quest");
    // The core calls update_state with this very middle just before.
    if (!s->covers(r.mid_begin(), r.mid_end()))
      fail(PQ_ERR_INTERNAL, "quest: block summaries do not cover the middle being selected");
    const float* mm = s->minmax[static_cast<size_t>(r.kv_head)].data();

    std::vector<float>& raw = r.scratch.raw;
    raw.resize(static_cast<size_t>(G) * nb);
    for (int64_t j = 0; j < nb; ++j) {
      const float* mn = mm + static_cast<size_t>(j) * 2 * d;
      const float* mx = mn + d;
      for (int32_t g = 0; g < G; ++g) {
        const float* q = r.queries() + static_cast<size_t>(g) * d;
        float bound = 0.f;
        for (int32_t i = 0; i < d; ++i) bound += std::max(q[i] * mn[i], q[i] * mx[i]);
        raw[static_cast<size_t>(g) * nb + j] = bound;
      }
    }
    std::vector<float>& combined = r.scratch.combined;
    combined.resize(static_cast<size_t>(nb));
    combine_group_scores(raw.data(), G, nb, r.combine(), r.scale(), combined.data(), r.scratch);
    take_blocks(r, B, combined.data(), nb, out);
    return static_cast<uint64_t>(nb) * 2 * r.store().row_bytes();
  }
};

}  // namespace

std::unique_ptr<Selector> make_quest_selector() { return std::make_unique<QuestSelector>(); }

}  // namespace pq
