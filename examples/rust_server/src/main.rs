//! rust_server: libpqcache in the shape of an inference server's decode
//! loop, on a real attention trace (SmolLM2-135M reading a State of the
//! Union address, tests/data/smollm2_sotu_2k.pqtrace).
//!
//! The library is loaded at RUN TIME (dlopen), as a server with an optional
//! PQCache path would do: without it the program says so and exits 2. For
//! one request it prefills every traced layer with the prompt's K/V, then
//! runs decode steps: per layer, append the new token's K/V, select the
//! tokens that matter for the step's query, and fetch their K/V for the
//! attention kernel. It reports, per layer, how much of the model's exact
//! attention (softmax over every past token) falls on the selected tokens,
//! and checks that fetched rows are the stored ones.
//!
//! Usage: rust_server [--library PATH] [--trace PATH] [--steps N] [--selector NAME] [--min-mass X]
//!   --library   libpqcache to load (default $PQCACHE_LIB, else the soname
//!               libpqcache.so.0 through the loader's search path)
//!   --trace     a .pqtrace file (default: the repository's committed trace)
//!   --steps     decode steps (default 32, at most the trace's query rows)
//!   --selector  pq (default), exact (the oracle) or window (StreamingLLM)
//!   --min-mass  exit 1 if the mean attention mass captured is below X

mod pqtrace;

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use pqcache::{Config, Context, DType, Library, Selection, Selector, Shape, Tensor, TensorMut};
use pqtrace::{Rows, Trace, TraceDType};

const REQUEST_ID: u64 = 1;

struct Options {
    library: String,
    trace: PathBuf,
    steps: usize,
    selector: Selector,
    min_mass: Option<f64>,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        library: std::env::var("PQCACHE_LIB")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| pqcache::SONAME.to_owned()),
        trace: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/smollm2_sotu_2k.pqtrace"),
        steps: 32,
        selector: Selector::Pq,
        min_mass: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--library" => options.library = value()?,
            "--trace" => options.trace = PathBuf::from(value()?),
            "--steps" => options.steps = value()?.parse().map_err(|_| "--steps needs a number".to_owned())?,
            "--selector" => {
                options.selector = match value()?.as_str() {
                    "pq" => Selector::Pq,
                    "exact" => Selector::Exact,
                    "window" => Selector::Window,
                    other => return Err(format!("--selector {other}: expected pq, exact or window")),
                }
            }
            "--min-mass" => {
                options.min_mass = Some(value()?.parse().map_err(|_| "--min-mass needs a number".to_owned())?)
            }
            "--help" | "-h" => {
                return Err("usage: rust_server [--library PATH] [--trace PATH] [--steps N] [--selector pq|exact|window] [--min-mass X]".to_owned())
            }
            other => return Err(format!("unknown argument {other} (try --help)")),
        }
    }
    Ok(options)
}

/// One traced layer's data and the buffers its decode steps reuse, as a
/// server keeps them per (request, layer).
struct LayerState {
    model_layer: usize,
    queries: Rows,
    keys: Rows,
    /// Queries and keys as f32, for the exact attention reference.
    queries_f32: Vec<f32>,
    keys_f32: Vec<f32>,
    values: Rows,
    selection: Selection,
    fetched_keys: Rows,
    fetched_values: Rows,
    /// Sum over steps of the exact attention mass on the selected tokens
    /// (mean over query heads).
    mass: f64,
    selected: usize,
}

/// A tensor over rows `[first, first + tokens)` of a [tokens][heads][dim] array.
fn rows_tensor(
    rows: &Rows,
    first: usize,
    tokens: usize,
    heads: usize,
    dim: usize,
) -> pqcache::Result<Tensor<'_>> {
    let range = first * heads * dim..(first + tokens) * heads * dim;
    let shape = Shape::token_major(tokens, heads, dim);
    match rows {
        Rows::F16(bits) => Tensor::f16(&bits[range], shape),
        Rows::F32(values) => Tensor::f32(&values[range], shape),
    }
}

fn output_tensor(rows: &mut Rows, shape: Shape) -> pqcache::Result<TensorMut<'_>> {
    match rows {
        Rows::F16(bits) => TensorMut::f16(bits, shape),
        Rows::F32(values) => TensorMut::f32(values, shape),
    }
}

