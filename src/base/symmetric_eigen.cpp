#include "base/symmetric_eigen.h"

#include <cmath>

namespace pq {

SymmetricEigen symmetric_eigen(std::vector<double> a, int32_t n) {
  const size_t N = static_cast<size_t>(n);
  SymmetricEigen out;
  out.vectors.assign(N * N, 0.0);
  for (size_t i = 0; i < N; ++i) out.vectors[i * N + i] = 1.0;
  auto at = [&](size_t r, size_t c) -> double& { return a[r * N + c]; };
  double total = 0.0;
  for (double x : a) total += x * x;
  // Each sweep zeroes every off-diagonal pair in turn (A' = J^T A J); the
  // off-diagonal mass falls quadratically once small.
  for (int sweep = 0; sweep < 64; ++sweep) {
    double off = 0.0;
    for (size_t p = 0; p < N; ++p)
      for (size_t q = p + 1; q < N; ++q) off += at(p, q) * at(p, q);
    if (off <= 1e-30 * total) break;
    for (size_t p = 0; p < N; ++p) {
      for (size_t q = p + 1; q < N; ++q) {
        const double apq = at(p, q);
        if (apq == 0.0) continue;
        const double theta = (at(q, q) - at(p, p)) / (2.0 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1.0));
        const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
        for (size_t k = 0; k < N; ++k) {  // columns p and q
          const double kp = at(k, p), kq = at(k, q);
          at(k, p) = c * kp - s * kq;
          at(k, q) = s * kp + c * kq;
        }
        for (size_t k = 0; k < N; ++k) {  // rows p and q
          const double pk = at(p, k), qk = at(q, k);
          at(p, k) = c * pk - s * qk;
          at(q, k) = s * pk + c * qk;
        }
        for (size_t k = 0; k < N; ++k) {
          double& vp = out.vectors[k * N + p];
          double& vq = out.vectors[k * N + q];
          const double kp = vp, kq = vq;
          vp = c * kp - s * kq;
          vq = s * kp + c * kq;
        }
      }
    }
  }
  out.values.resize(N);
  for (size_t i = 0; i < N; ++i) out.values[i] = at(i, i);
  return out;
}

}  // namespace pq
