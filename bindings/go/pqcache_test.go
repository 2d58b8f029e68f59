package pqcache

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"libpqcache.org/pqcache/internal/pqswig"
)

func newRefContext(t *testing.T) *Context {
	t.Helper()
	ctx, err := NewContext(refConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	return ctx
}

// wantError checks that err is an *Error with the status and a message
// containing each of the fragments.
func wantError(t *testing.T, err error, status Status, fragments ...string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want *Error with %v, got %T %v", status, err, err)
	}
	if !errors.Is(err, status) || e.Status != status {
		t.Fatalf("want status %d, got %d: %v", status, e.Status, err)
	}
	if e.Message == "" || !strings.Contains(err.Error(), e.Message) {
		t.Fatalf("the error should carry the message: %q", err.Error())
	}
	for _, f := range fragments {
		if !strings.Contains(e.Message, f) {
			t.Errorf("message %q does not mention %q", e.Message, f)
		}
	}
}

func TestVersion(t *testing.T) {
	if Version() != pqswig.PQ_VERSION_STRING {
		t.Errorf("Version() = %q, header says %q", Version(), pqswig.PQ_VERSION_STRING)
	}
	if VersionNumber() != pqswig.PQ_VERSION_NUMBER {
		t.Errorf("VersionNumber() = %d, header says %d", VersionNumber(), pqswig.PQ_VERSION_NUMBER)
	}
}

// The Go constants are written out (Go constants cannot come from C at run
// time); they must stay equal to the header's values. The selectors are
// checked against the header itself, all of them (selector_test.go).
func TestConstantsMatchHeader(t *testing.T) {
	pairs := []struct {
		name      string
		got, want int
	}{
		{"OK", int(OK), int(pqswig.PQ_OK)},
		{"ErrInvalidArgument", int(ErrInvalidArgument), int(pqswig.PQ_ERR_INVALID_ARGUMENT)},
		{"ErrOutOfMemory", int(ErrOutOfMemory), int(pqswig.PQ_ERR_OUT_OF_MEMORY)},
		{"ErrBadState", int(ErrBadState), int(pqswig.PQ_ERR_BAD_STATE)},
		{"ErrNotFound", int(ErrNotFound), int(pqswig.PQ_ERR_NOT_FOUND)},
		{"ErrUnsupported", int(ErrUnsupported), int(pqswig.PQ_ERR_UNSUPPORTED)},
		{"ErrBackend", int(ErrBackend), int(pqswig.PQ_ERR_BACKEND)},
		{"ErrInternal", int(ErrInternal), int(pqswig.PQ_ERR_INTERNAL)},
		{"ErrBufferTooSmall", int(ErrBufferTooSmall), int(pqswig.PQ_ERR_BUFFER_TOO_SMALL)},
		{"ErrCorrupt", int(ErrCorrupt), int(pqswig.PQ_ERR_CORRUPT)},
		{"ErrIncompatible", int(ErrIncompatible), int(pqswig.PQ_ERR_INCOMPATIBLE)},
		{"DTypeF32", int(DTypeF32), int(pqswig.PQ_DTYPE_F32)},
		{"DTypeF16", int(DTypeF16), int(pqswig.PQ_DTYPE_F16)},
		{"DTypeBF16", int(DTypeBF16), int(pqswig.PQ_DTYPE_BF16)},
		{"TokenMajor", int(TokenMajor), int(pqswig.PQ_LAYOUT_TOKEN_MAJOR)},
		{"HeadMajor", int(HeadMajor), int(pqswig.PQ_LAYOUT_HEAD_MAJOR)},
		{"GQASumSoftmax", int(GQASumSoftmax), int(pqswig.PQ_GQA_SUM_SOFTMAX)},
		{"GQAMax", int(GQAMax), int(pqswig.PQ_GQA_MAX)},
		{"GQAMean", int(GQAMean), int(pqswig.PQ_GQA_MEAN)},
		{"KMeansInitRandom", int(KMeansInitRandom), int(pqswig.PQ_KMEANS_INIT_RANDOM)},
		{"KMeansInitKMeansPP", int(KMeansInitKMeansPP), int(pqswig.PQ_KMEANS_INIT_KMEANSPP)},
		{"BackendCPU", int(BackendCPU), int(pqswig.PQ_BACKEND_CPU)},
		{"BackendCUDA", int(BackendCUDA), int(pqswig.PQ_BACKEND_CUDA)},
		{"BackendAuto", int(BackendAuto), int(pqswig.PQ_BACKEND_AUTO)},
		{"CacheLRU", int(CacheLRU), int(pqswig.PQ_CACHE_LRU)},
		{"CacheLFU", int(CacheLFU), int(pqswig.PQ_CACHE_LFU)},
		{"RotaryNone", int(RotaryNone), int(pqswig.PQ_ROTARY_NONE)},
		{"RotaryHalf", int(RotaryHalf), int(pqswig.PQ_ROTARY_HALF)},
		{"RotaryInterleaved", int(RotaryInterleaved), int(pqswig.PQ_ROTARY_INTERLEAVED)},
		{"PoolingMax", int(PoolingMax), int(pqswig.PQ_POOLING_MAX)},
		{"PoolingAvg", int(PoolingAvg), int(pqswig.PQ_POOLING_AVG)},
		{"TailNone", int(TailNone), int(pqswig.PQ_TAIL_NONE)},
		{"TailCodeMeans", int(TailCodeMeans), int(pqswig.PQ_TAIL_CODE_MEANS)},
		{"KVTierHost", int(KVTierHost), int(pqswig.PQ_KV_TIER_HOST)},
		{"KVTierDisk", int(KVTierDisk), int(pqswig.PQ_KV_TIER_DISK)},
		{"KVTierCaller", int(KVTierCaller), int(pqswig.PQ_KV_TIER_CALLER)},
		{"RowsPerToken", int(RowsPerToken), int(pqswig.PQ_ROWS_PER_TOKEN)},
		{"RowsPerHead", int(RowsPerHead), int(pqswig.PQ_ROWS_PER_HEAD)},
		{"RowsPerRequest", int(RowsPerRequest), int(pqswig.PQ_ROWS_PER_REQUEST)},
	}
	for _, p := range pairs {
		if p.got != p.want {
			t.Errorf("%s = %d, header says %d", p.name, p.got, p.want)
		}
	}
	for _, s := range []struct {
		status Status
		name   string
	}{{ErrNotFound, "PQ_ERR_NOT_FOUND"}, {ErrCorrupt, "PQ_ERR_CORRUPT"}, {ErrIncompatible, "PQ_ERR_INCOMPATIBLE"}} {
		if !strings.HasPrefix(s.status.Error(), s.name) {
			t.Errorf("%s.Error() = %q", s.name, s.status.Error())
		}
	}
}

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	// The documented defaults, read through the generated layer.
	if c.DType != DTypeF16 || c.PQSubspaces != 0 || c.PQBits != 0 ||
		c.KeyRotary != RotaryNone || c.PQRerank != 0 || c.Pooling != PoolingMax || c.SinkTokens != 4 ||
		c.KVTier != KVTierHost || c.KVDiskPath != "" ||
		c.LocalTokens != 128 || c.TopKFraction != 0.2 || c.Selector != SelectorPQ ||
		c.Seed != 0x5eed || c.NumLayers != 0 {
		t.Errorf("DefaultConfig() = %+v", c)
	}
}

