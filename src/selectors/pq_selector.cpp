// PQCache (paper section 3.4): score every middle token through a lookup
// table of query sub-vector x centroid dot products, summed over the codes.
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <vector>

#include "base/dtype.h"
#include "base/topk.h"
#include "base/vector_math.h"
#include "pq/outliers.h"
#include "pq/pq_softmax_scan.h"
#include "pq/pq_tuple_select.h"
#include "pq/rerank.h"
#include "backend/device_kernels.h"
#include "selectors/selection_request.h"
#include "selectors/selector.h"
#include "selectors/selector_capabilities.h"

namespace pq {

namespace {

class PqSelector final : public Selector, public BatchSelection {
 public:
  const char* name() const override { return "pq"; }
  const BatchSelection* batch_selection() const override { return this; }
  bool needs_index() const override { return true; }
  // The index: centroids (kv heads x 2^b x head_dim floats) and one code
  // byte per subspace, token and kv head (and the outliers' positions);
  // twice, for a rebuild's new index while the old one serves.
  StateCost state_cost(const pq_config& c) const override {
    // The centroids, and their layout for the kernels (centroid_layouts.h).
    const uint64_t centroids =
        static_cast<uint64_t>(c.num_kv_heads) * (uint64_t{1} << c.pq_bits) * c.head_dim *
            sizeof(float) +
        (c.pq_subspaces > 0
             ? CentroidLayouts::bytes_for(static_cast<uint64_t>(c.num_kv_heads) * c.pq_subspaces,
                                          int64_t{1} << c.pq_bits, c.head_dim / c.pq_subspaces)
             : 0);
    // Per chunk: a code byte per subspace, and (pq_outliers) the outliers'
    // positions, the share of the chunk at 4 bytes each.
    const uint64_t outliers = static_cast<uint64_t>(std::ceil(
        static_cast<double>(c.pq_outliers) * KvStore::kChunkTokens)) * sizeof(int32_t);
    const uint64_t codes = static_cast<uint64_t>(KvStore::kChunkTokens) * c.num_kv_heads *
                               c.pq_subspaces + outliers * c.num_kv_heads;
    // The tuple count tables (pq_tuple_select.h), where kept.
    const uint64_t tables = static_cast<uint64_t>(c.num_kv_heads) *
                            pq_tuple_table_size(c.pq_subspaces, 1 << c.pq_bits) * sizeof(uint32_t);
    return {2 * (sizeof(PqIndex) + centroids + tables), 2 * codes};
  }

  // The host path for one kv head: its LUT, a scan of its codes, the
  // combine and the top k.
  uint64_t select_middle(const SelectionRequest& r, int32_t* out) const override {
    if (select_without_scoring(r, out)) return 0;
    const PqCodebook& cb = *r.index()->codebook;
    std::vector<float> lut(cb.lut_floats(r.group_size()));
    cb.lut(r.kv_head, r.queries(), r.group_size(), r.head_dim(), lut.data());
    const int64_t wide_k = candidates(r.layer);
    if (wide_k == r.k()) return scan_on_host(r, lut.data(), out);
    LayerSelection wide = r.layer;
    wide.k = wide_k;
    std::vector<int32_t> picked(static_cast<size_t>(wide_k));
    const uint64_t bytes = scan_on_host(SelectionRequest{wide, r.kv_head, r.scratch}, lut.data(),
                                        picked.data());
    return bytes + rerank(r, picked.data(), wide_k, out);
  }

  // The whole layer: every head's LUT at once, then one device selection
  // (one upload, scan, top-k and wait for all heads) where the backend has
  // a device, else the host path head by head. With pq_rerank, that picks
  // the candidates and the host re-ranks them.
  uint64_t select_layer(const LayerSelection& r, int32_t* out) const override {
    if (trivial(r)) return Selector::select_layer(r, out);  // nothing to score
    const int64_t wide_k = candidates(r);
    if (wide_k == r.k) return pick(r, out);
    LayerSelection wide = r;
    wide.k = wide_k;
    std::vector<int32_t> picked(static_cast<size_t>(wide_k) * r.context.kv_heads());
    const uint64_t bytes = pick(wide, picked.data());
    return bytes + rerank_layer(r, picked.data(), wide_k, out);
  }

