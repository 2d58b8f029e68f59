use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use pqcache_sys as sys;

use crate::{Backend, Config, DType, Error, Library, Result, Selection, Status, Tensor, TensorMut};

/// The signature `pq_prefill_layer` and `pq_decode_append` share.
type StoreFn = unsafe extern "C" fn(
    *mut sys::pq_context,
    u64,
    i32,
    *const sys::pq_tensor,
    *const sys::pq_tensor,
) -> sys::pq_status;

/// The signature `pq_decode_select` and `pq_decode_speculate` share.
type SelectFn = unsafe extern "C" fn(
    *mut sys::pq_context,
    u64,
    i32,
    *const sys::pq_tensor,
    *mut sys::pq_selection,
) -> sys::pq_status;

/// A libpqcache context (`pq_context`): the KV cache and PQ indexes of any
/// number of sequences, named by the caller's `u64` ids. Dropping it waits
/// for the index builds in flight and frees everything (`pq_destroy`).
///
/// # Threading
/// `Context` is `Send` and `Sync`, and every method takes `&self`, because
/// pqcache.h's threading contract makes a `pq_context` thread-safe: calls on
/// different sequences run concurrently, calls on the same sequence and
/// different layers too, and calls on the same (sequence, layer) are
/// serialised by the library. The contract's exceptions are kept by Rust:
/// `pq_destroy` must not race with any call (it runs in `Drop`, which needs
/// ownership), and `pq_sequence_set_stream` must not race with calls on its
/// sequence (so [`Context::set_cuda_stream`] is `unsafe`). Share a context
/// between threads with `&Context` (e.g. `std::thread::scope`) or `Arc`.
///
/// # After drop
/// A dropped context cannot be reached, so no call can report a closed one
/// (the Python, Go and Java bindings, whose `close()` leaves the object,
/// report `PQ_ERR_BAD_STATE`, `"<C function>: the context is closed"`; see
/// docs/bindings/errors.md). Dropping moves the context, and the compiler
/// refuses any later use:
/// ```compile_fail,E0382
/// fn use_after_drop(ctx: pqcache::Context) -> pqcache::Result<()> {
///     drop(ctx);
///     ctx.add_sequence(1) // error[E0382]: borrow of moved value: `ctx`
/// }
/// ```
/// Nothing else in this crate holds a pointer into the C context: a
/// [`Selection`], an [`Attention`], [`Stats`] or a saved state are plain Rust
/// data, and [`crate::SelectItem`] and [`crate::FetchItem`] borrow the
/// caller's buffers, not the context. Anything that borrows the context (a
/// `&Context` kept by another object, a scoped thread) keeps it from being
/// dropped while the borrow lives; an `Arc<Context>` drops it with the last
/// clone:
/// ```compile_fail,E0505
/// fn borrow_across_drop(ctx: pqcache::Context) -> pqcache::Result<usize> {
///     let handle: &pqcache::Context = &ctx; // what any handle into it holds
///     drop(ctx); // error[E0505]: cannot move out of `ctx` because it is borrowed
///     handle.sequence_count()
/// }
/// ```
pub struct Context {
    ctx: NonNull<sys::pq_context>,
    library: Library,
    /// The effective configuration (pq_get_config), cuda_plugin_path,
    /// kv_disk_path and kv_scales NULL.
    config: sys::pq_config,
    /// Per layer, the largest selection capacity the library asked for so
    /// far: [`Context::select_batch`] sizes new selections with it.
    capacity_hints: Vec<AtomicUsize>,
}

// SAFETY: see "Threading" above; `config` is plain data (its one pointer is
// NULL) and `library` is Send + Sync.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

/// Argument `name` of the C function `op`, of the C type `ctype` (whose
/// largest value is `max`) there.
fn to_c<T: TryFrom<usize>>(op: &str, name: &str, value: usize, max: i64, ctype: &str) -> Result<T> {
    T::try_from(value).map_err(|_| {
        Error::invalid(
            op,
            format_args!("{name} is {value}; expected at most {max} ({ctype})"),
        )
    })
}

/// Argument `name` of the C function `op`, an `int64_t` there.
pub(crate) fn to_i64(op: &str, name: &str, value: usize) -> Result<i64> {
    to_c(op, name, value, i64::MAX, "int64_t")
}

/// Argument `name` of the C function `op`, an `int32_t` there.
pub(crate) fn to_i32(op: &str, name: &str, value: usize) -> Result<i32> {
    to_c(op, name, value, i32::MAX.into(), "int32_t")
}

