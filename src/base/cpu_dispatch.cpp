#include "base/cpu_dispatch.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

namespace pq {

bool cpu_has_avx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

// F16C from CPUID leaf 1 (clang's __builtin_cpu_supports has no "f16c").
bool cpu_has_f16c() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = [] {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0 &&
           __builtin_cpu_supports("avx");
  }();
  return has;
#else
  return false;
#endif
}

}  // namespace pq
