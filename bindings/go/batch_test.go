package pqcache

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"libpqcache.org/pqcache/internal/pqswig"
)

// Sequences of different lengths; with the reference config's 4 sinks, 16
// top-k and 16 local tokens their capacities are 36, 9 and 30.
var (
	batchIDs     = []uint64{11, 7, 1000}
	batchLengths = []int{300, 9, 30}
)

// newBatchContext prefills the batch's sequences and returns the context
// and one query per sequence.
func newBatchContext(t *testing.T) (*Context, []Tensor) {
	t.Helper()
	ctx := newRefContext(t)
	queries := make([]Tensor, len(batchIDs))
	for i, seq := range batchIDs {
		n, stream := batchLengths[i], uint32(20*i)
		if err := ctx.AddSequence(seq); err != nil {
			t.Fatal(err)
		}
		kv := n * refKVHeads * refHeadDim
		if err := ctx.PrefillLayer(seq, 0, TensorF32(refGenerate(stream+1, kv), n, refKVHeads, refHeadDim),
			TensorF32(refGenerate(stream+2, kv), n, refKVHeads, refHeadDim)); err != nil {
			t.Fatal(err)
		}
		queries[i] = TensorF32(refGenerate(stream+3, refQHeads*refHeadDim), 1, refQHeads, refHeadDim)
	}
	if err := ctx.WaitBuilds(); err != nil {
		t.Fatal(err)
	}
	return ctx, queries
}

func selectOneByOne(t *testing.T, ctx *Context, ids []uint64, queries []Tensor) []*Selection {
	t.Helper()
	out := make([]*Selection, len(ids))
	for i, seq := range ids {
		sel, err := ctx.DecodeSelect(seq, 0, queries[i])
		if err != nil {
			t.Fatal(err)
		}
		out[i] = sel
	}
	return out
}

func selectItems(ids []uint64, queries []Tensor) []SelectItem {
	items := make([]SelectItem, len(ids))
	for i, seq := range ids {
		items[i] = SelectItem{Seq: seq, Query: queries[i]}
	}
	return items
}

func heads(sel *Selection) [][]int32 {
	out := make([][]int32, sel.Heads())
	for h := range out {
		out[h] = sel.Head(h)
	}
	return out
}

// fetchOutputs are head-major keys and values per selection, filled with a
// marker that fetches must leave alone past each head's count.
func fetchOutputs(sels []*Selection) (keys, values [][]float32) {
	for _, sel := range sels {
		for _, out := range []*[][]float32{&keys, &values} {
			buf := make([]float32, refKVHeads*sel.Capacity*refHeadDim)
			for j := range buf {
				buf[j] = 7
			}
			*out = append(*out, buf)
		}
	}
	return keys, values
}

func fetchItems(ids []uint64, sels []*Selection, keys, values [][]float32) []FetchItem {
	items := make([]FetchItem, len(ids))
	for i, seq := range ids {
		c := sels[i].Capacity
		items[i] = FetchItem{Seq: seq, Selection: sels[i],
			Keys:   TensorF32(keys[i], c, refKVHeads, refHeadDim).HeadMajor(),
			Values: TensorF32(values[i], c, refKVHeads, refHeadDim).HeadMajor()}
	}
	return items
}

func fetchOneByOne(t *testing.T, ctx *Context, sels []*Selection) (keys, values [][]float32) {
	t.Helper()
	keys, values = fetchOutputs(sels)
	for _, it := range fetchItems(batchIDs, sels, keys, values) {
		if err := ctx.FetchKV(it.Seq, 0, it.Selection, it.Keys, it.Values); err != nil {
			t.Fatal(err)
		}
	}
	return keys, values
}

func TestDecodeSelectBatchEqualsDecodeSelect(t *testing.T) {
	ctx, queries := newBatchContext(t)
	// Nothing selected yet: every item starts too small and is selected
	// once more on its own.
	fresh := selectItems(batchIDs, queries)
	if err := ctx.DecodeSelectBatch(0, fresh); err != nil {
		t.Fatal(err)
	}
	want := selectOneByOne(t, ctx, batchIDs, queries)
	sized := selectItems(batchIDs, queries)
	if err := ctx.DecodeSelectBatch(0, sized); err != nil {
		t.Fatal(err)
	}
	for i, seq := range batchIDs {
		capacity, err := ctx.SelectionCapacity(seq, 0)
		if err != nil {
			t.Fatal(err)
		}
		if capacity != []int{36, 9, 30}[i] {
			t.Errorf("item %d: capacity %d", i, capacity)
		}
		for _, items := range [][]SelectItem{fresh, sized} {
			it := items[i]
			if it.Status != OK || it.Selection == nil || it.Selection.Capacity < capacity {
				t.Fatalf("item %d: %+v", i, it)
			}
			if !reflect.DeepEqual(heads(it.Selection), heads(want[i])) || want[i].MaxCount() == 0 {
				t.Errorf("item %d: batch %v, one by one %v", i, heads(it.Selection), heads(want[i]))
			}
		}
	}
	if err := ctx.DecodeSelectBatch(0, nil); err != nil {
		t.Errorf("an empty batch: %v", err)
	}
}