  // A batch of sequences at one layer: every LUT on the host, then one
  // device call for all of them where the backend has one.
  void select_layers(const std::vector<const LayerSelection*>& requests,
                     const std::vector<int32_t*>& outs,
                     std::vector<uint64_t>& bytes) const override {
    bytes.assign(requests.size(), 0);
    // Re-ranking goes request by request (one device call each, then the
    // host's exact scores), and so do outliers and top-p (host only): the
    // batch shares one configuration.
    if (!requests.empty() && (requests.front()->context.config.pq_rerank > 0.f ||
                              host_only(*requests.front()))) {
      for (size_t i = 0; i < requests.size(); ++i) bytes[i] = select_layer(*requests[i], outs[i]);
      return;
    }
    std::vector<std::vector<float>> luts(requests.size());
    std::vector<PqLayerSelectArgs> args;
    std::vector<int32_t*> device_outs;
    std::vector<size_t> scored;  // requests in args, by index
    for (size_t i = 0; i < requests.size(); ++i) {
      const LayerSelection& r = *requests[i];
      if (trivial(r)) {
        bytes[i] = Selector::select_layer(r, outs[i]);
        continue;
      }
      luts[i] = layer_luts(r);
      args.push_back(r.pq_args(luts[i].data()));
      device_outs.push_back(outs[i]);
      scored.push_back(i);
    }
    if (scored.empty()) return;
    const DeviceKernels* device = requests[scored.front()]->backend.device_kernels();
    const bool on_device = device != nullptr && device->pq_select_batch(args, device_outs);
    for (size_t i : scored)
      bytes[i] = on_device ? bytes_read(*requests[i])
                           : scan_layer_on_host(*requests[i], luts[i], outs[i]);
  }

 private:
  // Nothing to score: no budget, or every middle token (unless top-p
  // chooses fewer).
  static bool trivial(const LayerSelection& r) {
    return r.k == 0 || (r.k >= r.middle.size() && !adapts_budget(r));
  }
  // config.pq_outliers: exact scores for the outliers, on the host only.
  static bool scores_outliers(const LayerSelection& r) { return r.context.config.pq_outliers > 0.f; }
  // config.top_p: budgets per head from the scores, on the host only.
  static bool adapts_budget(const LayerSelection& r) { return r.context.config.top_p > 0.f; }
  // Whether the device selections serve the configuration.
  static bool host_only(const LayerSelection& r) { return scores_outliers(r) || adapts_budget(r); }

  // The candidates per kv head the codes pick (pq/rerank.h).
  static int64_t candidates(const LayerSelection& r) {
    return rerank_candidates(r.context.config.pq_rerank, r.k, r.middle.size());
  }

  // The codes' top k of every kv head: on the device where the backend has
  // one, else on the host.
  uint64_t pick(const LayerSelection& r, int32_t* out) const {
    std::vector<float> luts = layer_luts(r);
    const DeviceKernels* device = r.backend.device_kernels();
    if (device != nullptr && !host_only(r) &&
        device->pq_select_layer(r.pq_args(luts.data()), out))
      return bytes_read(r);
    return scan_layer_on_host(r, luts, out);
  }

  // Every kv head's re-ranking: picked holds wide_k candidates per head.
  uint64_t rerank_layer(const LayerSelection& r, const int32_t* picked, int64_t wide_k,
                        int32_t* out) const {
    std::atomic<uint64_t> bytes{0};
    r.for_each_head([&](int64_t h) {
      ScratchLease scratch(r.scratch);
      bytes += rerank(r.head(static_cast<int32_t>(h), *scratch), picked + h * wide_k, wide_k,
                      out + h * r.k);
    });
    return bytes.load();
  }

