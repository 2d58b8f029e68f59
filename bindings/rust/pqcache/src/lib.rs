//! Safe Rust API of libpqcache: a PQ-indexed KV cache that picks, at each
//! decode step, the past tokens that matter for the current query (PQCache).
//!
//! ```no_run
//! use pqcache::{Config, Context, DType, Selection, Shape, Tensor, TensorMut};
//!
//! let (tokens, kv_heads, q_heads, dim) = (1024, 2, 4, 64);
//! let config = Config::new().geometry(1, q_heads as i32, kv_heads as i32, dim as i32).dtype(DType::F32);
//! let ctx = Context::new(&config)?;
//! ctx.add_sequence(7)?;
//! let (k, v) = (vec![0.5f32; tokens * kv_heads * dim], vec![0.25f32; tokens * kv_heads * dim]);
//! let kv_shape = Shape::token_major(tokens, kv_heads, dim);
//! ctx.prefill(7, 0, &Tensor::f32(&k, kv_shape)?, &Tensor::f32(&v, kv_shape)?)?;
//!
//! let q = vec![0.1f32; q_heads * dim];
//! let mut selection = Selection::new(kv_heads, 0); // grown by select as needed
//! ctx.select(7, 0, &Tensor::f32(&q, Shape::token_major(1, q_heads, dim))?, &mut selection)?;
//! let rows = Shape::head_major(selection.capacity(), kv_heads, dim);
//! let (mut out_k, mut out_v) = (vec![0f32; rows.span().unwrap()], vec![0f32; rows.span().unwrap()]);
//! ctx.fetch(7, 0, &selection, &mut TensorMut::f32(&mut out_k, rows)?, &mut TensorMut::f32(&mut out_v, rows)?)?;
//! println!("kv head 0 attends to {:?}", selection.head(0));
//! # Ok::<(), pqcache::Error>(())
//! ```
//!
//! - Every call returns [`Result`]; an [`Error`] carries the library's
//!   [`Status`] and message. Shapes are checked against slices here, before
//!   the library sees them.
//! - [`Context`] is `Send + Sync` (the C API's threading contract; see its docs).
//! - A decode step over many sequences takes one call per layer:
//!   [`Context::select_batch`] and [`Context::fetch_batch`] take a
//!   [`SelectItem`] or [`FetchItem`] per sequence, each with its own status.
//! - [`Context::attend`] gives the attention output of a query over a
//!   selection (and its log-sum-exp) without gathering the rows first.
//! - A sequence's state can be rolled back ([`Context::truncate`]), shared
//!   ([`Context::fork`]), saved ([`Context::save`], [`Context::save_file`])
//!   and restored in this or another context ([`Context::restore`],
//!   [`Context::restore_file`]), also in pieces, selecting before the K/V
//!   arrive ([`Context::restore_begin`], [`Context::restore_kv`]).
//! - An index-only context ([`KvTier::Caller`]) keeps the PQ index and not
//!   the K/V, which stay in the caller's (paged) pool ([`PagedKeys`],
//!   [`Context::prefill_paged`]); [`Context::select_multi`] selects for
//!   several query tokens at once.
//! - The library is linked (feature `link`, the default) or loaded at run
//!   time with [`Library::load`]; the API is the same on both.

mod batch;
mod config;
mod context;
mod error;
mod library;
mod paged;
mod state;
mod tensor;

pub use batch::{FetchItem, SelectItem};
pub use config::{
    Backend, CachePolicy, Config, DType, GqaCombine, KeyRotary, KmeansInit, KvTier, Pooling,
    SelectRows, Selector, TailEstimate, SELECTOR_COUNT,
};
pub use context::{Attention, Context, LayerInfo, Stats};
pub use error::{Error, Result, Status};
pub use library::{Library, Version};
pub use paged::{PageMap, PagedKeys};
pub use state::RestoreStep;
pub use tensor::{Selection, Shape, Tensor, TensorMut};

/// The raw declarations this crate is built on.
pub use pqcache_sys as sys;

/// The soname to [`Library::load`] an installed libpqcache by.
pub const SONAME: &str = "libpqcache.so.0";

/// The version of the linked library.
#[cfg(feature = "link")]
pub fn version() -> Version {
    Library::linked().version()
}