func TestFetchKVBatchEqualsFetchKV(t *testing.T) {
	ctx, queries := newBatchContext(t)
	sels := selectOneByOne(t, ctx, batchIDs, queries)
	wantK, wantV := fetchOneByOne(t, ctx, sels)
	gotK, gotV := fetchOutputs(sels)
	items := fetchItems(batchIDs, sels, gotK, gotV)
	if err := ctx.FetchKVBatch(0, items); err != nil {
		t.Fatal(err)
	}
	for i := range items {
		if items[i].Status != OK {
			t.Errorf("item %d: status %v", i, items[i].Status)
		}
		// Bit for bit, rows past the counts (still 7) included.
		if !reflect.DeepEqual(gotK[i], wantK[i]) || !reflect.DeepEqual(gotV[i], wantV[i]) {
			t.Errorf("item %d: the batch fetched other bytes than FetchKV", i)
		}
	}
	// Token-major outputs too.
	tokenMajor := make([]float32, sels[0].MaxCount()*refKVHeads*refHeadDim)
	values := make([]float32, len(tokenMajor))
	one := []FetchItem{{Seq: batchIDs[0], Selection: sels[0],
		Keys:   TensorF32(tokenMajor, sels[0].MaxCount(), refKVHeads, refHeadDim),
		Values: TensorF32(values, sels[0].MaxCount(), refKVHeads, refHeadDim)}}
	if err := ctx.FetchKVBatch(0, one); err != nil {
		t.Fatal(err)
	}
	for h := 0; h < refKVHeads; h++ {
		for i := range sels[0].Head(h) {
			row := tokenMajor[(i*refKVHeads+h)*refHeadDim:][:refHeadDim]
			if !reflect.DeepEqual(row, wantK[0][(h*sels[0].Capacity+i)*refHeadDim:][:refHeadDim]) {
				t.Fatalf("token-major row %d of head %d differs", i, h)
			}
		}
	}
}

func TestFailingBatchItemIsNamedAndOthersAreFilled(t *testing.T) {
	ctx, queries := newBatchContext(t)
	ids := []uint64{batchIDs[0], 999, batchIDs[2]}
	// First with nothing selected yet (items[0], too small, is what the
	// library names, so the message for items[1] is built from its status),
	// then with selections large enough (the library names items[1]).
	for _, detail := range []string{"PQ_ERR_NOT_FOUND", "is not a sequence"} {
		items := selectItems(ids, queries)
		err := ctx.DecodeSelectBatch(0, items)
		wantError(t, err, ErrNotFound, "pq_decode_select_batch: items[1] (seq_id 999): ", detail)
		if !strings.HasPrefix(err.(*Error).Message, "pq_decode_select_batch: items[1]") {
			t.Errorf("message %q", err.(*Error).Message)
		}
		want := selectOneByOne(t, ctx, batchIDs, queries)
		if items[1].Status != ErrNotFound || items[1].Selection != nil {
			t.Errorf("items[1]: %+v", items[1])
		}
		for _, i := range []int{0, 2} {
			if items[i].Status != OK || !reflect.DeepEqual(heads(items[i].Selection), heads(want[i])) {
				t.Errorf("items[%d]: %+v, want %v", i, items[i], heads(want[i]))
			}
		}
	}

	sels := selectOneByOne(t, ctx, batchIDs, queries)
	wantK, _ := fetchOneByOne(t, ctx, sels)
	gotK, gotV := fetchOutputs(sels)
	items := fetchItems(ids, sels, gotK, gotV)
	err := ctx.FetchKVBatch(0, items)
	wantError(t, err, ErrNotFound, "pq_fetch_kv_batch: items[1] (seq_id 999): ")
	if items[0].Status != OK || items[1].Status != ErrNotFound || items[2].Status != OK {
		t.Errorf("statuses %v %v %v", items[0].Status, items[1].Status, items[2].Status)
	}
	if !reflect.DeepEqual(gotK[0], wantK[0]) || !reflect.DeepEqual(gotK[2], wantK[2]) {
		t.Error("the items that succeeded were not written as FetchKV writes them")
	}
	for _, x := range gotK[1] {
		if x != 7 {
			t.Fatal("the failed item's output was written")
		}
	}
}