  // Exact re-ranking of one kv head: the exact logits of the `count`
  // candidates (ascending positions) from their full keys, combined over
  // the GQA group as the codes' scores are (softmax normalised over the
  // candidates), and the best k of them, ascending. Returns the bytes read.
  static uint64_t rerank(const SelectionRequest& r, const int32_t* candidate, int64_t count,
                         int32_t* out) {
    std::vector<float>& raw = r.scratch.raw;
    raw.resize(static_cast<size_t>(r.group_size()) * count);
    const uint64_t bytes = r.exact_logits(candidate, 0, count, raw.data());
    std::vector<float>& combined = r.scratch.combined;
    combined.resize(static_cast<size_t>(count));
    combine_group_scores(raw.data(), r.group_size(), count, r.combine(), r.scale(), combined.data(),
                         r.scratch);
    std::vector<int32_t> best(static_cast<size_t>(r.k()));
    select_top_k(combined.data(), count, r.k(), 0, best.data(), r.scratch);
    std::sort(best.begin(), best.end());
    for (int64_t i = 0; i < r.k(); ++i) out[i] = candidate[best[static_cast<size_t>(i)]];
    std::sort(out, out + r.k());  // whatever order the candidates came in
    return bytes;
  }
  static uint64_t bytes_read(const LayerSelection& r) {
    return static_cast<uint64_t>(r.middle.size()) * r.index->codebook->subspaces *
           r.context.kv_heads();
  }
  // Every kv head's LUT, [kv_heads][group][m][centroids].
  static std::vector<float> layer_luts(const LayerSelection& r) {
    const PqCodebook& cb = *r.index->codebook;
    const int32_t group = r.context.group_size(), dim = r.context.head_dim();
    const size_t per_head = cb.lut_floats(group);
    std::vector<float> luts(per_head * static_cast<size_t>(r.context.kv_heads()));
    for (int32_t h = 0; h < r.context.kv_heads(); ++h)
      cb.lut(h, r.queries + static_cast<size_t>(h) * group * dim, group, dim,
             luts.data() + per_head * h);
    return luts;
  }
  // The host path of a layer: head by head (in parallel for a large one).
  uint64_t scan_layer_on_host(const LayerSelection& r, const std::vector<float>& luts,
                              int32_t* out) const {
    const size_t per_head = r.index->codebook->lut_floats(r.context.group_size());
    std::atomic<uint64_t> bytes{0};
    r.for_each_head([&](int64_t h) {
      ScratchLease scratch(r.scratch);
      bytes += scan_on_host(r.head(static_cast<int32_t>(h), *scratch), luts.data() + per_head * h,
                            out + h * r.k);
    });
    return bytes.load();
  }

  // Scores the head's middle through its LUT, combines and takes the top k.
  uint64_t scan_on_host(const SelectionRequest& r, const float* lut, int32_t* out) const {
    const int64_t m = r.middle();
    const PqCodebook& cb = *r.index()->codebook;
    const CodeColumn& codes = r.index()->codes[static_cast<size_t>(r.kv_head)];
    uint64_t bytes = static_cast<uint64_t>(m) * cb.subspaces;  // one byte per code
    const OutlierSpan outliers =
        outliers_between(*r.index(), r.kv_head, r.mid_begin(), r.mid_end());
    // Few possible code tuples (m * b <= 16): score the tuples, not the
    // tokens (pq_tuple_select.h); it has no per-token score for an outlier,
    // nor the scores top-p reads.
    if (outliers.count == 0 && !adapts_budget(r.layer) &&
        pq_tuple_select_pays(codes, cb.subspaces, cb.centroids, r.mid_begin(), m, r.scratch)) {
      TupleCountTable table;
      const auto& kept = r.index()->tuple_counts;
      if (static_cast<size_t>(r.kv_head) < kept.size())
        table = {kept[static_cast<size_t>(r.kv_head)].data(), r.index()->coded_tokens};
      pq_tuple_select(lut, r.group_size(), cb.subspaces, cb.centroids, codes, m, r.mid_begin(),
                      r.combine(), r.scale(), r.k(), out, r.scratch, table);
      return bytes;
    }
    // The default combine: scan and softmax fused (pq/pq_softmax_scan.h);
    // without outliers the combined scores are never written.
    if (r.combine() == PQ_GQA_SUM_SOFTMAX && r.group_size() > 1) {
      if (outliers.count == 0) {
        WeightedRows shares{};
        if (pq_softmax_shares(cb, lut, r.group_size(), codes, r.mid_begin(), r.mid_end(),
                              r.scale(), &shares, r.scratch)) {
          r.select_best(shares, out);
          return bytes;
        }
      } else {
        std::vector<float>& combined = r.scratch.combined;
        combined.resize(static_cast<size_t>(m));
        std::vector<double>& norms = r.scratch.log_norms;
        norms.resize(static_cast<size_t>(r.group_size()));
        if (pq_scan_sum_softmax(cb, lut, r.group_size(), codes, r.mid_begin(), r.mid_end(),
                                r.scale(), combined.data(), r.scratch, norms.data())) {
          bytes += score_outliers(r, outliers, norms.data(), combined.data());
          r.select_best(combined.data(), out);
          return bytes;
        }
      }
    }
    std::vector<float>& raw = r.scratch.raw;
    raw.resize(static_cast<size_t>(r.group_size()) * m);
    score_runs(r, lut, codes, raw.data());
    if (outliers.count == 0) {
      select_from_raw(r, raw.data(), out);
      return bytes;
    }
    const bool normalised = r.combine() == PQ_GQA_SUM_SOFTMAX && r.group_size() > 1;
    if (normalised) log_normalisers(raw.data(), r.group_size(), m, r.scale(), r.scratch.log_norms);
    std::vector<float>& combined = r.scratch.combined;
    combined.resize(static_cast<size_t>(m));
    combine_group_scores(raw.data(), r.group_size(), m, r.combine(), r.scale(), combined.data(),
                         r.scratch);
    bytes += score_outliers(r, outliers, normalised ? r.scratch.log_norms.data() : nullptr,
                            combined.data());
    r.select_best(combined.data(), out);
    return bytes;
  }

