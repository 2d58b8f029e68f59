// PQCache (paper section 3.4): score every middle token through a lookup
// table of query sub-vector x centroid dot products, summed over the codes.
#include <vector>

#include "selector.h"
#include "vector_math.h"

namespace pq {

namespace {

class PqSelector final : public Selector {
 public:
  const char* name() const override { return "pq"; }
  bool needs_index() const override { return true; }
  // The index: centroids (kv heads x 2^b x head_dim floats) and one code
  // byte per subspace, token and kv head; twice, for a rebuild's new index
  // while the old one serves.
  StateCost state_cost(const pq_config& c) const override {
    const uint64_t centroids = static_cast<uint64_t>(c.num_kv_heads) * (uint64_t{1} << c.pq_bits) *
                               c.head_dim * sizeof(float);
    const uint64_t codes = static_cast<uint64_t>(KvStore::kChunkTokens) * c.num_kv_heads *
                           c.pq_subspaces;
    return {2 * (sizeof(PqIndex) + centroids), 2 * codes};
  }

  // One LUT per call: a backend with a device (CUDA) scores, combines and
  // selects there; otherwise the host scans the codes through it.
  uint64_t select_middle(const SelectionRequest& r, int32_t* out) const override {
    if (select_without_scoring(r, out)) return 0;
    const int64_t m = r.middle();
    const PqCodebook& cb = r.index->codebook;
    const std::vector<float> lut = build_lut(r);
    const uint8_t* head_codes = r.index->codes[static_cast<size_t>(r.kv_head)].data();
    const uint8_t* codes = head_codes + r.mid_begin * cb.subspaces;
    const uint64_t bytes = static_cast<uint64_t>(m) * cb.subspaces;  // one byte per code
    const PqSelectArgs device_args{r.device,      r.index_generation, r.kv_head,     lut.data(),
                                   r.group_size,  cb.subspaces,       cb.centroids,  head_codes,
                                   r.index->coded_tokens, r.mid_begin, r.mid_end,    r.combine,
                                   r.scale,       r.k,                r.stream};
    if (r.backend.pq_select(device_args, out)) return bytes;
    std::vector<float>& raw = r.scratch.raw;
    raw.resize(static_cast<size_t>(r.group_size) * m);
    r.backend.pq_scores(lut.data(), r.group_size, cb.subspaces, cb.centroids, codes, m,
                        raw.data());
    select_from_raw(r, raw.data(), out);
    return bytes;
  }

 private:
  // lut[g][j][c] = q_g[j*sd : (j+1)*sd] . centroid[head][j][c]
  static std::vector<float> build_lut(const SelectionRequest& r) {
    const PqCodebook& cb = r.index->codebook;
    const int32_t m = cb.subspaces, k = cb.centroids, sd = cb.sub_dim;
    std::vector<float> lut(static_cast<size_t>(r.group_size) * m * k);
    for (int32_t g = 0; g < r.group_size; ++g)
      for (int32_t j = 0; j < m; ++j) {
        const float* q = r.queries + static_cast<size_t>(g) * r.head_dim + j * sd;
        const float* c = cb.at(r.kv_head, j);
        float* l = lut.data() + (static_cast<size_t>(g) * m + j) * k;
        for (int32_t ci = 0; ci < k; ++ci) l[ci] = dot(q, c + static_cast<size_t>(ci) * sd, sd);
      }
    return lut;
  }
};

}  // namespace

std::unique_ptr<Selector> make_pq_selector() { return std::make_unique<PqSelector>(); }

}  // namespace pq
