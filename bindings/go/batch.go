package pqcache

// #include <stdlib.h>
// #include "pqcache.h"
import "C"

import (
	"fmt"
	"sort"
	"unsafe"

	"libpqcache.org/pqcache/internal/pqswig"
)

// One layer for a batch of sequences (pq_decode_select_batch,
// pq_fetch_kv_batch, added in 0.4): a decode step takes one call per layer
// rather than one per (sequence, layer), and the library spreads the items
// over its worker pool.
//
// The C calls take an array of items that point at the data. cgo forbids C
// memory that holds Go pointers (and Go 1.19 has no runtime.Pinner), so the
// items and everything they point at live in C memory: the queries and
// selections are copied in, and the selections and fetched rows copied out
// into Go slices. The copies are what the per-sequence calls, which pass Go
// slices as arguments, do not make.

// SelectItem is one sequence of DecodeSelectBatch: the arguments of
// DecodeSelect, and what the call sets.
type SelectItem struct {
	Seq   uint64
	Query Tensor // 1 x NumQHeads x HeadDim, the config's dtype

	// Set by DecodeSelectBatch:
	Selection *Selection // nil if the item failed
	Status    Status     // OK, or why the item failed
}

// FetchItem is one sequence of FetchKVBatch: the arguments of FetchKV, and
// what the call sets.
type FetchItem struct {
	Seq          uint64
	Selection    *Selection
	Keys, Values Tensor // as FetchKV's; no two outputs of a batch may overlap

	Status Status // set by FetchKVBatch: OK, or why the item failed
}

// cBuffer is one C allocation that the batch's parts are carved from.
type cBuffer struct {
	base unsafe.Pointer
	used uintptr
}

func newCBuffer(size uintptr) *cBuffer {
	if size == 0 {
		size = 1
	}
	return &cBuffer{base: C.calloc(1, C.size_t(size))}
}

// take returns the next size bytes, 8-byte aligned.
func (b *cBuffer) take(size uintptr) unsafe.Pointer {
	p := unsafe.Add(b.base, b.used)
	b.used += (size + 7) &^ 7
	return p
}

func (b *cBuffer) free() { C.free(b.base) }

// padded is size rounded up as take does.
func padded(size uintptr) uintptr { return (size + 7) &^ 7 }

func elementSize(d DType) uintptr {
	switch d {
	case DTypeF32:
		return 4
	case DTypeFP8E4M3, DTypeFP8E5M2:
		return 1
	}
	return 2
}

// bytes is the size of the tensor's dense data; its shape was checked.
func (t Tensor) bytes() uintptr {
	return uintptr(t.tokens*t.heads*t.headDim) * elementSize(t.dtype)
}

// staged describes t over C memory at data (same dtype, layout and shape).
func (t Tensor) staged(out *C.pq_tensor, data unsafe.Pointer) Status {
	return Status(C.pq_tensor_init(out, data, C.int32_t(t.dtype), C.int32_t(t.layout),
		C.int64_t(t.tokens), C.int32_t(t.heads), C.int32_t(t.headDim)))
}

func cSlice[E any](p unsafe.Pointer, n int) []E {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*E)(p), n)
}

// stageSelection copies sel into C memory as a pq_selection.
func stageSelection(b *cBuffer, sel *Selection) C.pq_selection {
	positions := b.take(uintptr(len(sel.Positions)) * 4)
	counts := b.take(uintptr(len(sel.Counts)) * 4)
	copy(cSlice[int32](positions, len(sel.Positions)), sel.Positions)
	copy(cSlice[int32](counts, len(sel.Counts)), sel.Counts)
	return C.pq_selection{positions: (*C.int32_t)(positions), counts: (*C.int32_t)(counts),
		capacity: C.int64_t(sel.Capacity)}
}

// unstageSelection copies a selection out of C memory.
func unstageSelection(s *C.pq_selection, heads int) *Selection {
	capacity := int(s.capacity)
	return &Selection{
		Capacity:  capacity,
		Counts:    append([]int32(nil), cSlice[int32](unsafe.Pointer(s.counts), heads)...),
		Positions: append([]int32(nil), cSlice[int32](unsafe.Pointer(s.positions), heads*capacity)...),
	}
}

// itemError is the error of a failing item whose message the library did
// not give: it names only the first failing item of a call.
func itemError(op string, i int, seq uint64, status Status, detail string) *Error {
	return &Error{Op: op, Status: status,
		Message: fmt.Sprintf("%s: items[%d] (seq_id %d): %s", op, i, seq, detail)}
}

