//! The safe API against the real library: the reference cycle compared with
//! the C program's output, errors, two threads on one context, and the
//! dlopen mode. CTest passes $PQ_REFERENCE_CYCLE (the C program) and
//! $PQCACHE_LIB (the library file); by hand they default to build/.

use std::path::PathBuf;
use std::process::Command;

use pqcache::{
    Config, Context, DType, Error, FetchItem, Library, RestoreStep, SelectItem, Selection, Shape,
    Status, Tensor, TensorMut, Version,
};

// ---------------------------------------------------------------------------
// The reference cycle of tests/reference_cycle.c (its header comment is the spec)
// ---------------------------------------------------------------------------

const TOKENS: usize = 256;
const Q_HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;

/// The generator every binding reproduces bit for bit (32-bit wrapping).
fn value(stream: u32, i: u32) -> f32 {
    let mut h = i
        .wrapping_mul(2654435761)
        .wrapping_add(stream.wrapping_mul(97531));
    h ^= h >> 15;
    h = h.wrapping_mul(2246822519);
    h ^= h >> 13;
    (h >> 8) as f32 / 16777216.0 - 0.5
}

fn generate(stream: u32, n: usize) -> Vec<f32> {
    (0..n as u32).map(|i| value(stream, i)).collect()
}

fn fnv1a(mut hash: u64, data: &[f32]) -> u64 {
    for byte in data.iter().flat_map(|x| x.to_ne_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x100000001b3);
    }
    hash
}

fn reference_config(library: &Library) -> Config {
    library
        .default_config()
        .dtype(DType::F32)
        .geometry(1, Q_HEADS as i32, KV_HEADS as i32, HEAD_DIM as i32)
        .pq_subspaces(2)
        .pq_bits(4)
        .kmeans_iterations(8)
        .sink_tokens(4)
        .local_tokens(16)
        .topk_tokens(16)
        .seed(7)
        .worker_threads(1)
}

/// Runs the cycle on `seq` with data streams shifted by `stream_offset`
/// (0 is the reference) and prints it as reference_cycle.c does.
fn run_cycle(ctx: &Context, seq: u64, stream_offset: u32) -> Result<String, Error> {
    let s = |n: u32| n + stream_offset;
    ctx.add_sequence(seq)?;
    let kv = Shape::token_major(TOKENS, KV_HEADS, HEAD_DIM);
    let (k, v) = (
        generate(s(1), TOKENS * KV_HEADS * HEAD_DIM),
        generate(s(2), TOKENS * KV_HEADS * HEAD_DIM),
    );
    ctx.prefill(seq, 0, &Tensor::f32(&k, kv)?, &Tensor::f32(&v, kv)?)?;
    let one = Shape::token_major(1, KV_HEADS, HEAD_DIM);
    let (k1, v1) = (
        generate(s(3), KV_HEADS * HEAD_DIM),
        generate(s(4), KV_HEADS * HEAD_DIM),
    );
    ctx.append(seq, 0, &Tensor::f32(&k1, one)?, &Tensor::f32(&v1, one)?)?;

    let capacity = ctx.selection_capacity(seq, 0)?;
    let mut selection = Selection::new(KV_HEADS, capacity);
    let q = generate(s(5), Q_HEADS * HEAD_DIM);
    ctx.select(
        seq,
        0,
        &Tensor::f32(&q, Shape::token_major(1, Q_HEADS, HEAD_DIM))?,
        &mut selection,
    )?;
    assert_eq!(
        selection.capacity(),
        capacity,
        "a selection of the right capacity is not regrown"
    );

    let rows = Shape::head_major(capacity, KV_HEADS, HEAD_DIM);
    let mut out_k = vec![0f32; KV_HEADS * capacity * HEAD_DIM];
    let mut out_v = out_k.clone();
    ctx.fetch(
        seq,
        0,
        &selection,
        &mut TensorMut::f32(&mut out_k, rows)?,
        &mut TensorMut::f32(&mut out_v, rows)?,
    )?;

    let mut text = format!("capacity {capacity}\n");
    let (mut hk, mut hv) = (0xcbf29ce484222325u64, 0xcbf29ce484222325u64);
    for (h, positions) in selection.heads().enumerate() {
        let list: String = positions.iter().map(|p| format!(" {p}")).collect();
        text += &format!("head {h} count {} positions{list}\n", positions.len());
        let rows = h * capacity * HEAD_DIM..(h * capacity + positions.len()) * HEAD_DIM;
        hk = fnv1a(hk, &out_k[rows.clone()]);
        hv = fnv1a(hv, &out_v[rows]);
    }
    text += &format!("keys_fnv1a 0x{hk:016x}\nvalues_fnv1a 0x{hv:016x}\n");
    Ok(text)
}

fn build_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../build")
}

fn c_reference_output() -> String {
    let program = std::env::var_os("PQ_REFERENCE_CYCLE")
        .map(PathBuf::from)
        .unwrap_or_else(|| build_dir().join("tests/pq_reference_cycle"));
    let output = Command::new(&program).output().unwrap_or_else(|e| {
        panic!(
            "cannot run {} ({e}); build it or set $PQ_REFERENCE_CYCLE",
            program.display()
        )
    });
    assert!(
        output.status.success(),
        "{} failed: {output:?}",
        program.display()
    );
    String::from_utf8(output.stdout).unwrap()
}

