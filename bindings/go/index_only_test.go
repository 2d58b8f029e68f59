package pqcache

import (
	"math/rand"
	"reflect"
	"sort"
	"testing"
)

// The index-only tier (KVTierCaller), paged keys and the multi-token
// select, as tests/test_api_index_only.cpp checks them in C: an index-only
// context selects what a host-tier context with the same keys selects.

const (
	ioQHeads  = refQHeads
	ioKVHeads = refKVHeads
	ioHeadDim = 32
	ioPrompt  = 1500
	ioSeq     = 3
)

func indexOnlyConfig(tier KVTier) Config {
	c := refConfig() // f32, 1 layer, 4 q heads, 2 kv heads, 8 K-Means iterations
	c.HeadDim = ioHeadDim
	c.PQSubspaces, c.PQBits = 0, 0 // the defaults for head_dim 32
	c.TopKTokens = 40
	c.LocalTokens = 64
	c.WorkerThreads = 2
	c.KVTier = tier
	return c
}

func newIndexOnlyContext(t *testing.T, tier KVTier) *Context {
	t.Helper()
	ctx, err := NewContext(indexOnlyConfig(tier))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	if err := ctx.AddSequence(ioSeq); err != nil {
		t.Fatal(err)
	}
	return ctx
}

// normal is n standard-normal floats times scale.
func normal(n int, seed int64, scale float64) []float32 {
	r := rand.New(rand.NewSource(seed))
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(r.NormFloat64() * scale)
	}
	return out
}

// structuredKeys are [token][kv head][dim] keys with structure (a few
// directions per head plus noise), so that the index has clusters to find.
func structuredKeys(tokens int, seed int64) []float32 {
	keys := normal(tokens*ioKVHeads*ioHeadDim, seed, 0.3)
	dirs := normal(8*ioHeadDim, seed+1, 1)
	for t := 0; t < tokens; t++ {
		for h := 0; h < ioKVHeads; h++ {
			for d := 0; d < ioHeadDim; d++ {
				keys[(t*ioKVHeads+h)*ioHeadDim+d] += dirs[((t*7+h)%8)*ioHeadDim+d]
			}
		}
	}
	return keys
}

func keyRows(keys []float32, first, count int) Tensor {
	row := ioKVHeads * ioHeadDim
	return TensorF32(keys[first*row:(first+count)*row], count, ioKVHeads, ioHeadDim)
}

// selectOne is every kv head's selection for one query token.
func selectOne(t *testing.T, ctx *Context, query []float32) [][]int32 {
	t.Helper()
	sel, err := ctx.DecodeSelect(ioSeq, 0, TensorF32(query, 1, ioQHeads, ioHeadDim))
	if err != nil {
		t.Fatal(err)
	}
	return heads(sel)
}

// blockPool is the engine's pool: tokens positions scattered over blocks in
// a shuffled order, with spare blocks (filled with 99) around them.
type blockPool struct {
	blockSize int
	table     []int32
	slots     []int64
	data      []float32
	tokens    int // the pool's slots
}

func newBlockPool(keys []float32, tokens int, seed int64) *blockPool {
	p := &blockPool{blockSize: 16}
	blocks := (tokens + p.blockSize - 1) / p.blockSize
	poolBlocks := 2*blocks + 3
	order := rand.New(rand.NewSource(seed)).Perm(poolBlocks)
	for _, b := range order[:blocks] {
		p.table = append(p.table, int32(b))
	}
	p.tokens = poolBlocks * p.blockSize
	row := ioKVHeads * ioHeadDim
	p.data = make([]float32, p.tokens*row)
	for i := range p.data {
		p.data[i] = 99
	}
	for pos := 0; pos < tokens; pos++ {
		slot := int(p.table[pos/p.blockSize])*p.blockSize + pos%p.blockSize
		p.slots = append(p.slots, int64(slot))
		copy(p.data[slot*row:(slot+1)*row], keys[pos*row:(pos+1)*row])
	}
	return p
}

func (p *blockPool) byBlocks(tokens int) PagedKeys {
	return PagedKeys{Pool: TensorF32(p.data, p.tokens, ioKVHeads, ioHeadDim),
		BlockTable: p.table, BlockSize: p.blockSize, Tokens: tokens}
}

func (p *blockPool) bySlots(tokens int) PagedKeys {
	return PagedKeys{Pool: TensorF32(p.data, p.tokens, ioKVHeads, ioHeadDim),
		Slots: p.slots, Tokens: tokens}
}

