use std::ffi::c_void;
use std::marker::PhantomData;

use pqcache_sys as sys;

use crate::context::{to_i32, to_i64};
use crate::{DType, Error, Result};

/// Where each (token, head) row of `head_dim` elements starts in a buffer,
/// in elements: row (t, h) starts at `t * token_stride + h * head_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub tokens: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub token_stride: usize,
    pub head_stride: usize,
}

impl Shape {
    /// `[tokens][heads][head_dim]`, dense (vLLM's block layout).
    pub fn token_major(tokens: usize, heads: usize, head_dim: usize) -> Shape {
        Shape {
            tokens,
            heads,
            head_dim,
            token_stride: heads * head_dim,
            head_stride: head_dim,
        }
    }

    /// `[heads][tokens][head_dim]`, dense (Hugging Face's layout; with
    /// `tokens = selection capacity`, what a fetch for attention wants).
    pub fn head_major(tokens: usize, heads: usize, head_dim: usize) -> Shape {
        Shape {
            tokens,
            heads,
            head_dim,
            token_stride: head_dim,
            head_stride: tokens * head_dim,
        }
    }

    /// Any strides (in elements), e.g. a view of a larger buffer.
    pub fn strided(
        tokens: usize,
        heads: usize,
        head_dim: usize,
        token_stride: usize,
        head_stride: usize,
    ) -> Shape {
        Shape {
            tokens,
            heads,
            head_dim,
            token_stride,
            head_stride,
        }
    }

    /// Elements from the first to the end of the last row (0 if empty),
    /// or None on overflow.
    pub fn span(&self) -> Option<usize> {
        if self.tokens == 0 || self.heads == 0 {
            return Some(0);
        }
        (self.tokens - 1)
            .checked_mul(self.token_stride)?
            .checked_add((self.heads - 1).checked_mul(self.head_stride)?)?
            .checked_add(self.head_dim)
    }

    /// Whether distinct (token, head) rows never share an element: one axis
    /// must step over whole rows and the other over the first axis' extent.
    fn rows_disjoint(&self) -> bool {
        let d = self.head_dim;
        let (t, h, ts, hs) = (self.tokens, self.heads, self.token_stride, self.head_stride);
        let heads_inside_tokens = (h <= 1 || hs >= d) && (t <= 1 || ts >= (h - 1) * hs + d);
        let tokens_inside_heads = (t <= 1 || ts >= d) && (h <= 1 || hs >= (t - 1) * ts + d);
        t == 0 || h == 0 || heads_inside_tokens || tokens_inside_heads
    }

    /// The shape in words, for messages: "tokens 8 x heads 2 x head_dim 16,
    /// token_stride 32, head_stride 16".
    fn text(&self) -> String {
        format!(
            "tokens {} x heads {} x head_dim {}, token_stride {}, head_stride {}",
            self.tokens, self.heads, self.head_dim, self.token_stride, self.head_stride
        )
    }

    /// Checks this shape against a slice of `len` elements and fills a
    /// pq_tensor; the library then only touches elements inside the slice.
    /// A failure names the C function `op` and the argument `name` (the C
    /// parameter, e.g. `out_keys`, or `items[2].query` in a batch).
    fn describe(
        &self,
        op: &str,
        name: &str,
        data: *mut c_void,
        len: usize,
        dtype: DType,
    ) -> Result<sys::pq_tensor> {
        let Some(span) = self.span() else {
            return Err(Error::invalid(
                op,
                format_args!(
                    "{name}.data has {len} elements; expected at least the span of {}, which overflows usize",
                    self.text()
                ),
            ));
        };
        if span > len {
            return Err(Error::invalid(
                op,
                format_args!(
                    "{name}.data has {len} elements; expected at least {span} ({})",
                    self.text()
                ),
            ));
        }
        if !self.rows_disjoint() {
            return Err(Error::invalid(
                op,
                format_args!(
                    "{name}.token_stride / head_stride are {} / {}; expected strides under \
                     which no two rows overlap (tokens {} x heads {} x head_dim {})",
                    self.token_stride, self.head_stride, self.tokens, self.heads, self.head_dim
                ),
            ));
        }
        let field = |field: &str| format!("{name}.{field}");
        Ok(sys::pq_tensor {
            data,
            dtype: dtype as i32,
            memory: sys::PQ_MEMORY_HOST,
            tokens: to_i64(op, &field("tokens"), self.tokens)?,
            heads: to_i32(op, &field("heads"), self.heads)?,
            head_dim: to_i32(op, &field("head_dim"), self.head_dim)?,
            token_stride: to_i64(op, &field("token_stride"), self.token_stride)?,
            head_stride: to_i64(op, &field("head_stride"), self.head_stride)?,
        })
    }
}

