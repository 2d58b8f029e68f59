//! The checks this crate makes before calling the library speak the shared
//! vocabulary of docs/bindings/errors.md: `InvalidArgument` (the status the
//! library gives a bad argument) and a message that starts with the C
//! function and names the argument, its value and what was expected. Each
//! test asserts the whole message, and that the library was not called.

use std::path::Path;

use pqcache::{
    Config, Context, DType, Error, FetchItem, Library, SelectItem, Selection, Shape, Status,
    Tensor, TensorMut,
};

const LAYERS: usize = 2;
const Q_HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const TOKENS: usize = 64;

fn config() -> Config {
    Library::linked()
        .default_config()
        .dtype(DType::F32)
        .geometry(
            LAYERS as i32,
            Q_HEADS as i32,
            KV_HEADS as i32,
            HEAD_DIM as i32,
        )
        .pq_subspaces(2)
        .pq_bits(4)
        .sink_tokens(4)
        .local_tokens(8)
        .topk_tokens(8)
        .worker_threads(1)
}

/// A context with sequence 1 prefilled at every layer, and a selection of it.
fn prefilled() -> (Context, Selection) {
    let ctx = Context::new(&config()).unwrap();
    ctx.add_sequence(1).unwrap();
    let kv: Vec<f32> = (0..TOKENS * KV_HEADS * HEAD_DIM)
        .map(|i| ((i * 37 % 101) as f32) / 101.0 - 0.5)
        .collect();
    let shape = Shape::token_major(TOKENS, KV_HEADS, HEAD_DIM);
    for layer in 0..LAYERS {
        let t = Tensor::f32(&kv, shape).unwrap();
        ctx.prefill(1, layer, &t, &t).unwrap();
    }
    ctx.wait_builds().unwrap();
    let q = vec![0.25f32; Q_HEADS * HEAD_DIM];
    let mut sel = Selection::new(KV_HEADS, 0);
    ctx.select(1, 0, &query(&q), &mut sel).unwrap();
    (ctx, sel)
}

fn query(q: &[f32]) -> Tensor<'_> {
    Tensor::f32(q, Shape::token_major(1, Q_HEADS, HEAD_DIM)).unwrap()
}

/// `InvalidArgument` with exactly `message`.
#[track_caller]
fn assert_refused<T: std::fmt::Debug>(result: pqcache::Result<T>, message: &str) {
    let err: Error = result.unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert_eq!(err.message, message);
    assert_eq!(
        err.to_string(),
        format!("PQ_ERR_INVALID_ARGUMENT: {message}")
    );
}

#[test]
fn tensors_too_short_or_overlapping_name_the_call_and_the_argument() {
    let ctx = Context::new(&config()).unwrap();
    ctx.add_sequence(1).unwrap();
    let kv = vec![0.5f32; 8 * KV_HEADS * HEAD_DIM];
    let shape = Shape::token_major(8, KV_HEADS, HEAD_DIM);
    let whole = Tensor::f32(&kv, shape).unwrap();
    // A view is made without a check; the call checks it.
    let short = Tensor::f32(&kv[1..], shape).unwrap();
    assert_refused(
        ctx.prefill(1, 0, &whole, &short),
        "pq_prefill_layer: values.data has 255 elements; expected at least 256 \
         (tokens 8 x heads 2 x head_dim 16, token_stride 32, head_stride 16)",
    );
    let overlapping = Tensor::f32(
        &kv,
        Shape::strided(8, KV_HEADS, HEAD_DIM, HEAD_DIM, HEAD_DIM),
    )
    .unwrap();
    assert_refused(
        ctx.append(1, 1, &overlapping, &whole),
        "pq_decode_append: keys.token_stride / head_stride are 16 / 16; expected strides \
         under which no two rows overlap (tokens 8 x heads 2 x head_dim 16)",
    );
    let huge = Tensor::f32(&kv, Shape::token_major(usize::MAX, Q_HEADS, HEAD_DIM)).unwrap();
    assert_refused(
        ctx.prefill_queries(1, 0, &huge),
        &format!(
            "pq_prefill_queries: queries.data has 256 elements; expected at least the span of \
             tokens {} x heads 4 x head_dim 16, token_stride 64, head_stride 16, which \
             overflows usize",
            usize::MAX
        ),
    );
    // Nothing reached the library.
    assert_eq!(ctx.sequence_length(1, 0).unwrap(), 0);
    assert_eq!(ctx.sequence_length(1, 1).unwrap(), 0);
}