/// A count the library returned (never negative on success).
pub(crate) fn to_usize(value: i64) -> usize {
    usize::try_from(value).expect("the library returned a negative count")
}

impl Context {
    /// Creates a context on the linked library (`pq_create`).
    #[cfg(feature = "link")]
    pub fn new(config: &Config) -> Result<Context> {
        Library::linked().create(config)
    }

    /// # Safety
    /// `ctx` must be a live context of `library` that nothing else owns.
    pub(crate) unsafe fn from_raw(
        library: Library,
        ctx: NonNull<sys::pq_context>,
    ) -> Result<Context> {
        let mut config = library.default_config().as_raw().to_owned();
        let mut context = Context {
            ctx,
            library,
            config,
            capacity_hints: Vec::new(),
        };
        // pq_get_config copies up to struct_size bytes, which
        // pq_config_default set. On failure `context` drops and destroys ctx.
        context.library.check((context.api().pq_get_config)(
            context.ctx.as_ptr(),
            &mut config,
        ))?;
        // Pointed at the caller's strings during create.
        config.cuda_plugin_path = std::ptr::null();
        config.kv_disk_path = std::ptr::null();
        // The context's own copy; kept out of this plain-data struct.
        config.kv_scales = std::ptr::null();
        context.config = config;
        context.capacity_hints = (0..config.num_layers)
            .map(|_| AtomicUsize::new(0))
            .collect();
        Ok(context)
    }

    pub(crate) fn api(&self) -> &sys::Api {
        self.library.api()
    }

    pub(crate) fn ptr(&self) -> *mut sys::pq_context {
        self.ctx.as_ptr()
    }

    /// The library this context lives in.
    pub fn library(&self) -> &Library {
        &self.library
    }

    /// The effective configuration (defaults resolved, e.g. worker_threads).
    pub fn config(&self) -> Config {
        Config::from_raw(self.config)
    }

    pub fn num_layers(&self) -> usize {
        self.config.num_layers as usize
    }

    pub fn num_q_heads(&self) -> usize {
        self.config.num_q_heads as usize
    }

    pub fn num_kv_heads(&self) -> usize {
        self.config.num_kv_heads as usize
    }

    pub fn head_dim(&self) -> usize {
        self.config.head_dim as usize
    }

    pub fn dtype(&self) -> DType {
        DType::try_from(self.config.dtype).expect("pq_create accepted the dtype")
    }

    /// The backend actually in use (Auto resolves to Cpu or Cuda).
    pub fn backend(&self) -> Result<Backend> {
        let mut backend = 0;
        // SAFETY (this and every call below): the context is live for &self;
        // out-pointers are locals or borrowed buffers whose sizes were
        // checked against what the header says the call touches.
        self.library
            .check(unsafe { (self.api().pq_get_backend)(self.ptr(), &mut backend) })?;
        Backend::try_from(backend).map_err(|b| {
            Error::new(
                Status::Internal,
                format!(
                    "pq_get_backend: out_backend is {b}; expected a pq_backend this crate knows"
                ),
            )
        })
    }

    /// Adds an empty sequence; an existing id is InvalidArgument.
    pub fn add_sequence(&self, seq_id: u64) -> Result<()> {
        self.library
            .check(unsafe { (self.api().pq_sequence_add)(self.ptr(), seq_id) })
    }

    /// Removes a sequence and frees its memory (NotFound if absent). Calls on
    /// it from other threads finish on their data or fail with NotFound.
    pub fn remove_sequence(&self, seq_id: u64) -> Result<()> {
        self.library
            .check(unsafe { (self.api().pq_sequence_remove)(self.ptr(), seq_id) })
    }

    /// Tokens stored for (sequence, layer).
    pub fn sequence_length(&self, seq_id: u64, layer: usize) -> Result<usize> {
        let mut tokens = 0;
        let layer = self.layer_arg("pq_sequence_length", layer)?;
        self.library.check(unsafe {
            (self.api().pq_sequence_length)(self.ptr(), seq_id, layer, &mut tokens)
        })?;
        Ok(to_usize(tokens))
    }

    /// Sequences in the context.
    pub fn sequence_count(&self) -> Result<usize> {
        let mut count = 0;
        self.library
            .check(unsafe { (self.api().pq_sequence_count)(self.ptr(), &mut count) })?;
        Ok(to_usize(count))
    }