/// Exact attention of query `row` at position `pos` (softmax over 0..=pos per
/// query head), summed over the selected positions of each head's kv head;
/// the mean over query heads.
fn captured_attention_mass(trace: &Trace, layer: &LayerState, row: usize, pos: usize) -> f64 {
    let (d, kv, group) = (
        trace.head_dim,
        trace.kv_heads,
        trace.q_heads / trace.kv_heads,
    );
    let scale = 1.0 / (d as f64).sqrt();
    let mut total = 0.0;
    for qh in 0..trace.q_heads {
        let h = qh / group;
        let q0 = (row * trace.q_heads + qh) * d;
        let logits: Vec<f64> = (0..=pos)
            .map(|t| {
                let k0 = (t * kv + h) * d;
                let (q, k) = (&layer.queries_f32[q0..q0 + d], &layer.keys_f32[k0..k0 + d]);
                q.iter()
                    .zip(k)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
        let sum: f64 = weights.iter().sum();
        total += layer
            .selection
            .head(h)
            .iter()
            .map(|&p| weights[p as usize])
            .sum::<f64>()
            / sum;
    }
    total / trace.q_heads as f64
}

fn run(options: &Options, library: &Library) -> Result<f64, Box<dyn Error>> {
    let trace = Trace::open(&options.trace)?;
    let steps = options.steps.min(trace.tokens - trace.q_first);
    println!(
        "trace: {} over {}, {} tokens ({} dtype), {} q heads / {} kv heads x {}, layers {:?} of {}",
        trace.model,
        trace.text,
        trace.tokens,
        if trace.dtype == TraceDType::F16 {
            "f16"
        } else {
            "f32"
        },
        trace.q_heads,
        trace.kv_heads,
        trace.head_dim,
        trace.layers,
        trace.model_layers
    );

    // The model's geometry and the selector; every other setting is the
    // library's default (m = 2, b = 6, top 1/5 of the middle tokens, 4 sinks, 128 local).
    let config: Config = library
        .default_config()
        .geometry(
            trace.model_layers as i32,
            trace.q_heads as i32,
            trace.kv_heads as i32,
            trace.head_dim as i32,
        )
        .dtype(if trace.dtype == TraceDType::F16 {
            DType::F16
        } else {
            DType::F32
        })
        .selector(options.selector)
        .seed(1);
    let ctx: Context = library
        .create(&config)
        .map_err(|e| format!("pq_create: {e}"))?;
    let (kv, d, q_heads) = (trace.kv_heads, trace.head_dim, trace.q_heads);
    let empty = |n: usize| {
        if trace.dtype == TraceDType::F16 {
            Rows::F16(vec![0; n])
        } else {
            Rows::F32(vec![0.0; n])
        }
    };

    // A request arrives: its prompt is everything before the first traced query.
    let prompt = trace.q_first;
    let ids = trace.token_ids();
    println!("request {REQUEST_ID}: a prompt of {prompt} tokens (ids {:?} ...), then {steps} decode steps", &ids[..ids.len().min(6)]);
    ctx.add_sequence(REQUEST_ID)?;
    let mut layers: Vec<LayerState> = Vec::new();
    let mut prefill_time = Duration::ZERO;
    for (i, &model_layer) in trace.layers.iter().enumerate() {
        let (keys, values) = (trace.keys(i), trace.values(i));
        let k = rows_tensor(&keys, 0, prompt, kv, d)?;
        let v = rows_tensor(&values, 0, prompt, kv, d)?;
        // Returns once the data is copied; the layer's index builds in the background.
        let started = Instant::now();
        ctx.prefill(REQUEST_ID, model_layer, &k, &v)
            .map_err(|e| format!("prefill layer {model_layer}: {e}"))?;
        prefill_time += started.elapsed();
        let queries = trace.queries(i);
        layers.push(LayerState {
            model_layer,
            queries_f32: queries.to_f32(),
            keys_f32: keys.to_f32(),
            queries,
            keys,
            values,
            selection: Selection::new(kv, 0),
            fetched_keys: empty(0),
            fetched_values: empty(0),
            mass: 0.0,
            selected: 0,
        });
    }
    println!("selector: {:?}", options.selector);
    println!("prefill: {prompt} prompt tokens into {} layers in {:.1} ms (index builds run in the background)",
             layers.len(), prefill_time.as_secs_f64() * 1e3);

    // Decode: one token per step through every layer, as the model would.
    let mut decode_time = Duration::ZERO;
    for step in 0..steps {
        let pos = prompt + step;
        for layer in &mut layers {
            let l = layer.model_layer;
            let k = rows_tensor(&layer.keys, pos, 1, kv, d)?;
            let v = rows_tensor(&layer.values, pos, 1, kv, d)?;
            let q = rows_tensor(&layer.queries, step, 1, q_heads, d)?;
            let started = Instant::now();
            ctx.append(REQUEST_ID, l, &k, &v)
                .map_err(|e| format!("append layer {l}: {e}"))?;
            ctx.select(REQUEST_ID, l, &q, &mut layer.selection)
                .map_err(|e| format!("select layer {l}: {e}"))?;

            // Head-major [kv_head][capacity][head_dim]: what an attention kernel reads.
            let shape = Shape::head_major(layer.selection.capacity(), kv, d);
            if layer.fetched_keys_len() != shape.span().unwrap_or(0) {
                layer.fetched_keys = empty(shape.span().unwrap_or(0));
                layer.fetched_values = empty(shape.span().unwrap_or(0));
            }
            let mut out_k = output_tensor(&mut layer.fetched_keys, shape)?;
            let mut out_v = output_tensor(&mut layer.fetched_values, shape)?;
            ctx.fetch(REQUEST_ID, l, &layer.selection, &mut out_k, &mut out_v)
                .map_err(|e| format!("fetch layer {l}: {e}"))?;
            decode_time += started.elapsed();

            check_fetched_rows(layer, kv, d)?;
            layer.mass += captured_attention_mass(&trace, layer, step, pos);
            layer.selected += layer.selection.heads().map(<[i32]>::len).sum::<usize>();
        }
    }
    let decode_ms = decode_time.as_secs_f64() * 1e3;

    println!(
        "decode: {steps} steps x {} layers (append + select + fetch) in {decode_ms:.1} ms",
        layers.len()
    );
    let mut mean_mass = 0.0;
    for layer in &layers {
        let info = ctx.layer_info(REQUEST_ID, layer.model_layer)?;
        let mass = layer.mass / steps.max(1) as f64;
        mean_mass += mass / layers.len() as f64;
        println!(
            "  layer {:>2}: {} tokens, {:.0} selected per kv head per step, K-Means {} iterations, \
             attention mass on the selection {:.3}",
            layer.model_layer,
            info.tokens,
            layer.selected as f64 / (steps.max(1) * kv) as f64,
            info.kmeans_iterations,
            mass
        );
    }
    let stats = ctx.stats()?;
    println!(
        "stats: {} selects ({:.2} ms), {} fetches ({:.2} ms, {} KiB), {} index builds, K/V {} KiB, index {} KiB",
        stats.select_calls, stats.select_seconds * 1e3, stats.fetch_calls, stats.fetch_seconds * 1e3,
        stats.bytes_fetched / 1024, stats.builds_finished, stats.kv_bytes / 1024, stats.index_bytes / 1024
    );
    // The request ends: its cache goes.
    ctx.remove_sequence(REQUEST_ID)?;
    println!("mean attention mass on the selected tokens: {mean_mass:.3}");
    Ok(mean_mass)
}

impl LayerState {
    fn fetched_keys_len(&self) -> usize {
        match &self.fetched_keys {
            Rows::F16(v) => v.len(),
            Rows::F32(v) => v.len(),
        }
    }
}

/// The fetched rows must be the trace's rows at the selected positions.
fn check_fetched_rows(layer: &LayerState, kv: usize, d: usize) -> Result<(), String> {
    let capacity = layer.selection.capacity();
    for (h, positions) in layer.selection.heads().enumerate() {
        for (i, &p) in positions.iter().enumerate() {
            let stored = (p as usize * kv + h) * d..(p as usize * kv + h + 1) * d;
            let fetched = (h * capacity + i) * d..(h * capacity + i + 1) * d;
            if !layer
                .fetched_keys
                .same_bits(fetched.clone(), &layer.keys, stored.clone())
                || !layer
                    .fetched_values
                    .same_bits(fetched, &layer.values, stored)
            {
                return Err(format!(
                    "layer {}: fetched row {i} of kv head {h} is not token {p}'s K/V",
                    layer.model_layer
                ));
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let options = match parse_options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("rust_server: {message}");
            return ExitCode::from(2);
        }
    };
    // The optional dependency: a server would fall back to full attention here.
    let library = match Library::load(&options.library) {
        Ok(library) => library,
        Err(e) => {
            eprintln!("rust_server: libpqcache is not available, so PQCache selection is off.");
            eprintln!("  {}", e.message);
            eprintln!(
                "  Give its path with --library PATH or $PQCACHE_LIB, or install libpqcache0."
            );
            return ExitCode::from(2);
        }
    };
    println!(
        "libpqcache {} loaded from {}",
        library.version(),
        options.library
    );
    match run(&options, &library) {
        Ok(mass) => match options.min_mass {
            Some(min) if mass < min => {
                eprintln!("rust_server: attention mass {mass:.3} is below --min-mass {min}");
                ExitCode::FAILURE
            }
            _ => ExitCode::SUCCESS,
        },
        Err(error) => {
            eprintln!("rust_server: {error}");
            ExitCode::FAILURE
        }
    }
}
