package pqcache

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// selectAndFetch is seq's selection for query and the rows it fetches: what
// a sequence forked or restored from another must reproduce exactly.
func selectAndFetch(t *testing.T, ctx *Context, seq uint64, query Tensor) ([][]int32, []float32, []float32) {
	t.Helper()
	sels := selectOneByOne(t, ctx, []uint64{seq}, []Tensor{query})
	keys, values := fetchOutputs(sels)
	it := fetchItems([]uint64{seq}, sels, keys, values)[0]
	if err := ctx.FetchKV(seq, 0, it.Selection, it.Keys, it.Values); err != nil {
		t.Fatal(err)
	}
	return heads(sels[0]), keys[0], values[0]
}

// statePrompt is the state tests' prompt: two full 256-token chunks and a
// partial one.
const statePrompt = 600

// addPrefilled adds seq to ctx with a statePrompt-token prefill and 4
// decode steps (the state tests' sequence).
func addPrefilled(t *testing.T, ctx *Context, seq uint64) {
	t.Helper()
	const prompt = statePrompt
	if err := ctx.AddSequence(seq); err != nil {
		t.Fatal(err)
	}
	kv := prompt * refKVHeads * refHeadDim
	if err := ctx.PrefillLayer(seq, 0, TensorF32(refGenerate(61, kv), prompt, refKVHeads, refHeadDim),
		TensorF32(refGenerate(62, kv), prompt, refKVHeads, refHeadDim)); err != nil {
		t.Fatal(err)
	}
	for step := uint32(0); step < 4; step++ {
		row := refKVHeads * refHeadDim
		if err := ctx.DecodeAppend(seq, 0, TensorF32(refGenerate(63+2*step, row), 1, refKVHeads, refHeadDim),
			TensorF32(refGenerate(64+2*step, row), 1, refKVHeads, refHeadDim)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTruncateForkSaveAndRestoreKeepSelectionsAndRows(t *testing.T) {
	const prompt = statePrompt
	ctx := newRefContext(t)
	addPrefilled(t, ctx, 1)
	wantLength := func(c *Context, seq uint64, want int64) {
		t.Helper()
		if n, err := c.SequenceLength(seq, 0); err != nil || n != want {
			t.Fatalf("SequenceLength(%d) = %d, %v; want %d", seq, n, err, want)
		}
	}
	wantLength(ctx, 1, prompt+4)

	// Two rejected speculative tokens rolled back; more than the sequence
	// holds is refused.
	if err := ctx.TruncateSequence(1, prompt+2); err != nil {
		t.Fatal(err)
	}
	wantLength(ctx, 1, prompt+2)
	wantError(t, ctx.TruncateSequence(1, prompt+100), ErrInvalidArgument)
	wantError(t, ctx.TruncateSequence(99, 1), ErrNotFound)

	query := TensorF32(refGenerate(71, refQHeads*refHeadDim), 1, refQHeads, refHeadDim)
	wantSel, wantK, wantV := selectAndFetch(t, ctx, 1, query)

	// A fork selects what its parent selects.
	if err := ctx.ForkSequence(1, 2); err != nil {
		t.Fatal(err)
	}
	wantLength(ctx, 2, prompt+2)
	if sel, _, _ := selectAndFetch(t, ctx, 2, query); !reflect.DeepEqual(sel, wantSel) {
		t.Fatalf("fork selects %v, parent %v", sel, wantSel)
	}
	wantError(t, ctx.ForkSequence(1, 2), ErrInvalidArgument)

	// Save to bytes and to a file: the same bytes.
	state, err := ctx.SaveSequence(1)
	if err != nil {
		t.Fatal(err)
	}
	if size, err := ctx.SequenceStateSize(1); err != nil || size != int64(len(state)) {
		t.Fatalf("SequenceStateSize = %d, %v; saved %d bytes", size, err, len(state))
	}
	path := filepath.Join(t.TempDir(), "state.bin")
	if err := ctx.SaveSequenceFile(1, path); err != nil {
		t.Fatal(err)
	}
	if file, err := os.ReadFile(path); err != nil || !bytes.Equal(file, state) {
		t.Fatalf("the file (%d bytes, %v) differs from SaveSequence's %d bytes", len(file), err, len(state))
	}
	_, err = ctx.SaveSequence(99)
	wantError(t, err, ErrNotFound)
	wantError(t, ctx.SaveSequenceFile(1, "bad\x00path"), ErrInvalidArgument, "NUL")

	// Restored in this context (from bytes and from the file) and in a
	// second one: the same length, selections and rows.
	if err := ctx.RestoreSequence(3, state); err != nil {
		t.Fatal(err)
	}
	if err := ctx.RestoreSequenceFile(4, path); err != nil {
		t.Fatal(err)
	}
	other := newRefContext(t)
	if err := other.RestoreSequence(1, state); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		ctx *Context
		seq uint64
	}{{ctx, 3}, {ctx, 4}, {other, 1}} {
		wantLength(r.ctx, r.seq, prompt+2)
		sel, k, v := selectAndFetch(t, r.ctx, r.seq, query)
		if !reflect.DeepEqual(sel, wantSel) {
			t.Fatalf("restored sequence %d selects %v, the saved one %v", r.seq, sel, wantSel)
		}
		if !reflect.DeepEqual(k, wantK) || !reflect.DeepEqual(v, wantV) {
			t.Fatalf("restored sequence %d fetches other rows than the saved one", r.seq)
		}
	}

	// Damaged states are refused and add nothing.
	count, _ := ctx.SequenceCount()
	flipped := append([]byte(nil), state...)
	flipped[len(flipped)/2] ^= 0xff
	wantError(t, ctx.RestoreSequence(5, flipped), ErrCorrupt)
	err = ctx.RestoreSequence(5, state[:len(state)/2])
	if !errorsIsAny(err, ErrCorrupt, ErrInvalidArgument) {
		t.Fatalf("a truncated state: %v", err)
	}
	if n, _ := ctx.SequenceCount(); n != count {
		t.Fatalf("%d sequences after failed restores, %d before", n, count)
	}
	wantError(t, ctx.RestoreSequence(3, state), ErrInvalidArgument)
	wantError(t, ctx.RestoreSequenceFile(5, path+".missing"), ErrNotFound)
}

func errorsIsAny(err error, statuses ...Status) bool {
	e, ok := err.(*Error)
	if !ok {
		return false
	}
	for _, s := range statuses {
		if e.Status == s {
			return true
		}
	}
	return false
}

func TestRestoreInPiecesSelectsBeforeTheKVArrive(t *testing.T) {
	ctx := newRefContext(t)
	addPrefilled(t, ctx, 1)
	query := TensorF32(refGenerate(71, refQHeads*refHeadDim), 1, refQHeads, refHeadDim)
	wantSel, wantK, wantV := selectAndFetch(t, ctx, 1, query)
	state, err := ctx.SaveSequence(1)
	if err != nil {
		t.Fatal(err)
	}

	// The description arrives first: grow the prefix until it is enough.
	other := newRefContext(t)
	prefix := uint64(0)
	var begun uint64
	for {
		begun, err = other.RestoreSequenceBegin(1, state[:prefix])
		if err == nil {
			break
		}
		wantError(t, err, ErrBufferTooSmall)
		needed := err.(*Error).Needed
		if needed <= prefix || needed > uint64(len(state)) {
			t.Fatalf("a prefix of %d bytes needs %d of %d", prefix, needed, len(state))
		}
		if n, _ := other.SequenceCount(); n != 0 {
			t.Fatalf("a short begin added a sequence")
		}
		prefix = needed
	}
	if begun == 0 || begun > prefix || begun >= uint64(len(state))/2 {
		t.Fatalf("began with %d bytes of %d (prefix %d)", begun, len(state), prefix)
	}
	if n, err := other.SequenceLength(1, 0); err != nil || n != statePrompt+4 {
		t.Fatalf("SequenceLength = %d, %v", n, err)
	}

	// It selects as the saved sequence does before any K/V; a fetch waits
	// for them.
	sels := selectOneByOne(t, other, []uint64{1}, []Tensor{query})
	if got := heads(sels[0]); !reflect.DeepEqual(got, wantSel) {
		t.Fatalf("before the K/V it selects %v, the saved one %v", got, wantSel)
	}
	keys, values := fetchOutputs(sels)
	it := fetchItems([]uint64{1}, sels, keys, values)[0]
	wantError(t, other.FetchKV(1, 0, it.Selection, it.Keys, it.Values), ErrBadState)

	// Then one section a call, each given all the rest; a short slice reads
	// nothing and says how many bytes the section needs.
	_, err = other.RestoreSequenceKV(1, state[begun:begun+4])
	wantError(t, err, ErrBufferTooSmall)
	if needed := err.(*Error).Needed; needed <= 4 {
		t.Fatalf("4 bytes of a K/V section need %d", needed)
	}
	at, sections := begun, 0
	for at < uint64(len(state)) {
		n, err := other.RestoreSequenceKV(1, state[at:])
		if err != nil {
			t.Fatalf("section %d at %d: %v", sections, at, err)
		}
		at += n
		sections++
	}
	if at != uint64(len(state)) || sections != 2 {
		t.Fatalf("%d sections read %d bytes of %d; want one layer's K/V and the end", sections, at, len(state))
	}
	_, err = other.RestoreSequenceKV(1, state[begun:])
	wantError(t, err, ErrBadState)

	sel, k, v := selectAndFetch(t, other, 1, query)
	if !reflect.DeepEqual(sel, wantSel) || !reflect.DeepEqual(k, wantK) || !reflect.DeepEqual(v, wantV) {
		t.Fatalf("after the K/V arrived it selects or fetches other than the saved sequence")
	}
}
