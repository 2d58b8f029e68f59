#include "base/cpu_dispatch.h"

#include <cstdlib>
#include <cstring>

#if PQ_X86_KERNELS
#include <cpuid.h>
#endif

namespace pq {

namespace {

#if PQ_X86_KERNELS
// CPUID leaf `leaf`, subleaf `sub`; false when the CPU has no such leaf.
bool cpuid(unsigned leaf, unsigned sub, unsigned regs[4]) {
  if (static_cast<unsigned>(__get_cpuid_max(0, nullptr)) < leaf) return false;
  __cpuid_count(leaf, sub, regs[0], regs[1], regs[2], regs[3]);
  return true;
}

// F16C from CPUID leaf 1 (clang's __builtin_cpu_supports has no "f16c").
bool has_f16c() {
  unsigned r[4];
  return cpuid(1, 0, r) && (r[2] & bit_F16C) != 0;
}

CpuLevel detect() {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
  if (!avx2) return CpuLevel::kPortable;
  // __builtin_cpu_supports reports AVX-512 only where the OS saves its state.
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return avx512 ? CpuLevel::kAvx512 : CpuLevel::kAvx2;
}
#else
CpuLevel detect() { return CpuLevel::kPortable; }
#endif

CpuLevel requested(CpuLevel available) {
  const char* env = std::getenv("PQ_CPU_LEVEL");
  if (env == nullptr) return available;
  CpuLevel asked = available;
  if (std::strcmp(env, "portable") == 0) asked = CpuLevel::kPortable;
  if (std::strcmp(env, "avx2") == 0) asked = CpuLevel::kAvx2;
  if (std::strcmp(env, "avx512") == 0) asked = CpuLevel::kAvx512;
  return static_cast<int>(asked) < static_cast<int>(available) ? asked : available;
}

}  // namespace

// Pure functions of the CPU and the environment at first use: evaluated
// once, never written afterwards.
CpuLevel cpu_level_available() {
  static const CpuLevel level = detect();
  return level;
}

CpuLevel cpu_level() {
  static const CpuLevel level = requested(cpu_level_available());
  return level;
}

const char* cpu_level_name(CpuLevel level) {
  switch (level) {
    case CpuLevel::kAvx512: return "avx512";
    case CpuLevel::kAvx2: return "avx2";
    default: return "portable";
  }
}

bool cpu_has_avx2() { return cpu_level() >= CpuLevel::kAvx2; }
bool cpu_has_f16c() { return cpu_level() >= CpuLevel::kAvx2; }

namespace {
// Whether the level in use is AVX-512 and the CPU has the extension in
// CPUID leaf Leaf.Sub, register Reg (0 EAX .. 3 EDX), bit Bit; the CPUID is
// read once per extension.
template <unsigned Leaf, unsigned Sub, int Reg, int Bit>
bool avx512_extension() {
#if PQ_X86_KERNELS
  static const bool has = [] {
    unsigned r[4];
    return cpuid(Leaf, Sub, r) && (r[Reg] & (1u << Bit)) != 0;
  }();
  return cpu_level() >= CpuLevel::kAvx512 && has;
#else
  return false;
#endif
}
}  // namespace

bool cpu_has_avx512_vbmi() { return avx512_extension<7, 0, 2, 1>(); }  // ECX bit 1
bool cpu_has_avx512_bf16() { return avx512_extension<7, 1, 0, 5>(); }  // EAX bit 5

}  // namespace pq