func TestCreateAndClose(t *testing.T) {
	ctx, err := NewContext(refConfig())
	if err != nil {
		t.Fatal(err)
	}
	eff := ctx.Config()
	if eff.NumKVHeads != refKVHeads || eff.TopKTokens != 16 || eff.WorkerThreads != 1 {
		t.Errorf("effective config: %+v", eff)
	}
	if b, err := ctx.Backend(); err != nil || b != BackendCPU {
		t.Errorf("Backend() = %v, %v", b, err)
	}
	if err := ctx.AddSequence(7); err != nil {
		t.Fatal(err)
	}
	if n, err := ctx.SequenceCount(); err != nil || n != 1 {
		t.Errorf("SequenceCount = %d, %v", n, err)
	}
	if err := ctx.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ctx.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	err = ctx.AddSequence(8)
	wantError(t, err, ErrBadState, "closed")
	// The status and text every binding gives a closed context.
	if e := err.(*Error); e.Message != "pq_sequence_add: the context is closed" || e.Op != "pq_sequence_add" {
		t.Errorf("closed context: Op %q, Message %q", e.Op, e.Message)
	}
	_, err = ctx.Stats()
	wantError(t, err, ErrBadState, "closed")
}

func TestCreateErrors(t *testing.T) {
	c := refConfig()
	c.NumQHeads = 3 // not a multiple of NumKVHeads = 2
	_, err := NewContext(c)
	wantError(t, err, ErrInvalidArgument, "num_q_heads")
	if e := err.(*Error); e.Op != "pq_create" {
		t.Errorf("Op = %q", e.Op)
	}

	_, err = NewContext(DefaultConfig()) // geometry not set
	wantError(t, err, ErrInvalidArgument)

	c = refConfig()
	c.PQBits = 9
	_, err = NewContext(c)
	wantError(t, err, ErrUnsupported, "pq_bits")

	// Caught in Go: the int32 field would wrap around to 0.
	c = refConfig()
	c.NumLayers = 1 << 32
	_, err = NewContext(c)
	wantError(t, err, ErrInvalidArgument, "pq_create: config.num_layers is 4294967296")
}

