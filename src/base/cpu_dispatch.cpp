#include "base/cpu_dispatch.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#if PQ_X86_KERNELS
#include <cpuid.h>
#endif
#if PQ_X86_KERNELS && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
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

// CPUID leaf Leaf.Sub, register Reg (0 EAX .. 3 EDX), bit Bit.
template <unsigned Leaf, unsigned Sub, int Reg, int Bit>
bool cpuid_bit() {
#if PQ_X86_KERNELS
  unsigned r[4];
  return cpuid(Leaf, Sub, r) && (r[Reg] & (1u << Bit)) != 0;
#else
  return false;
#endif
}

// Empty when the CPU and the OS let this process use AMX-BF16 tiles, else
// why not. Linux keeps the tile data (8 KiB a thread) out of a thread's
// saved state until the process asks for it (arch_prctl
// ARCH_REQ_XCOMP_PERM, once); a tile instruction without that permission
// kills the process with SIGILL.
std::string amx_bf16_refusal() {
#if PQ_X86_KERNELS && defined(__linux__)
  // CPUID.(7,0):EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
  if (!cpuid_bit<7, 0, 3, 22>() || !cpuid_bit<7, 0, 3, 24>()) return "the CPU has no AMX-BF16";
  if (!cpuid_bit<1, 0, 2, 27>()) return "the OS does not enable XSAVE";  // OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  constexpr unsigned kTileCfg = 1u << 17, kTileData = 1u << 18;  // XCR0
  if ((lo & (kTileCfg | kTileData)) != (kTileCfg | kTileData))
    return "the OS does not enable the AMX tile state (XCR0 bits 17 and 18)";
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
    return std::string("Linux refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
           std::strerror(errno) + ")";
  return {};
#else
  return "AMX is used on Linux x86-64 only";
#endif
}

// Whether PQ_CPU_FEATURES names "-<name>" (entries separated by commas or
// spaces).
bool switched_off(const char* name) {
  const char* env = std::getenv("PQ_CPU_FEATURES");
  if (env == nullptr) return false;
  const std::string list = std::string(",") + env + ",";
  for (size_t i = 0; (i = list.find(std::string("-") + name, i)) != std::string::npos; ++i) {
    const char before = list[i - 1], after = list[i + 1 + std::strlen(name)];
    if ((before == ',' || before == ' ') && (after == ',' || after == ' ')) return true;
  }
  return false;
}

std::string missing(CpuFeature feature) {
  if (cpu_level() < CpuLevel::kAvx512)
    return std::string("the kernel level in use is ") + cpu_level_name(cpu_level()) +
           ", not avx512";
  const char* name = cpu_feature_name(feature);
  if (switched_off(name)) return std::string("switched off by PQ_CPU_FEATURES=-") + name;
  switch (feature) {
    case CpuFeature::kAvx512Bf16:  // CPUID.(7,1):EAX bit 5
      return cpuid_bit<7, 1, 0, 5>() ? "" : "the CPU has no AVX512_BF16";
    case CpuFeature::kAvx512Vbmi:  // CPUID.(7,0):ECX bit 1
      return cpuid_bit<7, 0, 2, 1>() ? "" : "the CPU has no AVX512_VBMI";
    case CpuFeature::kAvx512Fp16:  // CPUID.(7,0):EDX bit 23
      return cpuid_bit<7, 0, 3, 23>() ? "" : "the CPU has no AVX512_FP16";
    case CpuFeature::kAmxBf16: return amx_bf16_refusal();
  }
  return "unknown feature";
}

}  // namespace

const char* cpu_feature_name(CpuFeature feature) {
  switch (feature) {
    case CpuFeature::kAvx512Bf16: return "avx512bf16";
    case CpuFeature::kAvx512Vbmi: return "avx512vbmi";
    case CpuFeature::kAvx512Fp16: return "avx512fp16";
    case CpuFeature::kAmxBf16: return "amx";
  }
  return "unknown";
}

// Decided once per feature, at its first use (AMX's permission is asked
// only by a process that asks for AMX): a pure function of the CPU, the OS
// and the environment then.
const std::string& cpu_feature_missing(CpuFeature feature) {
  switch (feature) {
    case CpuFeature::kAvx512Bf16: {
      static const std::string reason = missing(feature);
      return reason;
    }
    case CpuFeature::kAvx512Vbmi: {
      static const std::string reason = missing(feature);
      return reason;
    }
    case CpuFeature::kAvx512Fp16: {
      static const std::string reason = missing(feature);
      return reason;
    }
    default: {
      static const std::string reason = missing(CpuFeature::kAmxBf16);
      return reason;
    }
  }
}

bool cpu_has_avx512_vbmi() { return cpu_feature_missing(CpuFeature::kAvx512Vbmi).empty(); }
bool cpu_has_avx512_bf16() { return cpu_feature_missing(CpuFeature::kAvx512Bf16).empty(); }
bool cpu_has_avx512_fp16() { return cpu_feature_missing(CpuFeature::kAvx512Fp16).empty(); }
bool cpu_has_amx_bf16() { return cpu_feature_missing(CpuFeature::kAmxBf16).empty(); }

}  // namespace pq
