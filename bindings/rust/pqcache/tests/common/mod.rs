//! What several integration tests share: deterministic test data and the
//! small PQ context they run on.

use pqcache::{Config, DType, Library, Selector};

pub const TOKENS: usize = 300;
pub const KV_HEADS: usize = 2;
pub const Q_HEADS: usize = 4;
pub const HEAD_DIM: usize = 16;

/// One layer of `Q_HEADS` x `KV_HEADS` x `HEAD_DIM` f32, 2 x 4-bit PQ, 4
/// sinks, a 16-token window and 16 selected tokens, with `selector`.
pub fn small_config(selector: Selector) -> Config {
    Library::linked()
        .default_config()
        .geometry(1, Q_HEADS as i32, KV_HEADS as i32, HEAD_DIM as i32)
        .dtype(DType::F32)
        .pq_subspaces(2)
        .pq_bits(4)
        .sink_tokens(4)
        .local_tokens(16)
        .topk_tokens(16)
        .selector(selector)
}

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
