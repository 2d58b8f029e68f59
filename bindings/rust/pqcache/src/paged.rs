//! Keys in the caller's paged pool and several query tokens in one select
//! (added in 0.10). A serving engine keeps K/V in its own pool of slots and
//! a table per request that maps token positions to slots (vLLM's block
//! table, SGLang's req_to_token row); an index-only context
//! ([`crate::KvTier::Caller`]) reads the keys from there and keeps no second
//! copy.

use pqcache_sys as sys;

use crate::context::{to_i32, to_i64, to_usize};
use crate::{Context, Result, SelectRows, Selection, Tensor};

/// The signature `pq_prefill_layer_paged` and `pq_decode_append_paged` share.
type StorePagedFn = unsafe extern "C" fn(
    *mut sys::pq_context,
    u64,
    i32,
    *const sys::pq_paged_keys,
) -> sys::pq_status;

/// How a sequence's positions map to the pool's slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageMap<'a> {
    /// Position p is slot p.
    Dense,
    /// Position p is slot `slots[p]` (SGLang's req_to_token row).
    Slots(&'a [i64]),
    /// Position p is slot `table[p / block_size] * block_size + p %
    /// block_size` (vLLM's block table).
    Blocks { table: &'a [i32], block_size: usize },
}

/// Where a sequence's keys are (`pq_paged_keys`): the key of position p is
/// row slot(p) of `pool`, slot(p) as `map` says. The pool is a host tensor
/// whose tokens are the slots (vLLM's key cache `[blocks * block_size]
/// [kv_heads][head_dim]` is [`crate::Shape::token_major`] with tokens =
/// blocks * block_size), num_kv_heads heads, the context's dtype. The
/// library checks every slot and block against the pool and reads the pool
/// during a call only.
#[derive(Debug, Clone, Copy)]
pub struct PagedKeys<'a> {
    pub pool: Tensor<'a>,
    pub map: PageMap<'a>,
}

impl<'a> PagedKeys<'a> {
    /// Position p is row `slots[p]` of `pool`.
    pub fn slots(pool: Tensor<'a>, slots: &'a [i64]) -> PagedKeys<'a> {
        PagedKeys {
            pool,
            map: PageMap::Slots(slots),
        }
    }

    /// Position p is row `table[p / block_size] * block_size + p %
    /// block_size` of `pool`.
    pub fn blocks(pool: Tensor<'a>, table: &'a [i32], block_size: usize) -> PagedKeys<'a> {
        PagedKeys {
            pool,
            map: PageMap::Blocks { table, block_size },
        }
    }

    /// Position p is row p of `pool`.
    pub fn dense(pool: Tensor<'a>) -> PagedKeys<'a> {
        PagedKeys {
            pool,
            map: PageMap::Dense,
        }
    }

    /// The C struct for argument `keys` of the C function `op`, `tokens`
    /// the tokens a prefill or append adds. Its pointers are valid while
    /// `self` is borrowed.
    fn c_keys(&self, op: &str, tokens: usize) -> Result<sys::pq_paged_keys> {
        let pool = self.pool.c_tensor(op, "keys.pool")?;
        let (mut slots, mut block_table) = (std::ptr::null(), std::ptr::null());
        let (block_size, map_length) = match self.map {
            PageMap::Dense => (0, 0),
            PageMap::Slots(map) => {
                slots = map.as_ptr();
                (0, map.len())
            }
            PageMap::Blocks { table, block_size } => {
                block_table = table.as_ptr();
                (to_i32(op, "keys.block_size", block_size)?, table.len())
            }
        };
        Ok(sys::pq_paged_keys {
            pool,
            slots,
            block_table,
            block_size,
            map_length: to_i64(op, "keys.map_length", map_length)?,
            tokens: to_i64(op, "keys.tokens", tokens)?,
        })
    }
}

impl Context {
    /// [`Context::prefill`] for an index-only context whose keys are in a
    /// paged pool (`pq_prefill_layer_paged`): the keys of positions
    /// `[L, L + tokens)` are read through the map, L the layer's length
    /// before the call. A context that stores K/V needs the values
    /// (`Unsupported`).
    pub fn prefill_paged(
        &self,
        seq_id: u64,
        layer: usize,
        keys: &PagedKeys<'_>,
        tokens: usize,
    ) -> Result<()> {
        let call = self.api().pq_prefill_layer_paged;
        self.store_paged("pq_prefill_layer_paged", call, seq_id, layer, keys, tokens)
    }