    /// Orders the sequence's device work on a CUDA stream (`cudaStream_t`;
    /// NULL: the context's own). The CPU backend rejects a non-NULL stream.
    ///
    /// # Safety
    /// No other call on `seq_id` may run concurrently (pqcache.h), and the
    /// stream must stay valid until it is replaced by NULL.
    pub unsafe fn set_cuda_stream(&self, seq_id: u64, stream: *mut c_void) -> Result<()> {
        self.library.check((self.api().pq_sequence_set_stream)(
            self.ptr(),
            seq_id,
            stream,
        ))
    }

    /// Appends a prompt chunk's keys and values (tokens x kv heads x
    /// head_dim) to one layer and schedules its index build. The data is
    /// copied before this returns. `values` is `&tensor`, or `None` in an
    /// index-only context ([`crate::KvTier::Caller`]), which keeps no values.
    pub fn prefill<'v, 'd: 'v>(
        &self,
        seq_id: u64,
        layer: usize,
        keys: &Tensor<'_>,
        values: impl Into<Option<&'v Tensor<'d>>>,
    ) -> Result<()> {
        let call = self.api().pq_prefill_layer;
        self.store("pq_prefill_layer", call, seq_id, layer, keys, values.into())
    }

    /// Appends decode tokens' keys and values (usually one token) to a
    /// prefilled layer, without a rebuild; `values` as for
    /// [`Context::prefill`].
    pub fn append<'v, 'd: 'v>(
        &self,
        seq_id: u64,
        layer: usize,
        keys: &Tensor<'_>,
        values: impl Into<Option<&'v Tensor<'d>>>,
    ) -> Result<()> {
        let call = self.api().pq_decode_append;
        self.store("pq_decode_append", call, seq_id, layer, keys, values.into())
    }

    /// prefill's and append's body: `call` (the C function `op`), values
    /// NULL when `None`.
    fn store(
        &self,
        op: &str,
        call: StoreFn,
        seq_id: u64,
        layer: usize,
        keys: &Tensor<'_>,
        values: Option<&Tensor<'_>>,
    ) -> Result<()> {
        let layer = self.layer_arg(op, layer)?;
        let keys = keys.c_tensor(op, "keys")?;
        let values = values.map(|v| v.c_tensor(op, "values")).transpose()?;
        let values = values.as_ref().map_or(std::ptr::null(), std::ptr::from_ref);
        self.library
            .check(unsafe { call(self.ptr(), seq_id, layer, &keys, values) })
    }

    /// Positions per kv head a selection needs at the layer's current length.
    pub fn selection_capacity(&self, seq_id: u64, layer: usize) -> Result<usize> {
        let mut capacity = 0;
        let layer = self.layer_arg("pq_selection_capacity", layer)?;
        self.library.check(unsafe {
            (self.api().pq_selection_capacity)(self.ptr(), seq_id, layer, &mut capacity)
        })?;
        Ok(to_usize(capacity))
    }

    /// Positions per kv head a selection needs at `layer` for a sequence of
    /// `tokens` tokens, without a sequence (`pq_selection_capacity_for`). It
    /// never decreases as `tokens` grows: the capacity for the longest
    /// sequence admitted sizes every [`Selection`] once.
    pub fn selection_capacity_for(&self, layer: usize, tokens: usize) -> Result<usize> {
        let mut capacity = 0;
        const OP: &str = "pq_selection_capacity_for";
        let (layer, tokens) = (self.layer_arg(OP, layer)?, to_i64(OP, "tokens", tokens)?);
        self.library.check(unsafe {
            (self.api().pq_selection_capacity_for)(self.ptr(), layer, tokens, &mut capacity)
        })?;
        Ok(to_usize(capacity))
    }

    /// Selects, per kv head, the sink, top-k and local tokens for `query`
    /// (1 token x q heads x head_dim) into `out` (`pq_decode_select`).
    ///
    /// `out` is used as it is when it is large enough (reuse one selection
    /// per sequence across steps, or size it with
    /// [`Context::selection_capacity_for`]); when the library answers
    /// [`Status::BufferTooSmall`], `out` grows to the capacity the library
    /// asked for and the call is made once more. Errors are the library's
    /// for `pq_decode_select`; on error `out` holds no positions.
    pub fn select(
        &self,
        seq_id: u64,
        layer: usize,
        query: &Tensor<'_>,
        out: &mut Selection,
    ) -> Result<()> {
        self.select_with(
            "pq_decode_select",
            self.api().pq_decode_select,
            seq_id,
            layer,
            query,
            out,
        )
    }

    /// A selection a step early, from an estimate of the query
    /// (`pq_decode_speculate`): what [`Context::select`] would write for it,
    /// without changing the selector's state; the next select of this
    /// layer at the same length counts how much of its middle it held
    /// ([`Stats::hint_covered`]). `out` grows as for [`Context::select`].
    pub fn speculate(
        &self,
        seq_id: u64,
        layer: usize,
        query_estimate: &Tensor<'_>,
        out: &mut Selection,
    ) -> Result<()> {
        self.select_with(
            "pq_decode_speculate",
            self.api().pq_decode_speculate,
            seq_id,
            layer,
            query_estimate,
            out,
        )
    }

    /// select's and speculate's body: `call` (the C function `op`) into
    /// `out` (sized for this context's kv heads), grown once when the
    /// library asks for more.
    fn select_with(
        &self,
        op: &str,
        call: SelectFn,
        seq_id: u64,
        layer: usize,
        query: &Tensor<'_>,
        out: &mut Selection,
    ) -> Result<()> {
        let layer = self.layer_arg(op, layer)?;
        // pq_decode_speculate's parameter is query_estimate.
        let query = query.c_tensor(
            op,
            if op == "pq_decode_speculate" {
                "query_estimate"
            } else {
                "query"
            },
        )?;
        // The library writes num_kv_heads counts (and rows): size them here.
        out.reserve(self.num_kv_heads(), out.capacity());
        let mut status = self.decode_call(call, seq_id, layer, &query, out);
        if status == sys::PQ_ERR_BUFFER_TOO_SMALL {
            status = self.decode_call_grown(call, seq_id, layer, &query, out);
        }
        self.library.check(status)
    }

    /// One `call` (`pq_decode_select` or `pq_decode_speculate`) into `out`
    /// (sized for this context's kv heads).
    fn decode_call(
        &self,
        call: SelectFn,
        seq_id: u64,
        layer: i32,
        query: &sys::pq_tensor,
        out: &mut Selection,
    ) -> sys::pq_status {
        let mut raw = out.as_raw();
        unsafe { call(self.ptr(), seq_id, layer, query, &mut raw) }
    }

    /// After `PQ_ERR_BUFFER_TOO_SMALL` (the needed capacity is in `out`'s
    /// counts): grows `out` to it and calls once more. A second
    /// `PQ_ERR_BUFFER_TOO_SMALL` (another thread appended meanwhile) is
    /// returned as it is, with `out` cleared.
    pub(crate) fn decode_call_grown(
        &self,
        call: SelectFn,
        seq_id: u64,
        layer: i32,
        query: &sys::pq_tensor,
        out: &mut Selection,
    ) -> sys::pq_status {
        let needed = out.needed_capacity();
        if let Some(hint) = self.hint_slot(layer) {
            hint.fetch_max(needed, Ordering::Relaxed);
        }
        out.reserve(self.num_kv_heads(), needed);
        let status = self.decode_call(call, seq_id, layer, query, out);
        if status == sys::PQ_ERR_BUFFER_TOO_SMALL {
            out.clear();
        }
        status
    }

    /// Gathers the K and V rows of `selection` into the caller's buffers:
    /// selected token i of kv head h goes to row (i, h). The tensors need
    /// num_kv_heads heads and at least `selection.max_count()` tokens.
    pub fn fetch(
        &self,
        seq_id: u64,
        layer: usize,
        selection: &Selection,
        keys: &mut TensorMut<'_>,
        values: &mut TensorMut<'_>,
    ) -> Result<()> {
        const OP: &str = "pq_fetch_kv";
        let layer = self.layer_arg(OP, layer)?;
        self.check_selection(OP, "selection", selection)?;
        let (keys, values) = (
            keys.c_tensor(OP, "out_keys")?,
            values.c_tensor(OP, "out_values")?,
        );
        let raw = selection.as_raw_const();
        self.library.check(unsafe {
            (self.api().pq_fetch_kv)(self.ptr(), seq_id, layer, &raw, &keys, &values)
        })
    }

    /// The attention of one token's `query` (1 token x q heads x head_dim,
    /// the config dtype) over the tokens of `selection`, read from the
    /// library's store without the gathered copy of [`Context::fetch`]
    /// (`pq_decode_attend`). Query head q attends over the selected tokens of
    /// kv head `q / (num_q_heads / num_kv_heads)` with logits
    /// `scale * q . K`; `scale` `None` (or `Some(0.0)`) means
    /// `1 / sqrt(head_dim)`. The result is in `f32` whatever the stored
    /// dtype. Errors are the library's for `pq_decode_attend`
    /// (`InvalidArgument` for the query's shape, a negative or non-finite
    /// scale, positions past the length; `NotFound`; `BadState` before the
    /// layer's prefill).
    pub fn attend(
        &self,
        seq_id: u64,
        layer: usize,
        query: &Tensor<'_>,
        selection: &Selection,
        scale: Option<f32>,
    ) -> Result<Attention> {
        self.attention_of("pq_decode_attend", seq_id, layer, query, selection, scale)
    }

    /// [`Context::attend`] into the caller's buffers, allocating nothing:
    /// `out` receives num_q_heads x head_dim floats (`[q head][dim]`) and
    /// `lse`, if given, num_q_heads floats. Both are written only on success.
    #[allow(clippy::too_many_arguments)]
    pub fn attend_into(
        &self,
        seq_id: u64,
        layer: usize,
        query: &Tensor<'_>,
        selection: &Selection,
        scale: Option<f32>,
        out: &mut [f32],
        lse: Option<&mut [f32]>,
    ) -> Result<()> {
        self.attend_op(
            "pq_decode_attend",
            seq_id,
            layer,
            query,
            selection,
            scale,
            out,
            lse,
        )
    }

    /// The tail estimate alone (`pq_decode_tail`, 0.12; a context configured
    /// with [`crate::TailEstimate::CodeMeans`]): the attention over the middle
    /// tokens `selection` leaves out, the part [`Context::attend`] adds, for a
    /// caller that attends over the fetched rows itself. Merge per query head
    /// with your own `(o_a, lse_a)`: `m = max(lse_a, lse)`, `w_a = exp(lse_a -
    /// m)`, `w_t = exp(lse - m)`, `o = (w_a o_a + w_t out) / (w_a + w_t)`. A kv
    /// head with nothing left out gives zeros and `-inf`. Errors are
    /// attend's, and `BadState` without the estimate.
    pub fn tail(
        &self,
        seq_id: u64,
        layer: usize,
        query: &Tensor<'_>,
        selection: &Selection,
        scale: Option<f32>,
    ) -> Result<Attention> {
        self.attention_of("pq_decode_tail", seq_id, layer, query, selection, scale)
    }

    /// attend and tail: `op` into a new [`Attention`].
    fn attention_of(
        &self,
        op: &'static str,
        seq_id: u64,
        layer: usize,
        query: &Tensor<'_>,
        selection: &Selection,
        scale: Option<f32>,
    ) -> Result<Attention> {
        let mut attention = Attention {
            output: vec![0.0; self.num_q_heads() * self.head_dim()],
            lse: vec![0.0; self.num_q_heads()],
            head_dim: self.head_dim(),
        };
        let (output, lse) = (&mut attention.output, &mut attention.lse);
        self.attend_op(
            op,
            seq_id,
            layer,
            query,
            selection,
            scale,
            output,
            Some(lse),
        )?;
        Ok(attention)
    }

    /// `pq_decode_attend` or (`op` `pq_decode_tail`) `pq_decode_tail`.
    #[allow(clippy::too_many_arguments)]
    fn attend_op(
        &self,
        op: &'static str,
        seq_id: u64,
        layer: usize,
        query: &Tensor<'_>,
        selection: &Selection,
        scale: Option<f32>,
        out: &mut [f32],
        lse: Option<&mut [f32]>,
    ) -> Result<()> {
        let layer = self.layer_arg(op, layer)?;
        let query = query.c_tensor(op, "query")?;
        self.check_selection(op, "selection", selection)?;
        let (heads, dim) = (self.num_q_heads(), self.head_dim());
        if out.len() < heads * dim {
            return Err(Error::invalid(
                op,
                format_args!(
                    "out has {} floats; expected at least {} (num_q_heads {heads} x head_dim {dim})",
                    out.len(),
                    heads * dim
                ),
            ));
        }
        let lse = match lse {
            Some(lse) if lse.len() < heads => {
                return Err(Error::invalid(
                    op,
                    format_args!(
                        "out_lse has {} floats; expected at least {heads} (num_q_heads)",
                        lse.len()
                    ),
                ))
            }
            Some(lse) => lse.as_mut_ptr(),
            None => std::ptr::null_mut(),
        };
        let raw = selection.as_raw_const();
        let call = if op == "pq_decode_tail" {
            self.api().pq_decode_tail
        } else {
            self.api().pq_decode_attend
        };
        self.library.check(unsafe {
            (call)(
                self.ptr(),
                seq_id,
                layer,
                &query,
                &raw,
                scale.unwrap_or(0.0),
                out.as_mut_ptr(),
                lse,
            )
        })
    }

    /// The last prompt queries of a layer, for selectors that score the
    /// prompt from an observation window (SnapKV, PyramidKV, SCOPE).
    pub fn prefill_queries(&self, seq_id: u64, layer: usize, queries: &Tensor<'_>) -> Result<()> {
        const OP: &str = "pq_prefill_queries";
        let layer = self.layer_arg(OP, layer)?;
        let queries = queries.c_tensor(OP, "queries")?;
        self.library
            .check(unsafe { (self.api().pq_prefill_queries)(self.ptr(), seq_id, layer, &queries) })
    }

    /// Attention probabilities over `selection`'s tokens (H2O, SCOPE):
    /// `probs[h * selection.capacity() + i]` belongs to `selection.head(h)[i]`.
    pub fn observe_attention(
        &self,
        seq_id: u64,
        layer: usize,
        selection: &Selection,
        probs: &[f32],
    ) -> Result<()> {
        const OP: &str = "pq_observe_attention";
        let layer = self.layer_arg(OP, layer)?;
        self.check_selection(OP, "selection", selection)?;
        let needed = selection.kv_heads() * selection.capacity();
        if probs.len() < needed {
            return Err(Error::invalid(
                OP,
                format_args!(
                    "probs has {} floats; expected at least {needed} ({} kv heads x selection capacity {})",
                    probs.len(),
                    selection.kv_heads(),
                    selection.capacity()
                ),
            ));
        }
        let raw = selection.as_raw_const();
        self.library.check(unsafe {
            (self.api().pq_observe_attention)(self.ptr(), seq_id, layer, &raw, probs.as_ptr())
        })
    }

    /// The classes (`sys::PQ_TOKEN_SPECIAL` | `sys::PQ_TOKEN_PUNCTUATION`
    /// flags) of the tokens at `first ..`, for every layer (FastGen reads
    /// them; give the prompt's before `prefill_queries`).
    pub fn token_classes(&self, seq_id: u64, first: usize, classes: &[u8]) -> Result<()> {
        const OP: &str = "pq_sequence_token_classes";
        let first = to_i64(OP, "first", first)?;
        let count = to_i64(OP, "count", classes.len())?;
        self.library.check(unsafe {
            (self.api().pq_sequence_token_classes)(
                self.ptr(),
                seq_id,
                first,
                count,
                classes.as_ptr(),
            )
        })
    }

    /// The `int32_t layer` of the C function `op`. One past `i32` is out of
    /// range for any context: refused here with the library's own text.
    pub(crate) fn layer_arg(&self, op: &str, layer: usize) -> Result<i32> {
        i32::try_from(layer).map_err(|_| {
            Error::invalid(
                op,
                format_args!(
                    "layer is {layer}; expected 0..{}",
                    self.config.num_layers - 1
                ),
            )
        })
    }

    /// The `int32_t kv_head` of the C function `op`, as [`Context::layer_arg`].
    fn kv_head_arg(&self, op: &str, kv_head: usize) -> Result<i32> {
        i32::try_from(kv_head).map_err(|_| {
            Error::invalid(
                op,
                format_args!(
                    "kv_head is {kv_head}; expected 0..{}",
                    self.config.num_kv_heads - 1
                ),
            )
        })
    }

    /// The largest capacity the library asked for at `layer` so far (0 for
    /// a layer out of range: the library reports it).
    pub(crate) fn capacity_hint(&self, layer: i32) -> usize {
        self.hint_slot(layer)
            .map_or(0, |hint| hint.load(Ordering::Relaxed))
    }

    fn hint_slot(&self, layer: i32) -> Option<&AtomicUsize> {
        usize::try_from(layer)
            .ok()
            .and_then(|l| self.capacity_hints.get(l))
    }

    /// The library reads num_kv_heads counts and rows of a selection:
    /// argument `name` of the C function `op` must have as many.
    pub(crate) fn check_selection(
        &self,
        op: &str,
        name: &str,
        selection: &Selection,
    ) -> Result<()> {
        if selection.kv_heads() != self.num_kv_heads() {
            return Err(Error::invalid(
                op,
                format_args!(
                    "{name} has {} kv heads; expected {} (num_kv_heads)",
                    selection.kv_heads(),
                    self.num_kv_heads()
                ),
            ));
        }
        Ok(())
    }

    /// Index state of (sequence, layer), without waiting for builds.
    pub fn layer_info(&self, seq_id: u64, layer: usize) -> Result<LayerInfo> {
        let mut info = sys::pq_layer_info::new();
        let layer = self.layer_arg("pq_layer_info_get", layer)?;
        self.library.check(unsafe {
            (self.api().pq_layer_info_get)(self.ptr(), seq_id, layer, &mut info)
        })?;
        Ok(LayerInfo::from(info))
    }

    /// PQ codes of tokens `first..first + out.len() / pq_subspaces` of one
    /// kv head, token-major, one byte per subspace. Waits for the build.
    pub fn index_codes(
        &self,
        seq_id: u64,
        layer: usize,
        kv_head: usize,
        first: usize,
        out: &mut [u8],
    ) -> Result<()> {
        const OP: &str = "pq_index_codes";
        let (layer, kv_head, first) = (
            self.layer_arg(OP, layer)?,
            self.kv_head_arg(OP, kv_head)?,
            to_i64(OP, "first", first)?,
        );
        let subspaces = self.config.pq_subspaces as usize;
        if out.len() % subspaces != 0 {
            return Err(Error::invalid(
                OP,
                format_args!(
                    "out has {} bytes; expected a multiple of pq_subspaces {subspaces} (count tokens x pq_subspaces)",
                    out.len()
                ),
            ));
        }
        let count = to_i64(OP, "count", out.len() / subspaces)?;
        self.library.check(unsafe {
            (self.api().pq_index_codes)(
                self.ptr(),
                seq_id,
                layer,
                kv_head,
                first,
                count,
                out.as_mut_ptr(),
            )
        })
    }

    /// Centroids of one kv head: pq_subspaces x 2^pq_bits x
    /// (head_dim / pq_subspaces) floats. Waits for the build.
    pub fn index_centroids(
        &self,
        seq_id: u64,
        layer: usize,
        kv_head: usize,
        out: &mut [f32],
    ) -> Result<()> {
        const OP: &str = "pq_index_centroids";
        let (layer, kv_head, len) = (
            self.layer_arg(OP, layer)?,
            self.kv_head_arg(OP, kv_head)?,
            to_i64(OP, "out_floats", out.len())?,
        );
        self.library.check(unsafe {
            (self.api().pq_index_centroids)(
                self.ptr(),
                seq_id,
                layer,
                kv_head,
                out.as_mut_ptr(),
                len,
            )
        })
    }

    /// The number of floats [`Context::index_centroids`] writes.
    pub fn centroid_floats(&self) -> usize {
        let c = &self.config;
        (1usize << c.pq_bits) * c.head_dim as usize
    }

    /// Context-wide statistics.
    pub fn stats(&self) -> Result<Stats> {
        let mut stats = sys::pq_stats::new();
        self.library
            .check(unsafe { (self.api().pq_stats_get)(self.ptr(), &mut stats) })?;
        Ok(Stats::from(stats))
    }

    /// Statistics of one sequence.
    pub fn sequence_stats(&self, seq_id: u64) -> Result<Stats> {
        let mut stats = sys::pq_stats::new();
        self.library
            .check(unsafe { (self.api().pq_sequence_stats_get)(self.ptr(), seq_id, &mut stats) })?;
        Ok(Stats::from(stats))
    }

    /// Blocks until every index build queued so far has finished.
    pub fn wait_builds(&self) -> Result<()> {
        self.library
            .check(unsafe { (self.api().pq_wait_builds)(self.ptr()) })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: &mut self: no other call on this context can be running.
        unsafe { (self.api().pq_destroy)(self.ptr()) }
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("layers", &self.num_layers())
            .field("q_heads", &self.num_q_heads())
            .field("kv_heads", &self.num_kv_heads())
            .field("head_dim", &self.head_dim())
            .field("dtype", &self.dtype())
            .finish_non_exhaustive()
    }
}

