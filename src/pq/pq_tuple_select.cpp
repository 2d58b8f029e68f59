#include "pq/pq_tuple_select.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "pq/pq_index.h"
#include "pqcache.h"
#include "base/cpu_dispatch.h"
#include "base/topk.h"
#include "pq/pq_tuple_emit.h"

namespace pq {

namespace {

int32_t log2_of(int32_t centroids) {
  int32_t b = 0;
  while ((1 << b) < centroids) ++b;
  return b;
}

// The tuple of token i: code j in bits [j*b, (j+1)*b).
template <int M>
inline uint32_t tuple_of(const uint8_t* codes, int64_t i, int32_t b) {
  const uint8_t* c = codes + i * M;
  uint32_t t = 0;
  for (int j = 0; j < M; ++j) t |= static_cast<uint32_t>(c[j]) << (j * b);
  return t;
}
inline uint32_t tuple_of_any(const uint8_t* codes, int64_t i, int32_t m, int32_t b) {
  const uint8_t* c = codes + i * m;
  uint32_t t = 0;
  for (int32_t j = 0; j < m; ++j) t |= static_cast<uint32_t>(c[j]) << (j * b);
  return t;
}

// Adds the tuples of n tokens into h: `copies` interleaved tables of
// `tuples` entries (4 for small tables, so that equal tuples in a row do
// not wait on each other's stores).
template <int M>
void add_tuples(const uint8_t* codes, int64_t n, int32_t b, uint32_t tuples, int copies,
                uint32_t* h) {
  if (copies == 4) {
    const int64_t whole = n - n % 4;
    for (int64_t i = 0; i < whole; i += 4) {
      ++h[tuple_of<M>(codes, i, b)];
      ++h[tuples + tuple_of<M>(codes, i + 1, b)];
      ++h[2 * tuples + tuple_of<M>(codes, i + 2, b)];
      ++h[3 * tuples + tuple_of<M>(codes, i + 3, b)];
    }
    for (int64_t i = whole; i < n; ++i) ++h[tuple_of<M>(codes, i, b)];
  } else {
    for (int64_t i = 0; i < n; ++i) ++h[tuple_of<M>(codes, i, b)];
  }
}

// counts[t] = tokens of [first, end) whose tuple is t, over the column's runs.
void count_tuples(const CodeColumn& codes, int64_t first, int64_t end, int32_t m, int32_t b,
                  uint32_t tuples, std::vector<uint32_t>& counts) {
  const int copies = (m == 2 || m == 4) && tuples <= 4096 ? 4 : 1;
  counts.assign(static_cast<size_t>(copies) * tuples, 0);
  uint32_t* h = counts.data();
  codes.for_each_run(first, end, [&](int64_t, int64_t n, const uint8_t* p) {
    switch (m) {
      case 2: add_tuples<2>(p, n, b, tuples, copies, h); break;
      case 4: add_tuples<4>(p, n, b, tuples, copies, h); break;
      default:
        for (int64_t i = 0; i < n; ++i) ++h[tuple_of_any(p, i, m, b)];
        break;
    }
  });
  for (int c = 1; c < copies; ++c)
    for (uint32_t t = 0; t < tuples; ++t) h[t] += h[c * tuples + t];
  counts.resize(tuples);
}

// Takes the tuples of tokens [first, end) out of counts.
void uncount_tuples(const CodeColumn& codes, int64_t first, int64_t end, int32_t m, int32_t b,
                    std::vector<uint32_t>& counts) {
  codes.for_each_run(first, end, [&](int64_t, int64_t n, const uint8_t* p) {
    for (int64_t i = 0; i < n; ++i) --counts[tuple_of_any(p, i, m, b)];
  });
}

// The weighted top k over tuple keys: the key K of the k-th best token and
// how many tokens score above it. An MSD radix select, a byte per pass,
// where each tuple counts for its tokens.
struct Threshold {
  uint32_t key;
  int64_t above;  // tokens with a key > key
};
Threshold weighted_threshold(const std::vector<uint32_t>& keys, const std::vector<uint32_t>& weights,
                             int64_t k, std::vector<int32_t>& candidates,
                             std::vector<int32_t>& next) {
  candidates.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) candidates[i] = static_cast<int32_t>(i);
  uint64_t histogram[256];
  int64_t need = k, above = 0;
  uint32_t prefix = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    std::fill(histogram, histogram + 256, 0);
    for (int32_t c : candidates) histogram[(keys[c] >> shift) & 255] += weights[c];
    uint32_t bucket = 255;
    while (static_cast<int64_t>(histogram[bucket]) < need) {
      need -= static_cast<int64_t>(histogram[bucket]);
      above += static_cast<int64_t>(histogram[bucket]);
      --bucket;
    }
    prefix |= bucket << shift;
    next.clear();
    for (int32_t c : candidates)
      if (((keys[c] >> shift) & 255) == bucket) next.push_back(c);
    candidates.swap(next);
  }
  return Threshold{prefix, above};
}