fn library_file() -> PathBuf {
    std::env::var_os("PQCACHE_LIB")
        .map(PathBuf::from)
        .unwrap_or_else(|| build_dir().join("libpqcache.so"))
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
fn reference_cycle_matches_the_c_program() {
    let ctx = Context::new(&reference_config(&Library::linked())).unwrap();
    let rust = run_cycle(&ctx, 1, 0).unwrap();
    assert_eq!(rust, c_reference_output());
    // What the cycle did, seen through stats and layer info.
    let stats = ctx.stats().unwrap();
    assert_eq!(
        (
            stats.sequences,
            stats.tokens,
            stats.select_calls,
            stats.fetch_calls
        ),
        (1, 257, 1, 1)
    );
    let info = ctx.layer_info(1, 0).unwrap();
    assert_eq!((info.tokens, info.prefill_tokens), (257, 256));
    assert!(
        info.index_ready && !info.build_pending && info.kmeans_iterations <= 8,
        "{info:?}"
    );
    assert_eq!(ctx.sequence_length(1, 0).unwrap(), 257);
    assert_eq!(ctx.sequence_count().unwrap(), 1);
}

#[test]
fn dlopen_mode_runs_the_same_cycle() {
    let library = Library::load(library_file()).unwrap();
    assert_eq!(library.version(), Version::HEADER);
    let ctx = library.create(&reference_config(&library)).unwrap();
    assert_eq!(run_cycle(&ctx, 1, 0).unwrap(), c_reference_output());
    // The context keeps the library loaded after the handle is dropped.
    drop(library);
    ctx.remove_sequence(1).unwrap();
    assert_eq!(ctx.sequence_count().unwrap(), 0);
}

#[test]
fn missing_library_is_a_clear_error() {
    let err = Library::load("/nonexistent/dir/libpqcache.so.0").unwrap_err();
    assert_eq!(err.status, Status::NotFound);
    assert!(
        err.message.contains("/nonexistent/dir/libpqcache.so.0"),
        "{err}"
    );
    assert!(
        err.message.contains("No such file"),
        "the loader's own text: {err}"
    );
}

#[test]
fn library_without_the_functions_is_a_clear_error() {
    // libm is a real shared library, just not libpqcache.
    let err = Library::load("libm.so.6").unwrap_err();
    assert_eq!(err.status, Status::NotFound);
    assert!(
        err.message.contains("pq_version_number") && err.message.contains("undefined symbol"),
        "{err}"
    );
}

#[test]
fn invalid_arguments_carry_the_library_status_and_message() {
    let library = Library::linked();
    // Configuration errors name the field.
    let err = Context::new(&reference_config(&library).num_kv_heads(3)).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(
        err.message.contains("num_kv_heads") || err.message.contains("num_q_heads"),
        "{err}"
    );
    assert!(
        err.to_string().starts_with("PQ_ERR_INVALID_ARGUMENT: "),
        "{err}"
    );
    let err = Context::new(&reference_config(&library).pq_bits(9)).unwrap_err();
    assert_eq!(err.status, Status::Unsupported, "{err}");

    let ctx = Context::new(&reference_config(&library)).unwrap();
    let kv = vec![0.25f32; 8 * KV_HEADS * HEAD_DIM];
    let shape = Shape::token_major(8, KV_HEADS, HEAD_DIM);
    let tensor = Tensor::f32(&kv, shape).unwrap();
    let err = ctx.prefill(42, 0, &tensor, &tensor).unwrap_err();
    assert_eq!(err.status, Status::NotFound, "{err}");

    ctx.add_sequence(42).unwrap();
    assert_eq!(
        ctx.add_sequence(42).unwrap_err().status,
        Status::InvalidArgument
    );
    let err = ctx.prefill(42, 1, &tensor, &tensor).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("layer"), "{err}");

    // A query before any prefill: the call is valid, but not now.
    let q = vec![0.5f32; Q_HEADS * HEAD_DIM];
    let query = Tensor::f32(&q, Shape::token_major(1, Q_HEADS, HEAD_DIM)).unwrap();
    let err = ctx
        .select(42, 0, &query, &mut Selection::new(KV_HEADS, 8))
        .unwrap_err();
    assert_eq!(err.status, Status::BadState, "{err}");

    // The library checks shapes against the configuration...
    let narrow = Tensor::f32(&kv, Shape::token_major(8, KV_HEADS, HEAD_DIM / 2)).unwrap();
    let err = ctx.prefill(42, 0, &narrow, &narrow).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("head_dim"), "{err}");
    // ...and the dtype, here f16 bits into an f32 cache.
    let bits = vec![0u16; 8 * KV_HEADS * HEAD_DIM];
    let half = Tensor::f16(&bits, shape).unwrap();
    assert_eq!(
        ctx.prefill(42, 0, &half, &half).unwrap_err().status,
        Status::InvalidArgument
    );
    // NaN is rejected with the token named; nothing is stored.
    let mut bad = kv.clone();
    bad[3 * KV_HEADS * HEAD_DIM] = f32::NAN;
    let err = ctx
        .prefill(42, 0, &Tensor::f32(&bad, shape).unwrap(), &tensor)
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert_eq!(ctx.sequence_length(42, 0).unwrap(), 0);

    // Slices too short for their shape never reach the library: the call
    // refuses them, naming itself and the argument (tests/prechecks.rs has
    // the exact messages).
    let short = Tensor::f32(&kv[1..], shape).unwrap();
    let err = ctx.prefill(42, 0, &tensor, &short).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(
        err.message
            .starts_with("pq_prefill_layer: values.data has 255 elements"),
        "{err}"
    );
    let overlapping = Tensor::f32(
        &kv,
        Shape::strided(8, KV_HEADS, HEAD_DIM, HEAD_DIM, HEAD_DIM),
    )
    .unwrap();
    let err = ctx.prefill(42, 0, &overlapping, &tensor).unwrap_err();
    assert!(err.message.starts_with("pq_prefill_layer: keys."), "{err}");
    assert!(err.message.contains("overlap"), "{err}");
    assert_eq!(ctx.sequence_length(42, 0).unwrap(), 0);

    // A selection for another geometry is refused before the call.
    let mut out = vec![0f32; 16 * 3 * HEAD_DIM];
    let mut out_t = TensorMut::f32(&mut out, Shape::head_major(16, 3, HEAD_DIM)).unwrap();
    let mut out2 = vec![0f32; 16 * 3 * HEAD_DIM];
    let mut out_t2 = TensorMut::f32(&mut out2, Shape::head_major(16, 3, HEAD_DIM)).unwrap();
    let err = ctx
        .fetch(42, 0, &Selection::new(3, 16), &mut out_t, &mut out_t2)
        .unwrap_err();
    assert!(
        err.message
            .starts_with("pq_fetch_kv: selection has 3 kv heads"),
        "{err}"
    );
    assert_eq!(ctx.remove_sequence(7).unwrap_err().status, Status::NotFound);
}

