package pqcache

// #include <stdlib.h>
// #include "pqcache.h"
import "C"

import (
	"math"
	"runtime"
	"runtime/cgo"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"libpqcache.org/pqcache/internal/pqswig"
)

// Version is the version of the library loaded at run time,
// "MAJOR.MINOR.PATCH".
func Version() string { return pqswig.Pq_version_string() }

// VersionNumber is the same as MAJOR*10000 + MINOR*100 + PATCH.
func VersionNumber() int { return pqswig.Pq_version_number() }

// Context is a pq_context: the KV cache and PQ indexes of any number of
// sequences. It is safe for concurrent use (see the package comment).
type Context struct {
	// The lifetime (withHandle, Close): pq_destroy must not race with another
	// call on the context. mu guards handle, calls and closing; it is held
	// only to enter and leave a call, never across one. Not an RWMutex: a
	// waiting writer (Close) would queue a BuildDone hook's call behind it
	// while Close waits for a WaitBuilds that waits for the hook's worker.
	mu      sync.Mutex
	idle    sync.Cond                   // on mu: signalled when calls drops to 0 while closing
	calls   int                         // calls in progress, which Close waits for
	closing bool                        // Close has begun: calls fail with ErrBadState at once
	handle  pqswig.Struct_SS_pq_context // nil once closed
	config  Config                      // the effective configuration
	// Per layer, the largest selection capacity the library asked for so
	// far: DecodeSelect sizes its buffers with it and grows them when told.
	capacityHints []atomic.Int64
	// NewContextWithHooks: the hooks the library's trampolines reach, and
	// the pool the context holds (kept reachable for as long).
	hooks cgo.Handle
	pool  *Pool
}

// NewContext creates a context (pq_create). Errors are *Error:
// ErrInvalidArgument names the bad field, ErrUnsupported and ErrNotFound
// (CUDA backend without plug-in or device) as documented in pqcache.h.
func NewContext(cfg Config) (*Context, error) { return newContext(cfg, nil) }

// newContext is NewContext, or with hooks pq_create_with_hooks.
func newContext(cfg Config, hooks *Hooks) (*Context, error) {
	cc, err := cfg.toC()
	if err != nil {
		return nil, err
	}
	defer pqswig.DeletePq_config(cc)
	// pq_create reads the paths and does not keep them.
	for _, p := range []struct {
		field, path string
		dst         **C.char
	}{
		{"cuda_plugin_path", cfg.CUDAPluginPath, &cConfig(cc).cuda_plugin_path},
		{"kv_disk_path", cfg.KVDiskPath, &cConfig(cc).kv_disk_path},
	} {
		if p.path == "" {
			continue
		}
		if strings.IndexByte(p.path, 0) >= 0 { // C would see a shorter path
			return nil, invalid("pq_create", "config.%s is %q; expected a path without NUL bytes",
				p.field, p.path)
		}
		path := C.CString(p.path)
		defer C.free(unsafe.Pointer(path))
		*p.dst = path
	}

	// The scales too are read by pq_create only; C memory, as cgo wants
	// for a pointer stored in C memory.
	if len(cfg.KVScales) > 0 {
		scales := C.malloc(C.size_t(len(cfg.KVScales)) * 4)
		defer C.free(scales)
		copy(unsafe.Slice((*float32)(scales), len(cfg.KVScales)), cfg.KVScales)
		cConfig(cc).kv_scales = (*C.float)(scales)
	}

	c := &Context{}
	c.idle.L = &c.mu
	if hooks == nil {
		out := pqswig.New_contextOut()
		defer pqswig.Delete_contextOut(out)
		if err := call("pq_create", func() Status { return Status(pqswig.Pq_create(cc, out)) }); err != nil {
			return nil, err
		}
		c.handle = pqswig.ContextOut_value(out)
	} else {
		c.hooks = cgo.NewHandle(hooks)
		if c.handle, err = createWithHooks(cc, hooks, c.hooks); err != nil {
			c.hooks.Delete()
			return nil, err
		}
		c.pool = hooks.Pool
	}

	effective := pqswig.NewPq_config()
	defer pqswig.DeletePq_config(effective)
	pqswig.Pq_config_default(effective) // sets struct_size
	if err := call("pq_get_config", func() Status {
		return Status(pqswig.Pq_get_config(c.handle, effective))
	}); err != nil {
		c.Close()
		return nil, err
	}
	c.config = configFromC(effective)
	if p := cConfig(effective).kv_scales; p != nil { // the context's own copy
		n := c.config.NumLayers * 2 * c.config.KVScaleCount
		c.config.KVScales = append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(p)), n)...)
	}
	c.capacityHints = make([]atomic.Int64, c.config.NumLayers)

	// A safety net only: the collector may run it late or never.
	runtime.SetFinalizer(c, func(c *Context) { c.Close() })
	return c, nil
}