// One token of step 4 (below): class c (2 above the threshold, 1 at it, 0
// below), taken if above or while ties remain; its position is written at
// out[w - 1] either way and kept by moving w down (no branch).
struct Emitter {
  int32_t* out;
  int64_t w;
  int64_t ties;
  PQ_ALWAYS_INLINE void visit(int64_t position, uint8_t c) {
    const bool tie = c == 1 && ties > 0;
    const bool take = c == 2 || tie;
    ties -= tie;
    out[w - 1] = static_cast<int32_t>(position);
    w -= take;
  }
};

void emit_positions(const CodeColumn& codes, int64_t first, int64_t n, int32_t m, int32_t b,
                    const std::vector<uint8_t>& cls_of_tuple, int64_t ties, int64_t k,
                    int32_t* out) {
  Emitter e{out, k, ties};
  const uint8_t* cls = cls_of_tuple.data();
  codes.for_each_run_reverse(first, first + n, [&](int64_t run_first, int64_t count,
                                                   const uint8_t* p) {
    if (m == 4) {
      for (int64_t i = count - 1; i >= 0 && e.w > 0; --i)
        e.visit(run_first + i, cls[tuple_of<4>(p, i, b)]);
    } else {
      for (int64_t i = count - 1; i >= 0 && e.w > 0; --i)
        e.visit(run_first + i, cls[tuple_of_any(p, i, m, b)]);
    }
  });
}

}  // namespace

int64_t pq_tuple_table_size(int32_t subspaces, int32_t centroids) {
  const int32_t bits = subspaces * log2_of(centroids);
  return bits <= 12 ? int64_t{1} << bits : 0;
}

void pq_index_count_tuples(PqIndex& index, int64_t from, int64_t to) {
  const int32_t m = index.codebook->subspaces, b = log2_of(index.codebook->centroids);
  const int64_t size = pq_tuple_table_size(m, index.codebook->centroids);
  if (size == 0) return;
  index.tuple_counts.resize(index.codes.size());
  for (size_t h = 0; h < index.codes.size(); ++h) {
    std::vector<uint32_t>& counts = index.tuple_counts[h];
    int64_t start = from;
    if (start == 0 || counts.size() != static_cast<size_t>(size)) {  // afresh
      counts.assign(static_cast<size_t>(size), 0);
      start = 0;
    }
    index.codes[h].for_each_run(start, to, [&](int64_t, int64_t n, const uint8_t* p) {
      for (int64_t i = 0; i < n; ++i) ++counts[tuple_of_any(p, i, m, b)];
    });
  }
}

// Eight tokens per tuple: where counting beats the row scan even on random
// keys, which present every tuple (measured on a 2-core AMD EPYC with
// AVX-512, 8 kv heads x 4 query heads: 2 x 8 bits at 128K tokens, tuples
// 5.2-5.8 ms against the scan's 1.5 ms; at 512K, 7.2 against 6.0-9.3 ms;
// 2 x 6 bits at 128K, tuples 0.98 against 2.4 ms).
bool pq_tuple_select_applies(int32_t subspaces, int32_t centroids, int64_t n) {
  const int32_t bits = subspaces * log2_of(centroids);
  return bits <= 16 && n >= (int64_t{8} << bits);
}

bool pq_tuple_select_pays(const CodeColumn& codes, int32_t subspaces, int32_t centroids,
                          int64_t first, int64_t n, SelectScratch& scratch) {
  const int32_t b = log2_of(centroids), bits = subspaces * b;
  if (bits > 16 || n < (int64_t{1} << bits)) return false;
  if (pq_tuple_select_applies(subspaces, centroids, n)) return true;
  // Between one and eight tokens per tuple: counting pays where the keys
  // repeat (2 x 8 bits at 128K tokens: 1.67 ms by tuples against 2.32 ms by
  // rows on clustered keys, 5.2-5.8 against 1.5 ms on random ones). A
  // sample of the middle tells which: at most one distinct tuple in four.
  constexpr int64_t kSample = 4096;
  const int64_t size = std::min(n, kSample);
  std::vector<uint8_t>& seen = scratch.chosen;
  seen.assign(size_t{1} << bits, 0);
  int64_t distinct = 0;
  for (int64_t s = 0; s < size; ++s) {
    const uint32_t t = tuple_of_any(codes.at(first + s * (n / size)), 0, subspaces, b);
    distinct += seen[t] == 0;
    seen[t] = 1;
  }
  return distinct * 4 <= size;
}

