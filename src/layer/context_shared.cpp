#include "layer/context_shared.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "config/kv_scales.h"
#include "store/host_slabs.h"
#include "store/kv_tier.h"
#include "selectors/selector_capabilities.h"

namespace pq {

namespace {
std::unique_ptr<Backend> make_backend(const pq_config& c, const char* plugin_path) {
  switch (c.backend) {
    case PQ_BACKEND_CUDA:
      return load_cuda_backend(plugin_path, c.device_id);
    case PQ_BACKEND_AUTO:
      try {
        return load_cuda_backend(plugin_path, c.device_id);
      } catch (const Error&) {
        return make_cpu_backend();  // no plug-in or no device: the host does the work
      }
    default:
      return make_cpu_backend();
  }
}

// One slot per chunk: its K block then its V block.
std::shared_ptr<ChunkFile> make_chunk_file(const pq_config& c, const char* directory,
                                           const DiskIo& io) {
  if (c.kv_tier != PQ_KV_TIER_DISK) return nullptr;
  const size_t block = static_cast<size_t>(KvTier::kChunkTokens) * c.num_kv_heads * c.head_dim *
                       dtype_size(c.dtype);
  return std::make_shared<ChunkFile>(directory, 2 * block, io);
}

// The resolved configuration with kv_scales at the context's own copy.
pq_config with_scales(pq_config c, const std::vector<float>& copy) {
  c.kv_scales = copy.empty() ? nullptr : copy.data();
  return c;
}

std::unique_ptr<Selector> built_in_selector(int32_t kind) {
  std::unique_ptr<Selector> s = make_selector(kind);
  if (!s)
    fail(PQ_ERR_UNSUPPORTED,
         "config.selector " + std::to_string(kind) + " is not built into this library");
  return s;
}
}  // namespace

ContextShared::ContextShared(const pq_config& c, const CallerPaths& paths, const Hooks& h,
                             std::shared_ptr<ThreadPool> shared_pool)
    : kv_scale_copy(paths.kv_scales),
      kv_head_scales(head_scales(c, kv_scale_copy)),
      config(with_scales(c, kv_scale_copy)),
      group_size(c.num_q_heads / c.num_kv_heads),
      scale(1.0f / std::sqrt(static_cast<float>(c.head_dim))),
      budget(c.host_memory_limit),
      backend(make_backend(c, paths.cuda_plugin)),
      selector(built_in_selector(c.selector)),
      cost(memory_cost(c, *selector)),
      hooks(h),
      chunk_file(make_chunk_file(c, paths.kv_disk, h.disk_io)),
      host_slabs(c.kv_tier != PQ_KV_TIER_CALLER && c.kv_tier != PQ_KV_TIER_DISK &&
                         h.allocator.alloc == nullptr && backend->device_memory() == nullptr &&
                         host_slabs_enabled() && cost.chunk_kv / 2 >= kHostSlabMinBlock
                     ? make_host_slabs(&budget)
                     : nullptr),
      owns_pool(shared_pool == nullptr),
      pool(shared_pool ? std::move(shared_pool) : std::make_shared<ThreadPool>(c.worker_threads)) {
  const uint64_t fixed = cost.sequence_fixed(c.num_layers);
  if (c.host_memory_limit != 0 && fixed > c.host_memory_limit)
    fail(PQ_ERR_INVALID_ARGUMENT,
         "config.host_memory_limit is " + std::to_string(c.host_memory_limit) +
             " bytes, but one sequence's fixed state alone takes " + std::to_string(fixed) +
             " (" + cost.explain(c) + "); raise the limit or shrink the configuration");
}

Regions ContextShared::regions(int64_t n, int32_t layer) const {
  Regions r;
  r.n = n;
  r.sink_end = std::min<int64_t>(config.sink_tokens, n);
  r.mid_end = std::max(r.sink_end, n - static_cast<int64_t>(config.local_tokens));
  const int64_t middle = r.mid_end - r.sink_end;
  r.k = configured_k(config, middle);
  r.k_mean = r.k;
  // A selector without LayerBudgets takes the configured k on every head.
  if (const LayerBudgets* budgets = selector->layer_budgets()) {
    const int64_t layer_k = budgets->budget(r.k, middle, layer, config);
    r.k = std::max<int64_t>(0, std::min<int64_t>(middle, layer_k));
    r.k_mean = r.k;
    const int64_t head_k = budgets->head_capacity(r.k_mean, middle, config);
    r.k = std::max(r.k_mean, std::min<int64_t>(middle, head_k));
  }
  return r;
}

std::future<void> ContextShared::submit(std::function<void()> task, std::function<void()> after) {
  {
    std::lock_guard<std::mutex> lock(tasks_mutex_);
    ++tasks_;
  }
  auto finished = [this] {
    std::lock_guard<std::mutex> lock(tasks_mutex_);
    if (--tasks_ == 0) tasks_done_.notify_all();
  };
  try {
    return pool->submit(std::move(task), [after = std::move(after), finished] {
      struct Finish {
        const decltype(finished)& f;
        ~Finish() { f(); }
      } finish{finished};
      if (after) after();
    });
  } catch (...) {
    finished();
    throw;
  }
}

void ContextShared::wait_tasks() {
  std::unique_lock<std::mutex> lock(tasks_mutex_);
  tasks_done_.wait(lock, [this] { return tasks_ == 0; });
}

void ContextShared::add_draining_build() {
  std::lock_guard<std::mutex> lock(tasks_mutex_);
  ++draining_builds_;
}

void ContextShared::remove_draining_build() {
  std::lock_guard<std::mutex> lock(tasks_mutex_);
  if (--draining_builds_ == 0) tasks_done_.notify_all();
}

void ContextShared::wait_draining_builds() {
  std::unique_lock<std::mutex> lock(tasks_mutex_);
  tasks_done_.wait(lock, [this] { return draining_builds_ == 0; });
}

int32_t ContextShared::iteration_budget(int64_t tokens, int64_t training_points) {
  if (config.kmeans_iterations > 0) return config.kmeans_iterations;
  const ComputeTimeModel compute{config.compute_alpha, config.compute_beta, config.compute_gamma,
                                 config.layer_time_budget};
  const bool has_model = compute.alpha2 > 0 || compute.beta2 > 0 || compute.gamma2 > 0 ||
                         compute.layer_budget > 0;
  if (has_model) {
    std::call_once(profile_once_, [&] {
      KMeansParams p;
      p.subspaces = config.pq_subspaces;
      p.bits = config.pq_bits;
      p.init = config.kmeans_init;
      p.seed = config.seed;
      cluster_model_ = profile_cluster_time(config.num_kv_heads, config.head_dim, p, *pool);
    });
  }
  return adaptive_iterations(cluster_model_, compute, tokens, training_points,
                             config.kmeans_min_iterations, config.kmeans_max_iterations);
}

}  // namespace pq
