package pqcache

import (
	"math"
	"testing"
)

// tailContexts makes two reference contexts holding the same 300 tokens
// (streams seed, seed+1), without the estimate (off) and with it (on), and
// the query of stream seed+2.
func tailContexts(t *testing.T, seed uint32) (off, on *Context, query Tensor) {
	t.Helper()
	const tokens = 300
	kv := tokens * refKVHeads * refHeadDim
	keys := TensorF32(refGenerate(seed, kv), tokens, refKVHeads, refHeadDim)
	values := TensorF32(refGenerate(seed+1, kv), tokens, refKVHeads, refHeadDim)
	var made [2]*Context
	for i, tail := range []TailEstimate{TailNone, TailCodeMeans} {
		c := refConfig()
		c.TailEstimate = tail
		ctx, err := NewContext(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ctx.Close() })
		if got := ctx.Config().TailEstimate; got != tail {
			t.Fatalf("Config().TailEstimate = %d, want %d", got, tail)
		}
		if err := ctx.AddSequence(1); err != nil {
			t.Fatal(err)
		}
		if err := ctx.PrefillLayer(1, 0, keys, values); err != nil {
			t.Fatal(err)
		}
		made[i] = ctx
	}
	return made[0], made[1], TensorF32(refGenerate(seed+2, refQHeads*refHeadDim), 1, refQHeads, refHeadDim)
}

// TailCodeMeans (0.12): DecodeAttend adds an estimate of the middle tokens
// the selection leaves out, so every query head's log-sum-exp grows past
// the selected rows' own, and the output moves; it needs SelectorPQ.
func TestTailEstimateAddsTheLeftOutTokens(t *testing.T) {
	off, on, query := tailContexts(t, 51)
	sel, err := on.DecodeSelect(1, 0, query)
	if err != nil {
		t.Fatal(err)
	}
	rows, rowsLSE, err := off.DecodeAttend(1, 0, query, sel, 0)
	if err != nil {
		t.Fatal(err)
	}
	whole, wholeLSE, err := on.DecodeAttend(1, 0, query, sel, 0)
	if err != nil {
		t.Fatal(err)
	}
	for q := range rowsLSE {
		if !(wholeLSE[q] > rowsLSE[q]) {
			t.Errorf("query head %d: lse with the estimate %g, not above the rows' own %g", q, wholeLSE[q], rowsLSE[q])
		}
	}
	moved := false
	for i := range rows {
		moved = moved || rows[i] != whole[i]
	}
	if !moved {
		t.Error("the estimate left the output as it was")
	}

	c := refConfig()
	c.TailEstimate = TailCodeMeans
	c.Selector = SelectorExact
	_, err = NewContext(c)
	wantError(t, err, ErrInvalidArgument, "tail_estimate", "PQ_SELECTOR_PQ")
}

// DecodeTail (pq_decode_tail): the tail alone, merged as its comment says
// with the caller's own attention over the selected rows, is DecodeAttend's
// result with the estimate.
func TestDecodeTailMergesIntoDecodeAttend(t *testing.T) {
	off, on, query := tailContexts(t, 61)
	sel, err := on.DecodeSelect(1, 0, query)
	if err != nil {
		t.Fatal(err)
	}
	whole, wholeLSE, err := on.DecodeAttend(1, 0, query, sel, 0)
	if err != nil {
		t.Fatal(err)
	}
	rows, rowsLSE, err := off.DecodeAttend(1, 0, query, sel, 0)
	if err != nil {
		t.Fatal(err)
	}
	tail, tailLSE, err := on.DecodeTail(1, 0, query, sel, 0)
	if err != nil {
		t.Fatal(err)
	}
	for q := 0; q < refQHeads; q++ {
		m := math.Max(float64(rowsLSE[q]), float64(tailLSE[q]))
		wa, wt := math.Exp(float64(rowsLSE[q])-m), math.Exp(float64(tailLSE[q])-m)
		if got := m + math.Log(wa+wt); math.Abs(got-float64(wholeLSE[q])) > 1e-4 {
			t.Errorf("query head %d: merged lse %g, DecodeAttend's %g", q, got, wholeLSE[q])
		}
		for d := 0; d < refHeadDim; d++ {
			i := q*refHeadDim + d
			got := (wa*float64(rows[i]) + wt*float64(tail[i])) / (wa + wt)
			if math.Abs(got-float64(whole[i])) > 1e-4 {
				t.Fatalf("out[%d]: merged %g, DecodeAttend's %g", i, got, whole[i])
			}
		}
	}
	_, _, err = off.DecodeTail(1, 0, query, sel, 0)
	wantError(t, err, ErrBadState, "pq_decode_tail", "tail_estimate")
}