void pq_tuple_select(const float* lut, int32_t group_size, int32_t subspaces, int32_t centroids,
                     const CodeColumn& codes, int64_t n, int64_t first, int32_t combine,
                     float scale,
                     int64_t k, int32_t* out, SelectScratch& scratch,
                     const TupleCountTable& table) {
  const int32_t m = subspaces, b = log2_of(centroids);
  const uint32_t tuples = uint32_t{1} << (m * b);

  // 1. How many tokens hold each tuple: the kept table less the coded
  // tokens outside the middle, when they are fewer than the middle.
  std::vector<uint32_t>& counts = scratch.histogram;
  const int64_t after = table.coded - first - n;  // coded tokens past the middle
  if (table.counts && after >= 0 && first + after <= n) {
    counts.assign(table.counts, table.counts + tuples);
    uncount_tuples(codes, 0, first, m, b, counts);
    uncount_tuples(codes, first + n, table.coded, m, b, counts);
  } else {
    count_tuples(codes, first, first + n, m, b, tuples, counts);
  }

  // 2. The tuples present, their raw scores per query head (the per-token
  // pipeline's sums: pq_scores' order), their combined scores and keys.
  std::vector<int32_t>& used = scratch.tied;
  used.clear();
  for (uint32_t t = 0; t < tuples; ++t)
    if (counts[t] != 0) used.push_back(static_cast<int32_t>(t));
  const int64_t u = static_cast<int64_t>(used.size());
  std::vector<float>& raw = scratch.raw;
  raw.resize(static_cast<size_t>(group_size) * u);
  const uint32_t mask = (uint32_t{1} << b) - 1;
  for (int32_t g = 0; g < group_size; ++g) {
    const float* lq = lut + static_cast<size_t>(g) * m * centroids;
    float* rg = raw.data() + static_cast<size_t>(g) * u;
    for (int64_t i = 0; i < u; ++i) {
      const uint32_t t = static_cast<uint32_t>(used[static_cast<size_t>(i)]);
      if (m == 2) {
        rg[i] = lq[t & mask] + lq[centroids + (t >> b)];
      } else {
        float s = 0.f;
        for (int32_t j = 0; j < m; ++j) s += lq[j * centroids + ((t >> (j * b)) & mask)];
        rg[i] = s;
      }
    }
  }
  std::vector<uint32_t>& weights = scratch.weights;
  weights.resize(static_cast<size_t>(u));
  for (int64_t i = 0; i < u; ++i) weights[static_cast<size_t>(i)] = counts[used[static_cast<size_t>(i)]];
  std::vector<float>& combined = scratch.combined;
  combined.resize(static_cast<size_t>(u));
  if (combine == PQ_GQA_SUM_SOFTMAX && group_size > 1)
    combine_softmax_weighted(raw.data(), weights.data(), group_size, u, scale, combined.data(),
                             scratch);
  else  // elementwise: each tuple's score is exactly its tokens' score
    combine_group_scores(raw.data(), group_size, u, combine, scale, combined.data(), scratch);
  std::vector<uint32_t>& keys = scratch.keys;
  keys.resize(static_cast<size_t>(u));
  for (int64_t i = 0; i < u; ++i) keys[static_cast<size_t>(i)] = ordered_score_key(combined[i]);

  // 3. The threshold: tokens above it are in, and of the tokens at it the
  // last ones (ties go to the larger position), as many as still needed.
  const Threshold th = weighted_threshold(keys, weights, k, scratch.candidates, scratch.next);
  int64_t ties = k - th.above;
  // 4. The positions, ascending, k of them: the tuples above the threshold
  // and, of the tokens at it, the last `ties` (ties go to the larger
  // position). Each present tuple's class (2 above, 1 at, 0 below) goes
  // straight into the table the last pass reads.
  auto class_of = [&](int64_t i) {
    const uint32_t key = keys[static_cast<size_t>(i)];
    return static_cast<uint8_t>(key > th.key ? 2 : key == th.key ? 1 : 0);
  };
  if (m == 2) {
    // Forward, by code pairs: the tie tokens are counted first, so that the
    // last `ties` of them are the ones taken.
    PairClassTable table(scratch.pair_classes);
    const uint32_t mask = (uint32_t{1} << b) - 1;
    auto pair_of = [&](int32_t t) { return (t & mask) | ((static_cast<uint32_t>(t) >> b) << 8); };
    int64_t tie_tokens = 0;
    for (int64_t i = 0; i < u; ++i) {
      const uint8_t c = class_of(i);
      table.set(pair_of(used[static_cast<size_t>(i)]), c);
      if (c == PairClassTable::kTie) tie_tokens += weights[static_cast<size_t>(i)];
    }
    emit_chosen_pairs(codes, first, n, table, tie_tokens, ties, k, out);
    for (int32_t t : used) table.clear(pair_of(t));
  } else {
    // From the last token down, written from out[k - 1] down.
    std::vector<uint8_t>& cls = scratch.chosen;
    cls.assign(tuples, 0);
    for (int64_t i = 0; i < u; ++i) cls[static_cast<size_t>(used[static_cast<size_t>(i)])] = class_of(i);
    emit_positions(codes, first, n, m, b, cls, ties, k, out);
  }
}

}  // namespace pq