func TestCallErrors(t *testing.T) {
	ctx := newRefContext(t)

	wantError(t, ctx.RemoveSequence(42), ErrNotFound)
	_, err := ctx.SelectionCapacity(42, 0)
	wantError(t, err, ErrNotFound)

	if err := ctx.AddSequence(1); err != nil {
		t.Fatal(err)
	}
	wantError(t, ctx.AddSequence(1), ErrInvalidArgument)

	query := TensorF32(make([]float32, refQHeads*refHeadDim), 1, refQHeads, refHeadDim)
	_, err = ctx.DecodeSelect(1, 0, query)
	wantError(t, err, ErrBadState)

	row := make([]float32, refKVHeads*refHeadDim)
	one := TensorF32(row, 1, refKVHeads, refHeadDim)
	wantError(t, ctx.DecodeAppend(1, 0, one, one), ErrBadState)
	wantError(t, ctx.PrefillLayer(1, 5, one, one), ErrInvalidArgument, "layer")
	wantError(t, ctx.PrefillLayer(1, 1<<33, one, one), ErrInvalidArgument, "layer")

	// A slice shorter than its shape is refused before the library reads it.
	short := TensorF32(row[:refHeadDim], 1, refKVHeads, refHeadDim)
	wantError(t, ctx.PrefillLayer(1, 0, short, one), ErrInvalidArgument, "keys.data has 16 elements")
	empty := TensorF32(nil, 4, refKVHeads, refHeadDim)
	wantError(t, ctx.PrefillLayer(1, 0, one, empty), ErrInvalidArgument, "values")
	negative := TensorF32(row, -1, refKVHeads, refHeadDim)
	wantError(t, ctx.PrefillLayer(1, 0, negative, one), ErrInvalidArgument, "keys.tokens is -1")

	// Shapes and types the library refuses, with its own message.
	three := TensorF32(make([]float32, 3*refHeadDim), 1, 3, refHeadDim)
	wantError(t, ctx.PrefillLayer(1, 0, three, three), ErrInvalidArgument)
	half := TensorF16(make([]uint16, refKVHeads*refHeadDim), 1, refKVHeads, refHeadDim)
	wantError(t, ctx.PrefillLayer(1, 0, half, half), ErrInvalidArgument)

	// After a valid prefill, a hand-made selection that overstates its
	// counts is refused on the Go side (the library would read past it).
	kv := make([]float32, 64*refKVHeads*refHeadDim)
	for i := range kv {
		kv[i] = refValue(9, uint32(i))
	}
	data := TensorF32(kv, 64, refKVHeads, refHeadDim)
	if err := ctx.PrefillLayer(1, 0, data, data); err != nil {
		t.Fatal(err)
	}
	q := make([]float32, refQHeads*refHeadDim)
	for i := range q {
		q[i] = refValue(10, uint32(i))
	}
	sel, err := ctx.DecodeSelect(1, 0, TensorF32(q, 1, refQHeads, refHeadDim))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, refKVHeads*sel.Capacity*refHeadDim)
	outV := make([]float32, len(out))
	dst := TensorF32(out, sel.Capacity, refKVHeads, refHeadDim).HeadMajor()
	dstV := TensorF32(outV, sel.Capacity, refKVHeads, refHeadDim).HeadMajor()
	bad := *sel
	bad.Counts = []int32{int32(sel.Capacity + 1), 0}
	wantError(t, ctx.FetchKV(1, 0, &bad, dst, dstV), ErrInvalidArgument, "Counts[0]")
	bad.Counts = sel.Counts[:1]
	wantError(t, ctx.FetchKV(1, 0, &bad, dst, dstV), ErrInvalidArgument, "selection")
	wantError(t, ctx.FetchKV(1, 0, nil, dst, dstV), ErrInvalidArgument, "selection")
	// Keys and values into the same buffer: the library's overlap check.
	wantError(t, ctx.FetchKV(1, 0, sel, dst, dst), ErrInvalidArgument, "overlap")
	// A position past the sequence: the library's check.
	bad = *sel
	bad.Positions = append([]int32(nil), sel.Positions...)
	bad.Positions[0] = 1000
	wantError(t, ctx.FetchKV(1, 0, &bad, dst, dstV), ErrInvalidArgument, "positions")
	// The untouched selection still works.
	if err := ctx.FetchKV(1, 0, sel, dst, dstV); err != nil {
		t.Fatal(err)
	}
}