#[test]
fn two_sequences_from_two_threads_match_sequential_runs() {
    let library = Library::linked();
    // Each sequence alone in its own context, one after the other...
    let expected: Vec<String> = (0..2u32)
        .map(|i| {
            run_cycle(
                &Context::new(&reference_config(&library)).unwrap(),
                1,
                10 * i,
            )
            .unwrap()
        })
        .collect();
    assert_ne!(
        expected[0], expected[1],
        "the two sequences see different data"
    );
    // ...then both in one context at the same time (1 worker thread, so
    // the index builds of both queue on the same pool).
    let ctx = Context::new(&reference_config(&library)).unwrap();
    let results: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2u32)
            .map(|i| {
                let ctx = &ctx;
                scope.spawn(move || run_cycle(ctx, 100 + u64::from(i), 10 * i))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    });
    assert_eq!(results, expected);
    assert_eq!(ctx.stats().unwrap().sequences, 2);
    assert_eq!(ctx.stats().unwrap().select_calls, 2);
}

#[test]
fn f16_cache_returns_the_stored_bits_and_exposes_its_index() {
    // f16 bits of small values; fetch copies rows exactly as stored.
    let (tokens, kv_heads, q_heads, dim) = (300usize, 2usize, 4usize, 16usize);
    let to_f16 = |x: f32| -> u16 {
        // |x| < 0.5 and not tiny: exponent and 10 mantissa bits, truncated.
        let bits = x.to_bits();
        let sign = ((bits >> 16) & 0x8000) as u16;
        let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
        if exp <= 0 {
            sign
        } else {
            sign | ((exp as u16) << 10) | ((bits >> 13) & 0x3ff) as u16
        }
    };
    let k: Vec<u16> = generate(11, tokens * kv_heads * dim)
        .into_iter()
        .map(to_f16)
        .collect();
    let v: Vec<u16> = generate(12, tokens * kv_heads * dim)
        .into_iter()
        .map(to_f16)
        .collect();
    let q: Vec<u16> = generate(13, q_heads * dim)
        .into_iter()
        .map(to_f16)
        .collect();

    let config = Config::new()
        .geometry(1, q_heads as i32, kv_heads as i32, dim as i32)
        .dtype(DType::F16)
        .seed(3)
        .worker_threads(1);
    let ctx = Context::new(&config).unwrap();
    assert_eq!(ctx.dtype(), DType::F16);
    assert_eq!(ctx.config().as_raw().worker_threads, 1);
    ctx.add_sequence(5).unwrap();
    let kv = Shape::token_major(tokens, kv_heads, dim);
    ctx.prefill(
        5,
        0,
        &Tensor::f16(&k, kv).unwrap(),
        &Tensor::f16(&v, kv).unwrap(),
    )
    .unwrap();
    ctx.wait_builds().unwrap();

    let mut selection = Selection::new(kv_heads, 0);
    ctx.select(
        5,
        0,
        &Tensor::f16(&q, Shape::token_major(1, q_heads, dim)).unwrap(),
        &mut selection,
    )
    .unwrap();
    assert_eq!(
        selection.capacity(),
        ctx.selection_capacity(5, 0).unwrap(),
        "select grew the selection"
    );
    let rows = Shape::head_major(selection.max_count(), kv_heads, dim);
    let mut out_k = vec![0u16; rows.span().unwrap()];
    let mut out_v = out_k.clone();
    ctx.fetch(
        5,
        0,
        &selection,
        &mut TensorMut::f16(&mut out_k, rows).unwrap(),
        &mut TensorMut::f16(&mut out_v, rows).unwrap(),
    )
    .unwrap();
    for (h, positions) in selection.heads().enumerate() {
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "ascending and unique"
        );
        for (i, &p) in positions.iter().enumerate() {
            let stored = (p as usize * kv_heads + h) * dim..(p as usize * kv_heads + h) * dim + dim;
            let fetched = (h * rows.tokens + i) * dim..(h * rows.tokens + i) * dim + dim;
            assert_eq!(
                out_k[fetched.clone()],
                k[stored.clone()],
                "keys of token {p}, head {h}"
            );
            assert_eq!(out_v[fetched], v[stored], "values of token {p}, head {h}");
        }
    }

    // The index: one code per subspace and token (2 subspaces by default),
    // each below 2^pq_bits.
    let raw = *ctx.config().as_raw();
    let middle = ctx.layer_info(5, 0).unwrap().coded_tokens as usize;
    assert!(middle > 0);
    let mut codes = vec![0xffu8; 10 * raw.pq_subspaces as usize];
    ctx.index_codes(5, 0, 1, raw.sink_tokens as usize, &mut codes)
        .unwrap();
    assert!(
        codes.iter().all(|&c| u32::from(c) < 1 << raw.pq_bits),
        "{codes:?}"
    );
    let mut centroids = vec![f32::NAN; ctx.centroid_floats()];
    ctx.index_centroids(5, 0, 0, &mut centroids).unwrap();
    assert!(centroids.iter().all(|c| c.is_finite()));
    let err = ctx
        .index_centroids(5, 0, 0, &mut centroids[1..])
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert_eq!(ctx.sequence_stats(5).unwrap().fetch_calls, 1);
}

#[test]
fn versions_agree() {
    assert_eq!(pqcache::version(), Version::HEADER);
    assert_eq!(
        Version::HEADER.to_string(),
        pqcache::sys::PQ_VERSION_STRING.to_str().unwrap()
    );
    assert_eq!(pqcache::SONAME, pqcache::sys::PQ_SONAME.to_str().unwrap());
    assert_eq!(Status::from_code(-1), Some(Status::InvalidArgument));
    assert_eq!(Status::from_code(-99), Some(Status::Unknown(-99)));
    assert_eq!(Status::from_code(0), None);
    assert_eq!(Status::Backend.code(), pqcache::sys::PQ_ERR_BACKEND);
}

// ---------------------------------------------------------------------------
// One layer for a batch of sequences
// ---------------------------------------------------------------------------

/// Sequences of different lengths (capacities 36, 9 and 30 with the
/// reference config's 4 sinks, 16 top-k and 16 local tokens), prefilled.
const BATCH_IDS: [u64; 3] = [11, 7, 1000];
const BATCH_LENGTHS: [usize; 3] = [300, 9, 30];

