package pqcache

import (
	"errors"

	"libpqcache.org/pqcache/internal/pqswig"
)

// Keys in the caller's paged pool and several query tokens in one select
// (added in 0.10). A serving engine keeps K/V in its own pool of slots and
// a table per request that maps token positions to slots (vLLM's block
// table, SGLang's req_to_token row); an index-only context (KVTierCaller)
// reads the keys from there and keeps no second copy. The calls are
// written in cgo (tensor.go) for the reason the other buffer calls are.

// PagedKeys says where a sequence's keys are (pq_paged_keys): the key of
// position p is row slot(p) of Pool, where
//
//	slot(p) = Slots[p]                                            (Slots != nil)
//	slot(p) = BlockTable[p/BlockSize]*BlockSize + p%BlockSize     (BlockTable != nil)
//	slot(p) = p                                                   (both nil: dense)
//
// The library checks every slot against Pool's tokens and every block
// against Pool's tokens / BlockSize, and reads the pool during the call
// only.
type PagedKeys struct {
	// Pool: the engine's key pool, its tokens the slots (vLLM's key cache
	// [blocks*block_size][kv_heads][head_dim] is token-major with tokens =
	// blocks*block_size), NumKVHeads heads, the config's dtype.
	Pool       Tensor
	Slots      []int64 // the slot of each position, or nil
	BlockTable []int32 // the block of each BlockSize positions, or nil
	BlockSize  int     // tokens per block (BlockTable only), >= 1
	// Tokens: the tokens a PrefillLayerPaged or DecodeAppendPaged call adds,
	// from the layer's length on; DecodeSelectMulti does not read it.
	Tokens int
}

// SelectRows is the form of DecodeSelectMulti's rows (pq_select_rows).
type SelectRows int32

const (
	// RowsPerToken: token t's selection for kv head h in row
	// t*NumKVHeads + h, what DecodeSelect returns for that token alone.
	RowsPerToken SelectRows = 0
	// RowsPerHead: row h, the union over the tokens of kv head h's selections.
	RowsPerHead SelectRows = 1
	// RowsPerRequest: one row, the union over the tokens and kv heads.
	RowsPerRequest SelectRows = 2
)

// PrefillLayerPaged is PrefillLayer for an index-only context whose keys
// are in a paged pool (pq_prefill_layer_paged): the keys of positions
// [L, L+keys.Tokens) are read through the map, L the layer's length before
// the call. A context that stores K/V needs the values: ErrUnsupported.
func (c *Context) PrefillLayerPaged(seq uint64, layer int, keys PagedKeys) error {
	return c.storePaged("pq_prefill_layer_paged", seq, layer, false, &keys)
}

// DecodeAppendPaged is DecodeAppend for an index-only context whose keys
// are in a paged pool (pq_decode_append_paged), as PrefillLayerPaged.
func (c *Context) DecodeAppendPaged(seq uint64, layer int, keys PagedKeys) error {
	return c.storePaged("pq_decode_append_paged", seq, layer, true, &keys)
}

// SelectionCapacityMulti is the number of rows and the capacity per row
// that DecodeSelectMulti needs at (seq, layer)'s current length for
// queryTokens tokens (pq_selection_capacity_multi).
func (c *Context) SelectionCapacityMulti(seq uint64, layer int, queryTokens int,
	rows SelectRows) (nrows, capacity int, err error) {
	const op = "pq_selection_capacity_multi"
	if err := c.checkLayer(op, layer); err != nil {
		return 0, 0, err
	}
	outRows, outCapacity := make([]int64, 1), make([]int64, 1)
	err = c.do(op, func(h pqswig.Struct_SS_pq_context) Status {
		return Status(pqswig.Pq_selection_capacity_multi(h, seq, layer, int64(queryTokens),
			int(rows), outRows, outCapacity))
	})
	return int(outRows[0]), int(outCapacity[0]), err
}

// DecodeSelectMulti selects for several query tokens of one sequence in
// one call (pq_decode_select_multi): queries is tokens x NumQHeads x
// HeadDim, each token scored as DecodeSelect would score it alone, and the
// rows are written as rows says, each ascending and padded with -1 up to
// the selection's Capacity (the padded index list SGLang's sparse
// attention takes, Counts its valid lengths). keys (may be nil) is where
// the exact keys are, for PQRerank > 0 in an index-only context, which
// needs it (ErrBadState without); its map covers the layer's positions.
// The selection is sized with SelectionCapacityMulti and grown once if
// another goroutine appended in between.
func (c *Context) DecodeSelectMulti(seq uint64, layer int, queries Tensor, rows SelectRows,
	keys *PagedKeys) (*Selection, error) {
	const op = "pq_decode_select_multi"
	if err := c.checkLayer(op, layer); err != nil {
		return nil, err
	}
	if _, err := queries.shape(op, "queries"); err != nil {
		return nil, err
	}
	nrows, capacity, err := c.SelectionCapacityMulti(seq, layer, queries.tokens, rows)
	if err != nil {
		return nil, err
	}
	sel := newSelection(nrows, capacity)
	err = c.withHandle(op, func(h pqswig.Struct_SS_pq_context) error {
		err := c.selectMultiInto(h, seq, layer, queries, rows, keys, sel)
		if errors.Is(err, ErrBufferTooSmall) {
			sel = newSelection(nrows, int(sel.Counts[0]))
			err = c.selectMultiInto(h, seq, layer, queries, rows, keys, sel)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return sel, nil
}

func newSelection(rows, capacity int) *Selection {
	return &Selection{Capacity: capacity, Counts: make([]int32, rows),
		Positions: make([]int32, rows*capacity)}
}