// f16 and bf16 data travel as raw bits in []uint16, and fetch returns the
// stored bits exactly.
func TestHalfPrecisionRoundTrip(t *testing.T) {
	for _, dtype := range []DType{DTypeF16, DTypeBF16} {
		c := refConfig()
		c.DType = dtype
		ctx, err := NewContext(c)
		if err != nil {
			t.Fatal(err)
		}
		defer ctx.Close()
		const tokens = 64
		make16 := func(stream uint32, n int) []uint16 {
			out := make([]uint16, n)
			for i := range out {
				// Small finite values in both formats: sign, a middle
				// exponent, random mantissa bits.
				out[i] = uint16(refValue(stream, uint32(i))*4096)&0x83ff | 0x3400
			}
			return out
		}
		view := TensorF16
		if dtype == DTypeBF16 {
			view = TensorBF16
		}
		keys := make16(1, tokens*refKVHeads*refHeadDim)
		values := make16(2, tokens*refKVHeads*refHeadDim)
		if err := ctx.AddSequence(1); err != nil {
			t.Fatal(err)
		}
		if err := ctx.PrefillLayer(1, 0, view(keys, tokens, refKVHeads, refHeadDim),
			view(values, tokens, refKVHeads, refHeadDim)); err != nil {
			t.Fatal(err)
		}
		sel, err := ctx.DecodeSelect(1, 0, view(make16(3, refQHeads*refHeadDim), 1, refQHeads, refHeadDim))
		if err != nil {
			t.Fatal(err)
		}
		outK := make([]uint16, refKVHeads*sel.Capacity*refHeadDim)
		outV := make([]uint16, len(outK))
		if err := ctx.FetchKV(1, 0, sel, view(outK, sel.Capacity, refKVHeads, refHeadDim).HeadMajor(),
			view(outV, sel.Capacity, refKVHeads, refHeadDim).HeadMajor()); err != nil {
			t.Fatal(err)
		}
		checked := 0
		for h := 0; h < sel.Heads(); h++ {
			for i, p := range sel.Head(h) {
				for d := 0; d < refHeadDim; d++ {
					got := outK[(h*sel.Capacity+i)*refHeadDim+d]
					want := keys[(int(p)*refKVHeads+h)*refHeadDim+d]
					if got != want || outV[(h*sel.Capacity+i)*refHeadDim+d] != values[(int(p)*refKVHeads+h)*refHeadDim+d] {
						t.Fatalf("dtype %d: head %d token %d dim %d: fetched %#04x, stored %#04x", dtype, h, p, d, got, want)
					}
					checked++
				}
			}
		}
		if checked == 0 {
			t.Fatalf("dtype %d: nothing selected", dtype)
		}
	}
}

// attendReference is the attention DecodeAttend computes, in float64, over
// head-major [kv head][capacity][head dim] keys and values as FetchKV
// gathers them: query head q uses kv head q / (refQHeads / refKVHeads).
func attendReference(query []float32, sel *Selection, keys, values []float32,
	scale float64) (out, lse []float64) {
	group := refQHeads / refKVHeads
	out = make([]float64, refQHeads*refHeadDim)
	lse = make([]float64, refQHeads)
	for q := 0; q < refQHeads; q++ {
		h := q / group
		n := int(sel.Counts[h])
		logits := make([]float64, n)
		peak := math.Inf(-1)
		for i := range logits {
			row := keys[(h*sel.Capacity+i)*refHeadDim:][:refHeadDim]
			dot := 0.0
			for d, k := range row {
				dot += float64(query[q*refHeadDim+d]) * float64(k)
			}
			logits[i] = scale * dot
			peak = math.Max(peak, logits[i])
		}
		sum := 0.0
		for i, l := range logits {
			w := math.Exp(l - peak)
			sum += w
			row := values[(h*sel.Capacity+i)*refHeadDim:][:refHeadDim]
			for d, v := range row {
				out[q*refHeadDim+d] += w * float64(v)
			}
		}
		if n == 0 {
			lse[q] = math.Inf(-1)
			continue
		}
		for d := 0; d < refHeadDim; d++ {
			out[q*refHeadDim+d] /= sum
		}
		lse[q] = peak + math.Log(sum)
	}
	return out, lse
}