fn batch_context() -> (Context, Vec<Vec<f32>>) {
    let ctx = Context::new(&reference_config(&Library::linked())).unwrap();
    let mut queries = Vec::new();
    for (i, (&seq, &n)) in BATCH_IDS.iter().zip(&BATCH_LENGTHS).enumerate() {
        let stream = 20 * i as u32;
        ctx.add_sequence(seq).unwrap();
        let kv = Shape::token_major(n, KV_HEADS, HEAD_DIM);
        let (k, v) = (
            generate(stream + 1, n * KV_HEADS * HEAD_DIM),
            generate(stream + 2, n * KV_HEADS * HEAD_DIM),
        );
        ctx.prefill(
            seq,
            0,
            &Tensor::f32(&k, kv).unwrap(),
            &Tensor::f32(&v, kv).unwrap(),
        )
        .unwrap();
        queries.push(generate(stream + 3, Q_HEADS * HEAD_DIM));
    }
    ctx.wait_builds().unwrap();
    (ctx, queries)
}

fn query_tensor(q: &[f32]) -> Tensor<'_> {
    Tensor::f32(q, Shape::token_major(1, Q_HEADS, HEAD_DIM)).unwrap()
}

/// The per-sequence selections, to compare with.
fn select_one_by_one(ctx: &Context, ids: &[u64], queries: &[Vec<f32>]) -> Vec<Selection> {
    ids.iter()
        .zip(queries)
        .map(|(&seq, q)| {
            let mut sel = Selection::new(KV_HEADS, 0);
            ctx.select(seq, 0, &query_tensor(q), &mut sel).unwrap();
            sel
        })
        .collect()
}

fn heads(sel: &Selection) -> Vec<Vec<i32>> {
    sel.heads().map(<[i32]>::to_vec).collect()
}

/// Fetches with `fetch_batch`, or one `fetch` per sequence: head-major
/// [kv][max_count][dim] keys and values per sequence.
fn fetch_all(ctx: &Context, ids: &[u64], sels: &[Selection], batch: bool) -> Vec<Vec<f32>> {
    let shapes: Vec<Shape> = sels
        .iter()
        .map(|s| Shape::head_major(s.max_count(), KV_HEADS, HEAD_DIM))
        .collect();
    let mut outs: Vec<Vec<f32>> = shapes
        .iter()
        .flat_map(|s| {
            [
                vec![f32::NAN; s.span().unwrap()],
                vec![f32::NAN; s.span().unwrap()],
            ]
        })
        .collect();
    let mut tensors = outs.chunks_mut(2).zip(&shapes).map(|(kv, &shape)| {
        let (k, v) = kv.split_at_mut(1);
        (
            TensorMut::f32(&mut k[0], shape).unwrap(),
            TensorMut::f32(&mut v[0], shape).unwrap(),
        )
    });
    if batch {
        let mut items: Vec<FetchItem> = ids
            .iter()
            .zip(sels)
            .zip(&mut tensors)
            .map(|((&seq, sel), (k, v))| FetchItem::new(seq, sel, k, v))
            .collect();
        ctx.fetch_batch(0, &mut items).unwrap();
        assert!(items.iter().all(|item| item.status().is_none()));
    } else {
        for ((&seq, sel), (mut k, mut v)) in ids.iter().zip(sels).zip(&mut tensors) {
            ctx.fetch(seq, 0, sel, &mut k, &mut v).unwrap();
        }
    }
    drop(tensors);
    outs
}

#[test]
fn batched_select_and_fetch_equal_the_per_sequence_calls() {
    let (ctx, queries) = batch_context();
    let want = select_one_by_one(&ctx, &BATCH_IDS, &queries);
    let capacities: Vec<usize> = want.iter().map(Selection::capacity).collect();
    assert_eq!(capacities, [36, 9, 30], "the sequences differ in length");

    // Fresh selections (grown by the batch) and one already large enough.
    let mut got = vec![
        Selection::new(KV_HEADS, 0),
        Selection::new(KV_HEADS, 40),
        Selection::new(KV_HEADS, 1),
    ];
    let mut items: Vec<SelectItem> = BATCH_IDS
        .iter()
        .zip(&queries)
        .zip(&mut got)
        .map(|((&seq, q), out)| SelectItem::new(seq, query_tensor(q), out))
        .collect();
    ctx.select_batch(0, &mut items).unwrap();
    assert!(items.iter().all(|item| item.status().is_none()));
    drop(items);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(heads(g), heads(w), "item {i}");
        assert!(g.max_count() > 0);
    }
    assert_eq!(got[1].capacity(), 40, "a large enough selection is kept");

    let one_by_one = fetch_all(&ctx, &BATCH_IDS, &want, false);
    let batched = fetch_all(&ctx, &BATCH_IDS, &want, true);
    for (i, (b, o)) in batched.iter().zip(&one_by_one).enumerate() {
        assert_eq!(
            b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            o.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "fetched bytes of output {i}"
        );
        assert!(b.iter().all(|x| !x.is_nan()), "every row written");
    }
}