// Close frees the context (pq_destroy), after waiting for the calls in
// progress on other goroutines. From its start, calls return ErrBadState at
// once (a BuildDone hook's too, so that it never waits for Close). It is
// idempotent and always returns nil; a Close that finds another one begun
// returns at once.
func (c *Context) Close() error {
	// closing is set before the wait, so no call starts behind it; the
	// handle is taken after the calls in progress and destroyed outside the
	// lock: pq_destroy waits for the builds' BuildDone hooks, and a hook
	// that calls the context meanwhile must get ErrBadState, not wait.
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return nil
	}
	c.closing = true
	for c.calls > 0 {
		c.idle.Wait()
	}
	handle, hooks := c.handle, c.hooks
	c.handle, c.hooks, c.pool = nil, 0, nil
	c.mu.Unlock()
	if handle == nil {
		return nil
	}
	runtime.SetFinalizer(c, nil)
	pqswig.Pq_destroy(handle)
	if hooks != 0 { // pq_destroy waited for the builds and their hooks
		hooks.Delete()
	}
	return nil
}

// Config returns the effective configuration: defaults resolved (for
// example WorkerThreads), CUDAPluginPath and KVDiskPath not kept.
func (c *Context) Config() Config { return c.config }

// do runs one library call on the open context.
func (c *Context) do(op string, f func(h pqswig.Struct_SS_pq_context) Status) error {
	return c.withHandle(op, func(h pqswig.Struct_SS_pq_context) error {
		return call(op, func() Status { return f(h) })
	})
}

// withHandle runs f, which may make several library calls (each through
// call), on the open context, as one call in progress for Close. The
// deferred leave also keeps the Context reachable until f returns, so the
// finalizer cannot run in the middle of it.
func (c *Context) withHandle(op string, f func(h pqswig.Struct_SS_pq_context) error) error {
	h, err := c.enter(op)
	if err != nil {
		return err
	}
	defer c.leave()
	return f(h)
}

// enter counts a call in progress and returns the handle, or ErrBadState
// once Close has begun (also for a zero Context, which has no handle).
func (c *Context) enter(op string) (pqswig.Struct_SS_pq_context, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing || c.handle == nil {
		// The text every binding gives a closed context (docs/bindings/errors.md).
		return nil, &Error{Op: op, Status: ErrBadState, Message: op + ": the context is closed"}
	}
	c.calls++
	return c.handle, nil
}

// leave ends a call counted by enter, waking a Close that waits for it.
func (c *Context) leave() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls--; c.calls == 0 && c.closing {
		c.idle.Broadcast()
	}
}

// Backend is the backend in use (pq_get_backend).
func (c *Context) Backend() (Backend, error) {
	out := make([]int, 1)
	err := c.do("pq_get_backend", func(h pqswig.Struct_SS_pq_context) Status {
		return Status(pqswig.Pq_get_backend(h, out))
	})
	return Backend(out[0]), err
}

// AddSequence adds an empty sequence named by the caller's id
// (pq_sequence_add). An id in use is ErrInvalidArgument.
func (c *Context) AddSequence(seq uint64) error {
	return c.do("pq_sequence_add", func(h pqswig.Struct_SS_pq_context) Status {
		return Status(pqswig.Pq_sequence_add(h, seq))
	})
}

// RemoveSequence frees a sequence (pq_sequence_remove); an unknown id is
// ErrNotFound.
func (c *Context) RemoveSequence(seq uint64) error {
	return c.do("pq_sequence_remove", func(h pqswig.Struct_SS_pq_context) Status {
		return Status(pqswig.Pq_sequence_remove(h, seq))
	})
}

// SequenceLength is the number of tokens stored for (seq, layer).
func (c *Context) SequenceLength(seq uint64, layer int) (int64, error) {
	const op = "pq_sequence_length"
	if err := c.checkLayer(op, layer); err != nil {
		return 0, err
	}
	out := make([]int64, 1)
	err := c.do(op, func(h pqswig.Struct_SS_pq_context) Status {
		return Status(pqswig.Pq_sequence_length(h, seq, layer, out))
	})
	return out[0], err
}

