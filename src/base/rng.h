// Seeded random numbers for K-Means: splitmix64 to mix seeds, xoshiro256**
// for the streams. Small, fast and fully determined by the seed, so that an
// index depends only on (seed, layer, group) and never on time or threads.
#pragma once

#include <cstdint>

namespace pq {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Folds `value` into `seed`; different (seed, value) pairs give unrelated
// results.
inline uint64_t mix_seed(uint64_t seed, uint64_t value) {
  uint64_t state = seed ^ (value * 0xd1342543de82ef95ULL + 0x2545f4914f6cdd1dULL);
  splitmix64(state);
  return splitmix64(state);
}

// xoshiro256**: small, fast, and fully determined by its seed.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& word : state_) word = splitmix64(seed);
  }

  uint64_t next() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [0, bound), bound >= 1, without modulo bias.
  uint64_t below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }

  // Uniform in [0, 1).
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
};

}  // namespace pq