#[test]
fn a_failing_batch_item_is_named_and_the_others_are_filled() {
    let (ctx, queries) = batch_context();
    let ids = [BATCH_IDS[0], 999, BATCH_IDS[2]];
    let select = |detail: &str| {
        let mut got: Vec<Selection> = (0..3).map(|_| Selection::new(KV_HEADS, 0)).collect();
        let mut items: Vec<SelectItem> = ids
            .iter()
            .zip(&queries)
            .zip(&mut got)
            .map(|((&seq, q), out)| SelectItem::new(seq, query_tensor(q), out))
            .collect();
        let err = ctx.select_batch(0, &mut items).unwrap_err();
        assert_eq!(err.status, Status::NotFound, "{err}");
        assert!(
            err.message
                .starts_with("pq_decode_select_batch: items[1] (seq_id 999): ")
                && err.message.contains(detail),
            "{err}"
        );
        let statuses: Vec<Option<Status>> = items.iter().map(SelectItem::status).collect();
        assert_eq!(statuses, [None, Some(Status::NotFound), None]);
        drop(items);
        assert_eq!(got[1].max_count(), 0, "the failed item selected nothing");
        got
    };
    // A fresh context knows no capacity yet: items[0], too small, comes back
    // first and is selected again on its own, so the message for items[1]
    // is built from its status...
    let first = select("PQ_ERR_NOT_FOUND");
    // ...then the batch sizes its selections from what the layer needed,
    // and the library's own message names items[1].
    let second = select("is not a sequence");
    let want = select_one_by_one(&ctx, &BATCH_IDS, &queries);
    for got in [&first, &second] {
        assert_eq!(heads(&got[0]), heads(&want[0]));
        assert_eq!(heads(&got[2]), heads(&want[2]));
    }

    // The same for a fetch: the failing item is named, the others written.
    let shape = Shape::head_major(36, KV_HEADS, HEAD_DIM);
    let mut bufs = vec![vec![0f32; shape.span().unwrap()]; 6];
    let mut chunks = bufs.chunks_mut(2);
    let mut items: Vec<FetchItem> = [BATCH_IDS[0], 999, BATCH_IDS[2]]
        .iter()
        .zip([&want[0], &want[1], &want[2]])
        .map(|(&seq, sel)| {
            let (k, v) = chunks.next().unwrap().split_at_mut(1);
            FetchItem::new(
                seq,
                sel,
                TensorMut::f32(&mut k[0], shape).unwrap(),
                TensorMut::f32(&mut v[0], shape).unwrap(),
            )
        })
        .collect();
    let err = ctx.fetch_batch(0, &mut items).unwrap_err();
    assert_eq!(err.status, Status::NotFound, "{err}");
    assert!(err.message.contains("items[1] (seq_id 999)"), "{err}");
    let statuses: Vec<Option<Status>> = items.iter().map(FetchItem::status).collect();
    assert_eq!(statuses, [None, Some(Status::NotFound), None]);
    drop(items);
    assert!(bufs[0].iter().any(|&x| x != 0.0) && bufs[5].iter().any(|&x| x != 0.0));
    assert!(
        bufs[2].iter().all(|&x| x == 0.0),
        "nothing written for the failed item"
    );

    // A call-level error (a sequence twice) runs no item: no status.
    let mut a = Selection::new(KV_HEADS, 0);
    let mut b = Selection::new(KV_HEADS, 0);
    let mut items = vec![
        SelectItem::new(11, query_tensor(&queries[0]), &mut a),
        SelectItem::new(11, query_tensor(&queries[1]), &mut b),
    ];
    let err = ctx.select_batch(0, &mut items).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert!(items.iter().all(|item| item.status().is_none()));
}

#[test]
fn select_errors_name_pq_decode_select_and_buffer_too_small_maps() {
    let (ctx, queries) = batch_context();
    let err = ctx
        .select(
            12345,
            0,
            &query_tensor(&queries[0]),
            &mut Selection::new(KV_HEADS, 0),
        )
        .unwrap_err();
    assert_eq!(err.status, Status::NotFound, "{err}");
    assert!(err.message.starts_with("pq_decode_select"), "{err}");
    assert!(!err.message.contains("pq_selection_capacity"), "{err}");

    // A selection one entry too small grows to what the library asked for.
    let mut sel = Selection::new(KV_HEADS, 35);
    ctx.select(11, 0, &query_tensor(&queries[0]), &mut sel)
        .unwrap();
    assert_eq!(sel.capacity(), 36);
    assert_eq!(sel.max_count(), 36);

    // The capacity for a length, without a sequence, agrees and never shrinks.
    for (&seq, &n) in BATCH_IDS.iter().zip(&BATCH_LENGTHS) {
        assert_eq!(
            ctx.selection_capacity_for(0, n).unwrap(),
            ctx.selection_capacity(seq, 0).unwrap()
        );
    }
    let caps: Vec<usize> = (0..100)
        .map(|n| ctx.selection_capacity_for(0, n).unwrap())
        .collect();
    assert!(caps.windows(2).all(|w| w[0] <= w[1]), "{caps:?}");
    let err = ctx.selection_capacity_for(1, 10).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");

    let code = pqcache::sys::PQ_ERR_BUFFER_TOO_SMALL;
    assert_eq!(Status::from_code(code), Some(Status::BufferTooSmall));
    assert_eq!(Status::BufferTooSmall.code(), code);
    assert_eq!(
        Status::BufferTooSmall.to_string(),
        "PQ_ERR_BUFFER_TOO_SMALL"
    );
}

// ---------------------------------------------------------------------------
// Attention over a selection
// ---------------------------------------------------------------------------

/// softmax(scale * q.K) V and the log-sum-exp per query head, in f64, over
/// head-major [kv][capacity][dim] rows as `fetch` gathers them; GQA: query
/// head q uses kv head q / (Q_HEADS / KV_HEADS).
fn attention_over(
    q: &[f32],
    sel: &Selection,
    keys: &[f32],
    values: &[f32],
    scale: f64,
) -> (Vec<f64>, Vec<f64>) {
    let (cap, group) = (sel.capacity(), Q_HEADS / KV_HEADS);
    let mut out = vec![0f64; Q_HEADS * HEAD_DIM];
    let mut lse = vec![f64::NEG_INFINITY; Q_HEADS];
    for qh in 0..Q_HEADS {
        let h = qh / group;
        let n = sel.head(h).len();
        let row = |data: &[f32], i: usize| -> Vec<f64> {
            let start = (h * cap + i) * HEAD_DIM;
            data[start..start + HEAD_DIM]
                .iter()
                .map(|&x| f64::from(x))
                .collect()
        };
        let logits: Vec<f64> = (0..n)
            .map(|i| {
                let k = row(keys, i);
                let dot: f64 = (0..HEAD_DIM)
                    .map(|d| f64::from(q[qh * HEAD_DIM + d]) * k[d])
                    .sum();
                scale * dot
            })
            .collect();
        if n == 0 {
            continue;
        }
        let peak = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = logits.iter().map(|l| (l - peak).exp()).collect();
        let sum: f64 = weights.iter().sum();
        for (i, w) in weights.iter().enumerate() {
            for (d, v) in row(values, i).into_iter().enumerate() {
                out[qh * HEAD_DIM + d] += w * v / sum;
            }
        }
        lse[qh] = peak + sum.ln();
    }
    (out, lse)
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_infinite() {
            f64::from(g) == w
        } else {
            (f64::from(g) - w).abs() <= 1e-5 + 1e-4 * w.abs()
        };
        assert!(ok, "{what}[{i}] = {g}, want {w}");
    }
}

