// ClusterKV (methods digest, section 6.8): recallable selection by semantic
// clusters of keys. Nothing is dropped: every select ranks the clusters
// against the current query and takes their tokens.
//
// The rule follows the authors' efficiency path (sjtu-zhao-lab/ClusterKV,
// clusterkv/clusterkv_utils/__init__.py build_cluster and the
// get_neigh_c / get_sel_indices kernels, commit cb66a22):
// - Clustering, per kv head: K-Means whose assignment is cosine (argmax of
//   normalised key . normalised centroid, norms + 1e-8, the first cluster on
//   a tie) and whose centroids are the mean of their members' raw keys (an
//   empty cluster keeps its centroid), 20 iterations, then a last
//   assignment. The prompt's middle (the middle tokens among those
//   pq_prefill_layer gave, as the authors cluster at the end of the
//   prefill) is clustered at the first select into cluster_count clusters
//   (as many as its tokens if fewer); the tokens that enter the middle after
//   it are clustered 320 at a time into 8 clusters of their own, appended
//   (the prompt's clusters are never redone). The clusters so depend on the
//   tokens only, not on when selects came. A truncate drops the window it
//   cuts through and every later one, clusters included (a cut inside the
//   prompt's tokens keeps the prompt's clusters for the tokens left).
// - Selection: the tokens not clustered yet are kept first (the authors
//   attend to them in full; the most recent if they alone exceed k). The
//   clusters are ranked by q . centroid; whole clusters are taken in that
//   order, their tokens ascending, and the last one is cut to fill exactly
//   k (the authors' "truc").
//
// Differences that remain (docs/selector-references.md):
// - Initial centroids: the authors draw cluster_count random tokens (with
//   replacement); here they are the tokens at evenly spaced ranks,
//   begin + floor((2j + 1) * count / (2 * clusters)), so that the clusters
//   depend on nothing but the keys (a fork, a restore and a rerun agree).
// - GQA: the authors rank per query head; a kv head here selects once for
//   its group, combining the group's scores with config.gqa_combine (each
//   token scores its cluster's q . c * scale; PQ_GQA_SUM_SOFTMAX takes the
//   softmax over the middle's tokens per query head and sums).
// - The authors run layers 0 and 1 dense; every layer here selects k.
//
// Bytes: a select reads the centroids (clusters x head_dim floats); the
// clustering reads each key once per iteration when it runs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "base/cut_to.h"
#include "base/dtype.h"
#include "base/error.h"
#include "base/vector_math.h"
#include "format/state_io.h"
#include "pq/nearest_centroid.h"
#include "selectors/selection_request.h"
#include "selectors/selector.h"

namespace pq {

namespace {

constexpr int32_t kIterations = 20;     // niter of both official paths
constexpr int64_t kWindowTokens = 320;  // tokens clustered together after the first select
constexpr int32_t kWindowClusters = 8;  // clusters each such window gets
constexpr float kEpsilon = 1e-8f;

// The clusters of one kv head: the prompt's middle [begin, prompt_end) in
// prompt_clusters clusters, then whole windows [prompt_end + 320 j, + 320)
// of kWindowClusters clusters each, up to end.
struct HeadClusters {
  int64_t begin = -1, end = -1;  // tokens [begin, end) are clustered; -1: none yet
  int64_t prompt_end = -1;
  int32_t prompt_clusters = 0;
  int32_t clusters = 0;
  std::vector<float> centroids;  // [clusters][head_dim]
  std::vector<int32_t> label;    // [end - begin]: the cluster of token begin + i
  // From label: cluster c's tokens are member[offset[c] .. offset[c + 1]), ascending.
  std::vector<int32_t> offset, member;

  bool clustered() const { return end >= 0; }