func closeTo(got float32, want float64) bool {
	if math.IsInf(want, -1) {
		return math.IsInf(float64(got), -1)
	}
	return math.Abs(float64(got)-want) <= 1e-5+1e-4*math.Abs(want)
}

// DecodeAttend equals softmax(scale * q.K) V computed here over the rows
// FetchKV gathers for the same selection, with GQA's head mapping; scale 0
// is 1 / sqrt(head_dim).
func TestDecodeAttendMatchesAttentionOverFetchedKV(t *testing.T) {
	ctx := newRefContext(t)
	const tokens = 300
	if err := ctx.AddSequence(1); err != nil {
		t.Fatal(err)
	}
	kv := tokens * refKVHeads * refHeadDim
	if err := ctx.PrefillLayer(1, 0, TensorF32(refGenerate(31, kv), tokens, refKVHeads, refHeadDim),
		TensorF32(refGenerate(32, kv), tokens, refKVHeads, refHeadDim)); err != nil {
		t.Fatal(err)
	}
	q := refGenerate(33, refQHeads*refHeadDim)
	for i := range q {
		q[i] *= 8 // logits far from uniform: the softmax weights matter
	}
	query := TensorF32(q, 1, refQHeads, refHeadDim)
	sel, err := ctx.DecodeSelect(1, 0, query)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]float32, refKVHeads*sel.Capacity*refHeadDim)
	values := make([]float32, len(keys))
	if err := ctx.FetchKV(1, 0, sel, TensorF32(keys, sel.Capacity, refKVHeads, refHeadDim).HeadMajor(),
		TensorF32(values, sel.Capacity, refKVHeads, refHeadDim).HeadMajor()); err != nil {
		t.Fatal(err)
	}

	// A kv head with nothing selected gives zeros and -Inf.
	emptyHead := &Selection{Capacity: sel.Capacity, Counts: append([]int32(nil), sel.Counts...),
		Positions: sel.Positions}
	emptyHead.Counts[1] = 0
	for _, c := range []struct {
		name  string
		sel   *Selection
		scale float32
		want  float64
	}{
		{"default scale", sel, 0, 1 / math.Sqrt(refHeadDim)},
		{"explicit scale", sel, 0.05, 0.05},
		{"empty kv head", emptyHead, 0, 1 / math.Sqrt(refHeadDim)},
	} {
		out, lse, err := ctx.DecodeAttend(1, 0, query, c.sel, c.scale)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(out) != refQHeads*refHeadDim || len(lse) != refQHeads {
			t.Fatalf("%s: %d outputs and %d lse", c.name, len(out), len(lse))
		}
		wantOut, wantLSE := attendReference(q, c.sel, keys, values, c.want)
		for i, w := range wantOut {
			if !closeTo(out[i], w) {
				t.Fatalf("%s: out[%d] = %g, want %g", c.name, i, out[i], w)
			}
		}
		for i, w := range wantLSE {
			if !closeTo(lse[i], w) {
				t.Fatalf("%s: lse[%d] = %g, want %g", c.name, i, lse[i], w)
			}
		}
	}
}

