// The kernel level a tests/test_kernels_*.cpp process was asked to run:
// CMake registers each such program once per level with PQ_CPU_LEVEL set
// (tests/CMakeLists.txt), or with PQ_CPU_FEATURES alone for the AVX-512
// kernels without their extensions. A level the CPU lacks is SKIPPED with the reason,
// so every level is checked on a machine that has it and none is silently
// dropped on one that has not.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "base/cpu_dispatch.h"

namespace pq_test {

// Empty when the process runs the level PQ_CPU_LEVEL asks for (or none is
// asked); otherwise why not.
inline std::string kernel_level_skip_reason() {
  const char* asked = std::getenv("PQ_CPU_LEVEL");
  // PQ_CPU_FEATURES alone asks for the AVX-512 kernels with extensions off.
  if (asked == nullptr && std::getenv("PQ_CPU_FEATURES") != nullptr &&
      pq::cpu_level() < pq::CpuLevel::kAvx512)
    return std::string("PQ_CPU_FEATURES switches off AVX-512 extensions, but this process "
                       "runs the ") + pq::cpu_level_name(pq::cpu_level()) + " kernels";
  if (asked == nullptr) return {};
  const char* used = pq::cpu_level_name(pq::cpu_level());
  if (std::strcmp(asked, used) == 0) return {};
  return std::string("PQ_CPU_LEVEL=") + asked + " asked, but this CPU offers at most " +
         pq::cpu_level_name(pq::cpu_level_available());
}

}  // namespace pq_test

// At the top of every kernel test.
#define PQ_REQUIRE_ASKED_KERNEL_LEVEL()                                   \
  do {                                                                    \
    const std::string reason = pq_test::kernel_level_skip_reason();       \
    if (!reason.empty()) GTEST_SKIP() << reason;                          \
  } while (0)
