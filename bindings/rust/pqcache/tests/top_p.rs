//! `top_p` (0.15): budgets per kv head and step. A tiny share keeps the
//! floor (one middle token with a floor of 0), 1 keeps all k, and both
//! fields round-trip through the context's config; a selector without
//! q.k estimates is an `InvalidArgument` naming the field.

mod common;

use common::{generate, small_config, HEAD_DIM, KV_HEADS, Q_HEADS, TOKENS};
use pqcache::{Context, Selection, Selector, Shape, Status, Tensor};

/// Each kv head's count (sinks, middle, window) of one select.
fn counts(top_p: f32, floor: f32) -> Vec<usize> {
    let ctx = Context::new(&small_config(Selector::Pq).top_p(top_p).top_p_floor(floor)).unwrap();
    assert_eq!(ctx.config().as_raw().top_p, top_p);
    assert_eq!(ctx.config().as_raw().top_p_floor, floor);
    let kv = Shape::token_major(TOKENS, KV_HEADS, HEAD_DIM);
    let (k, v) = (
        generate(81, TOKENS * KV_HEADS * HEAD_DIM),
        generate(82, TOKENS * KV_HEADS * HEAD_DIM),
    );
    let q = generate(83, Q_HEADS * HEAD_DIM);
    let query = Tensor::f32(&q, Shape::token_major(1, Q_HEADS, HEAD_DIM)).unwrap();
    ctx.add_sequence(1).unwrap();
    ctx.prefill(1, 0, &Tensor::f32(&k, kv).unwrap(), &Tensor::f32(&v, kv).unwrap())
        .unwrap();
    let mut sel = Selection::new(KV_HEADS, 0);
    ctx.select(1, 0, &query, &mut sel).unwrap();
    (0..KV_HEADS).map(|h| sel.head(h).len()).collect()
}

#[test]
fn a_tiny_share_keeps_the_floor_and_one_keeps_every_k() {
    // 4 sinks and a 16-token window around the middle's picks (k = 16).
    assert_eq!(counts(1e-6, 0.0), vec![4 + 1 + 16; KV_HEADS]);
    assert_eq!(counts(1.0, 0.02), vec![4 + 16 + 16; KV_HEADS]);
}

#[test]
fn top_p_needs_estimates_of_q_k() {
    let err = Context::new(&small_config(Selector::H2o).top_p(0.5)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert!(err.message.contains("top_p"), "{err}");
    let err = Context::new(&small_config(Selector::Pq).top_p(1.5)).unwrap_err();
    assert!(err.message.contains("top_p"), "{err}");
}
