// Eigenvectors of a small symmetric matrix (InfiniGen's skew: the right
// singular vectors of a head's queries are the eigenvectors of Q^T Q).
// Cyclic Jacobi rotations in double: O(n^3) a sweep, a few sweeps; meant for
// head_dim-sized matrices (64 to 256), where a LAPACK dependency would buy
// nothing the library needs elsewhere.
#pragma once

#include <cstdint>
#include <vector>

namespace pq {

struct SymmetricEigen {
  std::vector<double> values;   // [n], in no particular order
  std::vector<double> vectors;  // [n][n] row-major: vectors[i * n + j] is component i of vector j
};

// a: [n][n] row-major, symmetric (only that is read). The vectors are
// orthonormal to rounding; a = V diag(values) V^T.
SymmetricEigen symmetric_eigen(std::vector<double> a, int32_t n);

}  // namespace pq