func TestDecodeAttendErrors(t *testing.T) {
	ctx := newRefContext(t)
	if err := ctx.AddSequence(1); err != nil {
		t.Fatal(err)
	}
	q := refGenerate(41, refQHeads*refHeadDim)
	query := TensorF32(q, 1, refQHeads, refHeadDim)
	before := &Selection{Capacity: 1, Counts: make([]int32, refKVHeads), Positions: make([]int32, refKVHeads)}
	_, _, err := ctx.DecodeAttend(1, 0, query, before, 0)
	wantError(t, err, ErrBadState, "pq_decode_attend")

	kv := 64 * refKVHeads * refHeadDim
	if err := ctx.PrefillLayer(1, 0, TensorF32(refGenerate(42, kv), 64, refKVHeads, refHeadDim),
		TensorF32(refGenerate(43, kv), 64, refKVHeads, refHeadDim)); err != nil {
		t.Fatal(err)
	}
	sel, err := ctx.DecodeSelect(1, 0, query)
	if err != nil {
		t.Fatal(err)
	}
	// The library's checks, with its message naming the call and the argument.
	_, _, err = ctx.DecodeAttend(1, 0, query, sel, -1)
	wantError(t, err, ErrInvalidArgument, "pq_decode_attend", "scale")
	_, _, err = ctx.DecodeAttend(1, 0, query, sel, float32(math.NaN()))
	wantError(t, err, ErrInvalidArgument, "pq_decode_attend", "scale")
	kvShaped := TensorF32(q, 1, refKVHeads, refHeadDim) // kv heads, not q heads
	_, _, err = ctx.DecodeAttend(1, 0, kvShaped, sel, 0)
	wantError(t, err, ErrInvalidArgument, "pq_decode_attend", "query")
	out, lse, err := ctx.DecodeAttend(42, 0, query, sel, 0)
	wantError(t, err, ErrNotFound, "pq_decode_attend")
	if out != nil || lse != nil {
		t.Errorf("outputs on error: %v %v", out, lse)
	}
	// Caught in Go before the library would read past the slices.
	short := TensorF32(q[:refHeadDim], 1, refQHeads, refHeadDim)
	_, _, err = ctx.DecodeAttend(1, 0, short, sel, 0)
	wantError(t, err, ErrInvalidArgument, "pq_decode_attend", "query.data")
	_, _, err = ctx.DecodeAttend(1, 0, query, nil, 0)
	wantError(t, err, ErrInvalidArgument, "pq_decode_attend", "selection")
	bad := *sel
	bad.Positions = append([]int32(nil), sel.Positions...)
	bad.Positions[0] = 1000
	_, _, err = ctx.DecodeAttend(1, 0, query, &bad, 0)
	wantError(t, err, ErrInvalidArgument, "pq_decode_attend", "position")
	_, _, err = ctx.DecodeAttend(1, 1<<33, query, sel, 0)
	wantError(t, err, ErrInvalidArgument, "layer")
}

// wantMessage checks that err is an *Error with the status, the Op and
// exactly the message.
func wantMessage(t *testing.T, err error, status Status, op, message string) {
	t.Helper()
	wantError(t, err, status)
	if e := err.(*Error); e.Op != op || e.Message != message {
		t.Errorf("got Op %q, message\n\t%q\nwant Op %q, message\n\t%q", e.Op, e.Message, op, message)
	}
}