#[test]
fn attend_equals_softmax_over_the_fetched_rows() {
    let (ctx, queries) = batch_context();
    let sels = select_one_by_one(&ctx, &BATCH_IDS, &queries);
    let default_scale = 1.0 / (HEAD_DIM as f64).sqrt();
    for (i, (&seq, sel)) in BATCH_IDS.iter().zip(&sels).enumerate() {
        // Larger query values: the softmax weights are far from uniform.
        let q: Vec<f32> = queries[i].iter().map(|x| 8.0 * x).collect();
        let rows = Shape::head_major(sel.capacity(), KV_HEADS, HEAD_DIM);
        let mut keys = vec![0f32; rows.span().unwrap()];
        let mut values = keys.clone();
        ctx.fetch(
            seq,
            0,
            sel,
            &mut TensorMut::f32(&mut keys, rows).unwrap(),
            &mut TensorMut::f32(&mut values, rows).unwrap(),
        )
        .unwrap();
        for (scale, effective) in [
            (None, default_scale),
            (Some(0.0), default_scale),
            (Some(0.05), 0.05),
        ] {
            let attention = ctx.attend(seq, 0, &query_tensor(&q), sel, scale).unwrap();
            assert_eq!(
                (attention.num_q_heads(), attention.head_dim()),
                (Q_HEADS, HEAD_DIM)
            );
            let (want_out, want_lse) = attention_over(&q, sel, &keys, &values, effective);
            let what = format!("seq {seq} scale {scale:?}");
            assert_close(attention.output(), &want_out, &format!("{what} out"));
            assert_close(attention.lse(), &want_lse, &format!("{what} lse"));
            assert_eq!(
                attention.head(1),
                &attention.output()[HEAD_DIM..2 * HEAD_DIM]
            );

            // attend_into writes the same into the caller's buffers, lse optional.
            let mut out = vec![f32::NAN; Q_HEADS * HEAD_DIM];
            ctx.attend_into(seq, 0, &query_tensor(&q), sel, scale, &mut out, None)
                .unwrap();
            assert_eq!(out, attention.output());
        }
    }
    // A kv head with nothing selected gives zeros and -inf.
    let empty = Selection::new(KV_HEADS, 4);
    let attention = ctx
        .attend(BATCH_IDS[0], 0, &query_tensor(&queries[0]), &empty, None)
        .unwrap();
    assert!(attention.output().iter().all(|&x| x == 0.0));
    assert!(attention.lse().iter().all(|&x| x == f32::NEG_INFINITY));
}

#[test]
fn attend_errors_name_pq_decode_attend() {
    let (ctx, queries) = batch_context();
    let (seq, q) = (BATCH_IDS[0], &queries[0]);
    let mut sel = Selection::new(KV_HEADS, 0);
    ctx.select(seq, 0, &query_tensor(q), &mut sel).unwrap();

    let err = ctx
        .attend(seq, 0, &query_tensor(q), &sel, Some(-1.0))
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert!(err.message.starts_with("pq_decode_attend"), "{err}");
    assert!(err.message.contains("scale"), "{err}");
    let err = ctx
        .attend(seq, 0, &query_tensor(q), &sel, Some(f32::NAN))
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");

    // A query shaped for the kv heads, not the query heads.
    let kv_shaped = Tensor::f32(q, Shape::token_major(1, KV_HEADS, HEAD_DIM)).unwrap();
    let err = ctx.attend(seq, 0, &kv_shaped, &sel, None).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert!(
        err.message.starts_with("pq_decode_attend") && err.message.contains("query"),
        "{err}"
    );
    let err = ctx
        .attend(12345, 0, &query_tensor(q), &sel, None)
        .unwrap_err();
    assert_eq!(err.status, Status::NotFound, "{err}");
    assert!(err.message.starts_with("pq_decode_attend"), "{err}");

    // Caught in Rust before the library would write past the buffers.
    let mut short = vec![0f32; Q_HEADS * HEAD_DIM - 1];
    let err = ctx
        .attend_into(seq, 0, &query_tensor(q), &sel, None, &mut short, None)
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert!(err.message.starts_with("pq_decode_attend: out"), "{err}");
    let mut out = vec![0f32; Q_HEADS * HEAD_DIM];
    let mut lse = vec![0f32; Q_HEADS - 1];
    let err = ctx
        .attend_into(
            seq,
            0,
            &query_tensor(q),
            &sel,
            None,
            &mut out,
            Some(&mut lse),
        )
        .unwrap_err();
    assert!(
        err.message.starts_with("pq_decode_attend: out_lse"),
        "{err}"
    );
    let err = ctx
        .attend(seq, 0, &query_tensor(q), &Selection::new(3, 4), None)
        .unwrap_err();
    assert!(
        err.message.starts_with("pq_decode_attend") && err.message.contains("kv heads"),
        "{err}"
    );
    assert!(out.iter().all(|&x| x == 0.0), "nothing written on error");
}

// ---------------------------------------------------------------------------
// Sequence state: truncate, fork, save and restore
// ---------------------------------------------------------------------------

/// Each id's selection for `q` and the rows it fetches: what a sequence
/// restored or forked from another must reproduce exactly.
fn selections_and_rows(
    ctx: &Context,
    ids: &[u64],
    q: &[f32],
) -> (Vec<Vec<Vec<i32>>>, Vec<Vec<f32>>) {
    let queries = vec![q.to_vec(); ids.len()];
    let sels = select_one_by_one(ctx, ids, &queries);
    (
        sels.iter().map(heads).collect(),
        fetch_all(ctx, ids, &sels, false),
    )
}

/// Two full 256-token chunks and a partial one.
const PROMPT: usize = 600;

