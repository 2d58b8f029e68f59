#include "config/config.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "config/config_fields.h"
#include "config/kv_scales.h"
#include "base/error.h"
#include "selectors/selector.h"

namespace pq {

namespace {

struct Name {
  int32_t value;
  const char* name;
};
using Names = std::vector<Name>;

const Names kDtypeNames = {{PQ_DTYPE_F32, "PQ_DTYPE_F32"},
                            {PQ_DTYPE_F16, "PQ_DTYPE_F16"},
                            {PQ_DTYPE_BF16, "PQ_DTYPE_BF16"},
                            {PQ_DTYPE_FP8_E4M3, "PQ_DTYPE_FP8_E4M3"},
                            {PQ_DTYPE_FP8_E5M2, "PQ_DTYPE_FP8_E5M2"}};
const Names kKmeansInitNames = {{PQ_KMEANS_INIT_RANDOM, "PQ_KMEANS_INIT_RANDOM"},
                                {PQ_KMEANS_INIT_KMEANSPP, "PQ_KMEANS_INIT_KMEANSPP"}};
const Names kGqaCombineNames = {
    {PQ_GQA_SUM_SOFTMAX, "PQ_GQA_SUM_SOFTMAX"}, {PQ_GQA_MAX, "PQ_GQA_MAX"}, {PQ_GQA_MEAN, "PQ_GQA_MEAN"}};
const Names kBackendNames = {
    {PQ_BACKEND_CPU, "PQ_BACKEND_CPU"}, {PQ_BACKEND_CUDA, "PQ_BACKEND_CUDA"}, {PQ_BACKEND_AUTO, "PQ_BACKEND_AUTO"}};
const Names kCachePolicyNames = {{PQ_CACHE_LRU, "PQ_CACHE_LRU"}, {PQ_CACHE_LFU, "PQ_CACHE_LFU"}};
const Names kKeyRotaryNames = {{PQ_ROTARY_NONE, "PQ_ROTARY_NONE"},
                               {PQ_ROTARY_HALF, "PQ_ROTARY_HALF"},
                               {PQ_ROTARY_INTERLEAVED, "PQ_ROTARY_INTERLEAVED"}};
const Names kKvTierNames = {{PQ_KV_TIER_HOST, "PQ_KV_TIER_HOST"},
                            {PQ_KV_TIER_DISK, "PQ_KV_TIER_DISK"},
                            {PQ_KV_TIER_CALLER, "PQ_KV_TIER_CALLER"}};
const Names kPoolingNames = {{PQ_POOLING_MAX, "PQ_POOLING_MAX"}, {PQ_POOLING_AVG, "PQ_POOLING_AVG"}};
const Names kTailEstimateNames = {{PQ_TAIL_NONE, "PQ_TAIL_NONE"},
                                  {PQ_TAIL_CODE_MEANS, "PQ_TAIL_CODE_MEANS"}};

// The selectors' names come from their registry, the one list of them.
const Names& selector_names() {
  static const Names names = [] {
    Names n;
    for (const SelectorInfo& s : selector_registry()) n.push_back({s.value, s.enum_name});
    return n;
  }();
  return names;
}

void check_int(const char* field, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi)
    invalid(std::string("config.") + field + " is " + str(value) + "; expected " + str(lo) +
            ".." + str(hi));
}

// The value as the caller's field holds it (float or double), and the
// bounds exactly as checked.
template <typename Real>
void check_real(const char* field, Real value, double lo, double hi, bool lo_open) {
  const bool ok = std::isfinite(value) && (lo_open ? value > lo : value >= lo) && value <= hi;
  if (ok) return;
  invalid(std::string("config.") + field + " is " + number_text(value) + "; expected " +
          (hi >= kMaxReal ? "a finite value in " : "a value in ") + (lo_open ? "(" : "[") +
          number_text(lo) + ", " + number_text(hi) + "]");
}

// The name a table gives a value (checked by check_enum first).
std::string name_of(const Names& names, int32_t value) {
  for (const Name& n : names)
    if (n.value == value) return n.name;
  return str(value);
}

void check_enum(const char* field, int32_t value, const Names& names) {
  for (const Name& n : names)
    if (n.value == value) return;
  std::string want;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) want += i + 1 == names.size() ? " or " : ", ";
    want += std::string(names[i].name) + " (" + str(names[i].value) + ")";
  }
  invalid(std::string("config.") + field + " is " + str(value) + "; expected " + want);
}

}  // namespace