  // Each head's log of the sum of exp(scale x raw) over the middle (the
  // max-shifted form, in double).
  static void log_normalisers(const float* raw, int32_t group, int64_t n, float scale,
                              std::vector<double>& out) {
    out.resize(static_cast<size_t>(group));
    for (int32_t g = 0; g < group; ++g) {
      const float* row = raw + static_cast<size_t>(g) * n;
      const double top = static_cast<double>(*std::max_element(row, row + n)) * scale;
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(row[i]) * scale - top);
      out[static_cast<size_t>(g)] = top + std::log(sum);
    }
  }

  // config.pq_outliers: the outliers' combined scores from their exact
  // logits, in place of their codes'. With log normalisers (SUM_SOFTMAX over
  // a group) each is sum_g exp(scale x q_g.k - L_g), the softmax share its
  // exact logit takes against the codes' normaliser of the middle; else the
  // combine of its exact logits. Returns the key bytes read.
  static uint64_t score_outliers(const SelectionRequest& r, const OutlierSpan& outliers,
                                 const double* log_norms, float* combined) {
    const int64_t n = outliers.count;
    const int32_t group = r.group_size();
    std::vector<float>& exact = r.scratch.outlier_logits;
    exact.resize(static_cast<size_t>(group) * n + static_cast<size_t>(n));
    float* values = exact.data() + static_cast<size_t>(group) * n;  // their combined scores
    const uint64_t bytes = r.exact_logits(outliers.positions, 0, n, exact.data());
    if (log_norms != nullptr) {
      for (int64_t i = 0; i < n; ++i) {
        double v = 0.0;
        for (int32_t g = 0; g < group; ++g)
          v += std::exp(static_cast<double>(exact[static_cast<size_t>(g) * n + i]) * r.scale() -
                        log_norms[g]);
        values[i] = static_cast<float>(std::min(v, double{FLT_MAX}));
      }
    } else {  // MAX, MEAN, one head: no normaliser (combine_group_scores uses no scratch there)
      combine_group_scores(exact.data(), group, n, r.combine(), r.scale(), values, r.scratch);
    }
    for (int64_t i = 0; i < n; ++i) combined[outliers.positions[i] - r.mid_begin()] = values[i];
    return bytes;
  }

  // raw[g * middle + i]: query head g's score of middle token i, each run
  // of the codes (a fork's are several; code_column.h) into its part of the
  // rows.
  static void score_runs(const SelectionRequest& r, const float* lut, const CodeColumn& codes,
                         float* raw) {
    const PqCodebook& cb = *r.index()->codebook;
    codes.for_each_run(r.mid_begin(), r.mid_end(), [&](int64_t first, int64_t n, const uint8_t* p) {
      cb.scores(lut, r.group_size(), p, n, raw + (first - r.mid_begin()), r.middle());
    });
  }
};

}  // namespace

std::unique_ptr<Selector> make_pq_selector() { return std::make_unique<PqSelector>(); }

}  // namespace pq
