package pqcache

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// The cycle of tests/reference_cycle.c, repeated in Go; that file's header
// describes the generator, the configuration and the output format.

const (
	refTokens  = 256
	refQHeads  = 4
	refKVHeads = 2
	refHeadDim = 16
)

func refConfig() Config {
	c := DefaultConfig()
	c.DType = DTypeF32
	c.NumLayers = 1
	c.NumQHeads = refQHeads
	c.NumKVHeads = refKVHeads
	c.HeadDim = refHeadDim
	c.PQSubspaces = 2
	c.PQBits = 4
	c.KMeansIterations = 8
	c.SinkTokens = 4
	c.LocalTokens = 16
	c.TopKTokens = 16
	c.Seed = 7
	c.WorkerThreads = 1
	return c
}

// refValue is value(stream, i) of reference_cycle.c: 32-bit unsigned
// arithmetic, exact in float32.
// refSelectOnce opens a context of c, prefills layer 0 of sequence 1 with
// `tokens` tokens (streams seed and seed+1 for K and V) and selects once
// with a query from stream seed+2. The caller closes the context.
func refSelectOnce(t *testing.T, c Config, tokens int, seed uint32) (*Context, *Selection) {
	t.Helper()
	kv := tokens * refKVHeads * refHeadDim
	keys := TensorF32(refGenerate(seed, kv), tokens, refKVHeads, refHeadDim)
	values := TensorF32(refGenerate(seed+1, kv), tokens, refKVHeads, refHeadDim)
	query := TensorF32(refGenerate(seed+2, refQHeads*refHeadDim), 1, refQHeads, refHeadDim)
	ctx, err := NewContext(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctx.AddSequence(1); err != nil {
		ctx.Close()
		t.Fatal(err)
	}
	if err := ctx.PrefillLayer(1, 0, keys, values); err != nil {
		ctx.Close()
		t.Fatal(err)
	}
	sel, err := ctx.DecodeSelect(1, 0, query)
	if err != nil {
		ctx.Close()
		t.Fatal(err)
	}
	return ctx, sel
}

func refValue(stream, i uint32) float32 {
	h := i*2654435761 + stream*97531
	h ^= h >> 15
	h *= 2246822519
	h ^= h >> 13
	return float32(h>>8)/16777216.0 - 0.5
}

func refGenerate(stream uint32, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = refValue(stream, uint32(i))
	}
	return out
}

func fnv1a(h uint64, rows []float32) uint64 {
	for _, f := range rows {
		bits := math.Float32bits(f)
		for b := 0; b < 4; b++ { // little-endian bytes, as the C program hashes memory
			h ^= uint64(byte(bits >> (8 * b)))
			h *= 0x100000001b3
		}
	}
	return h
}

// runCycle prefills seq and runs `steps` decode steps (append one token,
// select, fetch), writing the reference program's output lines for each
// step. Streams are numbered from base: prefill keys base+1, values base+2;
// step s appends keys base+3+3s, values base+4+3s and queries with
// base+5+3s. With base 0 and one step it is exactly reference_cycle.c.
func runCycle(ctx *Context, seq uint64, base uint32, steps int) (string, error) {
	var out strings.Builder
	if err := ctx.AddSequence(seq); err != nil {
		return "", err
	}
	kv := refTokens * refKVHeads * refHeadDim
	err := ctx.PrefillLayer(seq, 0,
		TensorF32(refGenerate(base+1, kv), refTokens, refKVHeads, refHeadDim),
		TensorF32(refGenerate(base+2, kv), refTokens, refKVHeads, refHeadDim))
	if err != nil {
		return "", err
	}
	for s := uint32(0); s < uint32(steps); s++ {
		err := ctx.DecodeAppend(seq, 0,
			TensorF32(refGenerate(base+3+3*s, refKVHeads*refHeadDim), 1, refKVHeads, refHeadDim),
			TensorF32(refGenerate(base+4+3*s, refKVHeads*refHeadDim), 1, refKVHeads, refHeadDim))
		if err != nil {
			return "", err
		}
		query := TensorF32(refGenerate(base+5+3*s, refQHeads*refHeadDim), 1, refQHeads, refHeadDim)
		sel, err := ctx.DecodeSelect(seq, 0, query)
		if err != nil {
			return "", err
		}
		keys := make([]float32, refKVHeads*sel.Capacity*refHeadDim)
		values := make([]float32, len(keys))
		err = ctx.FetchKV(seq, 0, sel,
			TensorF32(keys, sel.Capacity, refKVHeads, refHeadDim).HeadMajor(),
			TensorF32(values, sel.Capacity, refKVHeads, refHeadDim).HeadMajor())
		if err != nil {
			return "", err
		}

		fmt.Fprintf(&out, "capacity %d\n", sel.Capacity)
		hk, hv := uint64(0xcbf29ce484222325), uint64(0xcbf29ce484222325)
		for h := 0; h < sel.Heads(); h++ {
			fmt.Fprintf(&out, "head %d count %d positions", h, sel.Counts[h])
			for _, p := range sel.Head(h) {
				fmt.Fprintf(&out, " %d", p)
			}
			out.WriteString("\n")
			rows := h * sel.Capacity * refHeadDim
			n := int(sel.Counts[h]) * refHeadDim
			hk = fnv1a(hk, keys[rows:rows+n])
			hv = fnv1a(hv, values[rows:rows+n])
		}
		fmt.Fprintf(&out, "keys_fnv1a 0x%016x\nvalues_fnv1a 0x%016x\n", hk, hv)
	}
	return out.String(), nil
}

