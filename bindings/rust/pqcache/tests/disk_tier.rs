//! The disk tier (`KvTier::Disk`): rows that went to the file come back as
//! they were prefilled, and the directory is checked at create.

use std::path::PathBuf;

use pqcache::{
    Config, Context, DType, KvTier, Library, Selection, Selector, Shape, Status, Tensor, TensorMut,
};

const TOKENS: usize = 600; // past sink + local + 256: a chunk goes to the file
const KV_HEADS: usize = 2;
const Q_HEADS: usize = 4;
const HEAD_DIM: usize = 16;

fn config() -> Config {
    Library::linked()
        .default_config()
        .geometry(1, Q_HEADS as i32, KV_HEADS as i32, HEAD_DIM as i32)
        .dtype(DType::F32)
        .selector(Selector::Exact)
        .sink_tokens(4)
        .local_tokens(16)
        .topk_tokens(TOKENS as i32) // every token: every row is compared
        .worker_threads(1)
        .kv_tier(KvTier::Disk)
}

#[test]
fn rows_on_disk_come_back_as_prefilled() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("pqcache-disk-tier-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ctx = Context::new(&config().kv_disk_path(&dir)).unwrap();
    assert_eq!(
        KvTier::try_from(ctx.config().as_raw().kv_tier),
        Ok(KvTier::Disk)
    );

    let n = TOKENS * KV_HEADS * HEAD_DIM;
    let keys: Vec<f32> = (0..n).map(|i| i as f32 * 0.001).collect();
    let values: Vec<f32> = (0..n).map(|i| -(i as f32) * 0.002).collect();
    let shape = Shape::token_major(TOKENS, KV_HEADS, HEAD_DIM);
    ctx.add_sequence(1).unwrap();
    ctx.prefill(
        1,
        0,
        &Tensor::f32(&keys, shape).unwrap(),
        &Tensor::f32(&values, shape).unwrap(),
    )
    .unwrap();

    let query = vec![0.1f32; Q_HEADS * HEAD_DIM];
    let mut selection = Selection::new(KV_HEADS, 0);
    let q_shape = Shape::token_major(1, Q_HEADS, HEAD_DIM);
    ctx.select(1, 0, &Tensor::f32(&query, q_shape).unwrap(), &mut selection)
        .unwrap();
    let rows = Shape::head_major(selection.capacity(), KV_HEADS, HEAD_DIM);
    let (mut out_k, mut out_v) = (
        vec![0f32; rows.span().unwrap()],
        vec![0f32; rows.span().unwrap()],
    );
    ctx.fetch(
        1,
        0,
        &selection,
        &mut TensorMut::f32(&mut out_k, rows).unwrap(),
        &mut TensorMut::f32(&mut out_v, rows).unwrap(),
    )
    .unwrap();
    for (h, positions) in selection.heads().enumerate() {
        assert_eq!(positions.len(), TOKENS, "kv head {h} selects every token");
        for (i, &p) in positions.iter().enumerate() {
            let got = (h * selection.capacity() + i) * HEAD_DIM;
            let want = (p as usize * KV_HEADS + h) * HEAD_DIM;
            assert_eq!(
                out_k[got..got + HEAD_DIM],
                keys[want..want + HEAD_DIM],
                "K of token {p}"
            );
            assert_eq!(
                out_v[got..got + HEAD_DIM],
                values[want..want + HEAD_DIM],
                "V of token {p}"
            );
        }
    }
    drop(ctx);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_disk_tier_needs_a_directory_without_nul_bytes() {
    let err = Context::new(&config()).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert!(err.message.contains("kv_disk_path"), "{err}");

    let err = Context::new(&config().kv_disk_path("dir\0ectory")).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert_eq!(
        err.message,
        "pq_create: config.kv_disk_path is \"dir\\0ectory\"; expected a path without NUL bytes"
    );
}