// The checks made in Go before the library is called speak the shared
// vocabulary of docs/bindings/errors.md: ErrInvalidArgument, the C
// function, and the argument (as the C function names it) with its value
// and what was expected.
func TestPrechecksSpeakTheSharedVocabulary(t *testing.T) {
	c := refConfig()
	c.TopKTokens = 1 << 31
	_, err := NewContext(c)
	wantMessage(t, err, ErrInvalidArgument, "pq_create",
		"pq_create: config.topk_tokens is 2147483648; expected -2147483648..2147483647 (int32_t)")

	ctx := newRefContext(t)
	if err := ctx.AddSequence(1); err != nil {
		t.Fatal(err)
	}
	row := make([]float32, refKVHeads*refHeadDim)
	one := TensorF32(row, 1, refKVHeads, refHeadDim)
	wantMessage(t, ctx.PrefillLayer(1, 0, one, TensorF32(row[:31], 1, refKVHeads, refHeadDim)),
		ErrInvalidArgument, "pq_prefill_layer",
		"pq_prefill_layer: values.data has 31 elements; expected at least 32 (tokens 1 x heads 2 x head_dim 16)")
	wantMessage(t, ctx.DecodeAppend(1, 0, TensorF32(row, 1, -2, refHeadDim), one),
		ErrInvalidArgument, "pq_decode_append", "pq_decode_append: keys.heads is -2; expected >= 0")
	wantMessage(t, ctx.PrefillLayer(1, 0, TensorF32(row, 1, 1<<31, refHeadDim), one),
		ErrInvalidArgument, "pq_prefill_layer",
		"pq_prefill_layer: keys.heads is 2147483648; expected at most 2147483647 (int32_t)")
	// A layer past int32 reads as the library's own text for a layer out of range.
	wantMessage(t, ctx.PrefillLayer(1, 1, one, one), ErrInvalidArgument, "pq_prefill_layer",
		"pq_prefill_layer: layer is 1; expected 0..0")
	_, err = ctx.SequenceLength(1, 1<<33)
	wantMessage(t, err, ErrInvalidArgument, "pq_sequence_length",
		"pq_sequence_length: layer is 8589934592; expected 0..0")
	if n, err := ctx.SequenceLength(1, 0); err != nil || n != 0 {
		t.Fatalf("a refused call stored something: %d, %v", n, err)
	}

	kv := refGenerate(50, 64*refKVHeads*refHeadDim)
	data := TensorF32(kv, 64, refKVHeads, refHeadDim)
	if err := ctx.PrefillLayer(1, 0, data, data); err != nil {
		t.Fatal(err)
	}
	q := refGenerate(51, refQHeads*refHeadDim)
	query := TensorF32(q, 1, refQHeads, refHeadDim)
	_, err = ctx.DecodeSelect(1, 0, TensorF32(q[:63], 1, refQHeads, refHeadDim))
	wantMessage(t, err, ErrInvalidArgument, "pq_decode_select",
		"pq_decode_select: query.data has 63 elements; expected at least 64 (tokens 1 x heads 4 x head_dim 16)")
	sel, err := ctx.DecodeSelect(1, 0, query)
	if err != nil {
		t.Fatal(err)
	}
	n := refKVHeads * sel.Capacity * refHeadDim
	dst := TensorF32(make([]float32, n), sel.Capacity, refKVHeads, refHeadDim).HeadMajor()
	shortV := TensorF32(make([]float32, n-1), sel.Capacity, refKVHeads, refHeadDim).HeadMajor()
	wantMessage(t, ctx.FetchKV(1, 0, sel, dst, shortV), ErrInvalidArgument, "pq_fetch_kv",
		fmt.Sprintf("pq_fetch_kv: out_values.data has %d elements; expected at least %d "+
			"(tokens %d x heads 2 x head_dim 16)", n-1, n, sel.Capacity))
	dstV := TensorF32(make([]float32, n), sel.Capacity, refKVHeads, refHeadDim).HeadMajor()
	three := &Selection{Capacity: 1, Counts: make([]int32, 3), Positions: make([]int32, 3)}
	wantMessage(t, ctx.FetchKV(1, 0, three, dst, dstV), ErrInvalidArgument, "pq_fetch_kv",
		"pq_fetch_kv: selection has 3 kv heads; expected 2 (num_kv_heads)")
	wantMessage(t, ctx.FetchKV(1, 0, nil, dst, dstV), ErrInvalidArgument, "pq_fetch_kv",
		"pq_fetch_kv: selection is nil; expected a *Selection")
	bad := *sel
	bad.Counts = []int32{int32(sel.Capacity + 1), 0}
	wantMessage(t, ctx.FetchKV(1, 0, &bad, dst, dstV), ErrInvalidArgument, "pq_fetch_kv",
		fmt.Sprintf("pq_fetch_kv: selection.Counts[0] is %d; expected 0..%d (Capacity)",
			sel.Capacity+1, sel.Capacity))
	bad = *sel
	bad.Positions = sel.Positions[:len(sel.Positions)-1]
	wantMessage(t, ctx.FetchKV(1, 0, &bad, dst, dstV), ErrInvalidArgument, "pq_fetch_kv",
		fmt.Sprintf("pq_fetch_kv: selection.Positions has %d entries; expected at least %d "+
			"(num_kv_heads 2 x Capacity %d)", len(sel.Positions)-1, 2*sel.Capacity, sel.Capacity))
	bad = *sel
	bad.Capacity = -1
	_, _, err = ctx.DecodeAttend(1, 0, query, &bad, 0)
	wantMessage(t, err, ErrInvalidArgument, "pq_decode_attend",
		"pq_decode_attend: selection.Capacity is -1; expected >= 0")

	// A batch names the item and its argument.
	items := []FetchItem{{Seq: 1, Selection: sel, Keys: dst, Values: shortV}}
	wantMessage(t, ctx.FetchKVBatch(0, items), ErrInvalidArgument, "pq_fetch_kv_batch",
		fmt.Sprintf("pq_fetch_kv_batch: items[0].out_values.data has %d elements; expected at least %d "+
			"(tokens %d x heads 2 x head_dim 16)", n-1, n, sel.Capacity))
	items = []FetchItem{{Seq: 1, Selection: sel, Keys: dst, Values: dst}}
	wantMessage(t, ctx.FetchKVBatch(0, items), ErrInvalidArgument, "pq_fetch_kv_batch",
		"pq_fetch_kv_batch: items[0].out_keys and items[0].out_values overlap; "+
			"items of a batch run concurrently and must not share outputs")
	wantMessage(t, ctx.DecodeSelectBatch(1<<32, nil), ErrInvalidArgument, "pq_decode_select_batch",
		"pq_decode_select_batch: layer is 4294967296; expected 0..0")

	wantMessage(t, ctx.SaveSequenceFile(1, "state\x00.pq"), ErrInvalidArgument, "pq_sequence_save_file",
		`pq_sequence_save_file: path is "state\x00.pq"; expected a path without NUL bytes`)
	wantMessage(t, ctx.RestoreSequenceFile(2, "state\x00.pq"), ErrInvalidArgument, "pq_sequence_restore_file",
		`pq_sequence_restore_file: path is "state\x00.pq"; expected a path without NUL bytes`)
}