/// Adds `seq` with a PROMPT-token prefill and 4 decode steps (the state
/// tests' sequence).
fn add_prefilled_sequence(ctx: &Context, seq: u64) {
    ctx.add_sequence(seq).unwrap();
    let kv = Shape::token_major(PROMPT, KV_HEADS, HEAD_DIM);
    let (k, v) = (
        generate(61, PROMPT * KV_HEADS * HEAD_DIM),
        generate(62, PROMPT * KV_HEADS * HEAD_DIM),
    );
    ctx.prefill(
        seq,
        0,
        &Tensor::f32(&k, kv).unwrap(),
        &Tensor::f32(&v, kv).unwrap(),
    )
    .unwrap();
    let one = Shape::token_major(1, KV_HEADS, HEAD_DIM);
    for step in 0..4 {
        let (k1, v1) = (
            generate(63 + 2 * step, KV_HEADS * HEAD_DIM),
            generate(64 + 2 * step, KV_HEADS * HEAD_DIM),
        );
        ctx.append(
            seq,
            0,
            &Tensor::f32(&k1, one).unwrap(),
            &Tensor::f32(&v1, one).unwrap(),
        )
        .unwrap();
    }
    assert_eq!(ctx.sequence_length(seq, 0).unwrap(), PROMPT + 4);
}

#[test]
fn truncate_fork_save_and_restore_keep_selections_and_rows() {
    let library = Library::linked();
    let ctx = Context::new(&reference_config(&library)).unwrap();
    add_prefilled_sequence(&ctx, 1);

    // Two rejected speculative tokens rolled back; more than the sequence
    // holds is refused.
    ctx.truncate(1, PROMPT + 2).unwrap();
    assert_eq!(ctx.sequence_length(1, 0).unwrap(), PROMPT + 2);
    let err = ctx.truncate(1, PROMPT + 100).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert_eq!(ctx.truncate(99, 1).unwrap_err().status, Status::NotFound);

    let q = generate(71, Q_HEADS * HEAD_DIM);
    let (want_sel, want_rows) = selections_and_rows(&ctx, &[1], &q);

    // A fork selects what its parent selects.
    ctx.fork(1, 2).unwrap();
    assert_eq!(ctx.sequence_length(2, 0).unwrap(), PROMPT + 2);
    assert_eq!(selections_and_rows(&ctx, &[2], &q).0, want_sel);
    assert_eq!(ctx.fork(1, 2).unwrap_err().status, Status::InvalidArgument);

    // Save to bytes, to a writer (pq_write_fn) and to a file: the same bytes.
    let state = ctx.save(1).unwrap();
    assert_eq!(ctx.state_size(1).unwrap(), state.len());
    let mut streamed = Vec::new();
    ctx.save_to(1, &mut streamed).unwrap();
    assert!(streamed == state, "save_to and save differ");
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("pqcache-state-{}.bin", std::process::id()));
    ctx.save_file(1, &path).unwrap();
    assert!(
        std::fs::read(&path).unwrap() == state,
        "save_file and save differ"
    );
    assert_eq!(ctx.save(99).unwrap_err().status, Status::NotFound);

    // Restored in this context (from bytes and from the file) and in a
    // second one: the same length, selections and rows.
    ctx.restore(3, &state).unwrap();
    ctx.restore_file(4, &path).unwrap();
    let other = Context::new(&reference_config(&library)).unwrap();
    other.restore(1, &state).unwrap();
    for (context, seq) in [(&ctx, 3), (&ctx, 4), (&other, 1)] {
        assert_eq!(context.sequence_length(seq, 0).unwrap(), PROMPT + 2);
        let (sel, rows) = selections_and_rows(context, &[seq], &q);
        assert_eq!(sel, want_sel, "selection of restored sequence {seq}");
        assert!(rows == want_rows, "rows of restored sequence {seq}");
    }
    std::fs::remove_file(&path).unwrap();

    // Damaged states are refused and add nothing.
    let count = ctx.sequence_count().unwrap();
    let mut flipped = state.clone();
    flipped[state.len() / 2] ^= 0xff;
    let err = ctx.restore(5, &flipped).unwrap_err();
    assert_eq!(err.status, Status::Corrupt, "{err}");
    assert!(err.to_string().starts_with("PQ_ERR_CORRUPT: "), "{err}");
    let err = ctx.restore(5, &state[..state.len() / 2]).unwrap_err();
    assert!(
        matches!(err.status, Status::Corrupt | Status::InvalidArgument),
        "{err}"
    );
    assert_eq!(ctx.sequence_count().unwrap(), count);
    assert_eq!(
        ctx.restore(3, &state).unwrap_err().status,
        Status::InvalidArgument
    );
    let err = ctx
        .restore_file(5, path.with_extension("missing"))
        .unwrap_err();
    assert_eq!(err.status, Status::NotFound, "{err}");

    // (pqcache-sys's header test checks the library's names of the codes.)
    for (status, code, name) in [
        (
            Status::Corrupt,
            pqcache::sys::PQ_ERR_CORRUPT,
            "PQ_ERR_CORRUPT",
        ),
        (
            Status::Incompatible,
            pqcache::sys::PQ_ERR_INCOMPATIBLE,
            "PQ_ERR_INCOMPATIBLE",
        ),
    ] {
        assert_eq!(Status::from_code(code), Some(status));
        assert_eq!((status.code(), status.name()), (code, name));
    }
}

