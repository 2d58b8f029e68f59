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