// SequenceCount is the number of sequences in the context.
func (c *Context) SequenceCount() (int64, error) {
	out := make([]int64, 1)
	err := c.do("pq_sequence_count", func(h pqswig.Struct_SS_pq_context) Status {
		return Status(pqswig.Pq_sequence_count(h, out))
	})
	return out[0], err
}

// SelectionCapacity is the number of positions per kv head that
// DecodeSelect needs for (seq, layer) at its current length.
func (c *Context) SelectionCapacity(seq uint64, layer int) (int, error) {
	const op = "pq_selection_capacity"
	if err := c.checkLayer(op, layer); err != nil {
		return 0, err
	}
	out := make([]int64, 1)
	err := c.do(op, func(h pqswig.Struct_SS_pq_context) Status {
		return Status(pqswig.Pq_selection_capacity(h, seq, layer, out))
	})
	return int(out[0]), err
}

// SelectionCapacityFor is the number of positions per kv head that
// DecodeSelect needs at layer for a sequence of tokens tokens, without a
// sequence (pq_selection_capacity_for). It never decreases as tokens grow:
// the capacity for the longest sequence admitted sizes every buffer once.
func (c *Context) SelectionCapacityFor(layer int, tokens int64) (int, error) {
	const op = "pq_selection_capacity_for"
	if err := c.checkLayer(op, layer); err != nil {
		return 0, err
	}
	out := make([]int64, 1)
	err := c.do(op, func(h pqswig.Struct_SS_pq_context) Status {
		return Status(pqswig.Pq_selection_capacity_for(h, layer, tokens, out))
	})
	return int(out[0]), err
}

// capacityHint is the largest capacity the library asked for at layer so
// far (0 for a layer out of range: the library reports it).
func (c *Context) capacityHint(layer int) int {
	if layer < 0 || layer >= len(c.capacityHints) {
		return 0
	}
	return int(c.capacityHints[layer].Load())
}

// raiseCapacityHint records that layer needed capacity.
func (c *Context) raiseCapacityHint(layer, capacity int) {
	if layer < 0 || layer >= len(c.capacityHints) {
		return
	}
	hint := &c.capacityHints[layer]
	for old := hint.Load(); int64(capacity) > old && !hint.CompareAndSwap(old, int64(capacity)); {
		old = hint.Load()
	}
}

// WaitBuilds blocks until every index build queued so far has finished.
func (c *Context) WaitBuilds() error {
	return c.do("pq_wait_builds", func(h pqswig.Struct_SS_pq_context) Status {
		return Status(pqswig.Pq_wait_builds(h))
	})
}

// Stats mirrors pq_stats, with the seconds as durations.
type Stats struct {
	Sequences        int64
	Tokens           int64
	KVBytes          uint64
	IndexBytes       uint64
	BuildsFinished   uint64
	BuildsCancelled  uint64
	KMeansIterations uint64
	SelectCalls      uint64
	FetchCalls       uint64
	BuildTime        time.Duration // in builds, summed over worker threads
	SelectTime       time.Duration
	FetchTime        time.Duration
	BytesScored      uint64
	BytesFetched     uint64
	CacheHits        uint64
	CacheMisses      uint64
	HostBytes        uint64 // counted against Config.HostMemoryLimit
	BytesStaged      uint64 // K/V bytes the CPU copied to stage rows for the device
	HintTokens       uint64 // middle tokens selected after a hint (pq_decode_speculate)
	HintCovered      uint64 // of those, the ones the hint held
}

// Stats returns the context-wide statistics (pq_stats_get).
func (c *Context) Stats() (Stats, error) {
	return c.stats("pq_stats_get", func(h pqswig.Struct_SS_pq_context, s pqswig.Pq_stats) Status {
		return Status(pqswig.Pq_stats_get(h, s))
	})
}

// SequenceStats returns the statistics of one sequence
// (pq_sequence_stats_get).
func (c *Context) SequenceStats(seq uint64) (Stats, error) {
	return c.stats("pq_sequence_stats_get", func(h pqswig.Struct_SS_pq_context, s pqswig.Pq_stats) Status {
		return Status(pqswig.Pq_sequence_stats_get(h, seq, s))
	})
}

