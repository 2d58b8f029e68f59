//! What several integration tests share: deterministic test data.

/// Values in [-1, 1) from a 32-bit mix of (stream, i).
pub fn generate(stream: u32, n: usize) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            let mut h = i
                .wrapping_mul(2654435761)
                .wrapping_add(stream.wrapping_mul(97531));
            h ^= h >> 15;
            h = h.wrapping_mul(2246822519);
            h ^= h >> 13;
            (h >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}
