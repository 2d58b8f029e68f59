//! `pq_outliers` (0.13): the keys with the largest quantization residuals
//! are scored by their exact q.k, so the selection of the same tokens and
//! query changes; the share round-trips through the context's config; it
//! needs `Selector::Pq` and a share in [0, 0.25] (an `InvalidArgument`
//! naming the field otherwise).

mod common;

use common::{generate, small_config, HEAD_DIM, KV_HEADS, Q_HEADS, TOKENS};
use pqcache::{Config, Context, Selection, Selector, Shape, Status, Tensor};

fn config(share: f32, selector: Selector) -> Config {
    small_config(selector).pq_outliers(share)
}

#[test]
fn outliers_change_the_selection() {
    let kv = Shape::token_major(TOKENS, KV_HEADS, HEAD_DIM);
    let (k, v) = (
        generate(71, TOKENS * KV_HEADS * HEAD_DIM),
        generate(72, TOKENS * KV_HEADS * HEAD_DIM),
    );
    let q = generate(73, Q_HEADS * HEAD_DIM);
    let query = Tensor::f32(&q, Shape::token_major(1, Q_HEADS, HEAD_DIM)).unwrap();
    let mut rows = Vec::new();
    for share in [0.0f32, 0.05] {
        let ctx = Context::new(&config(share, Selector::Pq)).unwrap();
        assert_eq!(ctx.config().as_raw().pq_outliers, share);
        ctx.add_sequence(1).unwrap();
        ctx.prefill(
            1,
            0,
            &Tensor::f32(&k, kv).unwrap(),
            &Tensor::f32(&v, kv).unwrap(),
        )
        .unwrap();
        let mut sel = Selection::new(KV_HEADS, 0);
        ctx.select(1, 0, &query, &mut sel).unwrap();
        rows.push(
            (0..KV_HEADS)
                .map(|h| sel.head(h).to_vec())
                .collect::<Vec<_>>(),
        );
    }
    assert_ne!(
        rows[0], rows[1],
        "the outliers' exact scores changed nothing"
    );
}

#[test]
fn outliers_need_the_pq_selector_and_a_share_up_to_a_quarter() {
    for (share, selector) in [(0.01, Selector::Exact), (0.5, Selector::Pq)] {
        let err = Context::new(&config(share, selector)).unwrap_err();
        assert_eq!(err.status, Status::InvalidArgument, "{err}");
        assert!(err.message.contains("pq_outliers"), "{err}");
    }
}
