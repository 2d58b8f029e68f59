#include <cstring>

#include "backend/backend.h"
#include "base/error.h"

namespace pq {

namespace {

class CpuBackend final : public Backend {
 public:
  pq_backend kind() const override { return PQ_BACKEND_CPU; }
  const char* name() const override { return "cpu"; }
  bool supports_memory(int32_t memory) const override { return memory == PQ_MEMORY_HOST; }

  void copy_to_host(void* dst, const void* src, size_t bytes, int32_t src_memory,
                    void*) override {
    require_host(src_memory);
    std::memcpy(dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes, int32_t dst_memory,
                      void*) override {
    require_host(dst_memory);
    std::memcpy(dst, src, bytes);
  }

  void pq_scores(const float* lut, int32_t queries, int32_t subspaces, int32_t centroids,
                 const uint8_t* codes, int64_t tokens, float* out,
                 int64_t out_stride) const override {
    for (int32_t q = 0; q < queries; ++q) {
      const float* lq = lut + static_cast<size_t>(q) * subspaces * centroids;
      float* oq = out + static_cast<size_t>(q) * out_stride;
      if (subspaces == 2) {  // the paper's default; keep the loop tight
        const float* l0 = lq;
        const float* l1 = lq + centroids;
        for (int64_t t = 0; t < tokens; ++t) oq[t] = l0[codes[2 * t]] + l1[codes[2 * t + 1]];
        continue;
      }
      for (int64_t t = 0; t < tokens; ++t) {
        const uint8_t* c = codes + t * subspaces;
        float s = 0.f;
        for (int32_t j = 0; j < subspaces; ++j) s += lq[j * centroids + c[j]];
        oq[t] = s;
      }
    }
  }

 private:
  static void require_host(int32_t memory) {
    if (memory != PQ_MEMORY_HOST)
      fail(PQ_ERR_UNSUPPORTED,
           "device memory (PQ_MEMORY_DEVICE) needs the CUDA backend; this context uses the CPU "
           "backend (set pq_config.backend to PQ_BACKEND_CUDA or PQ_BACKEND_AUTO)");
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace pq