// DecodeSelectBatch runs DecodeSelect for every item at one layer, in one
// library call (pq_decode_select_batch). A sequence may appear once.
//
// Items succeed or fail on their own: each item's Status is set, and its
// Selection is filled when it succeeded (nil when it failed). The call
// returns nil when every item succeeded, else the *Error of the first
// failing item, whose message names it ("pq_decode_select_batch: items[3]
// (seq_id 42): ..."). Errors of the whole call (a bad layer, a repeated
// seq_id, a query slice shorter than its shape) return before any item
// runs, leaving every item as it was.
//
// Selections are sized as DecodeSelect sizes them; an item still too small
// for its sequence is selected once more on its own (pq_decode_select).
// Should that fail, or an item fail after such an item, the item's message
// is built here from its status.
func (c *Context) DecodeSelectBatch(layer int, items []SelectItem) error {
	const op = "pq_decode_select_batch"
	if err := c.checkLayer(op, layer); err != nil {
		return err
	}
	n := len(items)
	heads := c.config.NumKVHeads
	capacity := c.capacityHint(layer)
	size := padded(uintptr(n) * C.sizeof_pq_select_item)
	for i := range items {
		if _, err := items[i].Query.shape(op, fmt.Sprintf("items[%d].query", i)); err != nil {
			return err
		}
		size += padded(items[i].Query.bytes()) + padded(uintptr(heads*capacity)*4) +
			padded(uintptr(heads)*4)
	}
	buf := newCBuffer(size)
	if buf.base == nil {
		return &Error{Op: op, Status: ErrOutOfMemory, Message: op + ": no memory for the items"}
	}
	defer buf.free()
	raw := cSlice[C.pq_select_item](buf.take(uintptr(n)*C.sizeof_pq_select_item), n)
	for i := range items {
		q := items[i].Query
		data := buf.take(q.bytes())
		copy(cSlice[byte](data, int(q.bytes())), cSlice[byte](q.data, int(q.bytes())))
		if err := call(op, func() Status { return q.staged(&raw[i].query, data) }); err != nil {
			return err
		}
		raw[i].seq_id = C.uint64_t(items[i].Seq)
		raw[i].out = C.pq_selection{positions: (*C.int32_t)(buf.take(uintptr(heads*capacity) * 4)),
			counts: (*C.int32_t)(buf.take(uintptr(heads) * 4)), capacity: C.int64_t(capacity)}
		raw[i].status = C.PQ_OK
	}
	return c.withHandle(op, func(h pqswig.Struct_SS_pq_context) error {
		batchErr := call(op, func() Status {
			return Status(C.pq_decode_select_batch(cContext(h), C.int32_t(layer), rawPointer(raw),
				C.int64_t(n)))
		})
		named := -1 // the item the library's message is about
		for i := range raw {
			if raw[i].status != C.PQ_OK {
				named = i
				break
			}
		}
		if batchErr != nil && named < 0 {
			return batchErr // the call as a whole failed: no item ran
		}
		var first error
		for i := range items {
			it := &items[i]
			it.Selection, it.Status = nil, Status(raw[i].status)
			var retryErr *Error
			switch it.Status {
			case OK:
				it.Selection = unstageSelection(&raw[i].out, heads)
			case ErrBufferTooSmall:
				sel, err := c.selectGrown(h, it.Seq, layer, it.Query, int(*raw[i].out.counts))
				if err != nil {
					retryErr = asError(op, err)
					it.Status = retryErr.Status
				} else {
					it.Selection, it.Status = sel, OK
				}
			}
			if it.Status == OK || first != nil {
				continue
			}
			switch {
			case retryErr != nil:
				first = itemError(op, i, it.Seq, it.Status, retryErr.Message)
			case i == named:
				first = batchErr
			default:
				first = itemError(op, i, it.Seq, it.Status, pqswig.Pq_status_string(int(it.Status)))
			}
		}
		return first
	})
}