/// What both views hold: the slice's address and length in elements, and
/// the element type and shape laid over it.
#[derive(Debug, Clone, Copy)]
struct View {
    data: *mut c_void,
    len: usize,
    dtype: DType,
    shape: Shape,
}

impl View {
    /// The pq_tensor for argument `name` of the C function `op`, after
    /// checking the shape against the slice.
    fn c_tensor(&self, op: &str, name: &str) -> Result<sys::pq_tensor> {
        self.shape
            .describe(op, name, self.data, self.len, self.dtype)
    }
}

/// A read-only view of host K, V or Q data for the library (prefill, append,
/// select, prefill queries). The call that takes it checks the shape against
/// the slice before any C call (its error names the call and the argument:
/// `"pq_prefill_layer: keys.data has 255 elements; expected at least 256
/// (tokens 8 x heads 2 x head_dim 16, token_stride 32, head_stride 16)"`);
/// the library checks it against the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    view: View,
    _data: PhantomData<&'a [u8]>,
}

/// A writable view of host memory that [`crate::Context::fetch`] fills,
/// checked against its slice by the call as [`Tensor`] is.
#[derive(Debug)]
pub struct TensorMut<'a> {
    view: View,
    _data: PhantomData<&'a mut [u8]>,
}

// SAFETY: the views behave like the slices they borrow (&[T] and &mut [T]
// are Send and Sync for these element types).
unsafe impl Send for Tensor<'_> {}
unsafe impl Sync for Tensor<'_> {}
unsafe impl Send for TensorMut<'_> {}
unsafe impl Sync for TensorMut<'_> {}

