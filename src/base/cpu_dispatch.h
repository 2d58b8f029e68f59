// Choosing between an AVX2 and a portable build of one function at run
// time, without GCC's target_clones: its ifunc resolvers run while the
// dynamic loader relocates the library, before sanitizer runtimes are set
// up, and GCC 12's ThreadSanitizer crashes there. Instead each function has
// one body (an always-inline function), compiled twice by two thin
// wrappers, and a pointer to one of them chosen on first use:
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
#pragma once

#define PQ_ALWAYS_INLINE inline __attribute__((always_inline))
#if defined(__x86_64__) && defined(__GNUC__)
#define PQ_TARGET_AVX2 __attribute__((target("avx2")))
#else
#define PQ_TARGET_AVX2
#endif

namespace pq {

// Whether the CPU has AVX2 (asked once). False off x86-64.
bool cpu_has_avx2();
// Whether the CPU has F16C (and AVX), from CPUID (asked once).
bool cpu_has_f16c();

}  // namespace pq