func (c *Context) stats(op string, get func(pqswig.Struct_SS_pq_context, pqswig.Pq_stats) Status) (Stats, error) {
	s := pqswig.NewPq_stats()
	defer pqswig.DeletePq_stats(s)
	s.SetStruct_size(uint(C.sizeof_pq_stats))
	if err := c.do(op, func(h pqswig.Struct_SS_pq_context) Status { return get(h, s) }); err != nil {
		return Stats{}, err
	}
	return Stats{
		Sequences:        s.GetSequences(),
		Tokens:           s.GetTokens(),
		KVBytes:          s.GetKv_bytes(),
		IndexBytes:       s.GetIndex_bytes(),
		BuildsFinished:   s.GetBuilds_finished(),
		BuildsCancelled:  s.GetBuilds_cancelled(),
		KMeansIterations: s.GetKmeans_iterations(),
		SelectCalls:      s.GetSelect_calls(),
		FetchCalls:       s.GetFetch_calls(),
		BuildTime:        seconds(s.GetBuild_seconds()),
		SelectTime:       seconds(s.GetSelect_seconds()),
		FetchTime:        seconds(s.GetFetch_seconds()),
		BytesScored:      s.GetBytes_scored(),
		BytesFetched:     s.GetBytes_fetched(),
		CacheHits:        s.GetCache_hits(),
		CacheMisses:      s.GetCache_misses(),
		HostBytes:        s.GetHost_bytes(),
		BytesStaged:      s.GetBytes_staged(),
		HintTokens:       s.GetHint_tokens(),
		HintCovered:      s.GetHint_covered(),
	}, nil
}

// LayerInfo mirrors pq_layer_info: the state of one (sequence, layer).
type LayerInfo struct {
	Tokens           int64
	PrefillTokens    int64
	MiddleTokens     int64
	CodedTokens      int64
	BuildPending     bool
	KMeansIterations int // of the last finished build
	KMeansBudget     int
	IndexReady       bool
	BuildTime        time.Duration // of the last finished build
	LastSelectBytes  uint64
}

// LayerInfo describes (seq, layer) without waiting for builds
// (pq_layer_info_get).
func (c *Context) LayerInfo(seq uint64, layer int) (LayerInfo, error) {
	const op = "pq_layer_info_get"
	if err := c.checkLayer(op, layer); err != nil {
		return LayerInfo{}, err
	}
	li := pqswig.NewPq_layer_info()
	defer pqswig.DeletePq_layer_info(li)
	li.SetStruct_size(uint(C.sizeof_pq_layer_info))
	if err := c.do(op, func(h pqswig.Struct_SS_pq_context) Status {
		return Status(pqswig.Pq_layer_info_get(h, seq, layer, li))
	}); err != nil {
		return LayerInfo{}, err
	}
	return LayerInfo{
		Tokens:           li.GetTokens(),
		PrefillTokens:    li.GetPrefill_tokens(),
		MiddleTokens:     li.GetMiddle_tokens(),
		CodedTokens:      li.GetCoded_tokens(),
		BuildPending:     li.GetBuild_pending() != 0,
		KMeansIterations: li.GetKmeans_iterations(),
		KMeansBudget:     li.GetKmeans_budget(),
		IndexReady:       li.GetIndex_ready() != 0,
		BuildTime:        seconds(li.GetBuild_seconds()),
		LastSelectBytes:  li.GetLast_select_bytes(),
	}, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// checkLayer refuses a layer the int32_t parameter cannot hold: the
// conversion would wrap it into another, maybe valid, layer. Such a layer
// is out of range for any context, so the message is the library's own for
// a layer out of range.
func (c *Context) checkLayer(op string, layer int) error {
	if layer < math.MinInt32 || layer > math.MaxInt32 {
		return invalid(op, "layer is %d; expected 0..%d", layer, c.config.NumLayers-1)
	}
	return nil
}

// The generated layer and this package's cgo code see the same C objects
// under different Go types; these convert the SWIG handles (C pointers held
// as uintptr, never Go memory) for the calls written in cgo.
func cContext(h pqswig.Struct_SS_pq_context) *C.pq_context {
	return (*C.pq_context)(unsafe.Pointer(h.Swigcptr()))
}

func cConfig(cc pqswig.Pq_config) *C.pq_config {
	return (*C.pq_config)(unsafe.Pointer(cc.Swigcptr()))
}