func TestBatchCallLevelErrors(t *testing.T) {
	ctx, queries := newBatchContext(t)
	items := selectItems([]uint64{11, 11}, queries[:2])
	wantError(t, ctx.DecodeSelectBatch(0, items), ErrInvalidArgument, "seq_id")
	if items[0].Status != OK || items[0].Selection != nil {
		t.Errorf("a call-level error set an item: %+v", items[0])
	}
	wantError(t, ctx.DecodeSelectBatch(3, selectItems(batchIDs, queries)), ErrInvalidArgument, "layer")
	short := []Tensor{TensorF32(make([]float32, 3), 1, refQHeads, refHeadDim)}
	wantError(t, ctx.DecodeSelectBatch(0, selectItems(batchIDs[:1], short)), ErrInvalidArgument,
		"items[0].query")

	// Outputs that share memory are refused, as the library refuses them.
	sels := selectOneByOne(t, ctx, batchIDs, queries)
	keys, values := fetchOutputs(sels)
	values[2] = keys[0][:len(values[2])]
	wantError(t, ctx.FetchKVBatch(0, fetchItems(batchIDs, sels, keys, values)), ErrInvalidArgument,
		"items[0].out_keys and items[2].out_values overlap")
	keys, values = fetchOutputs(sels)
	bad := fetchItems(batchIDs, sels, keys, values)
	bad[1].Selection = &Selection{Capacity: 1, Counts: []int32{2, 0}, Positions: []int32{0, 0}}
	wantError(t, ctx.FetchKVBatch(0, bad), ErrInvalidArgument, "items[1].selection", "Counts[0]")
	dup := fetchItems([]uint64{11, 11}, sels[:2], keys, values)
	wantError(t, ctx.FetchKVBatch(0, dup), ErrInvalidArgument, "seq_id")

	ctx.Close()
	wantError(t, ctx.DecodeSelectBatch(0, selectItems(batchIDs, queries)), ErrBadState, "closed")
	wantError(t, ctx.FetchKVBatch(0, fetchItems(batchIDs, sels, keys, values)), ErrBadState, "closed")
}

func TestDecodeSelectErrorsNamePqDecodeSelect(t *testing.T) {
	ctx, queries := newBatchContext(t)
	_, err := ctx.DecodeSelect(12345, 0, queries[0])
	wantError(t, err, ErrNotFound, "pq_decode_select")
	if e := err.(*Error); e.Op != "pq_decode_select" || strings.Contains(e.Message, "pq_selection_capacity") {
		t.Errorf("Op %q, message %q", e.Op, e.Message)
	}
}

func TestBufferTooSmallStatus(t *testing.T) {
	if !strings.HasPrefix(ErrBufferTooSmall.Error(), "PQ_ERR_BUFFER_TOO_SMALL") {
		t.Errorf("ErrBufferTooSmall.Error() = %q", ErrBufferTooSmall.Error())
	}
	// Through the library: a selection one entry too small.
	ctx, queries := newBatchContext(t)
	var small *Selection
	err := ctx.withHandle("test", func(h pqswig.Struct_SS_pq_context) (err error) {
		small, err = ctx.selectInto(h, batchIDs[0], 0, queries[0], 35)
		return err
	})
	wantError(t, err, ErrBufferTooSmall, "capacity")
	if !errors.Is(err, ErrBufferTooSmall) || small.Counts[0] != 36 || small.Counts[1] != 36 {
		t.Errorf("err %v, counts %v: the library writes the capacity needed", err, small.Counts)
	}
}

func TestSelectionCapacityFor(t *testing.T) {
	ctx, _ := newBatchContext(t)
	for i, seq := range batchIDs {
		got, err := ctx.SelectionCapacityFor(0, int64(batchLengths[i]))
		want, err2 := ctx.SelectionCapacity(seq, 0)
		if err != nil || err2 != nil || got != want {
			t.Errorf("length %d: SelectionCapacityFor %d (%v), SelectionCapacity %d (%v)",
				batchLengths[i], got, err, want, err2)
		}
	}
	previous := 0
	for tokens := int64(0); tokens < 100; tokens++ {
		got, err := ctx.SelectionCapacityFor(0, tokens)
		if err != nil || got < previous {
			t.Fatalf("tokens %d: %d, %v (previous %d)", tokens, got, err, previous)
		}
		previous = got
	}
	_, err := ctx.SelectionCapacityFor(0, -1)
	wantError(t, err, ErrInvalidArgument, "tokens")
	_, err = ctx.SelectionCapacityFor(1<<40, 1)
	wantError(t, err, ErrInvalidArgument, "layer")
}