func TestIndexOnlyDenseAndPagedKeysSelectWhatTheHostTierSelects(t *testing.T) {
	const decode = 24
	keys := structuredKeys(ioPrompt+decode, 11)
	pool := newBlockPool(keys, ioPrompt+decode, 5)
	host := newIndexOnlyContext(t, KVTierHost)
	dense := newIndexOnlyContext(t, KVTierCaller)
	blocks := newIndexOnlyContext(t, KVTierCaller)
	slots := newIndexOnlyContext(t, KVTierCaller)
	if got := dense.Config().KVTier; got != KVTierCaller {
		t.Fatalf("effective KVTier %v", got)
	}
	prompt := keyRows(keys, 0, ioPrompt)
	must(t, host.PrefillLayer(ioSeq, 0, prompt, prompt))
	must(t, dense.PrefillLayer(ioSeq, 0, prompt, Tensor{})) // no values: index only
	must(t, blocks.PrefillLayerPaged(ioSeq, 0, pool.byBlocks(ioPrompt)))
	must(t, slots.PrefillLayerPaged(ioSeq, 0, pool.bySlots(ioPrompt)))
	selected := 0
	for step := 0; step < decode; step++ {
		query := normal(ioQHeads*ioHeadDim, int64(100+step), 1)
		want := selectOne(t, host, query)
		for name, ctx := range map[string]*Context{"dense": dense, "blocks": blocks, "slots": slots} {
			if got := selectOne(t, ctx, query); !reflect.DeepEqual(got, want) {
				t.Fatalf("step %d: %s keys select %v, the host tier %v", step, name, got, want)
			}
		}
		for _, row := range want {
			selected += len(row)
		}
		one := keyRows(keys, ioPrompt+step, 1)
		must(t, host.DecodeAppend(ioSeq, 0, one, one))
		must(t, dense.DecodeAppend(ioSeq, 0, one, Tensor{}))
		must(t, blocks.DecodeAppendPaged(ioSeq, 0, pool.byBlocks(1)))
		must(t, slots.DecodeAppendPaged(ioSeq, 0, pool.bySlots(1)))
	}
	if selected == 0 {
		t.Error("nothing was selected")
	}
	if n, err := blocks.SequenceLength(ioSeq, 0); err != nil || n != ioPrompt+decode {
		t.Errorf("SequenceLength = %d, %v; want %d", n, err, ioPrompt+decode)
	}
}

func TestIndexOnlyRefusesWhatNeedsKV(t *testing.T) {
	keys := structuredKeys(600, 16)
	ctx := newIndexOnlyContext(t, KVTierCaller)
	must(t, ctx.PrefillLayer(ioSeq, 0, keyRows(keys, 0, 600), Tensor{}))
	query := normal(ioQHeads*ioHeadDim, 1, 1)
	sel, err := ctx.DecodeSelect(ioSeq, 0, TensorF32(query, 1, ioQHeads, ioHeadDim))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, ioKVHeads*sel.Capacity*ioHeadDim)
	rows := TensorF32(out, sel.Capacity, ioKVHeads, ioHeadDim).HeadMajor()
	wantError(t, ctx.FetchKV(ioSeq, 0, sel, rows, rows), ErrUnsupported, "index-only")
	_, _, err = ctx.DecodeAttend(ioSeq, 0, TensorF32(query, 1, ioQHeads, ioHeadDim), sel, 0)
	wantError(t, err, ErrUnsupported, "index-only")

	// Paged keys need an index-only context: one that stores K/V needs the values.
	host := newIndexOnlyContext(t, KVTierHost)
	pool := newBlockPool(keys, 600, 3)
	wantError(t, host.PrefillLayerPaged(ioSeq, 0, pool.byBlocks(100)), ErrUnsupported, "values")
	// A bad map is named, and nothing is stored.
	fresh := newIndexOnlyContext(t, KVTierCaller)
	both := pool.byBlocks(100)
	both.Slots = pool.slots
	wantError(t, fresh.PrefillLayerPaged(ioSeq, 0, both), ErrInvalidArgument, "block_table")
	bad := pool.bySlots(100)
	bad.Slots = append([]int64(nil), pool.slots...)
	bad.Slots[7] = -1
	wantError(t, fresh.PrefillLayerPaged(ioSeq, 0, bad), ErrInvalidArgument, "slots[7]")
	wantError(t, fresh.PrefillLayerPaged(ioSeq, 0, pool.bySlots(601)), ErrInvalidArgument, "not mapped")
	if n, err := fresh.SequenceLength(ioSeq, 0); err != nil || n != 0 {
		t.Errorf("a refused call stored %d tokens (%v)", n, err)
	}
	// A pool shorter than its shape is caught before the library reads it.
	short := pool.byBlocks(100)
	short.Pool.length = 10
	wantError(t, fresh.PrefillLayerPaged(ioSeq, 0, short), ErrInvalidArgument, "keys.pool.data")
}

