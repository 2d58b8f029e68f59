//! One layer for a batch of sequences (`pq_decode_select_batch`,
//! `pq_fetch_kv_batch`, added in 0.4): a decode step costs one call per
//! layer instead of one per (sequence, layer), and the library spreads the
//! items over its worker pool.

use pqcache_sys as sys;

use crate::context::to_i64;
use crate::{Context, Error, Result, Selection, Status, Tensor, TensorMut};

/// One sequence of [`Context::select_batch`]: the arguments of
/// [`Context::select`], and the item's outcome once the batch has run.
#[derive(Debug)]
pub struct SelectItem<'a> {
    pub seq_id: u64,
    /// 1 token x q heads x head_dim, the context's dtype.
    pub query: Tensor<'a>,
    /// Filled as [`Context::select`] fills it (grown when too small).
    pub out: &'a mut Selection,
    status: Option<Status>,
}

impl<'a> SelectItem<'a> {
    pub fn new(seq_id: u64, query: Tensor<'a>, out: &'a mut Selection) -> SelectItem<'a> {
        SelectItem {
            seq_id,
            query,
            out,
            status: None,
        }
    }

    /// Why this item failed in the last batch; `None` if it succeeded (or
    /// the batch failed as a whole, before any item ran).
    pub fn status(&self) -> Option<Status> {
        self.status
    }
}

/// One sequence of [`Context::fetch_batch`]: the arguments of
/// [`Context::fetch`], and the item's outcome once the batch has run.
#[derive(Debug)]
pub struct FetchItem<'a> {
    pub seq_id: u64,
    pub selection: &'a Selection,
    /// num_kv_heads heads and at least `selection.max_count()` tokens.
    pub keys: TensorMut<'a>,
    pub values: TensorMut<'a>,
    status: Option<Status>,
}

impl<'a> FetchItem<'a> {
    pub fn new(
        seq_id: u64,
        selection: &'a Selection,
        keys: TensorMut<'a>,
        values: TensorMut<'a>,
    ) -> FetchItem<'a> {
        FetchItem {
            seq_id,
            selection,
            keys,
            values,
            status: None,
        }
    }

    /// Why this item failed in the last batch; `None` if it succeeded (or
    /// the batch failed as a whole, before any item ran).
    pub fn status(&self) -> Option<Status> {
        self.status
    }
}

/// The error of a failing item whose message the library did not give (it
/// names only the first failing item of a call).
fn item_error(op: &str, index: usize, seq_id: u64, status: Status, detail: &str) -> Error {
    Error::new(
        status,
        format!("{op}: items[{index}] (seq_id {seq_id}): {detail}"),
    )
}