/// What [`Context::attend`] computed for one token's query over a selection,
/// in `f32`: per query head, the attention output over the selected tokens
/// of its kv head and the log-sum-exp of its logits, which lets a caller
/// merge this attention with one over tokens it keeps itself. A kv head with
/// no selected token gives zeros and `f32::NEG_INFINITY`.
#[derive(Debug, Clone, PartialEq)]
pub struct Attention {
    output: Vec<f32>,
    lse: Vec<f32>,
    head_dim: usize,
}

impl Attention {
    /// The whole output, `[q head][head_dim]`.
    pub fn output(&self) -> &[f32] {
        &self.output
    }

    /// The output of query head `q` (`head_dim` floats).
    pub fn head(&self, q: usize) -> &[f32] {
        &self.output[q * self.head_dim..(q + 1) * self.head_dim]
    }

    /// The log-sum-exp of every query head.
    pub fn lse(&self) -> &[f32] {
        &self.lse
    }

    pub fn num_q_heads(&self) -> usize {
        self.lse.len()
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The output and the log-sum-exps, as owned vectors.
    pub fn into_parts(self) -> (Vec<f32>, Vec<f32>) {
        (self.output, self.lse)
    }
}

/// Index state of one (sequence, layer) (`pq_layer_info`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerInfo {
    pub tokens: i64,
    pub prefill_tokens: i64,
    pub middle_tokens: i64,
    pub coded_tokens: i64,
    /// A build is queued or running.
    pub build_pending: bool,
    pub kmeans_iterations: i32,
    pub kmeans_budget: i32,
    /// A build has finished (only the PQ selector builds one).
    pub index_ready: bool,
    pub build_seconds: f64,
    /// Bytes the selector read at the last select (all kv heads).
    pub last_select_bytes: u64,
}

