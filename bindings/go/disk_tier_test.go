package pqcache

import (
	"testing"
)

// diskTierConfig is a disk tier context whose sequences spill past the sink
// (4), the local window (16) and one 256-token chunk at 600 tokens, and
// whose selections hold every token (the exact selector, k = all).
func diskTierConfig(dir string) Config {
	c := refConfig()
	c.Selector = SelectorExact
	c.TopKTokens = 600
	c.KVTier = KVTierDisk
	c.KVDiskPath = dir
	return c
}

func TestDiskTierRowsComeBackAsPrefilled(t *testing.T) {
	const tokens = 600
	ctx, err := NewContext(diskTierConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	if eff := ctx.Config(); eff.KVTier != KVTierDisk || eff.KVDiskPath != "" {
		t.Errorf("effective KVTier %v, KVDiskPath %q", eff.KVTier, eff.KVDiskPath)
	}
	n := tokens * refKVHeads * refHeadDim
	keys, values := make([]float32, n), make([]float32, n)
	for i := range keys {
		keys[i], values[i] = float32(i)*0.001, -float32(i)*0.002
	}
	if err := ctx.AddSequence(1); err != nil {
		t.Fatal(err)
	}
	if err := ctx.PrefillLayer(1, 0, TensorF32(keys, tokens, refKVHeads, refHeadDim),
		TensorF32(values, tokens, refKVHeads, refHeadDim)); err != nil {
		t.Fatal(err)
	}
	query := make([]float32, refQHeads*refHeadDim)
	for i := range query {
		query[i] = 0.1
	}
	sel, err := ctx.DecodeSelect(1, 0, TensorF32(query, 1, refQHeads, refHeadDim))
	if err != nil {
		t.Fatal(err)
	}
	outK := make([]float32, refKVHeads*sel.Capacity*refHeadDim)
	outV := make([]float32, len(outK))
	if err := ctx.FetchKV(1, 0, sel, TensorF32(outK, sel.Capacity, refKVHeads, refHeadDim).HeadMajor(),
		TensorF32(outV, sel.Capacity, refKVHeads, refHeadDim).HeadMajor()); err != nil {
		t.Fatal(err)
	}
	for h := 0; h < sel.Heads(); h++ {
		if len(sel.Head(h)) != tokens {
			t.Fatalf("kv head %d selects %d tokens, want all %d", h, len(sel.Head(h)), tokens)
		}
		for i, p := range sel.Head(h) {
			got, want := (h*sel.Capacity+i)*refHeadDim, (int(p)*refKVHeads+h)*refHeadDim
			for d := 0; d < refHeadDim; d++ {
				if outK[got+d] != keys[want+d] || outV[got+d] != values[want+d] {
					t.Fatalf("token %d, kv head %d, dim %d: K %v V %v, want %v %v", p, h, d,
						outK[got+d], outV[got+d], keys[want+d], values[want+d])
				}
			}
		}
	}
}

func TestDiskTierNeedsADirectory(t *testing.T) {
	_, err := NewContext(diskTierConfig(""))
	wantError(t, err, ErrInvalidArgument, "kv_disk_path")
	_, err = NewContext(diskTierConfig("dir\x00ectory"))
	wantMessage(t, err, ErrInvalidArgument, "pq_create",
		`pq_create: config.kv_disk_path is "dir\x00ectory"; expected a path without NUL bytes`)
}
