package pqcache

/*
// The header and library come from pkg-config (pqcache.pc, from the
// libpqcache-dev package or any install prefix on PKG_CONFIG_PATH). #cgo
// directives apply to the whole package, so this one line serves every file.
#cgo pkg-config: pqcache
#include "pqcache.h"

// The calls that take the caller's buffers, written here rather than
// through SWIG so that Go slices reach the library without a copy. cgo
// allows a Go pointer as an argument but not a Go pointer stored in memory
// that C reads (a pq_tensor or pq_selection built in Go), so the data
// pointers travel as arguments and the descriptors are built here, on the C
// stack. The library keeps none of these pointers after the call.

typedef struct go_pq_shape {
  int32_t dtype, layout;
  int64_t tokens;
  int32_t heads, head_dim;
} go_pq_shape;

static pq_status go_pq_tensor(pq_tensor* t, void* data, go_pq_shape s) {
  return pq_tensor_init(t, data, s.dtype, s.layout, s.tokens, s.heads, s.head_dim);
}

// The keys and values descriptors of a store or a fetch.
static pq_status go_pq_kv(pq_tensor* tk, void* k, go_pq_shape ks, pq_tensor* tv, void* v,
                          go_pq_shape vs) {
  pq_status st = go_pq_tensor(tk, k, ks);
  return st == PQ_OK ? go_pq_tensor(tv, v, vs) : st;
}

// values 0: no values (NULL), for an index-only context.
static pq_status go_pq_store(pq_context* ctx, uint64_t seq, int32_t layer, int append,
                             void* k, go_pq_shape ks, int values, void* v, go_pq_shape vs) {
  pq_tensor tk, tv;
  pq_status st = values ? go_pq_kv(&tk, k, ks, &tv, v, vs) : go_pq_tensor(&tk, k, ks);
  if (st != PQ_OK) return st;
  const pq_tensor* pv = values ? &tv : NULL;
  return append ? pq_decode_append(ctx, seq, layer, &tk, pv)
                : pq_prefill_layer(ctx, seq, layer, &tk, pv);
}

// The scalar fields of a pq_paged_keys; its pool and maps travel as
// arguments (cgo's pointer rule above).
typedef struct go_pq_map {
  int32_t block_size;
  int64_t map_length, tokens;
} go_pq_map;

static pq_status go_pq_paged(pq_paged_keys* out, void* pool, go_pq_shape ps, int64_t* slots,
                             int32_t* block_table, go_pq_map m) {
  out->slots = slots;
  out->block_table = block_table;
  out->block_size = m.block_size;
  out->map_length = m.map_length;
  out->tokens = m.tokens;
  return go_pq_tensor(&out->pool, pool, ps);
}

static pq_status go_pq_store_paged(pq_context* ctx, uint64_t seq, int32_t layer, int append,
                                   void* pool, go_pq_shape ps, int64_t* slots,
                                   int32_t* block_table, go_pq_map m) {
  pq_paged_keys keys;
  pq_status st = go_pq_paged(&keys, pool, ps, slots, block_table, m);
  if (st != PQ_OK) return st;
  return append ? pq_decode_append_paged(ctx, seq, layer, &keys)
                : pq_prefill_layer_paged(ctx, seq, layer, &keys);
}

// keyed 0: no keys (NULL).
static pq_status go_pq_select_multi(pq_context* ctx, uint64_t seq, int32_t layer, void* q,
                                    go_pq_shape qs, int32_t rows, int keyed, void* pool,
                                    go_pq_shape ps, int64_t* slots, int32_t* block_table,
                                    go_pq_map m, int32_t* positions, int32_t* counts,
                                    int64_t capacity) {
  pq_tensor tq;
  pq_paged_keys keys;
  pq_selection sel = {positions, counts, capacity};
  pq_status st = go_pq_tensor(&tq, q, qs);
  if (st == PQ_OK && keyed) st = go_pq_paged(&keys, pool, ps, slots, block_table, m);
  if (st != PQ_OK) return st;
  return pq_decode_select_multi(ctx, seq, layer, &tq, rows, keyed ? &keys : NULL, &sel);
}

static pq_status go_pq_select(pq_context* ctx, uint64_t seq, int32_t layer, void* q,
                              go_pq_shape qs, int32_t* positions, int32_t* counts,
                              int64_t capacity) {
  pq_tensor tq;
  pq_selection sel = {positions, counts, capacity};
  pq_status st = go_pq_tensor(&tq, q, qs);
  if (st != PQ_OK) return st;
  return pq_decode_select(ctx, seq, layer, &tq, &sel);
}

static pq_status go_pq_fetch(pq_context* ctx, uint64_t seq, int32_t layer, int32_t* positions,
                             int32_t* counts, int64_t capacity, void* k, go_pq_shape ks,
                             void* v, go_pq_shape vs) {
  pq_tensor tk, tv;
  pq_selection sel = {positions, counts, capacity};
  pq_status st = go_pq_kv(&tk, k, ks, &tv, v, vs);
  if (st != PQ_OK) return st;
  return pq_fetch_kv(ctx, seq, layer, &sel, &tk, &tv);
}

// pq_decode_attend, or pq_decode_tail when tail_only.
static pq_status go_pq_attend(pq_context* ctx, uint64_t seq, int32_t layer, void* q,
                              go_pq_shape qs, int32_t* positions, int32_t* counts,
                              int64_t capacity, float scale, float* out, float* out_lse,
                              int tail_only) {
  pq_tensor tq;
  pq_selection sel = {positions, counts, capacity};
  pq_status st = go_pq_tensor(&tq, q, qs);
  if (st != PQ_OK) return st;
  if (tail_only) return pq_decode_tail(ctx, seq, layer, &tq, &sel, scale, out, out_lse);
  return pq_decode_attend(ctx, seq, layer, &tq, &sel, scale, out, out_lse);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"libpqcache.org/pqcache/internal/pqswig"
)

// Tensor is a view of a Go slice as a dense tokens x heads x headDim tensor
// (pq_tensor), in one of the preset layouts. Make one with TensorF32,
// TensorF16 or TensorBF16; the slice is neither copied nor kept by the
// library.
type Tensor struct {
	data    unsafe.Pointer // &slice[0], or nil for an empty slice
	length  int            // elements in the slice
	dtype   DType
	layout  Layout
	tokens  int
	heads   int
	headDim int
}

// TensorF32 views data as a token-major [tokens][heads][headDim] float32
// tensor.
func TensorF32(data []float32, tokens, heads, headDim int) Tensor {
	return Tensor{data: slicePointer(data), length: len(data), dtype: DTypeF32,
		layout: TokenMajor, tokens: tokens, heads: heads, headDim: headDim}
}

// TensorF16 views data, IEEE binary16 bit patterns, as a token-major
// [tokens][heads][headDim] tensor.
func TensorF16(data []uint16, tokens, heads, headDim int) Tensor {
	return Tensor{data: slicePointer(data), length: len(data), dtype: DTypeF16,
		layout: TokenMajor, tokens: tokens, heads: heads, headDim: headDim}
}

// TensorBF16 views data, bfloat16 bit patterns, as a token-major
// [tokens][heads][headDim] tensor.
func TensorBF16(data []uint16, tokens, heads, headDim int) Tensor {
	t := TensorF16(data, tokens, heads, headDim)
	t.dtype = DTypeBF16
	return t
}

// TensorFP8 views data, fp8 codes of dtype DTypeFP8E4M3 or DTypeFP8E5M2
// (0.10), as a token-major [tokens][heads][headDim] tensor: K/V to store,
// or FetchKV's outputs (the codes as stored).
func TensorFP8(data []uint8, dtype DType, tokens, heads, headDim int) Tensor {
	return Tensor{data: slicePointer(data), length: len(data), dtype: dtype,
		layout: TokenMajor, tokens: tokens, heads: heads, headDim: headDim}
}

// HeadMajor returns the same view laid out [heads][tokens][headDim]. With
// tokens = the selection's capacity it is the layout FetchKV fills for
// attention: each kv head's rows contiguous.
func (t Tensor) HeadMajor() Tensor {
	t.layout = HeadMajor
	return t
}

// DType, Tokens, Heads and HeadDim describe the view.
func (t Tensor) DType() DType { return t.dtype }
func (t Tensor) Tokens() int  { return t.tokens }
func (t Tensor) Heads() int   { return t.heads }
func (t Tensor) HeadDim() int { return t.headDim }

// slicePointer is &s[0], or nil for an empty slice (where &s[0] would
// panic; the library accepts NULL for 0 tokens, and rejects it otherwise).
func slicePointer[E float32 | uint16 | uint8 | int32 | int64](s []E) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}

func int32Pointer(s []int32) *C.int32_t { return (*C.int32_t)(slicePointer(s)) }

func int64Pointer(s []int64) *C.int64_t { return (*C.int64_t)(slicePointer(s)) }

func floatPointer(s []float32) *C.float { return (*C.float)(slicePointer(s)) }

// shape checks that the slice holds the whole shape (the library trusts the
// descriptor and would read or write past a short slice) and converts it.
// The library checks the rest: heads and headDim against the config, the
// dtype. name is the argument as the C function op calls it ("out_keys",
// "items[2].query"), which the message names.
func (t Tensor) shape(op, name string) (C.go_pq_shape, error) {
	for _, f := range []struct {
		field string
		value int
		max   int64
		ctype string
	}{
		{"tokens", t.tokens, math.MaxInt64, "int64_t"},
		{"heads", t.heads, math.MaxInt32, "int32_t"},
		{"head_dim", t.headDim, math.MaxInt32, "int32_t"},
	} {
		if f.value < 0 {
			return C.go_pq_shape{}, invalid(op, "%s.%s is %d; expected >= 0", name, f.field, f.value)
		}
		if int64(f.value) > f.max {
			return C.go_pq_shape{}, invalid(op, "%s.%s is %d; expected at most %d (%s)",
				name, f.field, f.value, f.max, f.ctype)
		}
	}
	dims := fmt.Sprintf("tokens %d x heads %d x head_dim %d", t.tokens, t.heads, t.headDim)
	need, ok := product(t.tokens, t.heads, t.headDim)
	if !ok {
		return C.go_pq_shape{}, invalid(op, "%s.data has %d elements; expected at least %s, which overflows int",
			name, t.length, dims)
	}
	if need > t.length {
		return C.go_pq_shape{}, invalid(op, "%s.data has %d elements; expected at least %d (%s)",
			name, t.length, need, dims)
	}
	return C.go_pq_shape{
		dtype: C.int32_t(t.dtype), layout: C.int32_t(t.layout), tokens: C.int64_t(t.tokens),
		heads: C.int32_t(t.heads), head_dim: C.int32_t(t.headDim),
	}, nil
}

// kvShapes checks and converts the keys and values of a store or a fetch.
func kvShapes(op string, keys, values Tensor) (ks, vs C.go_pq_shape, err error) {
	if ks, err = keys.shape(op, "keys"); err != nil {
		return ks, vs, err
	}
	vs, err = values.shape(op, "values")
	return ks, vs, err
}

// product multiplies non-negative sizes; ok is false on overflow.
func product(a, b, c int) (n int, ok bool) {
	if a == 0 || b == 0 || c == 0 {
		return 0, true
	}
	if a > math.MaxInt/b || a*b > math.MaxInt/c {
		return 0, false
	}
	return a * b * c, true
}

// PrefillLayer appends the prompt's keys and values for one layer
// (tokens x NumKVHeads x HeadDim each, the config's dtype) and schedules
// the layer's index build (pq_prefill_layer). The slices may be reused when
// it returns. An index-only context (KVTierCaller) keeps no values: pass
// the zero Tensor (Tensor{}) for them, which the library gets as NULL.
func (c *Context) PrefillLayer(seq uint64, layer int, keys, values Tensor) error {
	return c.store("pq_prefill_layer", seq, layer, false, keys, values)
}

// DecodeAppend appends decode tokens' keys and values to a prefilled layer
// without a rebuild (pq_decode_append); before any prefill it is
// ErrBadState. values may be the zero Tensor as for PrefillLayer.
func (c *Context) DecodeAppend(seq uint64, layer int, keys, values Tensor) error {
	return c.store("pq_decode_append", seq, layer, true, keys, values)
}

func (c *Context) store(op string, seq uint64, layer int, appendTokens bool, keys, values Tensor) error {
	if err := c.checkLayer(op, layer); err != nil {
		return err
	}
	hasValues := values != (Tensor{})
	var ks, vs C.go_pq_shape
	var err error
	if hasValues {
		ks, vs, err = kvShapes(op, keys, values)
	} else {
		ks, err = keys.shape(op, "keys")
	}
	if err != nil {
		return err
	}
	return c.do(op, func(h pqswig.Struct_SS_pq_context) Status {
		return Status(C.go_pq_store(cContext(h), C.uint64_t(seq), C.int32_t(layer), cBool(appendTokens),
			keys.data, ks, cBool(hasValues), values.data, vs))
	})
}

func cBool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// cMap checks and converts the map of paged keys; name is the argument
// ("keys").
func (k *PagedKeys) cMap(op, name string) (C.go_pq_map, error) {
	if k.BlockSize < math.MinInt32 || k.BlockSize > math.MaxInt32 {
		return C.go_pq_map{}, invalid(op, "%s.block_size is %d; expected %d..%d (int32_t)",
			name, k.BlockSize, math.MinInt32, math.MaxInt32)
	}
	// The library refuses both maps at once, by name.
	length := len(k.BlockTable)
	if k.Slots != nil {
		length = len(k.Slots)
	}
	return C.go_pq_map{block_size: C.int32_t(k.BlockSize), map_length: C.int64_t(length),
		tokens: C.int64_t(k.Tokens)}, nil
}

// storePaged is PrefillLayerPaged's and DecodeAppendPaged's call.
func (c *Context) storePaged(op string, seq uint64, layer int, appendTokens bool, keys *PagedKeys) error {
	if err := c.checkLayer(op, layer); err != nil {
		return err
	}
	ps, err := keys.Pool.shape(op, "keys.pool")
	if err != nil {
		return err
	}
	m, err := keys.cMap(op, "keys")
	if err != nil {
		return err
	}
	return c.do(op, func(h pqswig.Struct_SS_pq_context) Status {
		return Status(C.go_pq_store_paged(cContext(h), C.uint64_t(seq), C.int32_t(layer),
			cBool(appendTokens), keys.Pool.data, ps, int64Pointer(keys.Slots),
			int32Pointer(keys.BlockTable), m))
	})
}

// selectMultiInto runs pq_decode_select_multi into sel (sized by the
// caller); keys may be nil. The shapes are checked here.
func (c *Context) selectMultiInto(h pqswig.Struct_SS_pq_context, seq uint64, layer int,
	queries Tensor, rows SelectRows, keys *PagedKeys, sel *Selection) error {
	const op = "pq_decode_select_multi"
	qs, err := queries.shape(op, "queries")
	if err != nil {
		return err
	}
	var ps C.go_pq_shape
	var m C.go_pq_map
	var pool unsafe.Pointer
	var slots []int64
	var table []int32
	if keys != nil {
		if ps, err = keys.Pool.shape(op, "keys.pool"); err != nil {
			return err
		}
		if m, err = keys.cMap(op, "keys"); err != nil {
			return err
		}
		pool, slots, table = keys.Pool.data, keys.Slots, keys.BlockTable
	}
	return call(op, func() Status {
		return Status(C.go_pq_select_multi(cContext(h), C.uint64_t(seq), C.int32_t(layer),
			queries.data, qs, C.int32_t(rows), cBool(keys != nil), pool, ps, int64Pointer(slots),
			int32Pointer(table), m, int32Pointer(sel.Positions), int32Pointer(sel.Counts),
			C.int64_t(sel.Capacity)))
	})
}

// Selection is the result of DecodeSelect: per kv head, ascending unique
// token positions. Row h is Positions[h*Capacity : h*Capacity+Counts[h]].
// DecodeSelectMulti's has one row per token and kv head, per kv head or
// per request (SelectRows); its rows are padded with -1 up to Capacity.
type Selection struct {
	Capacity  int     // entries per kv head (row)
	Counts    []int32 // valid entries per kv head (row)
	Positions []int32 // NumKVHeads (rows) x Capacity
}

// Rows is the number of rows: Heads for DecodeSelect's selection.
func (s *Selection) Rows() int { return len(s.Counts) }

// Row returns the positions of row r (a subslice of Positions, not a copy).
func (s *Selection) Row(r int) []int32 { return s.Head(r) }

// Heads is the number of kv heads in the selection.
func (s *Selection) Heads() int { return len(s.Counts) }

// Head returns the selected positions of kv head h (a subslice of
// Positions, not a copy).
func (s *Selection) Head(h int) []int32 {
	return s.Positions[h*s.Capacity : h*s.Capacity+int(s.Counts[h])]
}

// MaxCount is the largest per-head count: the tokens FetchKV's outputs need.
func (s *Selection) MaxCount() int {
	m := 0
	for _, n := range s.Counts {
		if int(n) > m {
			m = int(n)
		}
	}
	return m
}

// DecodeSelect selects, per kv head, the sink tokens, the top-k middle
// tokens for the query (1 token x NumQHeads x HeadDim, the config's dtype)
// and the local tokens (pq_decode_select). Calls that change the same
// (seq, layer) from another goroutine meanwhile must be ordered by the
// caller, as for any decode step.
//
// The selection is sized from the largest capacity this layer needed so
// far, and grown once when the library asks for more (ErrBufferTooSmall),
// so its Capacity is at least SelectionCapacity(seq, layer). Errors are
// pq_decode_select's.
func (c *Context) DecodeSelect(seq uint64, layer int, query Tensor) (*Selection, error) {
	const op = "pq_decode_select"
	if err := c.checkLayer(op, layer); err != nil {
		return nil, err
	}
	if _, err := query.shape(op, "query"); err != nil {
		return nil, err
	}
	var sel *Selection
	err := c.withHandle(op, func(h pqswig.Struct_SS_pq_context) (err error) {
		sel, err = c.selectInto(h, seq, layer, query, c.capacityHint(layer))
		if errors.Is(err, ErrBufferTooSmall) {
			sel, err = c.selectGrown(h, seq, layer, query, int(sel.Counts[0]))
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return sel, nil
}

// selectInto runs pq_decode_select into a new selection of the given
// capacity; the query's shape was checked. On ErrBufferTooSmall the
// selection comes back too, its counts holding the capacity needed.
func (c *Context) selectInto(h pqswig.Struct_SS_pq_context, seq uint64, layer int, query Tensor,
	capacity int) (*Selection, error) {
	const op = "pq_decode_select"
	qs, err := query.shape(op, "query")
	if err != nil {
		return nil, err
	}
	sel := newSelection(c.config.NumKVHeads, capacity)
	err = call(op, func() Status {
		return Status(C.go_pq_select(cContext(h), C.uint64_t(seq), C.int32_t(layer), query.data, qs,
			int32Pointer(sel.Positions), int32Pointer(sel.Counts), C.int64_t(capacity)))
	})
	return sel, err
}

// selectGrown selects once more, after ErrBufferTooSmall, with the capacity
// the library asked for, and remembers it for the layer.
func (c *Context) selectGrown(h pqswig.Struct_SS_pq_context, seq uint64, layer int, query Tensor,
	needed int) (*Selection, error) {
	c.raiseCapacityHint(layer, needed)
	sel, err := c.selectInto(h, seq, layer, query, needed)
	if err != nil {
		return nil, err
	}
	return sel, nil
}

// FetchKV gathers the keys and values of a selection into the caller's
// tensors (pq_fetch_kv): NumKVHeads heads and at least sel.MaxCount()
// tokens, the config's dtype; selected token i of kv head h goes to row
// (i, h). TensorF32(buf, sel.Capacity, heads, dim).HeadMajor() gives
// [kv_head][capacity][head_dim].
func (c *Context) FetchKV(seq uint64, layer int, sel *Selection, keys, values Tensor) error {
	const op = "pq_fetch_kv"
	if err := c.checkLayer(op, layer); err != nil {
		return err
	}
	if err := c.checkSelection(op, "selection", sel); err != nil {
		return err
	}
	ks, err := keys.shape(op, "out_keys")
	if err != nil {
		return err
	}
	vs, err := values.shape(op, "out_values")
	if err != nil {
		return err
	}
	return c.do(op, func(h pqswig.Struct_SS_pq_context) Status {
		return Status(C.go_pq_fetch(cContext(h), C.uint64_t(seq), C.int32_t(layer),
			int32Pointer(sel.Positions), int32Pointer(sel.Counts), C.int64_t(sel.Capacity),
			keys.data, ks, values.data, vs))
	})
}

// DecodeAttend computes the attention of one token's query (1 token x
// NumQHeads x HeadDim, the config's dtype) over the tokens of a selection,
// read from the library's store without a gathered copy
// (pq_decode_attend). Query head q attends over the positions of kv head
// q / (NumQHeads / NumKVHeads):
//
//	out[q*HeadDim+d] = sum_i softmax_i(scale * query_q . K[p_i]) * V[p_i][d]
//	lse[q]           = ln sum_i exp(scale * query_q . K[p_i])
//
// out has NumQHeads x HeadDim floats and lse NumQHeads, both new slices, in
// float32 whatever the stored dtype. A scale of 0 means 1 / sqrt(HeadDim).
// The log-sum-exp lets a caller merge this attention with one over tokens it
// keeps itself; a kv head with no selected token gives zeros and -Inf.
// Errors are pq_decode_attend's: ErrInvalidArgument for a bad query shape,
// a scale < 0 or not finite, NaN in the query or positions past the length;
// ErrNotFound; ErrBadState before the layer's prefill. Calls that change the
// same (seq, layer) meanwhile must be ordered by the caller, as for FetchKV.
func (c *Context) DecodeAttend(seq uint64, layer int, query Tensor, sel *Selection,
	scale float32) (out, lse []float32, err error) {
	return c.attend("pq_decode_attend", seq, layer, query, sel, scale)
}

// DecodeTail is the tail estimate alone (pq_decode_tail, 0.12; a context
// made with Config.TailEstimate = TailCodeMeans): out and lse over the
// middle tokens the selection leaves out, the part DecodeAttend adds, for a
// caller that attends over the fetched rows itself. Merge per query head q
// with your own (oA, lseA):
//
//	m := max(lseA, lse[q]); wA, wT := exp(lseA-m), exp(lse[q]-m)
//	o[d] = (wA*oA[d] + wT*out[q*HeadDim+d]) / (wA + wT)
//
// A kv head with nothing left out gives zeros and -Inf. Errors are
// DecodeAttend's, and ErrBadState without the estimate.
func (c *Context) DecodeTail(seq uint64, layer int, query Tensor, sel *Selection,
	scale float32) (out, lse []float32, err error) {
	return c.attend("pq_decode_tail", seq, layer, query, sel, scale)
}

// attend is DecodeAttend (op pq_decode_attend) and DecodeTail (pq_decode_tail).
func (c *Context) attend(op string, seq uint64, layer int, query Tensor, sel *Selection,
	scale float32) (out, lse []float32, err error) {
	if err := c.checkLayer(op, layer); err != nil {
		return nil, nil, err
	}
	qs, err := query.shape(op, "query")
	if err != nil {
		return nil, nil, err
	}
	if err := c.checkSelection(op, "selection", sel); err != nil {
		return nil, nil, err
	}
	out = make([]float32, c.config.NumQHeads*c.config.HeadDim)
	lse = make([]float32, c.config.NumQHeads)
	tailOnly := C.int(0)
	if op == "pq_decode_tail" {
		tailOnly = 1
	}
	err = c.do(op, func(h pqswig.Struct_SS_pq_context) Status {
		return Status(C.go_pq_attend(cContext(h), C.uint64_t(seq), C.int32_t(layer), query.data, qs,
			int32Pointer(sel.Positions), int32Pointer(sel.Counts), C.int64_t(sel.Capacity),
			C.float(scale), floatPointer(out), floatPointer(lse), tailOnly))
	})
	if err != nil {
		return nil, nil, err
	}
	return out, lse, nil
}

// checkSelection refuses a selection the library would read past: it reads
// NumKVHeads counts and, per head, counts[h] positions from row h*Capacity,
// so a selection built or edited by hand must hold them. name is the
// argument as the C function op calls it ("selection", "items[1].selection").
func (c *Context) checkSelection(op, name string, sel *Selection) error {
	heads := c.config.NumKVHeads
	switch {
	case sel == nil:
		return invalid(op, "%s is nil; expected a *Selection", name)
	case len(sel.Counts) != heads:
		return invalid(op, "%s has %d kv heads; expected %d (num_kv_heads)", name, len(sel.Counts), heads)
	case sel.Capacity < 0:
		return invalid(op, "%s.Capacity is %d; expected >= 0", name, sel.Capacity)
	case len(sel.Positions)/heads < sel.Capacity:
		return invalid(op, "%s.Positions has %d entries; expected at least %d (num_kv_heads %d x Capacity %d)",
			name, len(sel.Positions), heads*sel.Capacity, heads, sel.Capacity)
	}
	for h, n := range sel.Counts {
		if n < 0 || int(n) > sel.Capacity {
			return invalid(op, "%s.Counts[%d] is %d; expected 0..%d (Capacity)", name, h, n, sel.Capacity)
		}
	}
	return nil
}