impl From<sys::pq_layer_info> for LayerInfo {
    fn from(i: sys::pq_layer_info) -> LayerInfo {
        LayerInfo {
            tokens: i.tokens,
            prefill_tokens: i.prefill_tokens,
            middle_tokens: i.middle_tokens,
            coded_tokens: i.coded_tokens,
            build_pending: i.build_pending != 0,
            kmeans_iterations: i.kmeans_iterations,
            kmeans_budget: i.kmeans_budget,
            index_ready: i.index_ready != 0,
            build_seconds: i.build_seconds,
            last_select_bytes: i.last_select_bytes,
        }
    }
}

/// Context or sequence statistics (`pq_stats`); pqcache.h documents each.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub sequences: i64,
    pub tokens: i64,
    pub kv_bytes: u64,
    pub index_bytes: u64,
    pub builds_finished: u64,
    pub builds_cancelled: u64,
    pub kmeans_iterations: u64,
    pub select_calls: u64,
    pub fetch_calls: u64,
    pub build_seconds: f64,
    pub select_seconds: f64,
    pub fetch_seconds: f64,
    pub bytes_scored: u64,
    pub bytes_fetched: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Host bytes counted against the configured host_memory_limit.
    pub host_bytes: u64,
    /// K/V bytes the CPU copied to stage rows for a device fetch (0 with
    /// the CUDA backend's own pinned store).
    pub bytes_staged: u64,
    /// Middle tokens chosen by selects that followed a hint
    /// ([`Context::speculate`]) of the same layer and length.
    pub hint_tokens: u64,
    /// Of those, the ones the hint held.
    pub hint_covered: u64,
}

impl From<sys::pq_stats> for Stats {
    fn from(s: sys::pq_stats) -> Stats {
        Stats {
            sequences: s.sequences,
            tokens: s.tokens,
            kv_bytes: s.kv_bytes,
            index_bytes: s.index_bytes,
            builds_finished: s.builds_finished,
            builds_cancelled: s.builds_cancelled,
            kmeans_iterations: s.kmeans_iterations,
            select_calls: s.select_calls,
            fetch_calls: s.fetch_calls,
            build_seconds: s.build_seconds,
            select_seconds: s.select_seconds,
            fetch_seconds: s.fetch_seconds,
            bytes_scored: s.bytes_scored,
            bytes_fetched: s.bytes_fetched,
            cache_hits: s.cache_hits,
            cache_misses: s.cache_misses,
            host_bytes: s.host_bytes,
            bytes_staged: s.bytes_staged,
            hint_tokens: s.hint_tokens,
            hint_covered: s.hint_covered,
        }
    }
}