func TestDecodeSelectMultiRows(t *testing.T) {
	const n, tokens = 1800, 3
	keys := structuredKeys(n, 18)
	for _, tier := range []KVTier{KVTierHost, KVTierCaller} {
		ctx := newIndexOnlyContext(t, tier)
		values := Tensor{}
		if tier == KVTierHost {
			values = keyRows(keys, 0, n)
		}
		must(t, ctx.PrefillLayer(ioSeq, 0, keyRows(keys, 0, n), values))
		queries := normal(tokens*ioQHeads*ioHeadDim, 21, 1)
		var single [][][]int32 // [token][kv head]
		for q := 0; q < tokens; q++ {
			single = append(single, selectOne(t, ctx, queries[q*ioQHeads*ioHeadDim:(q+1)*ioQHeads*ioHeadDim]))
		}
		qt := TensorF32(queries, tokens, ioQHeads, ioHeadDim)
		for _, form := range []SelectRows{RowsPerToken, RowsPerHead, RowsPerRequest} {
			var want [][]int32
			switch form {
			case RowsPerToken:
				for _, token := range single {
					want = append(want, token...)
				}
			case RowsPerHead:
				for h := 0; h < ioKVHeads; h++ {
					var rows [][]int32
					for _, token := range single {
						rows = append(rows, token[h])
					}
					want = append(want, union(rows...))
				}
			case RowsPerRequest:
				var rows [][]int32
				for _, token := range single {
					rows = append(rows, token...)
				}
				want = [][]int32{union(rows...)}
			}
			nrows, capacity, err := ctx.SelectionCapacityMulti(ioSeq, 0, tokens, form)
			if err != nil {
				t.Fatal(err)
			}
			sel, err := ctx.DecodeSelectMulti(ioSeq, 0, qt, form, nil)
			if err != nil {
				t.Fatal(err)
			}
			if nrows != len(want) || sel.Rows() != nrows || sel.Capacity != capacity {
				t.Fatalf("tier %v form %v: %d rows of capacity %d (capacity call: %d, %d), want %d rows",
					tier, form, sel.Rows(), sel.Capacity, nrows, capacity, len(want))
			}
			for r := 0; r < sel.Rows(); r++ {
				if got := sel.Row(r); !reflect.DeepEqual(got, want[r]) {
					t.Errorf("tier %v form %v row %d: %v, want %v", tier, form, r, got, want[r])
				}
				for i := int(sel.Counts[r]); i < sel.Capacity; i++ {
					if p := sel.Positions[r*sel.Capacity+i]; p != -1 {
						t.Fatalf("tier %v form %v row %d: padding %d at %d, want -1", tier, form, r, p, i)
					}
				}
			}
		}
		_, err := ctx.DecodeSelectMulti(ioSeq, 0, qt, SelectRows(3), nil)
		wantError(t, err, ErrInvalidArgument, "rows")
	}
}

// union is the sorted union of ascending rows.
func union(rows ...[]int32) []int32 {
	seen := map[int32]bool{}
	var out []int32
	for _, row := range rows {
		for _, p := range row {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func TestKVHeadOffsetRoundTrips(t *testing.T) {
	c := indexOnlyConfig(KVTierHost)
	c.KVHeadOffset = 6
	ctx, err := NewContext(c)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	if got := ctx.Config().KVHeadOffset; got != 6 {
		t.Errorf("effective KVHeadOffset %d, want 6", got)
	}
	if got := DefaultConfig().KVHeadOffset; got != 0 {
		t.Errorf("default KVHeadOffset %d, want 0", got)
	}
	c.KVHeadOffset = 65535 // + 2 kv heads is past 65536
	_, err = NewContext(c)
	wantError(t, err, ErrInvalidArgument, "kv_head_offset")
	c.KVHeadOffset = 1 << 31 // would wrap in the int32 field
	_, err = NewContext(c)
	wantError(t, err, ErrInvalidArgument, "config.kv_head_offset is 2147483648")
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
