// Products too small for a normal float become zero, not subnormals (which
// cost a microcode assist per multiply on some cores), at every kernel
// level alike: MXCSR's flush-to-zero and denormals-are-zero for the scope.
// The PQ scans that multiply tables of exps use it (pq_softmax_scan.cpp,
// tail_estimate.cpp).
#pragma once

#include "base/cpu_dispatch.h"
#include "base/x86_intrinsics.h"

namespace pq {

class FlushSubnormals {
 public:
#if PQ_X86_KERNELS
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushSubnormals() { _mm_setcsr(saved_); }
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
  unsigned saved_;
#endif
};

}  // namespace pq
