// <immintrin.h> for the kernels of each level (base/cpu_dispatch.h), where
// PQ_X86_KERNELS. GCC 12's AVX-512 headers start some results from
// _mm512_undefined_*() and then warn that they are uninitialised (GCC bug
// 105593), so those warnings are off for the header alone.
#pragma once

#include "base/cpu_dispatch.h"

#if PQ_X86_KERNELS
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif
