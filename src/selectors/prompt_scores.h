// Prompt-token scores from an observation window (SnapKV, section 4.2 of
// the methods digest), shared by SnapKV, PyramidKV and SCOPE's prompt side.
//
// pq_prefill_queries hands the selector the last w prompt queries of a layer
// (w = min(tokens, observation_window)). With P the number of tokens stored
// at that moment (the prompt), the query of window row i sits at prompt
// position P - w + i and, causally, sees the keys [0, P - w + i]. For every kv
// head and every query head g of its GQA group:
//   p[g][i][t] = softmax_t(q[g][i] . k[t] / sqrt(head_dim)),  t <= P - w + i
//   raw[t]     = sum over i and g of p[g][i][t]
//   score[t]   = max of raw over [t - K/2, t + K/2] clipped to t's span
//                (PQ_POOLING_MAX), or the sum of raw there / K
//                (PQ_POOLING_AVG: zero padding counted, as torch's
//                avg_pool1d, count_include_pad, in the official SnapKV
//                code and kvpress)
// (K = pooling_kernel, odd; "same" padding that never wins a max; K = 1 is
// no pooling). t's span is [0, P - w) for the tokens before the window and
// [P - w, P) for the window's own: the official code and kvpress score and
// pool only attn_weights[..., :-window] (the window is always kept), so the
// window's large attention must not lift the last K/2 tokens before it; the
// window's tokens, which the library ranks like the others when
// local_tokens < w, are pooled among themselves. The scores are static: they
// are computed once, here, reading every prompt key once, and never updated
// during decode. A later call replaces them (all stored tokens are rescored
// against the new window).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "base/cut_to.h"
#include "base/dtype.h"
#include "base/error.h"
#include "selectors/selection_request.h"
#include "selectors/selector.h"
#include "format/state_io.h"
#include "base/topk.h"
#include "base/vector_math.h"

namespace pq {

// pq_prefill_queries hands w queries of a layer holding P tokens: w <= P.
inline void check_window(int64_t w, int64_t P) {
  if (w > P)
    fail(PQ_ERR_INVALID_ARGUMENT,
         "pq_prefill_queries: the last " + std::to_string(w) +
             " queries are used but the layer holds only " + std::to_string(P) +
             " tokens; pass the queries of the prompt tokens already stored");
}

// q . k * scale as a window row's logit: the float dot, or where that
// overflows (queries and keys near FLT_MAX, which the library accepts) the
// double one clamped to the float range. A row of finite logits keeps its
// softmax a distribution (inf - inf is NaN), so the scores built from it
// stay finite, and a state the library saves restores (issue 39).
inline float window_logit(const float* q, const float* k, int32_t d, float scale) {
  const float v = dot(q, k, d) * scale;
  if (std::isfinite(v)) return v;
  double s = 0.0;
  for (int32_t e = 0; e < d; ++e) s += static_cast<double>(q[e]) * k[e];
  const double most = std::numeric_limits<float>::max();
  return static_cast<float>(std::clamp(s * scale, -most, most));
}

// The scaled logits of kv head h's window rows over the keys each sees:
// row r = i * group + g is window query i (prompt position P - w + i) of
// query head h * group + g, and row(r, logits, n) gets
// logits[t] = q . k[t] / sqrt(head_dim) for its n = P - w + i + 1 keys.
// Rows come in blocks so the logits stay under 16 MiB for long prompts; each
// key is converted once per block.
template <class Row>
void for_each_window_row(const KvTier& store, const float* queries, int64_t w,
                         const pq_config& c, int32_t h, Row row) {
  const int64_t P = store.tokens();
  const int32_t q_heads = c.num_q_heads, d = c.head_dim;
  const int32_t group = q_heads / c.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t rows = w * group;
  constexpr int64_t kMaxLogits = int64_t{1} << 22;
  const int64_t block_rows =
      std::max<int64_t>(1, std::min<int64_t>(rows, kMaxLogits / std::max<int64_t>(P, 1)));
  constexpr int64_t kKeyBlock = 256;
  std::vector<float> logits(static_cast<size_t>(block_rows * std::max<int64_t>(P, 1)));
  std::vector<float> keys(static_cast<size_t>(kKeyBlock) * d);
  auto query = [&](int64_t r) {
    const int64_t i = r / group, g = r % group;
    return queries + (static_cast<size_t>(i) * q_heads + h * group + g) * d;
  };
  auto seen = [&](int64_t r) { return P - w + r / group + 1; };  // keys row r sees
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
    const int64_t r1 = std::min(rows, r0 + block_rows);
    for (int64_t t0 = 0; t0 < P; t0 += kKeyBlock) {
      const int64_t t1 = std::min(P, t0 + kKeyBlock);
      store.keys_as_float(h, t0, t1 - t0, keys.data());
      for (int64_t r = r0; r < r1; ++r) {
        const float* q = query(r);
        float* l = logits.data() + (r - r0) * P;
        const int64_t end = std::min(t1, seen(r));
        for (int64_t t = t0; t < end; ++t) l[t] = window_logit(q, keys.data() + (t - t0) * d, d, scale);
      }
    }
    for (int64_t r = r0; r < r1; ++r) row(r, logits.data() + (r - r0) * P, seen(r));
  }
}