#[test]
fn restore_in_pieces_selects_before_the_kv_arrive() {
    let library = Library::linked();
    let ctx = Context::new(&reference_config(&library)).unwrap();
    add_prefilled_sequence(&ctx, 1);
    let q = generate(71, Q_HEADS * HEAD_DIM);
    let (want_sel, want_rows) = selections_and_rows(&ctx, &[1], &q);
    let state = ctx.save(1).unwrap();

    // The description arrives first: grow the prefix until it is enough.
    let other = Context::new(&reference_config(&library)).unwrap();
    let mut prefix = 0;
    let begun = loop {
        match other.restore_begin(1, &state[..prefix]).unwrap() {
            RestoreStep::Consumed(n) => break n,
            RestoreStep::NeedBytes(needed) => {
                assert!(
                    needed > prefix && needed <= state.len(),
                    "needs {needed} at {prefix}"
                );
                assert_eq!(
                    other.sequence_count().unwrap(),
                    0,
                    "a short begin adds nothing"
                );
                prefix = needed;
            }
        }
    };
    assert!(
        begun > 0 && begun <= prefix && begun < state.len() / 2,
        "began with {begun}"
    );
    assert_eq!(other.sequence_length(1, 0).unwrap(), PROMPT + 4);

    // It selects as the saved sequence does before any K/V; a fetch waits
    // for them.
    let sels = select_one_by_one(&other, &[1], &[q.clone()]);
    assert_eq!(heads(&sels[0]), want_sel[0]);
    let shape = Shape::head_major(sels[0].max_count(), KV_HEADS, HEAD_DIM);
    let (mut k, mut v) = (
        vec![0f32; shape.span().unwrap()],
        vec![0f32; shape.span().unwrap()],
    );
    let err = other
        .fetch(
            1,
            0,
            &sels[0],
            &mut TensorMut::f32(&mut k, shape).unwrap(),
            &mut TensorMut::f32(&mut v, shape).unwrap(),
        )
        .unwrap_err();
    assert_eq!(err.status, Status::BadState, "{err}");

    // Then one section a call, each call given all the rest; a short slice
    // reads nothing and says how many bytes it needs.
    match other.restore_kv(1, &state[begun..begun + 4]).unwrap() {
        RestoreStep::NeedBytes(n) => assert!(n > 4, "needs {n}"),
        step => panic!("4 bytes of a K/V section: {step:?}"),
    }
    let mut at = begun;
    let mut sections = 0;
    while at < state.len() {
        match other.restore_kv(1, &state[at..]).unwrap() {
            RestoreStep::Consumed(n) => at += n,
            RestoreStep::NeedBytes(n) => panic!("the rest of the state is short by {n}"),
        }
        sections += 1;
    }
    assert_eq!(at, state.len());
    assert_eq!(sections, 2, "one layer's K/V, then the end section");
    let err = other.restore_kv(1, &state[begun..]).unwrap_err();
    assert_eq!(err.status, Status::BadState, "complete: {err}");

    let (sel, rows) = selections_and_rows(&other, &[1], &q);
    assert_eq!(sel, want_sel);
    assert!(rows == want_rows, "rows after the K/V arrived");
}

/// FastGen reads the classes given through `token_classes`: at a recovery
/// ratio this low every kv head takes the special-token policy, so its
/// middle is exactly the special tokens (one given before the K/V, one
/// after); a class with an unknown bit is refused, naming its index.
#[test]
fn fastgen_keeps_the_special_tokens_it_is_told_of() {
    let config = reference_config(&Library::linked())
        .selector(pqcache::Selector::FastGen)
        .fastgen_recovery(1e-6);
    let ctx = Context::new(&config).unwrap();
    let n = 64;
    ctx.add_sequence(1).unwrap();
    let mut classes = vec![0u8; n];
    classes[10] = pqcache::sys::PQ_TOKEN_SPECIAL as u8;
    ctx.token_classes(1, 0, &classes).unwrap();
    let kv = Shape::token_major(n, KV_HEADS, HEAD_DIM);
    let (k, v) = (
        generate(1, n * KV_HEADS * HEAD_DIM),
        generate(2, n * KV_HEADS * HEAD_DIM),
    );
    ctx.prefill(
        1,
        0,
        &Tensor::f32(&k, kv).unwrap(),
        &Tensor::f32(&v, kv).unwrap(),
    )
    .unwrap();
    ctx.token_classes(1, 30, &[pqcache::sys::PQ_TOKEN_SPECIAL as u8])
        .unwrap();
    let q = generate(3, 8 * Q_HEADS * HEAD_DIM);
    let window = Tensor::f32(&q, Shape::token_major(8, Q_HEADS, HEAD_DIM)).unwrap();
    ctx.prefill_queries(1, 0, &window).unwrap();
    let mut sel = Selection::new(KV_HEADS, 0);
    ctx.select(1, 0, &query_tensor(&q[..Q_HEADS * HEAD_DIM]), &mut sel)
        .unwrap();
    let middle: Vec<i32> = (0..4)
        .chain([10, 30])
        .chain(n as i32 - 16..n as i32)
        .collect();
    assert_eq!(heads(&sel), vec![middle.clone(), middle]);

    let err = ctx.token_classes(1, 0, &[0, 3, 4]).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "{err}");
    assert!(err.message.contains("classes[2] is 4"), "{err}");
}

/// A speculation writes what the select then chooses for the same query,
/// and the select counts it as covered.
#[test]
fn speculate_is_a_hint_the_next_select_counts() {
    let config = reference_config(&Library::linked()).selector(pqcache::Selector::InfiniGen);
    let ctx = Context::new(&config).unwrap();
    let n = 96;
    ctx.add_sequence(1).unwrap();
    let kv = Shape::token_major(n, KV_HEADS, HEAD_DIM);
    let k = generate(1, n * KV_HEADS * HEAD_DIM);
    ctx.prefill(
        1,
        0,
        &Tensor::f32(&k, kv).unwrap(),
        &Tensor::f32(&k, kv).unwrap(),
    )
    .unwrap();
    let q = generate(3, 8 * Q_HEADS * HEAD_DIM);
    let window = Tensor::f32(&q, Shape::token_major(8, Q_HEADS, HEAD_DIM)).unwrap();
    ctx.prefill_queries(1, 0, &window).unwrap();
    let query = query_tensor(&q[..Q_HEADS * HEAD_DIM]);
    let (mut hint, mut sel) = (Selection::new(KV_HEADS, 0), Selection::new(KV_HEADS, 0));
    ctx.speculate(1, 0, &query, &mut hint).unwrap();
    ctx.select(1, 0, &query, &mut sel).unwrap();
    assert_eq!(heads(&hint), heads(&sel));
    let stats = ctx.stats().unwrap();
    assert_eq!(stats.select_calls, 1);
    assert!(stats.hint_tokens > 0);
    assert_eq!(stats.hint_covered, stats.hint_tokens);
}
