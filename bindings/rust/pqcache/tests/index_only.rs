//! The index-only tier (`KvTier::Caller`), paged keys and the multi-token
//! select, as tests/test_api_index_only.cpp checks them in C: an index-only
//! context selects what a host-tier context with the same keys selects.

use std::collections::BTreeSet;

use pqcache::{
    Config, Context, DType, KvTier, Library, PagedKeys, SelectRows, Selection, Shape, Status,
    Tensor, TensorMut,
};

const Q_HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 32;
const ROW: usize = KV_HEADS * HEAD_DIM;
const PROMPT: usize = 1500;
const SEQ: u64 = 3;

fn config(tier: KvTier) -> Config {
    Library::linked()
        .default_config()
        .geometry(1, Q_HEADS as i32, KV_HEADS as i32, HEAD_DIM as i32)
        .dtype(DType::F32)
        .topk_tokens(40)
        .local_tokens(64)
        .kmeans_iterations(8)
        .worker_threads(2)
        .kv_tier(tier)
}

fn context(tier: KvTier) -> Context {
    let ctx = Context::new(&config(tier)).unwrap();
    ctx.add_sequence(SEQ).unwrap();
    ctx
}

/// A small deterministic generator (splitmix64), so the test needs no crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

fn normal(n: usize, seed: u64, scale: f64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..n).map(|_| (rng.normal() * scale) as f32).collect()
}

/// [token][kv head][dim] keys with structure (a few directions per head
/// plus noise), so that the index has clusters to find.
fn keys(tokens: usize, seed: u64) -> Vec<f32> {
    let mut keys = normal(tokens * ROW, seed, 0.3);
    let dirs = normal(8 * HEAD_DIM, seed + 1, 1.0);
    for t in 0..tokens {
        for h in 0..KV_HEADS {
            for d in 0..HEAD_DIM {
                keys[(t * KV_HEADS + h) * HEAD_DIM + d] += dirs[((t * 7 + h) % 8) * HEAD_DIM + d];
            }
        }
    }
    keys
}

fn rows(keys: &[f32], first: usize, count: usize) -> Tensor<'_> {
    Tensor::f32(
        &keys[first * ROW..(first + count) * ROW],
        Shape::token_major(count, KV_HEADS, HEAD_DIM),
    )
    .unwrap()
}

/// Every kv head's selection for one query token.
fn select(ctx: &Context, query: &[f32]) -> Vec<Vec<i32>> {
    let mut selection = Selection::new(KV_HEADS, 0);
    let q = Tensor::f32(query, Shape::token_major(1, Q_HEADS, HEAD_DIM)).unwrap();
    ctx.select(SEQ, 0, &q, &mut selection).unwrap();
    selection.heads().map(<[i32]>::to_vec).collect()
}

/// The engine's pool: positions scattered over shuffled blocks, spare
/// blocks filled with 99.
struct Pool {
    table: Vec<i32>,
    slots: Vec<i64>,
    data: Vec<f32>,
}

const BLOCK: usize = 16;

impl Pool {
    fn new(keys: &[f32], positions: usize, seed: u64) -> Pool {
        let blocks = positions.div_ceil(BLOCK);
        let pool_blocks = 2 * blocks + 3;
        let mut order: Vec<i32> = (0..pool_blocks as i32).collect();
        let mut rng = Rng(seed);
        for i in (1..order.len()).rev() {
            order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        let table = order[..blocks].to_vec();
        let mut data = vec![99f32; pool_blocks * BLOCK * ROW];
        let mut slots = Vec::new();
        for p in 0..positions {
            let slot = table[p / BLOCK] as usize * BLOCK + p % BLOCK;
            slots.push(slot as i64);
            data[slot * ROW..(slot + 1) * ROW].copy_from_slice(&keys[p * ROW..(p + 1) * ROW]);
        }
        Pool { table, slots, data }
    }

    fn tensor(&self) -> Tensor<'_> {
        let slots = self.data.len() / ROW;
        Tensor::f32(&self.data, Shape::token_major(slots, KV_HEADS, HEAD_DIM)).unwrap()
    }

