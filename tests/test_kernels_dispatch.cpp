// The kernel level a process uses and the element conversions every kernel
// level starts from, against their scalar definitions (dtype.h), at the
// level PQ_CPU_LEVEL asks (tests/kernel_level.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/cpu_dispatch.h"
#include "base/dtype.h"
#include "kernel_level.h"
#include "pqcache.h"

namespace {

TEST(KernelLevel, TheAskedLevelIsTheOneInUse) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  const char* asked = std::getenv("PQ_CPU_LEVEL");
  if (asked == nullptr) GTEST_SKIP() << "PQ_CPU_LEVEL not set: this run tests the CPU's own level";
  EXPECT_STREQ(pq::cpu_level_name(pq::cpu_level()), asked);
  // The public report names the same level (with "+bf16" where it applies).
  EXPECT_EQ(std::strncmp(pq_cpu_level(), asked, std::strlen(asked)), 0) << pq_cpu_level();
  EXPECT_LE(static_cast<int>(pq::cpu_level()), static_cast<int>(pq::cpu_level_available()));
  if (pq::cpu_level() < pq::CpuLevel::kAvx512) EXPECT_FALSE(pq::cpu_has_avx512_bf16());
}

// The public report names AVX512_BF16 exactly when the kernels use it, and
// an extension PQ_CPU_FEATURES switches off is used by none (with that
// reason), whatever the CPU has.
TEST(KernelLevel, SwitchedOffFeaturesAreNotUsed) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  const std::string report = pq_cpu_level();
  EXPECT_EQ(report.find("+bf16") != std::string::npos, pq::cpu_has_avx512_bf16()) << report;
  const char* env = std::getenv("PQ_CPU_FEATURES");
  const std::string off = env != nullptr ? std::string(",") + env + "," : "";
  for (pq::CpuFeature f : {pq::CpuFeature::kAvx512Bf16, pq::CpuFeature::kAvx512Vbmi,
                           pq::CpuFeature::kAvx512Fp16, pq::CpuFeature::kAmxBf16}) {
    const std::string name = pq::cpu_feature_name(f);
    const std::string& why = pq::cpu_feature_missing(f);
    if (off.find(",-" + name + ",") != std::string::npos)
      EXPECT_NE(why.find("PQ_CPU_FEATURES"), std::string::npos) << name << ": " << why;
    if (pq::cpu_level() < pq::CpuLevel::kAvx512)
      EXPECT_NE(why.find("kernel level"), std::string::npos) << name << ": " << why;
    std::printf("%s: %s\n", name.c_str(), why.empty() ? "used where it applies" : why.c_str());
  }
  if (off.find(",-avx512bf16,") != std::string::npos) EXPECT_FALSE(pq::cpu_has_avx512_bf16());
  if (off.find(",-amx,") != std::string::npos) EXPECT_FALSE(pq::cpu_has_amx_bf16());
}

// Every 16-bit pattern (f16, bf16) and every fp8 code, converted in bulk by
// the level's kernel and one at a time by the scalar definition.
TEST(KernelLevel, ToFloatMatchesTheScalarDefinitionForEveryCode) {
  PQ_REQUIRE_ASKED_KERNEL_LEVEL();
  std::vector<uint16_t> halves(65536);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> got(halves.size());
  for (int32_t dtype : {PQ_DTYPE_F16, PQ_DTYPE_BF16}) {
    pq::to_float(halves.data(), dtype, static_cast<int64_t>(halves.size()), got.data());
    for (size_t i = 0; i < halves.size(); ++i) {
      const float want = dtype == PQ_DTYPE_F16 ? pq::half_to_float(halves[i])
                                                 : pq::bf16_to_float(halves[i]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got[i])) << pq::dtype_name(dtype) << " code " << i;
      } else {
        ASSERT_EQ(got[i], want) << pq::dtype_name(dtype) << " code " << i;
      }
    }
  }
  std::vector<uint8_t> bytes(256);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i);
  for (int32_t dtype : {PQ_DTYPE_FP8_E4M3, PQ_DTYPE_FP8_E5M2}) {
    const auto& table = dtype == PQ_DTYPE_FP8_E4M3 ? pq::kE4m3ToFloat : pq::kE5m2ToFloat;
    got.assign(256, 0.f);
    pq::to_float(bytes.data(), dtype, 256, got.data(), 0.5f);
    for (size_t i = 0; i < 256; ++i) {
      // e4m3's 0x7F/0xFF (NaN) never reach the bulk path: ingest rejects them.
      if (std::isnan(table[i])) continue;
      ASSERT_EQ(got[i], table[i] * 0.5f) << pq::dtype_name(dtype) << " code " << i;
    }
  }
}

}  // namespace