impl Context {
    /// [`Context::select`] for every item, at one layer, in one library
    /// call (`pq_decode_select_batch`).
    ///
    /// Items succeed or fail on their own: each item's
    /// [`SelectItem::status`] tells, and the selections of the items that
    /// succeeded are filled even when others failed. The call returns `Ok`
    /// when every item succeeded, else the error of the first failing item,
    /// whose message names it: `"pq_decode_select_batch: items[3] (seq_id
    /// 42): ..."`. Errors of the whole call (a bad layer, a `seq_id` given
    /// twice) leave every status `None`.
    ///
    /// Each `out` is first grown to the largest capacity this layer needed
    /// so far; one still too small for its sequence is grown to what the
    /// library asked for and that item selected once more on its own
    /// (`pq_decode_select`), as [`Context::select`] does. Should that retry
    /// fail, or an item fail after such a one, the item's message is built
    /// here from its status (the library names only the first failing item
    /// of a call).
    pub fn select_batch(&self, layer: usize, items: &mut [SelectItem<'_>]) -> Result<()> {
        const OP: &str = "pq_decode_select_batch";
        let layer = self.layer_arg(OP, layer)?;
        let count = to_i64(OP, "count", items.len())?;
        let (kv_heads, hint) = (self.num_kv_heads(), self.capacity_hint(layer));
        // Every query is checked against its slice before any item changes.
        let queries = items
            .iter()
            .enumerate()
            .map(|(i, item)| item.query.c_tensor(OP, &format!("items[{i}].query")))
            .collect::<Result<Vec<_>>>()?;
        let mut raw: Vec<sys::pq_select_item> = items
            .iter_mut()
            .zip(queries)
            .map(|(item, query)| {
                item.status = None;
                // The library writes num_kv_heads counts (and rows).
                item.out.reserve(kv_heads, item.out.capacity().max(hint));
                sys::pq_select_item {
                    seq_id: item.seq_id,
                    query,
                    out: item.out.as_raw(),
                    status: sys::PQ_OK,
                }
            })
            .collect();
        // SAFETY: every item's query and out point into buffers borrowed by
        // `items` for this call; the library keeps none of them.
        let status = unsafe {
            (self.api().pq_decode_select_batch)(self.ptr(), layer, raw.as_mut_ptr(), count)
        };
        // The message is this thread's and names the first failing item:
        // read it before any retry replaces it.
        let batch_error = self.library().check(status).err();
        let Some(batch_error) = batch_error else {
            return Ok(());
        };
        if raw.iter().all(|r| r.status == sys::PQ_OK) {
            return Err(batch_error); // a call-level error: no item ran
        }
        let named = raw.iter().position(|r| r.status != sys::PQ_OK);
        let mut first: Option<Error> = None;
        for (i, (item, r)) in items.iter_mut().zip(&raw).enumerate() {
            let mut status = r.status;
            let mut retry_error = None;
            if status == sys::PQ_ERR_BUFFER_TOO_SMALL {
                status = self.decode_call_grown(
                    self.api().pq_decode_select,
                    item.seq_id,
                    layer,
                    &r.query,
                    item.out,
                );
                retry_error = self.library().check(status).err();
            }
            item.status = Status::from_code(status);
            let Some(failed) = item.status else { continue };
            if first.is_none() {
                first = Some(match retry_error {
                    Some(e) => item_error(OP, i, item.seq_id, e.status, &e.message),
                    None if named == Some(i) => batch_error.clone(),
                    None => {
                        let detail = self.library().status_string(status);
                        item_error(OP, i, item.seq_id, failed, &detail)
                    }
                });
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// [`Context::fetch`] for every item, at one layer, in one library call
    /// (`pq_fetch_kv_batch`). Items succeed or fail on their own, as in
    /// [`Context::select_batch`]: each item's [`FetchItem::status`] tells,
    /// the outputs of the items that succeeded are written, and the call
    /// returns the first failing item's error, whose message names it.
    pub fn fetch_batch(&self, layer: usize, items: &mut [FetchItem<'_>]) -> Result<()> {
        const OP: &str = "pq_fetch_kv_batch";
        let layer = self.layer_arg(OP, layer)?;
        let count = to_i64(OP, "count", items.len())?;
        // Every item is checked before any changes.
        let mut raw = Vec::with_capacity(items.len());
        for (i, item) in items.iter_mut().enumerate() {
            self.check_selection(OP, &format!("items[{i}].selection"), item.selection)?;
            raw.push(sys::pq_fetch_item {
                seq_id: item.seq_id,
                selection: item.selection.as_raw_const(),
                out_keys: item.keys.c_tensor(OP, &format!("items[{i}].out_keys"))?,
                out_values: item
                    .values
                    .c_tensor(OP, &format!("items[{i}].out_values"))?,
                status: sys::PQ_OK,
            });
        }
        for item in items.iter_mut() {
            item.status = None;
        }
        // SAFETY: the selections and outputs are borrowed by `items` for
        // this call (the outputs mutably, so no two of them overlap).
        let status =
            unsafe { (self.api().pq_fetch_kv_batch)(self.ptr(), layer, raw.as_mut_ptr(), count) };
        let result = self.library().check(status);
        for (item, r) in items.iter_mut().zip(&raw) {
            item.status = Status::from_code(r.status);
        }
        result
    }
}