// referenceOutput runs tests/reference_cycle.c, whose path CTest passes in
// $PQ_REFERENCE_CYCLE.
func referenceOutput(t *testing.T) string {
	t.Helper()
	path := os.Getenv("PQ_REFERENCE_CYCLE")
	if path == "" {
		t.Fatal("PQ_REFERENCE_CYCLE is not set: run this test through ctest (test go_binding), " +
			"or set it to the built tests/pq_reference_cycle")
	}
	out, err := exec.Command(path).Output()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return string(out)
}

func TestReferenceCycleMatchesC(t *testing.T) {
	want := referenceOutput(t)
	ctx, err := NewContext(refConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	got, err := runCycle(ctx, 1, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("Go cycle differs from reference_cycle.c\n--- C:\n%s--- Go:\n%s", want, got)
	}
	// The output must say something: 2 heads, each with sinks, top-k and
	// local tokens (4 + 16 + 16 of 257).
	if !strings.Contains(got, "capacity 36\n") || !strings.Contains(got, "head 1 count 36 ") {
		t.Fatalf("unexpected selection sizes:\n%s", got)
	}

	stats, err := ctx.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if stats.Sequences != 1 || stats.SelectCalls != 1 || stats.FetchCalls != 1 ||
		stats.BytesFetched != 2*2*36*refHeadDim*4 {
		t.Errorf("stats after one cycle: %+v", stats)
	}
	info, err := ctx.LayerInfo(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if info.Tokens != refTokens+1 || info.PrefillTokens != refTokens || !info.IndexReady ||
		info.KMeansIterations < 1 || info.KMeansIterations > 8 {
		t.Errorf("layer info after one cycle: %+v", info)
	}
	if n, err := ctx.SequenceLength(1, 0); err != nil || n != refTokens+1 {
		t.Errorf("SequenceLength = %d, %v; want %d", n, err, refTokens+1)
	}
}

// Two sequences driven from two goroutines at once, several decode steps
// each, must give each sequence the result it gets alone.
func TestConcurrentSequences(t *testing.T) {
	const steps = 16
	bases := []uint32{0, 100}

	alone := make([]string, len(bases))
	for i, base := range bases {
		ctx, err := NewContext(refConfig())
		if err != nil {
			t.Fatal(err)
		}
		alone[i], err = runCycle(ctx, uint64(i+1), base, steps)
		ctx.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	// The first step of base 0 is the C reference: the expectation itself
	// is anchored to the C program.
	if want := referenceOutput(t); !strings.HasPrefix(alone[0], want) {
		t.Fatalf("sequential run does not start with the reference output:\n%s", alone[0])
	}
	if alone[0] == alone[1] {
		t.Fatal("the two sequences' data should differ")
	}

	cfg := refConfig()
	cfg.WorkerThreads = 2 // builds of both sequences may run at once
	ctx, err := NewContext(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	together := make([]string, len(bases))
	errs := make([]error, len(bases))
	var wg sync.WaitGroup
	for i, base := range bases {
		wg.Add(1)
		go func(i int, base uint32) {
			defer wg.Done()
			together[i], errs[i] = runCycle(ctx, uint64(i+1), base, steps)
		}(i, base)
	}
	wg.Wait()
	for i := range bases {
		if errs[i] != nil {
			t.Fatalf("sequence %d: %v", i+1, errs[i])
		}
		if together[i] != alone[i] {
			t.Errorf("sequence %d differs when run concurrently\n--- alone:\n%s--- together:\n%s",
				i+1, alone[i], together[i])
		}
	}
	if n, err := ctx.SequenceCount(); err != nil || n != 2 {
		t.Errorf("SequenceCount = %d, %v; want 2", n, err)
	}
}
