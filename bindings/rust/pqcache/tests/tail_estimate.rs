//! `TailEstimate::CodeMeans` (0.12): attend adds an estimate of the middle
//! tokens the selection leaves out, so every query head's log-sum-exp grows
//! past the selected rows' own and the output moves; it needs
//! `Selector::Pq` (an `InvalidArgument` naming the field otherwise).

mod common;

use common::{generate, small_config, HEAD_DIM, KV_HEADS, Q_HEADS, TOKENS};
use pqcache::{Config, Context, Selection, Selector, Shape, Status, TailEstimate, Tensor};

fn config(tail: TailEstimate, selector: Selector) -> Config {
    small_config(selector).tail_estimate(tail)
}

#[test]
fn attend_adds_the_left_out_tokens() {
    let kv = Shape::token_major(TOKENS, KV_HEADS, HEAD_DIM);
    let (k, v) = (
        generate(51, TOKENS * KV_HEADS * HEAD_DIM),
        generate(52, TOKENS * KV_HEADS * HEAD_DIM),
    );
    let q = generate(53, Q_HEADS * HEAD_DIM);
    let query = Tensor::f32(&q, Shape::token_major(1, Q_HEADS, HEAD_DIM)).unwrap();
    let mut sel = Selection::new(KV_HEADS, 0);
    let mut runs = Vec::new();
    for tail in [TailEstimate::None, TailEstimate::CodeMeans] {
        let ctx = Context::new(&config(tail, Selector::Pq)).unwrap();
        assert_eq!(ctx.config().as_raw().tail_estimate, tail as i32);
        ctx.add_sequence(1).unwrap();
        ctx.prefill(
            1,
            0,
            &Tensor::f32(&k, kv).unwrap(),
            &Tensor::f32(&v, kv).unwrap(),
        )
        .unwrap();
        if tail == TailEstimate::None {
            ctx.select(1, 0, &query, &mut sel).unwrap();
        }
        runs.push(ctx.attend(1, 0, &query, &sel, None).unwrap());
    }
    for h in 0..Q_HEADS {
        assert!(
            runs[1].lse()[h] > runs[0].lse()[h],
            "query head {h}: {} not above {}",
            runs[1].lse()[h],
            runs[0].lse()[h]
        );
    }
    assert_ne!(runs[0].output(), runs[1].output());
}

#[test]
fn the_estimate_needs_the_pq_selector() {
    let err = Context::new(&config(TailEstimate::CodeMeans, Selector::Exact)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert!(err.message.contains("tail_estimate"), "{err}");
}

/// `Context::tail` merged with the caller's own attention over the selected
/// rows, as its documentation says, is attend's result with the estimate.
#[test]
fn the_tail_alone_merges_into_attend() {
    let kv = Shape::token_major(TOKENS, KV_HEADS, HEAD_DIM);
    let (k, v) = (
        generate(61, TOKENS * KV_HEADS * HEAD_DIM),
        generate(62, TOKENS * KV_HEADS * HEAD_DIM),
    );
    let q = generate(63, Q_HEADS * HEAD_DIM);
    let query = Tensor::f32(&q, Shape::token_major(1, Q_HEADS, HEAD_DIM)).unwrap();
    let make = |tail| {
        let ctx = Context::new(&config(tail, Selector::Pq)).unwrap();
        ctx.add_sequence(1).unwrap();
        ctx.prefill(
            1,
            0,
            &Tensor::f32(&k, kv).unwrap(),
            &Tensor::f32(&v, kv).unwrap(),
        )
        .unwrap();
        ctx
    };
    let (on, off) = (make(TailEstimate::CodeMeans), make(TailEstimate::None));
    let mut sel = Selection::new(KV_HEADS, 0);
    on.select(1, 0, &query, &mut sel).unwrap();
    let whole = on.attend(1, 0, &query, &sel, None).unwrap();
    let rows = off.attend(1, 0, &query, &sel, None).unwrap();
    let tail = on.tail(1, 0, &query, &sel, None).unwrap();
    for h in 0..Q_HEADS {
        let (la, lt) = (rows.lse()[h] as f64, tail.lse()[h] as f64);
        let m = la.max(lt);
        let (wa, wt) = ((la - m).exp(), (lt - m).exp());
        let lse = m + (wa + wt).ln();
        assert!(
            (lse - whole.lse()[h] as f64).abs() < 1e-4,
            "query head {h}: lse {lse}"
        );
        for d in 0..HEAD_DIM {
            let i = h * HEAD_DIM + d;
            let o = (wa * rows.output()[i] as f64 + wt * tail.output()[i] as f64) / (wa + wt);
            assert!((o - whole.output()[i] as f64).abs() < 1e-4, "out[{i}]: {o}");
        }
    }
    let err = off.tail(1, 0, &query, &sel, None).unwrap_err();
    assert_eq!(err.status, Status::BadState, "{err}");
    assert!(err.message.contains("pq_decode_tail"), "{err}");
}