// Adds weight * softmax(logits[0, n)) to out[0, n), in double: one window
// row's attention (SnapKV's sum: weight 1; PyramidInfer's rows weighted by
// recency; FastGen's profile).
inline void add_softmax(const float* logits, int64_t n, double weight, double* out) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < n; ++t) mx = std::max(mx, logits[t]);
  double total = 0.0;
  for (int64_t t = 0; t < n; ++t) total += std::exp(static_cast<double>(logits[t]) - mx);
  const double scale = weight / total;
  for (int64_t t = 0; t < n; ++t) out[t] += std::exp(static_cast<double>(logits[t]) - mx) * scale;
}

// Loaded scores that are sums of attention probabilities: finite and >= 0
// (a NaN would break the top-k's order), else PQ_ERR_CORRUPT naming `what`.
inline void check_attention_scores(ByteReader& in, const std::vector<float>& s, const char* what) {
  for (size_t t = 0; t < s.size(); ++t)
    if (!(s[t] >= 0.f && s[t] < std::numeric_limits<float>::infinity()))
      in.corrupt(std::string("the ") + what + " of token " + std::to_string(t) + " is " +
                 number_text(s[t]) + "; expected a finite value >= 0");
}

struct PromptScores {
  static constexpr uint64_t kBytesPerToken = sizeof(float);  // per kv head
  // score[kv_head][t] for the prompt tokens t < prompt_tokens.
  std::vector<std::vector<float>> score;
  // Tokens stored at the last pq_prefill_queries; -1 before the first one.
  int64_t prompt_tokens = -1;

  bool ready() const { return prompt_tokens >= 0; }

  // Sequence state: the scores of the tokens kept stay as they were
  // computed (from the window that was observed then).
  void truncate(int64_t tokens) {
    if (prompt_tokens <= tokens) return;
    prompt_tokens = tokens;
    for (auto& s : score) cut_to(s, static_cast<size_t>(tokens));
  }
  void save(ByteWriter& out) const {
    out.put<int64_t>(prompt_tokens);
    out.put<uint32_t>(static_cast<uint32_t>(score.size()));
    for (const auto& s : score) out.put_vector(s);
  }
  void load(ByteReader& in, int64_t tokens, int32_t kv_heads) {
    prompt_tokens = in.get<int64_t>("prompt scores: prompt tokens");
    if (prompt_tokens < -1 || prompt_tokens > tokens)
      in.corrupt("prompt scores cover " + std::to_string(prompt_tokens) +
                 " tokens; the layer holds " + std::to_string(tokens));
    const uint32_t heads = in.get<uint32_t>("prompt scores: kv heads");
    if (heads != (ready() ? static_cast<uint32_t>(kv_heads) : 0u))
      in.corrupt("prompt scores have " + std::to_string(heads) + " kv heads; expected " +
                 std::to_string(ready() ? kv_heads : 0));
    score.assign(heads, {});
    for (auto& s : score) {
      s = in.get_vector<float>("prompt scores", static_cast<uint64_t>(prompt_tokens));
      if (static_cast<int64_t>(s.size()) != prompt_tokens)
        in.corrupt("a kv head has " + std::to_string(s.size()) + " prompt scores; expected " +
                   std::to_string(prompt_tokens));
      check_attention_scores(in, s, "prompt score");
    }
  }