/// The constructors return `Result` as they did before 0.7, when they
/// checked the shape against the slice themselves; since 0.7 they always
/// succeed and the call that takes the view checks it, so that the error
/// names the C function and the argument (docs/bindings/errors.md).
impl<'a> Tensor<'a> {
    pub fn f32(data: &'a [f32], shape: Shape) -> Result<Tensor<'a>> {
        Ok(Self::of(data, DType::F32, shape))
    }

    /// IEEE binary16 elements as their bits.
    pub fn f16(data: &'a [u16], shape: Shape) -> Result<Tensor<'a>> {
        Ok(Self::of(data, DType::F16, shape))
    }

    /// bfloat16 elements as their bits.
    pub fn bf16(data: &'a [u16], shape: Shape) -> Result<Tensor<'a>> {
        Ok(Self::of(data, DType::Bf16, shape))
    }

    /// fp8 codes (0.10): `dtype` is [`DType::Fp8E4m3`] or [`DType::Fp8E5m2`]
    /// (another dtype is the library's error at the call that takes it).
    pub fn fp8(data: &'a [u8], dtype: DType, shape: Shape) -> Result<Tensor<'a>> {
        Ok(Self::of(data, dtype, shape))
    }

    fn of<T>(data: &'a [T], dtype: DType, shape: Shape) -> Tensor<'a> {
        // The library takes inputs as const pq_tensor* and never writes them.
        let view = View {
            data: data.as_ptr().cast_mut().cast(),
            len: data.len(),
            dtype,
            shape,
        };
        Tensor {
            view,
            _data: PhantomData,
        }
    }

    pub fn dtype(&self) -> DType {
        self.view.dtype
    }

    /// The shape the view was made with.
    pub fn shape(&self) -> Shape {
        self.view.shape
    }

    /// The pq_tensor for argument `name` of the C function `op`, after
    /// checking the shape against the slice.
    pub(crate) fn c_tensor(&self, op: &str, name: &str) -> Result<sys::pq_tensor> {
        self.view.c_tensor(op, name)
    }
}

impl<'a> TensorMut<'a> {
    pub fn f32(data: &'a mut [f32], shape: Shape) -> Result<TensorMut<'a>> {
        Ok(Self::of(data, DType::F32, shape))
    }

    pub fn f16(data: &'a mut [u16], shape: Shape) -> Result<TensorMut<'a>> {
        Ok(Self::of(data, DType::F16, shape))
    }

    pub fn bf16(data: &'a mut [u16], shape: Shape) -> Result<TensorMut<'a>> {
        Ok(Self::of(data, DType::Bf16, shape))
    }

    /// fp8 codes (0.10), as [`Tensor::fp8`]: a fetch copies them as stored.
    pub fn fp8(data: &'a mut [u8], dtype: DType, shape: Shape) -> Result<TensorMut<'a>> {
        Ok(Self::of(data, dtype, shape))
    }

    fn of<T>(data: &'a mut [T], dtype: DType, shape: Shape) -> TensorMut<'a> {
        let view = View {
            data: data.as_mut_ptr().cast(),
            len: data.len(),
            dtype,
            shape,
        };
        TensorMut {
            view,
            _data: PhantomData,
        }
    }

    pub fn dtype(&self) -> DType {
        self.view.dtype
    }

    /// The shape the view was made with.
    pub fn shape(&self) -> Shape {
        self.view.shape
    }

    /// The pq_tensor for output argument `name` of the C function `op`,
    /// after checking the shape against the slice (`&mut self`: the library
    /// writes through it).
    pub(crate) fn c_tensor(&mut self, op: &str, name: &str) -> Result<sys::pq_tensor> {
        self.view.c_tensor(op, name)
    }
}

/// The positions a [`crate::Context::select`] chose: per kv head, ascending
/// token positions. Reusable across steps (the buffers are kept).
/// [`crate::Context::select_multi`]'s has a row per token and kv head, per
/// kv head or per request ([`crate::SelectRows`]) where this type says kv
/// head, each padded with -1 up to the capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    positions: Vec<i32>,
    counts: Vec<i32>,
    capacity: usize,
}

impl Selection {
    /// Room for `capacity` positions per kv head (see
    /// [`crate::Context::selection_capacity`]).
    pub fn new(kv_heads: usize, capacity: usize) -> Selection {
        Selection {
            positions: vec![0; kv_heads * capacity],
            counts: vec![0; kv_heads],
            capacity,
        }
    }

    pub fn kv_heads(&self) -> usize {
        self.counts.len()
    }

    /// Positions per kv head this selection can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The selected positions of kv head `h` (ascending).
    pub fn head(&self, h: usize) -> &[i32] {
        let count = usize::try_from(self.counts[h])
            .unwrap_or(0)
            .min(self.capacity);
        &self.positions[h * self.capacity..h * self.capacity + count]
    }

    /// Rows: [`Selection::kv_heads`], or a multi-token selection's rows.
    pub fn rows(&self) -> usize {
        self.counts.len()
    }

    /// The positions of row `r` ([`Selection::head`]).
    pub fn row(&self, r: usize) -> &[i32] {
        self.head(r)
    }

    /// Every row's `capacity` entries as the library wrote them, row after
    /// row: a multi-token selection pads each row with -1 past its count
    /// (the index list SGLang's sparse attention takes).
    pub fn padded_positions(&self) -> &[i32] {
        &self.positions
    }

    /// The valid entries of every row.
    pub fn counts(&self) -> &[i32] {
        &self.counts
    }

    /// Every kv head's positions, in head order.
    pub fn heads(&self) -> impl ExactSizeIterator<Item = &[i32]> + '_ {
        (0..self.kv_heads()).map(|h| self.head(h))
    }

    /// The longest head's count: the rows a fetch needs.
    pub fn max_count(&self) -> usize {
        self.heads().map(<[i32]>::len).max().unwrap_or(0)
    }

    /// Grows the buffers to `capacity` per head (never shrinks).
    pub(crate) fn reserve(&mut self, kv_heads: usize, capacity: usize) {
        if self.counts.len() != kv_heads || self.capacity < capacity {
            *self = Selection::new(kv_heads, capacity.max(self.capacity));
        }
    }

    /// The capacity a `pq_decode_select` that returned
    /// `PQ_ERR_BUFFER_TOO_SMALL` asked for (it writes it to every count).
    pub(crate) fn needed_capacity(&self) -> usize {
        self.counts
            .first()
            .map_or(0, |&n| usize::try_from(n).unwrap_or(0))
    }

    /// Forgets the selected positions (every count 0).
    pub(crate) fn clear(&mut self) {
        self.counts.fill(0);
    }

    /// The C view. Its pointers are valid while `self` is borrowed.
    pub(crate) fn as_raw(&mut self) -> sys::pq_selection {
        sys::pq_selection {
            positions: self.positions.as_mut_ptr(),
            counts: self.counts.as_mut_ptr(),
            capacity: self.capacity as i64,
        }
    }

    /// The C view for calls that only read it (const pq_selection*).
    pub(crate) fn as_raw_const(&self) -> sys::pq_selection {
        sys::pq_selection {
            positions: self.positions.as_ptr().cast_mut(),
            counts: self.counts.as_ptr().cast_mut(),
            capacity: self.capacity as i64,
        }
    }
}