// FetchKVBatch runs FetchKV for every item at one layer, in one library
// call (pq_fetch_kv_batch). A sequence may appear once, and no two outputs
// (keys or values of any items) may overlap.
//
// Items succeed or fail on their own: each item's Status is set, and the
// outputs of the items that succeeded are written. The call returns nil
// when every item succeeded, else the *Error of the first failing item,
// whose message names it ("pq_fetch_kv_batch: items[3] (seq_id 42): ...").
// Errors of the whole call (a bad layer, a repeated seq_id, overlapping
// outputs, a malformed selection or slice) return before any item runs.
//
// The library gathers into C memory and the rows it wrote are then copied
// into the items' slices: one copy more than FetchKV makes (see above).
func (c *Context) FetchKVBatch(layer int, items []FetchItem) error {
	const op = "pq_fetch_kv_batch"
	if err := c.checkLayer(op, layer); err != nil {
		return err
	}
	n := len(items)
	size := padded(uintptr(n) * C.sizeof_pq_fetch_item)
	for i := range items {
		it := &items[i]
		if err := c.checkSelection(op, fmt.Sprintf("items[%d].selection", i), it.Selection); err != nil {
			return err
		}
		if _, err := it.Keys.shape(op, fmt.Sprintf("items[%d].out_keys", i)); err != nil {
			return err
		}
		if _, err := it.Values.shape(op, fmt.Sprintf("items[%d].out_values", i)); err != nil {
			return err
		}
		size += padded(uintptr(len(it.Selection.Positions))*4) + padded(uintptr(len(it.Selection.Counts))*4) +
			padded(it.Keys.bytes()) + padded(it.Values.bytes())
	}
	if err := checkDisjoint(op, items); err != nil {
		return err
	}
	buf := newCBuffer(size)
	if buf.base == nil {
		return &Error{Op: op, Status: ErrOutOfMemory, Message: op + ": no memory for the items"}
	}
	defer buf.free()
	raw := cSlice[C.pq_fetch_item](buf.take(uintptr(n)*C.sizeof_pq_fetch_item), n)
	outs := make([][2]unsafe.Pointer, n) // the keys and values of each item in C memory
	for i := range items {
		it := &items[i]
		raw[i].seq_id = C.uint64_t(it.Seq)
		raw[i].selection = stageSelection(buf, it.Selection)
		outs[i] = [2]unsafe.Pointer{buf.take(it.Keys.bytes()), buf.take(it.Values.bytes())}
		if err := call(op, func() Status {
			if st := it.Keys.staged(&raw[i].out_keys, outs[i][0]); st != OK {
				return st
			}
			return it.Values.staged(&raw[i].out_values, outs[i][1])
		}); err != nil {
			return err
		}
		raw[i].status = C.PQ_OK
	}
	err := c.do(op, func(h pqswig.Struct_SS_pq_context) Status {
		return Status(C.pq_fetch_kv_batch(cContext(h), C.int32_t(layer), rawPointer(raw), C.int64_t(n)))
	})
	ran := false
	for i := range raw {
		ran = ran || raw[i].status != C.PQ_OK
	}
	if err != nil && !ran {
		return err // the call as a whole failed (or the Context is closed): no item ran
	}
	for i := range items {
		it := &items[i]
		it.Status = Status(raw[i].status)
		if it.Status == OK {
			counts := it.Selection.Counts
			unstageRows(it.Keys, outs[i][0], counts)
			unstageRows(it.Values, outs[i][1], counts)
		}
	}
	return err
}

func rawPointer[E any](s []E) *E {
	if len(s) == 0 {
		return nil
	}
	return &s[0]
}

// asError is err as an *Error (every error of this package is one).
func asError(op string, err error) *Error {
	if e, ok := err.(*Error); ok {
		return e
	}
	return &Error{Op: op, Status: ErrInternal, Message: err.Error()}
}

// unstageRows copies the rows a fetch wrote into C memory at data (row i of
// head h for i < counts[h]) into t's slice; other rows stay as they were.
func unstageRows(t Tensor, data unsafe.Pointer, counts []int32) {
	elem := elementSize(t.dtype)
	row := uintptr(t.headDim) * elem
	src := cSlice[byte](data, int(t.bytes()))
	dst := cSlice[byte](t.data, int(t.bytes()))
	for h, n := range counts {
		for i := 0; i < int(n); i++ {
			var at uintptr
			if t.layout == HeadMajor {
				at = uintptr(h*t.tokens+i) * row
			} else {
				at = uintptr(i*t.heads+h) * row
			}
			copy(dst[at:at+row], src[at:at+row])
		}
	}
}

// checkDisjoint refuses outputs that share memory: the library would
// refuse them, but it sees only the C copies. The tensors are dense, so two
// of them overlap exactly when their byte ranges do.
func checkDisjoint(op string, items []FetchItem) error {
	type span struct {
		start, end uintptr
		name       string
	}
	spans := make([]span, 0, 2*len(items))
	for i := range items {
		for _, out := range []struct {
			t    Tensor
			name string
		}{{items[i].Keys, "out_keys"}, {items[i].Values, "out_values"}} {
			if size := out.t.bytes(); size > 0 {
				start := uintptr(out.t.data)
				spans = append(spans, span{start, start + size, fmt.Sprintf("items[%d].%s", i, out.name)})
			}
		}
	}
	sort.Slice(spans, func(a, b int) bool { return spans[a].start < spans[b].start })
	for k := 1; k < len(spans); k++ {
		if spans[k].start < spans[k-1].end {
			return invalid(op, "%s and %s overlap; items of a batch run concurrently and must not share outputs",
				spans[k-1].name, spans[k].name)
		}
	}
	return nil
}
