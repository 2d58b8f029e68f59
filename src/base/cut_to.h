// Cutting held state back (a truncate) so that what it keeps stays within
// what the host memory limit charges: the charge allows a vector up to
// twice what it uses (kGrowthRoom, selectors/selector_state.h), and
// std::vector::resize never gives memory back.
#pragma once

#include <cstddef>
#include <vector>

namespace pq {

// Keeps the first n entries of v, and gives memory back once v would hold
// more than twice them. A run of small cuts copies nothing (each copy at
// least halves the capacity), so the cost stays proportional to what goes.
template <typename T>
void cut_to(std::vector<T>& v, size_t n) {
  if (n >= v.size()) return;
  if (v.capacity() > 2 * n)
    std::vector<T>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n)).swap(v);
  else
    v.resize(n);
}

}  // namespace pq