void fill_config_defaults(pq_config* c) {
  std::memset(c, 0, sizeof *c);
  c->struct_size = sizeof(pq_config);
#define PQ_DEFAULT_INT(f, d, lo, hi) c->f = d;
#define PQ_DEFAULT_REAL(f, d, lo, hi, open) c->f = d;
#define PQ_DEFAULT_ENUM(f, d, names) c->f = d;
#define PQ_DEFAULT_FREE(f, d) c->f = d;
  PQ_CONFIG_FIELDS(PQ_DEFAULT_INT, PQ_DEFAULT_REAL, PQ_DEFAULT_ENUM, PQ_DEFAULT_FREE)
#undef PQ_DEFAULT_INT
#undef PQ_DEFAULT_REAL
#undef PQ_DEFAULT_ENUM
#undef PQ_DEFAULT_FREE
}

int32_t default_subspaces(int32_t head_dim, int32_t key_rotary) {
  int32_t m = std::clamp(head_dim / 32, 1, 4);
  const int32_t unit = key_rotary == PQ_ROTARY_NONE ? 1 : 2;
  while (m > 1 && head_dim % (m * unit) != 0) --m;
  return m;
}

int32_t hardware_threads() {
  return std::max(1, static_cast<int32_t>(std::thread::hardware_concurrency()));
}

// What an index-only context (PQ_KV_TIER_CALLER) can serve: it keeps no
// values and, once coded, no keys.
static void check_index_only(pq_config& c) {
  const char* tier = "config.kv_tier is PQ_KV_TIER_CALLER (index only: the caller keeps K/V)";
  if (c.selector != PQ_SELECTOR_PQ && c.selector != PQ_SELECTOR_WINDOW &&
      c.selector != PQ_SELECTOR_RANDOM)
    invalid(std::string(tier) + " and config.selector is " + selector_value_name(c.selector) +
            ", which reads the keys or values the library does not keep; index-only contexts "
            "serve PQ_SELECTOR_PQ, PQ_SELECTOR_WINDOW and PQ_SELECTOR_RANDOM");
  if (c.pq_rebuild_share > 0.f)
    invalid(std::string(tier) + " and config.pq_rebuild_share is " +
            number_text(c.pq_rebuild_share) +
            "; a rebuild re-clusters every key, which an index-only context drops once coded "
            "(use 0)");
  if (c.cache_tokens > 0)
    invalid(std::string(tier) + " and config.cache_tokens is " + str(c.cache_tokens) +
            "; the block cache keeps fetched K/V, and an index-only context fetches none (use 0)");
  if (c.tail_estimate != PQ_TAIL_NONE)
    invalid(std::string(tier) + " and config.tail_estimate is PQ_TAIL_CODE_MEANS; the estimate "
            "averages the values, which an index-only context does not keep (use PQ_TAIL_NONE)");
  if (c.pq_outliers > 0.f)
    invalid(std::string(tier) + " and config.pq_outliers is " + number_text(c.pq_outliers) +
            "; outliers are scored from their keys, which an index-only context does not keep "
            "(use 0)");
}

// config.top_p reads each token's share of the middle's estimated mass: a
// softmax over the middle of scores that estimate q.k.
static void check_top_p(const pq_config& c) {
  const std::string top_p = "config.top_p is " + number_text(c.top_p);
  if (c.selector != PQ_SELECTOR_PQ && c.selector != PQ_SELECTOR_EXACT &&
      c.selector != PQ_SELECTOR_SPARQ)
    invalid(top_p + " and config.selector is " + selector_value_name(c.selector) +
            "; top-p budgets read estimates of q.k, which PQ_SELECTOR_PQ, PQ_SELECTOR_EXACT and "
            "PQ_SELECTOR_SPARQ score (use 0)");
  if (c.gqa_combine != PQ_GQA_SUM_SOFTMAX)
    invalid(top_p + " and config.gqa_combine is " +
            name_of(kGqaCombineNames, c.gqa_combine) +
            "; top-p reads the combined scores as attention masses, which PQ_GQA_SUM_SOFTMAX "
            "gives");
  if (c.pq_rerank > 0.f && c.selector == PQ_SELECTOR_PQ)
    invalid(top_p + " and config.pq_rerank is " + number_text(c.pq_rerank) +
            "; re-ranking normalises over its candidates, not the middle whose mass top-p "
            "shares out (use one of them)");
}