    /// [`Context::append`] from a paged pool (`pq_decode_append_paged`), as
    /// [`Context::prefill_paged`].
    pub fn append_paged(
        &self,
        seq_id: u64,
        layer: usize,
        keys: &PagedKeys<'_>,
        tokens: usize,
    ) -> Result<()> {
        let call = self.api().pq_decode_append_paged;
        self.store_paged("pq_decode_append_paged", call, seq_id, layer, keys, tokens)
    }

    /// prefill_paged's and append_paged's body: `call`, the C function `op`.
    fn store_paged(
        &self,
        op: &str,
        call: StorePagedFn,
        seq_id: u64,
        layer: usize,
        keys: &PagedKeys<'_>,
        tokens: usize,
    ) -> Result<()> {
        let layer = self.layer_arg(op, layer)?;
        let keys = keys.c_keys(op, tokens)?;
        self.library()
            .check(unsafe { call(self.ptr(), seq_id, layer, &keys) })
    }

    /// The rows and the capacity per row that [`Context::select_multi`]
    /// needs for `query_tokens` tokens at the layer's current length
    /// (`pq_selection_capacity_multi`).
    pub fn selection_capacity_multi(
        &self,
        seq_id: u64,
        layer: usize,
        query_tokens: usize,
        rows: SelectRows,
    ) -> Result<(usize, usize)> {
        const OP: &str = "pq_selection_capacity_multi";
        let (layer, query_tokens) = (
            self.layer_arg(OP, layer)?,
            to_i64(OP, "query_tokens", query_tokens)?,
        );
        let (mut count, mut capacity) = (0, 0);
        self.library().check(unsafe {
            (self.api().pq_selection_capacity_multi)(
                self.ptr(),
                seq_id,
                layer,
                query_tokens,
                rows as i32,
                &mut count,
                &mut capacity,
            )
        })?;
        Ok((to_usize(count), to_usize(capacity)))
    }

    /// Selects for several query tokens of one sequence in one call
    /// (`pq_decode_select_multi`): `queries` is tokens x q heads x head_dim,
    /// each token scored as [`Context::select`] would score it alone, and
    /// `out` gets the rows `rows` says ([`Selection::row`]), each ascending
    /// and padded with -1 ([`Selection::padded_positions`]). `keys` is
    /// where the exact keys are, for `pq_rerank > 0` in an index-only
    /// context, which needs it (`BadState` without); its map covers the
    /// layer's positions. `out` is used as it is when it has the rows and
    /// room enough, else grown to what the library asks for and the call
    /// made once more, as [`Context::select`] does.
    pub fn select_multi(
        &self,
        seq_id: u64,
        layer: usize,
        queries: &Tensor<'_>,
        rows: SelectRows,
        keys: Option<&PagedKeys<'_>>,
        out: &mut Selection,
    ) -> Result<()> {
        const OP: &str = "pq_decode_select_multi";
        let layer = self.layer_arg(OP, layer)?;
        let tokens = queries.shape().tokens;
        let queries = queries.c_tensor(OP, "queries")?;
        let keys = keys.map(|k| k.c_keys(OP, 0)).transpose()?;
        let keys = keys.as_ref().map_or(std::ptr::null(), std::ptr::from_ref);
        // pq_selection_capacity_multi's rows; a bad `rows` cannot be made.
        let row_count = match rows {
            SelectRows::PerToken => tokens.saturating_mul(self.num_kv_heads()),
            SelectRows::PerHead => self.num_kv_heads(),
            SelectRows::PerRequest => 1,
        };
        let call = |out: &mut Selection| {
            let mut raw = out.as_raw();
            unsafe {
                (self.api().pq_decode_select_multi)(
                    self.ptr(),
                    seq_id,
                    layer,
                    &queries,
                    rows as i32,
                    keys,
                    &mut raw,
                )
            }
        };
        out.reserve(row_count, out.capacity());
        let mut status = call(out);
        if status == sys::PQ_ERR_BUFFER_TOO_SMALL {
            out.reserve(row_count, out.needed_capacity());
            status = call(out);
        }
        if status != sys::PQ_OK {
            out.clear();
        }
        self.library().check(status)
    }
}
