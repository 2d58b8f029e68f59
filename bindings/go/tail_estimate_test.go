package pqcache

import "testing"

// TailCodeMeans (0.12): DecodeAttend adds an estimate of the middle tokens
// the selection leaves out, so every query head's log-sum-exp grows past
// the selected rows' own, and the output moves; it needs SelectorPQ.
func TestTailEstimateAddsTheLeftOutTokens(t *testing.T) {
	const tokens = 300
	kv := tokens * refKVHeads * refHeadDim
	keys := TensorF32(refGenerate(51, kv), tokens, refKVHeads, refHeadDim)
	values := TensorF32(refGenerate(52, kv), tokens, refKVHeads, refHeadDim)
	query := TensorF32(refGenerate(53, refQHeads*refHeadDim), 1, refQHeads, refHeadDim)
	var outs [2][]float32
	var lses [2][]float32
	var sel *Selection
	for i, tail := range []TailEstimate{TailNone, TailCodeMeans} {
		c := refConfig()
		c.TailEstimate = tail
		ctx, err := NewContext(c)
		if err != nil {
			t.Fatal(err)
		}
		defer ctx.Close()
		if got := ctx.Config().TailEstimate; got != tail {
			t.Fatalf("Config().TailEstimate = %d, want %d", got, tail)
		}
		if err := ctx.AddSequence(1); err != nil {
			t.Fatal(err)
		}
		if err := ctx.PrefillLayer(1, 0, keys, values); err != nil {
			t.Fatal(err)
		}
		if sel == nil {
			if sel, err = ctx.DecodeSelect(1, 0, query); err != nil {
				t.Fatal(err)
			}
		}
		if outs[i], lses[i], err = ctx.DecodeAttend(1, 0, query, sel, 0); err != nil {
			t.Fatal(err)
		}
	}
	moved := false
	for q := range lses[0] {
		if !(lses[1][q] > lses[0][q]) {
			t.Errorf("query head %d: lse with the estimate %g, not above the rows' own %g", q, lses[1][q], lses[0][q])
		}
	}
	for i := range outs[0] {
		moved = moved || outs[0][i] != outs[1][i]
	}
	if !moved {
		t.Error("the estimate left the output as it was")
	}

	c := refConfig()
	c.TailEstimate = TailCodeMeans
	c.Selector = SelectorExact
	_, err := NewContext(c)
	wantError(t, err, ErrInvalidArgument, "tail_estimate", "PQ_SELECTOR_PQ")
}
