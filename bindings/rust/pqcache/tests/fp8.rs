//! fp8 K/V (`DType::Fp8E4m3`, 0.10): the scales reach the library (a bad
//! one is its error, naming the index), queries stay f32, and a fetch
//! copies the stored codes back.

use pqcache::{
    Config, Context, DType, Library, Selection, Selector, Shape, Status, Tensor, TensorMut,
};

const TOKENS: usize = 300;
const KV_HEADS: usize = 2;
const Q_HEADS: usize = 4;
const HEAD_DIM: usize = 16;

/// e4m3 K/V with one scale per layer for K and one for V.
fn config(scales: &[f32]) -> Config {
    let geometry = (1, Q_HEADS as i32, KV_HEADS as i32, HEAD_DIM as i32);
    let config = Library::linked().default_config().kv_scales(1, scales);
    config
        .geometry(geometry.0, geometry.1, geometry.2, geometry.3)
        .dtype(DType::Fp8E4m3)
        .selector(Selector::Exact)
}

#[test]
fn fp8_codes_come_back_as_stored() {
    let ctx = Context::new(&config(&[0.5, 2.0])).unwrap();
    assert_eq!(ctx.dtype(), DType::Fp8E4m3);
    assert_eq!(ctx.config().as_raw().kv_scale_count, 1);
    let n = TOKENS * KV_HEADS * HEAD_DIM;
    // Finite e4m3 codes (0x7F and 0xFF are NaN).
    let keys: Vec<u8> = (0..n).map(|i| (i % 0x7F) as u8).collect();
    let values: Vec<u8> = (0..n).map(|i| 0x80 | ((i * 7) % 0x7F) as u8).collect();
    let shape = Shape::token_major(TOKENS, KV_HEADS, HEAD_DIM);
    ctx.add_sequence(1).unwrap();
    ctx.prefill(
        1,
        0,
        &Tensor::fp8(&keys, DType::Fp8E4m3, shape).unwrap(),
        &Tensor::fp8(&values, DType::Fp8E4m3, shape).unwrap(),
    )
    .unwrap();
    // Queries of an fp8 context keep their own dtype: f32 here.
    let query: Vec<f32> = (0..Q_HEADS * HEAD_DIM)
        .map(|i| (i % 5) as f32 * 0.1)
        .collect();
    let mut selection = Selection::new(KV_HEADS, 64);
    let one_token = Shape::token_major(1, Q_HEADS, HEAD_DIM);
    let query = Tensor::f32(&query, one_token).unwrap();
    ctx.select(1, 0, &query, &mut selection).unwrap();
    let rows = Shape::head_major(selection.capacity(), KV_HEADS, HEAD_DIM);
    let (mut out_k, mut out_v) = (
        vec![0u8; rows.span().unwrap()],
        vec![0u8; rows.span().unwrap()],
    );
    ctx.fetch(
        1,
        0,
        &selection,
        &mut TensorMut::fp8(&mut out_k, DType::Fp8E4m3, rows).unwrap(),
        &mut TensorMut::fp8(&mut out_v, DType::Fp8E4m3, rows).unwrap(),
    )
    .unwrap();
    // The codes expected at each selected row; rows past a head's count stay 0.
    let (mut want_k, mut want_v) = (vec![0u8; out_k.len()], vec![0u8; out_v.len()]);
    for (h, positions) in selection.heads().enumerate() {
        assert!(!positions.is_empty());
        for (i, &p) in positions.iter().enumerate() {
            let row = (h * selection.capacity() + i) * HEAD_DIM..;
            let from = (p as usize * KV_HEADS + h) * HEAD_DIM;
            want_k[row.clone()][..HEAD_DIM].copy_from_slice(&keys[from..from + HEAD_DIM]);
            want_v[row][..HEAD_DIM].copy_from_slice(&values[from..from + HEAD_DIM]);
        }
    }
    assert_eq!(out_k, want_k);
    assert_eq!(out_v, want_v);
}

#[test]
fn bad_scales_are_the_librarys_errors() {
    let err = Context::new(&config(&[0.5, -1.0])).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert!(err.message.contains("kv_scales[1]"), "{err}");
    let err = Context::new(&config(&[0.5, 1.0]).dtype(DType::F16)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert!(err.message.contains("fp8 dtypes only"), "{err}");
    let err = Context::new(&config(&[])).unwrap_err();
    assert!(err.message.contains("kv_scales is NULL"), "{err}");
}