    fn by_blocks(&self) -> PagedKeys<'_> {
        PagedKeys::blocks(self.tensor(), &self.table, BLOCK)
    }

    fn by_slots(&self) -> PagedKeys<'_> {
        PagedKeys::slots(self.tensor(), &self.slots)
    }
}

#[test]
fn dense_and_paged_keys_select_what_the_host_tier_selects() {
    const DECODE: usize = 24;
    let keys = keys(PROMPT + DECODE, 11);
    let pool = Pool::new(&keys, PROMPT + DECODE, 5);
    let host = context(KvTier::Host);
    let dense = context(KvTier::Caller);
    let blocks = context(KvTier::Caller);
    let slots = context(KvTier::Caller);
    assert_eq!(
        KvTier::try_from(dense.config().as_raw().kv_tier),
        Ok(KvTier::Caller)
    );
    let prompt = rows(&keys, 0, PROMPT);
    host.prefill(SEQ, 0, &prompt, &prompt).unwrap();
    dense.prefill(SEQ, 0, &prompt, None).unwrap(); // no values: index only
    blocks
        .prefill_paged(SEQ, 0, &pool.by_blocks(), PROMPT)
        .unwrap();
    slots
        .prefill_paged(SEQ, 0, &pool.by_slots(), PROMPT)
        .unwrap();
    let mut selected = 0;
    for step in 0..DECODE {
        let query = normal(Q_HEADS * HEAD_DIM, 100 + step as u64, 1.0);
        let want = select(&host, &query);
        assert_eq!(select(&dense, &query), want, "dense keys, step {step}");
        assert_eq!(select(&blocks, &query), want, "block table, step {step}");
        assert_eq!(select(&slots, &query), want, "slot map, step {step}");
        selected += want.iter().map(Vec::len).sum::<usize>();
        let one = rows(&keys, PROMPT + step, 1);
        host.append(SEQ, 0, &one, &one).unwrap();
        dense.append(SEQ, 0, &one, None).unwrap();
        blocks.append_paged(SEQ, 0, &pool.by_blocks(), 1).unwrap();
        slots.append_paged(SEQ, 0, &pool.by_slots(), 1).unwrap();
    }
    assert!(selected > 0);
    assert_eq!(blocks.sequence_length(SEQ, 0).unwrap(), PROMPT + DECODE);
}

#[test]
fn what_needs_kv_is_refused() {
    let keys = keys(600, 16);
    let ctx = context(KvTier::Caller);
    ctx.prefill(SEQ, 0, &rows(&keys, 0, 600), None).unwrap();
    let query = normal(Q_HEADS * HEAD_DIM, 1, 1.0);
    let q = Tensor::f32(&query, Shape::token_major(1, Q_HEADS, HEAD_DIM)).unwrap();
    let mut selection = Selection::new(KV_HEADS, 0);
    ctx.select(SEQ, 0, &q, &mut selection).unwrap();
    let shape = Shape::head_major(selection.capacity(), KV_HEADS, HEAD_DIM);
    let (mut out_k, mut out_v) = (
        vec![0f32; shape.span().unwrap()],
        vec![0f32; shape.span().unwrap()],
    );
    let err = ctx
        .fetch(
            SEQ,
            0,
            &selection,
            &mut TensorMut::f32(&mut out_k, shape).unwrap(),
            &mut TensorMut::f32(&mut out_v, shape).unwrap(),
        )
        .unwrap_err();
    assert_eq!(err.status, Status::Unsupported, "{err}");
    assert!(err.message.contains("index-only"), "{err}");
    let err = ctx.attend(SEQ, 0, &q, &selection, None).unwrap_err();
    assert_eq!(err.status, Status::Unsupported, "{err}");

    // Paged keys need an index-only context: one that stores K/V needs the values.
    let pool = Pool::new(&keys, 600, 3);
    let host = context(KvTier::Host);
    let err = host
        .prefill_paged(SEQ, 0, &pool.by_blocks(), 100)
        .unwrap_err();
    assert_eq!(err.status, Status::Unsupported, "{err}");
    assert!(err.message.contains("values"), "{err}");
    let err = host
        .prefill(SEQ, 0, &rows(&keys, 0, 600), None)
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert!(err.message.contains("values"), "{err}");
    // A bad map is named, and nothing is stored.
    let fresh = context(KvTier::Caller);
    let mut bad = pool.slots.clone();
    bad[7] = -1;
    let err = fresh
        .prefill_paged(SEQ, 0, &PagedKeys::slots(pool.tensor(), &bad), 100)
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert!(err.message.contains("slots[7]"), "{err}");
    let err = fresh
        .prefill_paged(SEQ, 0, &pool.by_slots(), 601)
        .unwrap_err();
    assert!(err.message.contains("not mapped"), "{err}");
    assert_eq!(
        fresh.sequence_length(SEQ, 0).unwrap(),
        0,
        "a refused call stores nothing"
    );
    // A pool shorter than its shape is caught before the library reads it.
    let short = Tensor::f32(
        &pool.data[..10],
        Shape::token_major(100, KV_HEADS, HEAD_DIM),
    )
    .unwrap();
    let err = fresh
        .prefill_paged(SEQ, 0, &PagedKeys::dense(short), 100)
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert!(err.message.contains("keys.pool.data"), "{err}");
}

