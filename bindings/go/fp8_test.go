package pqcache

import (
	"bytes"
	"testing"
)

// fp8Config is an e4m3 context with one scale per layer for K and for V.
func fp8Config(scales []float32) Config {
	c := refConfig()
	c.DType = DTypeFP8E4M3
	c.Selector = SelectorExact
	c.KVScaleCount = 1
	c.KVScales = scales
	return c
}

func TestFP8CodesComeBackAsStored(t *testing.T) {
	const tokens = 300
	ctx, err := NewContext(fp8Config([]float32{0.5, 2}))
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	if eff := ctx.Config(); eff.DType != DTypeFP8E4M3 || eff.KVScaleCount != 1 ||
		len(eff.KVScales) != 2 || eff.KVScales[0] != 0.5 || eff.KVScales[1] != 2 {
		t.Errorf("effective DType %v, KVScaleCount %d, KVScales %v", eff.DType, eff.KVScaleCount, eff.KVScales)
	}
	n := tokens * refKVHeads * refHeadDim
	keys, values := make([]uint8, n), make([]uint8, n)
	for i := range keys { // finite e4m3 codes (0x7F and 0xFF are NaN)
		keys[i], values[i] = uint8(i%0x7F), 0x80|uint8((i*7)%0x7F)
	}
	if err := ctx.AddSequence(1); err != nil {
		t.Fatal(err)
	}
	if err := ctx.PrefillLayer(1, 0, TensorFP8(keys, DTypeFP8E4M3, tokens, refKVHeads, refHeadDim),
		TensorFP8(values, DTypeFP8E4M3, tokens, refKVHeads, refHeadDim)); err != nil {
		t.Fatal(err)
	}
	query := make([]float32, refQHeads*refHeadDim) // queries stay f32
	for i := range query {
		query[i] = float32(i%5) * 0.1
	}
	sel, err := ctx.DecodeSelect(1, 0, TensorF32(query, 1, refQHeads, refHeadDim))
	if err != nil {
		t.Fatal(err)
	}
	outK := make([]uint8, refKVHeads*sel.Capacity*refHeadDim)
	outV := make([]uint8, len(outK))
	if err := ctx.FetchKV(1, 0, sel, TensorFP8(outK, DTypeFP8E4M3, sel.Capacity, refKVHeads, refHeadDim).HeadMajor(),
		TensorFP8(outV, DTypeFP8E4M3, sel.Capacity, refKVHeads, refHeadDim).HeadMajor()); err != nil {
		t.Fatal(err)
	}
	// The codes expected at each selected row; rows past a head's count stay 0.
	wantK, wantV := make([]uint8, len(outK)), make([]uint8, len(outV))
	for h := 0; h < sel.Heads(); h++ {
		for i, p := range sel.Head(h) {
			row, from := (h*sel.Capacity+i)*refHeadDim, (int(p)*refKVHeads+h)*refHeadDim
			copy(wantK[row:row+refHeadDim], keys[from:])
			copy(wantV[row:row+refHeadDim], values[from:])
		}
	}
	if !bytes.Equal(outK, wantK) || !bytes.Equal(outV, wantV) {
		t.Fatalf("fetched codes differ from the stored ones:\nK %v\nwant %v", outK, wantK)
	}
}

func TestFP8ScalesAreChecked(t *testing.T) {
	_, err := NewContext(fp8Config([]float32{0.5, -1}))
	wantError(t, err, ErrInvalidArgument, "kv_scales[1]")
	c := fp8Config([]float32{0.5, 1})
	c.DType = DTypeF16
	_, err = NewContext(c)
	wantError(t, err, ErrInvalidArgument, "fp8 dtypes only")
	_, err = NewContext(fp8Config(nil))
	wantError(t, err, ErrInvalidArgument, "kv_scales is NULL")
}