// newPrefilledContext is a reference-config context whose sequence 1 holds
// 64 prefilled tokens; the test closes it.
func newPrefilledContext(t *testing.T) *Context {
	t.Helper()
	ctx, err := NewContext(refConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := ctx.AddSequence(1); err != nil {
		t.Fatal(err)
	}
	data := TensorF32(refGenerate(60, 64*refKVHeads*refHeadDim), 64, refKVHeads, refHeadDim)
	if err := ctx.PrefillLayer(1, 0, data, data); err != nil {
		t.Fatal(err)
	}
	return ctx
}

// What a Context handed out before Close (a Selection, batch items, a
// restore in pieces) holds no pointer into the C context: passed back after
// Close it meets the closed-context check, ErrBadState "<C function>: the
// context is closed", and the library is not called (docs/bindings/errors.md).
func TestObjectsMadeBeforeCloseMeetTheClosedContext(t *testing.T) {
	ctx := newPrefilledContext(t)
	query := TensorF32(refGenerate(61, refQHeads*refHeadDim), 1, refQHeads, refHeadDim)
	sel, err := ctx.DecodeSelect(1, 0, query)
	if err != nil {
		t.Fatal(err)
	}
	state, err := ctx.SaveSequence(1)
	if err != nil {
		t.Fatal(err)
	}
	described, err := ctx.RestoreSequenceBegin(2, state)
	if err != nil {
		t.Fatal(err)
	}
	n := refKVHeads * sel.Capacity * refHeadDim
	keys := TensorF32(make([]float32, n), sel.Capacity, refKVHeads, refHeadDim).HeadMajor()
	values := TensorF32(make([]float32, n), sel.Capacity, refKVHeads, refHeadDim).HeadMajor()
	ctx.Close()

	closed := func(op string, err error) {
		t.Helper()
		wantMessage(t, err, ErrBadState, op, op+": the context is closed")
	}
	closed("pq_fetch_kv", ctx.FetchKV(1, 0, sel, keys, values))
	_, _, err = ctx.DecodeAttend(1, 0, query, sel, 0)
	closed("pq_decode_attend", err)
	closed("pq_fetch_kv_batch", ctx.FetchKVBatch(0,
		[]FetchItem{{Seq: 1, Selection: sel, Keys: keys, Values: values}}))
	closed("pq_decode_select_batch", ctx.DecodeSelectBatch(0, []SelectItem{{Seq: 1, Query: query}}))
	_, err = ctx.RestoreSequenceKV(2, state[described:])
	closed("pq_sequence_restore_kv", err)
	_, err = ctx.SaveSequence(1)
	closed("pq_sequence_save_buffer", err)
	// The selection itself is Go data and stays readable.
	if len(sel.Head(0)) == 0 {
		t.Error("the selection lost its positions")
	}
}

// Close racing with calls on other goroutines waits for the calls in
// progress; every call either completes or reports the closed context, and
// none reaches a freed one (run it under -race or ASan to see the latter).
func TestCloseRacingWithCallsWaitsOrReportsClosed(t *testing.T) {
	ctx := newPrefilledContext(t)
	query := TensorF32(refGenerate(71, refQHeads*refHeadDim), 1, refQHeads, refHeadDim)
	errs := make(chan error, 2)
	started := make(chan struct{}, 2)
	for g := 0; g < 2; g++ {
		go func() {
			started <- struct{}{}
			for {
				sel, err := ctx.DecodeSelect(1, 0, query)
				if err == nil {
					n := refKVHeads * sel.Capacity * refHeadDim
					k := TensorF32(make([]float32, n), sel.Capacity, refKVHeads, refHeadDim).HeadMajor()
					v := TensorF32(make([]float32, n), sel.Capacity, refKVHeads, refHeadDim).HeadMajor()
					err = ctx.FetchKV(1, 0, sel, k, v)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	<-started
	<-started
	time.Sleep(20 * time.Millisecond)
	ctx.Close()
	for g := 0; g < 2; g++ {
		err := <-errs
		var e *Error
		if !errors.As(err, &e) || e.Status != ErrBadState ||
			(e.Message != "pq_decode_select: the context is closed" &&
				e.Message != "pq_fetch_kv: the context is closed") {
			t.Errorf("a call racing with Close: %v", err)
		}
	}
}