  void compute(const KvTier& store, const float* queries, int64_t w, const pq_config& c) {
    const int64_t P = store.tokens();
    check_window(w, P);
    std::vector<double> raw(static_cast<size_t>(P));
    std::vector<std::vector<float>> out(static_cast<size_t>(c.num_kv_heads));
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      std::fill(raw.begin(), raw.end(), 0.0);
      for_each_window_row(store, queries, w, c, h, [&](int64_t, const float* l, int64_t n) {
        add_softmax(l, n, 1.0, raw.data());
      });
      std::vector<float>& s = out[static_cast<size_t>(h)];
      s.resize(static_cast<size_t>(P));
      const int64_t half = c.pooling_kernel / 2;
      for (int64_t t = 0; t < P; ++t) {
        // The span t pools over: the tokens before the window, or the window.
        const int64_t span_begin = t < P - w ? 0 : P - w, span_end = t < P - w ? P - w : P;
        const int64_t lo = std::max(span_begin, t - half), hi = std::min(span_end - 1, t + half);
        double m = raw[static_cast<size_t>(t)];
        if (c.pooling == PQ_POOLING_AVG) {  // zero padding counted, as avg_pool1d
          double sum = 0.0;
          for (int64_t u = lo; u <= hi; ++u) sum += raw[static_cast<size_t>(u)];
          m = sum / static_cast<double>(c.pooling_kernel);
        } else {
          for (int64_t u = lo; u <= hi; ++u) m = std::max(m, raw[static_cast<size_t>(u)]);
        }
        s[static_cast<size_t>(t)] = static_cast<float>(m);
      }
    }
    score.swap(out);
    prompt_tokens = P;
  }

  // Writes the k positions of [begin, end) with the highest prompt scores
  // into out, ascending (ties: the larger position). Tokens at or after
  // prompt_tokens have no prompt score and rank +infinity (kept first).
  void select(const SelectionRequest& r, int64_t begin, int64_t end, int64_t k,
              int32_t* out) const {
    const int64_t m = end - begin;
    if (k <= 0 || m <= 0) return;
    std::vector<float>& buf = r.scratch.combined;
    buf.resize(static_cast<size_t>(m));
    const std::vector<float>& s = score[static_cast<size_t>(r.kv_head)];
    const int64_t scored = std::min(end, prompt_tokens);
    int64_t i = 0;
    for (; begin + i < scored; ++i) buf[static_cast<size_t>(i)] = s[static_cast<size_t>(begin + i)];
    for (; i < m; ++i) buf[static_cast<size_t>(i)] = std::numeric_limits<float>::infinity();
    select_top_k(buf.data(), m, k, begin, out, r.scratch);
  }
};

// The error of a prompt-scoring selector asked to select before any
// pq_prefill_queries call on the layer.
[[noreturn]] inline void fail_needs_prefill_queries(const char* selector, int32_t layer) {
  fail(PQ_ERR_BAD_STATE,
       std::string("layer ") + std::to_string(layer) + ": the " + selector +
           " selector scores the prompt from its observation window and has no scores yet; "
           "call pq_prefill_queries with the last prompt queries of this layer (after "
           "pq_prefill_layer) before pq_decode_select");
}

// Per-(sequence, layer) state of SnapKV and PyramidKV.
struct PromptState final : CopyableState<PromptState> {
  explicit PromptState(int32_t l) : layer(l) {}
  int32_t layer;
  PromptScores prompt;
  void truncate(int64_t tokens) override { prompt.truncate(tokens); }
  void save(ByteWriter& out) const override { prompt.save(out); }
  void load(ByteReader& in, int64_t tokens, const pq_config& c) override {
    prompt.load(in, tokens, c.num_kv_heads);
  }
};

// SnapKV's selection, which PyramidKV reuses with its own budget(): the top
// k middle tokens by static prompt score, unscored (later) tokens first.
class PromptScoreSelector : public Selector {
 public:
  bool selects_without_changing_state() const override { return true; }
  std::unique_ptr<SelectorState> make_state(const pq_config&, int32_t layer) const override {
    return std::make_unique<PromptState>(layer);
  }
  StateCost state_cost(const pq_config& c) const override {
    return {sizeof(PromptState), per_token_cost(c, PromptScores::kBytesPerToken)};
  }

  void observe_queries(SelectorState* state, const KvTier& store, const float* queries,
                       int64_t w, const pq_config& c) const override {
    state_of<PromptState>(state, name()).prompt.compute(store, queries, w, c);
  }

  // The core calls this before it writes any output, so failing here keeps
  // pq_decode_select's promise that *out is written only on success.
  void update_state(SelectorState* state, const KvTier&, int64_t, int64_t, int64_t,
                    const pq_config&) const override {
    const PromptState& s = state_of<PromptState>(state, name());
    if (!s.prompt.ready()) fail_needs_prefill_queries(name(), s.layer);
  }

  uint64_t select_middle(const SelectionRequest& r, int32_t* out) const override {
    PromptState& s = state_of<PromptState>(r.state(), name());
    if (!s.prompt.ready()) fail_needs_prefill_queries(name(), r.layer_index());
    s.prompt.select(r, r.mid_begin(), r.mid_end(), r.k(), out);
    return 0;  // the prompt keys were read once, at pq_prefill_queries
  }
};

}  // namespace pq