#[test]
fn select_fetch_attend_and_observe_name_their_arguments() {
    let (ctx, sel) = prefilled();
    let before = ctx.stats().unwrap();
    let q = vec![0.25f32; Q_HEADS * HEAD_DIM];
    let q_short = Tensor::f32(&q[..63], Shape::token_major(1, Q_HEADS, HEAD_DIM)).unwrap();
    assert_refused(
        ctx.select(1, 0, &q_short, &mut Selection::new(KV_HEADS, 0)),
        "pq_decode_select: query.data has 63 elements; expected at least 64 \
         (tokens 1 x heads 4 x head_dim 16, token_stride 64, head_stride 16)",
    );
    assert_refused(
        ctx.speculate(1, 0, &q_short, &mut Selection::new(KV_HEADS, 0)),
        "pq_decode_speculate: query_estimate.data has 63 elements; expected at least 64 \
         (tokens 1 x heads 4 x head_dim 16, token_stride 64, head_stride 16)",
    );

    let rows = Shape::head_major(sel.capacity(), KV_HEADS, HEAD_DIM);
    let span = rows.span().unwrap();
    let (mut k, mut v) = (vec![0f32; span], vec![0f32; span - 1]);
    assert_refused(
        ctx.fetch(
            1,
            0,
            &sel,
            &mut TensorMut::f32(&mut k, rows).unwrap(),
            &mut TensorMut::f32(&mut v, rows).unwrap(),
        ),
        &format!(
            "pq_fetch_kv: out_values.data has {} elements; expected at least {span} \
             (tokens {} x heads 2 x head_dim 16, token_stride 16, head_stride {})",
            span - 1,
            sel.capacity(),
            sel.capacity() * HEAD_DIM
        ),
    );
    let other_heads = Selection::new(3, sel.capacity());
    let mut v = vec![0f32; span];
    assert_refused(
        ctx.fetch(
            1,
            0,
            &other_heads,
            &mut TensorMut::f32(&mut k, rows).unwrap(),
            &mut TensorMut::f32(&mut v, rows).unwrap(),
        ),
        "pq_fetch_kv: selection has 3 kv heads; expected 2 (num_kv_heads)",
    );

    let mut out = vec![0f32; Q_HEADS * HEAD_DIM - 1];
    assert_refused(
        ctx.attend_into(1, 0, &query(&q), &sel, None, &mut out, None),
        "pq_decode_attend: out has 63 floats; expected at least 64 \
         (num_q_heads 4 x head_dim 16)",
    );
    let mut out = vec![0f32; Q_HEADS * HEAD_DIM];
    let mut lse = vec![0f32; Q_HEADS - 1];
    assert_refused(
        ctx.attend_into(1, 0, &query(&q), &sel, None, &mut out, Some(&mut lse)),
        "pq_decode_attend: out_lse has 3 floats; expected at least 4 (num_q_heads)",
    );
    assert_refused(
        ctx.attend(1, 0, &query(&q), &other_heads, None),
        "pq_decode_attend: selection has 3 kv heads; expected 2 (num_kv_heads)",
    );

    let probs = vec![0.1f32; 3];
    assert_refused(
        ctx.observe_attention(1, 0, &sel, &probs),
        &format!(
            "pq_observe_attention: probs has 3 floats; expected at least {} \
             (2 kv heads x selection capacity {})",
            KV_HEADS * sel.capacity(),
            sel.capacity()
        ),
    );
    let after = ctx.stats().unwrap();
    assert_eq!(after.select_calls, before.select_calls, "no select ran");
    assert_eq!(after.fetch_calls, before.fetch_calls, "no fetch ran");
}