pq_config resolve_config(const pq_config* in, std::vector<float>* kv_scales) {
  if (in == nullptr) invalid("config is NULL");
  const uint32_t min_size = offsetof(pq_config, pq_subspaces);
  if (in->struct_size < min_size || in->struct_size > sizeof(pq_config))
    invalid("config->struct_size is " + str(in->struct_size) + "; expected " + str(min_size) +
            ".." + str(sizeof(pq_config)) +
            " (initialise the struct with pq_config_default; a larger size means the caller was "
            "built against a newer pqcache.h than this library)");
  pq_config c;
  fill_config_defaults(&c);
  std::memcpy(&c, in, in->struct_size);  // an older caller's struct: the rest stays default
  c.struct_size = sizeof(pq_config);

  // A value this build could support with wider codes is UNSUPPORTED, not
  // INVALID: codes are one byte per subspace.
  if (c.pq_bits > 8)
    fail(PQ_ERR_UNSUPPORTED, "config.pq_bits is " + str(c.pq_bits) +
                                 "; codes are one byte per subspace, so at most 8 bits");
#define PQ_CHECK_INT(f, d, lo, hi) check_int(#f, c.f, lo, hi);
#define PQ_CHECK_REAL(f, d, lo, hi, open) check_real(#f, c.f, lo, hi, open);
#define PQ_CHECK_ENUM(f, d, names) check_enum(#f, c.f, names);
#define PQ_CHECK_FREE(f, d)
  PQ_CONFIG_FIELDS(PQ_CHECK_INT, PQ_CHECK_REAL, PQ_CHECK_ENUM, PQ_CHECK_FREE)
#undef PQ_CHECK_INT
#undef PQ_CHECK_REAL
#undef PQ_CHECK_ENUM
#undef PQ_CHECK_FREE

  // What ties fields together.
  if (c.num_q_heads % c.num_kv_heads != 0)
    invalid("config.num_q_heads is " + str(c.num_q_heads) + ", not a multiple of num_kv_heads " +
            str(c.num_kv_heads) + " (GQA groups query heads evenly)");
  const bool rotary = c.key_rotary != PQ_ROTARY_NONE;
  if (rotary && c.head_dim % 2 != 0)
    invalid("config.key_rotary is " + name_of(kKeyRotaryNames, c.key_rotary) +
            ", which pairs dimensions, but head_dim " + str(c.head_dim) + " is odd");
  if (c.pq_subspaces == 0) c.pq_subspaces = default_subspaces(c.head_dim, c.key_rotary);
  if (c.pq_bits == 0) c.pq_bits = kDefaultBits;
  if (c.head_dim % c.pq_subspaces != 0)
    invalid("config.head_dim " + str(c.head_dim) + " is not divisible by pq_subspaces " +
            str(c.pq_subspaces));
  if (rotary && (c.head_dim / c.pq_subspaces) % 2 != 0)
    invalid("config.pq_subspaces " + str(c.pq_subspaces) + " leaves " +
            str(c.head_dim / c.pq_subspaces) +
            " dimensions per subspace; config.key_rotary puts whole rotary pairs in each "
            "subspace, so the width must be even");
  if (c.topk_tokens == 0 && !(c.topk_fraction > 0.f && c.topk_fraction <= 1.f))
    invalid("config.topk_fraction is " + number_text(c.topk_fraction) +
            "; expected a value in (0, 1] when topk_tokens is 0");
  if (c.pooling_kernel % 2 == 0)
    invalid("config.pooling_kernel is " + str(c.pooling_kernel) + "; expected an odd size");

  if (c.worker_threads == 0) c.worker_threads = hardware_threads();
  if (c.kv_tier == PQ_KV_TIER_DISK && c.backend == PQ_BACKEND_CUDA)
    fail(PQ_ERR_UNSUPPORTED,
         "config.kv_tier is PQ_KV_TIER_DISK with backend PQ_BACKEND_CUDA; the CUDA backend "
         "reads K/V from host memory only (use PQ_KV_TIER_HOST, or the CPU backend)");
  if (c.kv_tier == PQ_KV_TIER_DISK && c.backend == PQ_BACKEND_AUTO) c.backend = PQ_BACKEND_CPU;
  if (c.kv_tier == PQ_KV_TIER_DISK && (c.kv_disk_path == nullptr || *c.kv_disk_path == '\0'))
    invalid("config.kv_disk_path is " + std::string(c.kv_disk_path == nullptr ? "NULL" : "empty") +
            "; PQ_KV_TIER_DISK needs the directory of its K/V file");
  if (c.kv_tier == PQ_KV_TIER_CALLER) check_index_only(c);
  if (c.tail_estimate != PQ_TAIL_NONE && c.selector != PQ_SELECTOR_PQ)
    invalid("config.tail_estimate is PQ_TAIL_CODE_MEANS and config.selector is " +
            selector_value_name(c.selector) +
            "; the estimate reads the PQ index, which only PQ_SELECTOR_PQ builds");
  if (c.pq_outliers > 0.f && c.selector != PQ_SELECTOR_PQ)
    invalid("config.pq_outliers is " + number_text(c.pq_outliers) + " and config.selector is " +
            selector_value_name(c.selector) +
            "; outliers are found by the PQ index, which only PQ_SELECTOR_PQ builds (use 0)");
  if (c.top_p > 0.f) check_top_p(c);
  if (c.kv_head_offset > (1 << 16) - c.num_kv_heads)
    invalid("config.kv_head_offset " + str(c.kv_head_offset) + " + num_kv_heads " +
            str(c.num_kv_heads) + " passes 65536, the most kv heads a model may have");
  std::vector<float> scales = read_kv_scales(c);
  if (kv_scales != nullptr) *kv_scales = std::move(scales);
  // Read during pq_create only (caller_paths, and the scales' copy, which
  // the context points kv_scales at); never kept.
  c.cuda_plugin_path = nullptr;
  c.kv_disk_path = nullptr;
  c.kv_scales = nullptr;
  return c;
}

CallerPaths caller_paths(const pq_config* config) {
  CallerPaths p;
  auto covers = [config](size_t end) { return config->struct_size >= end; };
  if (covers(offsetof(pq_config, cuda_plugin_path) + sizeof(const char*)))
    p.cuda_plugin = config->cuda_plugin_path;
  if (covers(offsetof(pq_config, kv_disk_path) + sizeof(const char*)))
    p.kv_disk = config->kv_disk_path;
  return p;
}

std::string selector_value_name(int32_t selector) {
  for (const SelectorInfo& s : selector_registry())
    if (s.value == selector) return s.enum_name;
  return "(unknown)";
}

}  // namespace pq