  void index_members() {
    offset.assign(static_cast<size_t>(clusters) + 1, 0);
    for (int32_t l : label) ++offset[static_cast<size_t>(l) + 1];
    for (int32_t c = 0; c < clusters; ++c) offset[c + 1] += offset[c];
    member.resize(label.size());
    std::vector<int32_t> next(offset.begin(), offset.end() - 1);
    for (size_t i = 0; i < label.size(); ++i)
      member[static_cast<size_t>(next[label[i]]++)] = static_cast<int32_t>(begin + static_cast<int64_t>(i));
  }
};

inline void normalise(const float* x, int32_t d, float* out) {
  const float norm = std::sqrt(dot(x, x, d)) + kEpsilon;
  for (int32_t e = 0; e < d; ++e) out[e] = x[e] / norm;
}

// label[i] = the unit centroid with the largest dot() with unit key i, the
// first on a tie: what a scalar loop over dot() decides, at GEMM speed. The
// blocked kernel of the PQ assignment (pq/nearest_centroid.h, norms set to
// 0) scores kScoreBlock keys against every centroid; the candidates within
// a margin of a key's best score are re-scored with dot(). Both orders of
// summation are within d * FLT_EPSILON of the exact product of two vectors
// of norm <= 1 (with or without FMA), so the margin of 8 d FLT_EPSILON keeps
// dot()'s argmax among the candidates and the label is bit-identical.
class CosineAssigner {
 public:
  CosineAssigner(int32_t clusters, int32_t d)
      : d_(d), margin_(2.f * 8.f * static_cast<float>(d) * std::numeric_limits<float>::epsilon()) {
    prepared_.padded = static_cast<int32_t>(padded_centroids(clusters));
    scores_.resize(static_cast<size_t>(kScoreBlock) * static_cast<size_t>(prepared_.padded));
  }

  void assign(const float* unit, int64_t count, const float* unit_c, int32_t clusters,
              int32_t* label) {
    prepare_centroids(unit_c, clusters, d_, &prepared_);
    std::fill(prepared_.norms.begin(), prepared_.norms.begin() + clusters, 0.f);
    for (int64_t first = 0; first < count; first += kScoreBlock) {
      const int64_t n = std::min<int64_t>(kScoreBlock, count - first);
      score_against_centroids(prepared_, unit + first * d_, n, d_, scores_.data());
      for (int64_t i = 0; i < n; ++i) {
        const float* s = scores_.data() + i * prepared_.padded;  // -2 x . c
        const float limit = smallest(s) + margin_;
        // Candidates found a lane-block at a time (most blocks have none).
        const float* u = unit + (first + i) * d_;
        float best = -std::numeric_limits<float>::infinity();
        int32_t arg = 0;
        for (int32_t c = 0; c < prepared_.padded; c += kLaneWidth) {
          int32_t any = 0;
          for (int32_t l = 0; l < kLaneWidth; ++l) any |= s[c + l] <= limit ? 1 : 0;
          if (!any) continue;
          for (int32_t j = c; j < std::min(c + kLaneWidth, clusters); ++j) {
            if (!(s[j] <= limit)) continue;
            const float v = dot(u, unit_c + static_cast<size_t>(j) * d_, d_);
            if (v > best) best = v, arg = j;
          }
        }
        label[first + i] = arg;
      }
    }
  }

 private:
  // The smallest of a row's padded scores (the padding scores about
  // FLT_MAX), with kLaneWidth independent minima that vectorise.
  float smallest(const float* s) const {
    float lanes[kLaneWidth];
    std::copy_n(s, kLaneWidth, lanes);
    for (int32_t c = kLaneWidth; c < prepared_.padded; c += kLaneWidth)
      for (int32_t l = 0; l < kLaneWidth; ++l) lanes[l] = s[c + l] < lanes[l] ? s[c + l] : lanes[l];
    return *std::min_element(lanes, lanes + kLaneWidth);
  }