#[test]
fn multi_token_select_rows() {
    const N: usize = 1800;
    const TOKENS: usize = 3;
    let keys = keys(N, 18);
    for tier in [KvTier::Host, KvTier::Caller] {
        let ctx = context(tier);
        let all = rows(&keys, 0, N);
        let values = (tier == KvTier::Host).then_some(&all);
        ctx.prefill(SEQ, 0, &all, values).unwrap();
        let queries = normal(TOKENS * Q_HEADS * HEAD_DIM, 21, 1.0);
        let single: Vec<Vec<Vec<i32>>> = queries // [token][kv head]
            .chunks(Q_HEADS * HEAD_DIM)
            .map(|q| select(&ctx, q))
            .collect();
        let q = Tensor::f32(&queries, Shape::token_major(TOKENS, Q_HEADS, HEAD_DIM)).unwrap();
        let union = |rows: &mut dyn Iterator<Item = &Vec<i32>>| -> Vec<i32> {
            rows.flatten()
                .copied()
                .collect::<BTreeSet<i32>>()
                .into_iter()
                .collect()
        };
        let mut out = Selection::new(0, 0); // grown by select_multi
        for form in [
            SelectRows::PerToken,
            SelectRows::PerHead,
            SelectRows::PerRequest,
        ] {
            let want: Vec<Vec<i32>> = match form {
                SelectRows::PerToken => single.iter().flatten().cloned().collect(),
                SelectRows::PerHead => (0..KV_HEADS)
                    .map(|h| union(&mut single.iter().map(|token| &token[h])))
                    .collect(),
                SelectRows::PerRequest => vec![union(&mut single.iter().flatten())],
            };
            let (row_count, capacity) = ctx.selection_capacity_multi(SEQ, 0, TOKENS, form).unwrap();
            ctx.select_multi(SEQ, 0, &q, form, None, &mut out).unwrap();
            assert_eq!(row_count, want.len(), "{tier:?} {form:?}");
            assert_eq!(out.rows(), row_count, "{tier:?} {form:?}");
            assert!(out.capacity() >= capacity, "{tier:?} {form:?}");
            for (r, want_row) in want.iter().enumerate() {
                assert_eq!(out.row(r), &want_row[..], "{tier:?} {form:?} row {r}");
                let padded = &out.padded_positions()[r * out.capacity()..(r + 1) * out.capacity()];
                assert!(
                    padded[want_row.len()..].iter().all(|&p| p == -1),
                    "{tier:?} {form:?} row {r} is not padded with -1: {padded:?}"
                );
            }
        }
    }
}

#[test]
fn kv_head_offset_round_trips() {
    let ctx = Context::new(&config(KvTier::Host).kv_head_offset(6)).unwrap();
    assert_eq!(ctx.config().as_raw().kv_head_offset, 6);
    assert_eq!(
        Context::new(&config(KvTier::Host))
            .unwrap()
            .config()
            .as_raw()
            .kv_head_offset,
        0
    );
    let err = Context::new(&config(KvTier::Host).kv_head_offset(65535)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert!(err.message.contains("kv_head_offset"), "{err}");
}