#[test]
fn integers_outside_the_c_types_read_as_the_library_would_say() {
    let (ctx, _) = prefilled();
    // A layer past int32_t is out of range for any context: the same text
    // as the library's for a layer past the last.
    let library = ctx.sequence_length(1, LAYERS).unwrap_err();
    assert_eq!(library.status, Status::InvalidArgument);
    assert_eq!(
        library.message,
        "pq_sequence_length: layer is 2; expected 0..1"
    );
    assert_refused(
        ctx.sequence_length(1, 1 << 40),
        "pq_sequence_length: layer is 1099511627776; expected 0..1",
    );
    assert_refused(
        ctx.index_centroids(1, 0, 1 << 32, &mut vec![0f32; ctx.centroid_floats()]),
        "pq_index_centroids: kv_head is 4294967296; expected 0..1",
    );
    assert_refused(
        ctx.index_codes(1, 0, 0, 0, &mut [0u8; 3]),
        "pq_index_codes: out has 3 bytes; expected a multiple of pq_subspaces 2 \
         (count tokens x pq_subspaces)",
    );
    let beyond = i64::MAX as usize + 1;
    assert_refused(
        ctx.token_classes(1, beyond, &[0u8; 4]),
        "pq_sequence_token_classes: first is 9223372036854775808; expected at most \
         9223372036854775807 (int64_t)",
    );
    assert_refused(
        ctx.truncate(1, beyond),
        "pq_sequence_truncate: tokens is 9223372036854775808; expected at most \
         9223372036854775807 (int64_t)",
    );
    assert_refused(
        ctx.selection_capacity_for(0, beyond),
        "pq_selection_capacity_for: tokens is 9223372036854775808; expected at most \
         9223372036854775807 (int64_t)",
    );
    assert_eq!(ctx.sequence_length(1, 0).unwrap(), TOKENS);
}

#[test]
fn batches_name_the_item_and_its_argument() {
    let (ctx, sel) = prefilled();
    ctx.add_sequence(2).unwrap();
    let q = vec![0.25f32; Q_HEADS * HEAD_DIM];
    let (mut a, mut b) = (Selection::new(KV_HEADS, 0), Selection::new(KV_HEADS, 0));
    let short = Tensor::f32(&q[..10], Shape::token_major(1, Q_HEADS, HEAD_DIM)).unwrap();
    let mut items = vec![
        SelectItem::new(1, query(&q), &mut a),
        SelectItem::new(2, short, &mut b),
    ];
    assert_refused(
        ctx.select_batch(0, &mut items),
        "pq_decode_select_batch: items[1].query.data has 10 elements; expected at least 64 \
         (tokens 1 x heads 4 x head_dim 16, token_stride 64, head_stride 16)",
    );
    assert!(items.iter().all(|item| item.status().is_none()));

    let rows = Shape::head_major(sel.capacity(), KV_HEADS, HEAD_DIM);
    let span = rows.span().unwrap();
    let other_heads = Selection::new(3, sel.capacity());
    let mut bufs = vec![vec![0f32; span]; 4];
    let (first, second) = bufs.split_at_mut(2);
    let (k0, v0) = first.split_at_mut(1);
    let (k1, v1) = second.split_at_mut(1);
    let mut items = vec![
        FetchItem::new(
            1,
            &sel,
            TensorMut::f32(&mut k0[0], rows).unwrap(),
            TensorMut::f32(&mut v0[0], rows).unwrap(),
        ),
        FetchItem::new(
            2,
            &other_heads,
            TensorMut::f32(&mut k1[0], rows).unwrap(),
            TensorMut::f32(&mut v1[0][1..], rows).unwrap(),
        ),
    ];
    assert_refused(
        ctx.fetch_batch(0, &mut items),
        "pq_fetch_kv_batch: items[1].selection has 3 kv heads; expected 2 (num_kv_heads)",
    );
    items[1].selection = &sel;
    assert_refused(
        ctx.fetch_batch(0, &mut items),
        &format!(
            "pq_fetch_kv_batch: items[1].out_values.data has {} elements; expected at least \
             {span} (tokens {} x heads 2 x head_dim 16, token_stride 16, head_stride {})",
            span - 1,
            sel.capacity(),
            sel.capacity() * HEAD_DIM
        ),
    );
    assert_refused(
        ctx.select_batch(1 << 31, &mut []),
        "pq_decode_select_batch: layer is 2147483648; expected 0..1",
    );
    drop(items);
    assert!(bufs.iter().flatten().all(|&x| x == 0.0), "nothing written");
}

#[test]
fn paths_with_a_nul_byte_name_the_call() {
    let (ctx, _) = prefilled();
    let path = Path::new("state\0.pq");
    assert_refused(
        ctx.save_file(1, path),
        "pq_sequence_save_file: path is \"state\\0.pq\"; expected a path without NUL bytes",
    );
    assert_refused(
        ctx.restore_file(3, path),
        "pq_sequence_restore_file: path is \"state\\0.pq\"; expected a path without NUL bytes",
    );
    assert_refused(
        Library::linked().create(&config().cuda_plugin_path("plug\0in.so")),
        "pq_create: config.cuda_plugin_path is \"plug\\0in.so\"; expected a path without NUL \
         bytes",
    );
}