  const int32_t d_;
  const float margin_;  // on the -2 x . c scale
  PreparedCentroids prepared_;
  std::vector<float> scores_;  // [kScoreBlock][padded]
};

// Clusters keys [first, first + count) of kv head h into `clusters` groups;
// appends the centroids and labels (offset by the clusters already there).
void cluster_keys(const KvTier& store, int32_t h, const pq_config& c, int64_t first,
                  int64_t count, int32_t clusters, HeadClusters& out) {
  const int32_t d = c.head_dim;
  std::vector<float> keys(static_cast<size_t>(count) * d), unit(keys.size());
  store.keys_as_float(h, first, count, keys.data());
  for (int64_t i = 0; i < count; ++i) {
    normalise(keys.data() + i * d, d, unit.data() + i * d);
  }
  std::vector<float> centroids(static_cast<size_t>(clusters) * d), unit_c(centroids.size());
  for (int32_t j = 0; j < clusters; ++j) {
    const int64_t t = (2 * static_cast<int64_t>(j) + 1) * count / (2 * static_cast<int64_t>(clusters));
    std::copy_n(keys.data() + t * d, d, centroids.data() + static_cast<size_t>(j) * d);
  }
  std::vector<int32_t> label(static_cast<size_t>(count));
  std::vector<double> sum(centroids.size());
  std::vector<int64_t> size(static_cast<size_t>(clusters));
  CosineAssigner assigner(clusters, d);
  auto assign = [&] {
    for (int32_t j = 0; j < clusters; ++j)
      normalise(centroids.data() + static_cast<size_t>(j) * d, d, unit_c.data() + static_cast<size_t>(j) * d);
    assigner.assign(unit.data(), count, unit_c.data(), clusters, label.data());
  };
  for (int32_t it = 0; it < kIterations; ++it) {
    assign();
    std::fill(sum.begin(), sum.end(), 0.0);
    std::fill(size.begin(), size.end(), 0);
    for (int64_t i = 0; i < count; ++i) {
      const size_t j = static_cast<size_t>(label[static_cast<size_t>(i)]);
      ++size[j];
      for (int32_t e = 0; e < d; ++e) sum[j * d + e] += keys[static_cast<size_t>(i * d + e)];
    }
    for (size_t j = 0; j < size.size(); ++j)
      if (size[j] > 0)
        for (int32_t e = 0; e < d; ++e)
          centroids[j * d + e] = static_cast<float>(sum[j * d + e] / static_cast<double>(size[j]));
  }
  assign();
  const int32_t base = out.clusters;
  out.centroids.insert(out.centroids.end(), centroids.begin(), centroids.end());
  for (int32_t l : label) out.label.push_back(base + l);
  out.clusters += clusters;
}

struct ClusterState final : CopyableState<ClusterState> {
  ClusterState(int32_t kv_heads, int32_t head_dim)
      : head_dim(head_dim), heads(static_cast<size_t>(kv_heads)) {}
  int32_t head_dim;
  std::vector<HeadClusters> heads;

  // What a run that never had the tokens at or after `tokens` would hold,
  // as near as the tokens allow: a window the cut goes through goes whole,
  // with its clusters (its tokens are clustered again once a whole window
  // has entered the middle); a cut inside the prompt's clusters keeps them
  // for the tokens left, and no window. So the clusters stay within what
  // the tokens bound (and the loader accepts), however many truncates and
  // regrowths come.
  void truncate(int64_t tokens) override {
    for (HeadClusters& h : heads) {
      if (!h.clustered() || tokens >= h.end) continue;
      if (tokens <= h.begin) {
        h = HeadClusters{};  // clustered again at the next select
        continue;
      }
      if (tokens < h.prompt_end) {
        h.end = h.prompt_end = tokens;
        h.clusters = h.prompt_clusters;
      } else {
        const int64_t windows = (tokens - h.prompt_end) / kWindowTokens;
        h.end = h.prompt_end + windows * kWindowTokens;
        h.clusters = h.prompt_clusters + static_cast<int32_t>(windows) * kWindowClusters;
      }
      cut_to(h.centroids, static_cast<size_t>(h.clusters) * static_cast<size_t>(head_dim));
      cut_to(h.label, static_cast<size_t>(h.end - h.begin));
      cut_to(h.member, h.label.size());
      cut_to(h.offset, static_cast<size_t>(h.clusters) + 1);
      h.index_members();
    }
  }

  void save(ByteWriter& out) const override {
    out.put<uint32_t>(static_cast<uint32_t>(heads.size()));
    for (const HeadClusters& h : heads) {
      out.put<int64_t>(h.begin);
      out.put<int64_t>(h.end);
      out.put<int64_t>(h.prompt_end);
      out.put<int32_t>(h.prompt_clusters);
      out.put<int32_t>(h.clusters);
      out.put_vector(h.centroids);
      out.put_vector(h.label);
    }
  }

