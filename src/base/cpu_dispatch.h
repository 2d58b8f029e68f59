// Choosing between kernel builds of one function at run time, without GCC's
// target_clones: its ifunc resolvers run while the dynamic loader relocates
// the library, before sanitizer runtimes are set up, and GCC 12's
// ThreadSanitizer crashes there. Instead each function has one body (an
// always-inline function), compiled once per level by thin wrappers, and a
// pointer to one of them chosen on first use:
//
//   PQ_ALWAYS_INLINE float f_body(...) { ... }
//   PQ_TARGET_AVX2 float f_avx2(...) { return f_body(...); }
//   float f_portable(...) { return f_body(...); }
//   float f(...) {
//     static const auto impl = cpu_has_avx2() ? f_avx2 : f_portable;
//     return impl(...);
//   }
//
// The body inlined into the AVX2 wrapper is vectorised with AVX2 there.
// Hand-written kernels (intrinsics) exist per level where they measure
// faster: cpu_level() says which level a process uses.
//
// The level is the highest the CPU (and the OS, for the AVX-512 state) has,
// lowered by the environment variable PQ_CPU_LEVEL ("portable", "avx2" or
// "avx512"; read once, at the first kernel call): that is how the tests run
// every kernel level against the portable reference on one machine, and how
// a benchmark compares levels. A level above what the CPU has gives what
// the CPU has; another value is ignored.
#pragma once

#include <string>

#define PQ_ALWAYS_INLINE inline __attribute__((always_inline))
#if defined(__x86_64__) && defined(__GNUC__)
#define PQ_TARGET_AVX2 __attribute__((target("avx2")))
#define PQ_X86_KERNELS 1
// The AVX-512 level's kernels. avx512f brings FMA with it, and GCC would
// then fuse a * b + c into one rounding, so a kernel would no longer give the
// portable build's bits: fp-contract is off in them (GCC: the optimize
// attribute here; clang: PQ_FP_CONTRACT_OFF in the body, as clang ignores
// that attribute and fuses only within one expression).
#if defined(__clang__)
#define PQ_TARGET_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")))
#else
#define PQ_TARGET_AVX512                                                         \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl"), \
                 optimize("fp-contract=off")))
#endif
#else
#define PQ_TARGET_AVX2
#define PQ_TARGET_AVX512
#define PQ_X86_KERNELS 0
#endif
#if defined(__clang__)
#define PQ_FP_CONTRACT_OFF _Pragma("clang fp contract(off)")
#else
#define PQ_FP_CONTRACT_OFF
#endif

namespace pq {

enum class CpuLevel : int {
  kPortable = 0,  // plain C++ (what the compiler's baseline target gives)
  kAvx2 = 1,      // AVX2 + FMA + F16C
  kAvx512 = 2,    // the AVX2 level + AVX-512 F, BW, DQ and VL
};

// The level in use (asked once; PQ_CPU_LEVEL may lower it).
CpuLevel cpu_level();
// "portable", "avx2" or "avx512".
const char* cpu_level_name(CpuLevel level);
// The highest level the CPU has, whatever PQ_CPU_LEVEL says.
CpuLevel cpu_level_available();

// Whether the level in use includes AVX2 + FMA + F16C. False off x86-64.
bool cpu_has_avx2();
// Whether the level in use includes F16C.
bool cpu_has_f16c();
// The AVX-512 extensions some kernels use where the CPU has them. The
// environment variable PQ_CPU_FEATURES switches them off ("-avx512bf16",
// "-avx512vbmi", "-avx512fp16", "-amx", separated by commas or spaces; read at a
// feature's first use; other entries are ignored, as an unknown
// PQ_CPU_LEVEL is): that is how the tests run the AVX-512 kernels without
// AVX512_BF16 (as on Skylake-X) on a CPU that has it.
enum class CpuFeature : int { kAvx512Bf16, kAvx512Vbmi, kAvx512Fp16, kAmxBf16 };
// "avx512bf16", "avx512vbmi", "avx512fp16", "amx": PQ_CPU_FEATURES's names.
const char* cpu_feature_name(CpuFeature feature);
// Empty when the kernels may use `feature` in this process, else why not:
// the level in use is below avx512, PQ_CPU_FEATURES switched it off, the
// CPU lacks it, or (AMX) the OS refused its state. Asked once per feature.
const std::string& cpu_feature_missing(CpuFeature feature);

// Whether the kernels may use AVX512_BF16 (VDPBF16PS: bf16 pairs
// multiplied and summed into float32).
bool cpu_has_avx512_bf16();
// ... AVX512_VBMI (VPERMB, VPERMT2B: byte permutes across a register).
bool cpu_has_avx512_vbmi();
// ... AVX512_FP16 (VCVTPH2PSX; used by no dispatched kernel, see
// attention.h's F16Conversion).
bool cpu_has_avx512_fp16();
// ... AMX-BF16 (TDPBF16PS on tiles of 16 rows x 32 bf16; used by no
// dispatched kernel, see attention.h's AttendLogits). The first call asks
// Linux for the tile state.
bool cpu_has_amx_bf16();

}  // namespace pq
