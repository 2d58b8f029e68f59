// Live bytes allocated through operator new, by anyone in the process (the
// library included: its calls to operator new bind to the executable's
// replacement, heap_counter.cpp). For benchmarks that report what an
// operation really allocates, which the memory limit's upper bounds
// (pq_stats.host_bytes) do not say.
#pragma once

#include <cstdint>

namespace bench {
uint64_t heap_bytes_live();
}  // namespace bench