  void load(ByteReader& in, int64_t tokens, const pq_config& c) override {
    const uint32_t n = in.get<uint32_t>("clusterkv: kv heads");
    if (n != heads.size())
      in.corrupt("clusterkv has " + std::to_string(n) + " kv heads; expected " +
                 std::to_string(heads.size()));
    for (HeadClusters& h : heads) {
      h.begin = in.get<int64_t>("clusterkv: first clustered token");
      h.end = in.get<int64_t>("clusterkv: end of the clustered tokens");
      h.prompt_end = in.get<int64_t>("clusterkv: end of the prompt's clustered tokens");
      h.prompt_clusters = in.get<int32_t>("clusterkv: the prompt's clusters");
      h.clusters = in.get<int32_t>("clusterkv: clusters");
      const bool none = h.begin == -1 && h.end == -1 && h.prompt_end == -1 &&
                        h.prompt_clusters == 0 && h.clusters == 0;
      // The prompt's clusters, then whole windows of kWindowClusters.
      const bool fits =
          0 <= h.begin && h.begin <= h.prompt_end && h.prompt_end <= h.end && h.end <= tokens &&
          0 <= h.prompt_clusters && h.prompt_clusters <= c.cluster_count &&
          (h.end - h.prompt_end) % kWindowTokens == 0 &&
          h.clusters == h.prompt_clusters + kWindowClusters * (h.end - h.prompt_end) / kWindowTokens;
      if (!none && !fits)
        in.corrupt("clusterkv: tokens [" + std::to_string(h.begin) + ", " + std::to_string(h.end) +
                   ") in " + std::to_string(h.clusters) + " clusters, of which the prompt's [" +
                   std::to_string(h.begin) + ", " + std::to_string(h.prompt_end) + ") in " +
                   std::to_string(h.prompt_clusters) + ", do not fit a layer of " +
                   std::to_string(tokens) + " tokens (windows of " + std::to_string(kWindowTokens) +
                   " tokens in " + std::to_string(kWindowClusters) + " clusters)");
      h.centroids = in.get_vector<float>("clusterkv: centroids",
                                         static_cast<uint64_t>(h.clusters) * c.head_dim);
      h.label = in.get_vector<int32_t>("clusterkv: labels",
                                       static_cast<uint64_t>(std::max<int64_t>(h.end - h.begin, 0)));
      if (h.centroids.size() != static_cast<size_t>(h.clusters) * c.head_dim ||
          h.label.size() != static_cast<size_t>(std::max<int64_t>(h.end - h.begin, 0)))
        in.corrupt("clusterkv: " + std::to_string(h.centroids.size()) + " centroid values and " +
                   std::to_string(h.label.size()) + " labels for " + std::to_string(h.clusters) +
                   " clusters of " + std::to_string(h.end - h.begin) + " tokens");
      for (float v : h.centroids)
        if (!std::isfinite(v)) in.corrupt("clusterkv: a centroid holds " + number_text(v));
      for (int32_t l : h.label)
        if (l < 0 || l >= h.clusters)
          in.corrupt("clusterkv: label " + std::to_string(l) + " of " + std::to_string(h.clusters) +
                     " clusters");
      if (!none) h.index_members();
    }
  }
};

class ClusterKvSelector final : public Selector {
 public:
  const char* name() const override { return "clusterkv"; }

  std::unique_ptr<SelectorState> make_state(const pq_config& c, int32_t) const override {
    return std::make_unique<ClusterState>(c.num_kv_heads, c.head_dim);
  }
  StateCost state_cost(const pq_config& c) const override {
    const uint64_t centroid = static_cast<uint64_t>(c.head_dim) * sizeof(float);
    // Per token a label and a member entry; per chunk at most two windows'
    // clusters (a window of 320 can straddle a chunk of 256).
    return {sizeof(ClusterState) +
                kGrowthRoom * c.num_kv_heads * (static_cast<uint64_t>(c.cluster_count) * centroid +
                                                sizeof(HeadClusters)),
            per_token_cost(c, 2 * sizeof(int32_t)) +
                kGrowthRoom * 2 * kWindowClusters * c.num_kv_heads * (centroid + sizeof(int32_t))};
  }

  // The clustering runs in select_middle, per kv head (the heads of a large
  // layer in parallel); here only the state's type is checked.
  void update_state(SelectorState* state, const KvTier&, int64_t, int64_t, int64_t,
                    const pq_config&) const override {
    (void)state_of<ClusterState>(state, name());
  }

  uint64_t select_middle(const SelectionRequest& r, int32_t* out) const override {
    if (select_without_scoring(r, out)) return 0;
    HeadClusters& h = state_of<ClusterState>(r.state(), name()).heads[static_cast<size_t>(r.kv_head)];
    update_clusters(r, h);
    const int64_t begin = r.mid_begin(), end = r.mid_end(), k = r.k();
    // The middle tokens no cluster holds: before the clusters (a restore
    // with other sinks) and after them (not yet a full window).
    int64_t w = 0;
    std::vector<int32_t>& taken = r.scratch.candidates;  // the select's scratch, reused
    taken.clear();
    const int64_t lo = h.clustered() ? std::clamp(h.begin, begin, end) : end;
    const int64_t hi = h.clustered() ? std::clamp(h.end, begin, end) : end;
    for (int64_t p = end - 1; p >= hi && static_cast<int64_t>(taken.size()) < k; --p)
      taken.push_back(static_cast<int32_t>(p));
    for (int64_t p = lo - 1; p >= begin && static_cast<int64_t>(taken.size()) < k; --p)
      taken.push_back(static_cast<int32_t>(p));
    if (static_cast<int64_t>(taken.size()) < k) take_clusters(r, h, begin, end, k, taken);
    // Every middle token is in a cluster or not yet clustered, so k are found.
    if (static_cast<int64_t>(taken.size()) != k)
      fail(PQ_ERR_INTERNAL, "clusterkv: kv head " + std::to_string(r.kv_head) + " found " +
                                std::to_string(taken.size()) + " of " + std::to_string(k) +
                                " middle tokens");
    std::sort(taken.begin(), taken.end());
    for (int32_t p : taken) out[w++] = p;
    return static_cast<uint64_t>(h.clusters) * r.head_dim() * sizeof(float);
  }

 private:
  // Clusters the middle at the first select, then each full window of
  // tokens that entered it since.
  void update_clusters(const SelectionRequest& r, HeadClusters& h) const {
    const pq_config& c = r.config();
    bool grew = false;
    if (!h.clustered()) {
      h.begin = r.mid_begin();
      const int64_t count =
          std::clamp<int64_t>(r.prefill_tokens() - c.local_tokens, h.begin, r.mid_end()) - h.begin;
      if (count > 0)
        cluster_keys(r.store(), r.kv_head, c, h.begin, count,
                     static_cast<int32_t>(std::min<int64_t>(c.cluster_count, count)), h);
      h.end = h.prompt_end = h.begin + count;
      h.prompt_clusters = h.clusters;
      grew = true;
    }
    while (r.mid_end() - h.end >= kWindowTokens) {
      cluster_keys(r.store(), r.kv_head, c, h.end, kWindowTokens, kWindowClusters, h);
      h.end += kWindowTokens;
      grew = true;
    }
    if (grew) h.index_members();
  }

  // Adds the tokens of the best-ranked clusters to `taken` until it holds k.
  void take_clusters(const SelectionRequest& r, const HeadClusters& h, int64_t begin, int64_t end,
                     int64_t k, std::vector<int32_t>& taken) const {
    const int32_t d = r.head_dim(), G = r.group_size(), C = h.clusters;
    std::vector<float>& score = r.scratch.combined;  // per cluster
    std::vector<float>& raw = r.scratch.raw;         // [group][cluster]
    raw.resize(static_cast<size_t>(G) * C);
    for (int32_t g = 0; g < G; ++g)
      for (int32_t j = 0; j < C; ++j)
        raw[static_cast<size_t>(g) * C + j] =
            dot(r.queries() + static_cast<size_t>(g) * d, h.centroids.data() + static_cast<size_t>(j) * d, d) *
            r.scale();
    auto members = [&](int32_t j) { return h.offset[j + 1] - h.offset[j]; };
    score.assign(static_cast<size_t>(C), 0.f);
    for (int32_t g = 0; g < G; ++g) {
      const float* s = raw.data() + static_cast<size_t>(g) * C;
      if (r.combine() == PQ_GQA_SUM_SOFTMAX) {
        // The softmax over the tokens: each of cluster j's members has s[j].
        float mx = -std::numeric_limits<float>::infinity();
        for (int32_t j = 0; j < C; ++j)
          if (members(j) > 0) mx = std::max(mx, s[j]);
        double z = 0.0;
        for (int32_t j = 0; j < C; ++j) z += members(j) * std::exp(static_cast<double>(s[j]) - mx);
        for (int32_t j = 0; j < C; ++j)
          score[static_cast<size_t>(j)] += static_cast<float>(std::exp(static_cast<double>(s[j]) - mx) / z);
      } else if (r.combine() == PQ_GQA_MAX) {
        for (int32_t j = 0; j < C; ++j)
          score[static_cast<size_t>(j)] = g == 0 ? s[j] : std::max(score[static_cast<size_t>(j)], s[j]);
      } else {
        for (int32_t j = 0; j < C; ++j) score[static_cast<size_t>(j)] += s[j] / static_cast<float>(G);
      }
    }
    std::vector<int32_t>& order = r.scratch.next;
    order.resize(static_cast<size_t>(C));
    for (int32_t j = 0; j < C; ++j) order[static_cast<size_t>(j)] = j;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)];
    });
    for (int32_t j : order) {
      for (int32_t i = h.offset[j]; i < h.offset[j + 1]; ++i) {
        const int32_t p = h.member[static_cast<size_t>(i)];
        if (p < begin || p >= end) continue;
        taken.push_back(p);
        if (static_cast<int64_t>(taken.size()) == k) return;
      }
    }
  }
};

}  // namespace

std::unique_ptr<Selector> make_clusterkv_selector() { return std::make_unique<ClusterKvSelector>(); }

}  // namespace pq
