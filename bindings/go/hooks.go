package pqcache

// #include <stdint.h>
// #include "pqcache.h"
import "C"

import (
	"math"
	"runtime"
	"runtime/cgo"
	"sync"
)

// LogLevel is a pq_log_level: a hook gets the messages of its level and
// the more severe ones.
type LogLevel int32

const (
	LogError LogLevel = 0 // a call failed: its message (as Error.Message)
	LogWarn  LogLevel = 1 // an index build failed (the default level)
	LogInfo  LogLevel = 2 // context created, index build finished
	LogDebug LogLevel = 3 // sequence added, removed, forked, truncated, saved, restored
)

// Hooks are what pq_create_with_hooks calls (NewContextWithHooks). The
// library calls Log and BuildDone on its worker goroutines' threads (a
// build's) or on the thread of a call, possibly from several at once; they
// must not call into the context, except BuildDone, which may make calls
// that do not wait for builds (Stats, calls on that layer) but not
// WaitBuilds or Close (pq_build_done_fn in pqcache.h); once Close has
// begun, such a call returns ErrBadState at once. A panic in a hook
// is not recovered (it would cross the library's C frames): recover in
// the hook itself.
type Hooks struct {
	// Log receives each message (without a trailing newline) at LogLevel
	// and above; nil: none.
	Log      func(level LogLevel, message string)
	LogLevel LogLevel
	// BuildDone runs when an index build of (seq, layer) ends: status OK
	// when its index is ready, else the error the layer reports at its next
	// call; nil: none. Close waits for the hooks of the builds it waits for.
	BuildDone func(seq uint64, layer int, status Status)
	// BuildProgress hears how far each index build has come: after every
	// K-Means iteration and every 65,536 tokens coded, before its
	// BuildDone, on the build's thread (the build waits for it, so it
	// should return quickly); it may call what BuildDone may. nil: none.
	BuildProgress func(BuildProgress)
	// Pool runs the context's work on a shared pool instead of one of its
	// own (Config.WorkerThreads is then ignored); nil: its own.
	Pool *Pool
}

// NewContextWithHooks is NewContext with hooks (pq_create_with_hooks).
// Errors: as NewContext, and ErrInvalidArgument for a LogLevel outside
// LogError..LogDebug, ErrBadState for a closed Pool.
func NewContextWithHooks(cfg Config, hooks Hooks) (*Context, error) {
	if hooks.LogLevel < LogError || hooks.LogLevel > LogDebug {
		return nil, invalid("pq_create_with_hooks", "hooks.LogLevel is %d; expected LogError (0) "+
			"to LogDebug (3)", hooks.LogLevel)
	}
	if hooks.Pool != nil {
		hooks.Pool.mu.Lock()
		defer hooks.Pool.mu.Unlock() // the pool stays open until the context holds it
		if hooks.Pool.pool == nil {
			return nil, &Error{Op: "pq_create_with_hooks", Status: ErrBadState,
				Message: "pq_create_with_hooks: the pool is closed"}
		}
	}
	h := hooks
	return newContext(cfg, &h)
}

//export goPqLogHook
func goPqLogHook(handle C.uintptr_t, level C.int32_t, message *C.char) {
	h := cgo.Handle(handle).Value().(*Hooks)
	h.Log(LogLevel(level), C.GoString(message))
}

// BuildStage is a pq_build_stage: the stages of an index build, in order.
type BuildStage int32

const (
	BuildStageKMeans BuildStage = 0 // training the codebook: Done iterations of a Total budget
	BuildStageEncode BuildStage = 1 // coding the tokens: Done of Total tokens
)

// BuildProgress is a pq_build_progress: Fraction, in [0, 1] and
// non-decreasing over one build, is the value to show (1 at the last call).
// K-Means may stop before its budget (converged); Fraction then moves on
// to the encode's share at once.
type BuildProgress struct {
	Seq      uint64
	Layer    int
	Stage    BuildStage
	Done     int64
	Total    int64
	Fraction float64
}

//export goPqBuildProgressHook
func goPqBuildProgressHook(handle C.uintptr_t, p *C.pq_build_progress) {
	h := cgo.Handle(handle).Value().(*Hooks)
	h.BuildProgress(BuildProgress{Seq: uint64(p.seq_id), Layer: int(p.layer),
		Stage: BuildStage(p.stage), Done: int64(p.done), Total: int64(p.total),
		Fraction: float64(p.fraction)})
}

//export goPqBuildDoneHook
func goPqBuildDoneHook(handle C.uintptr_t, seq C.uint64_t, layer C.int32_t, status C.int32_t) {
	h := cgo.Handle(handle).Value().(*Hooks)
	h.BuildDone(uint64(seq), int(layer), Status(status))
}

// Pool is a pq_pool: worker threads that several contexts share
// (Hooks.Pool), so that a server holding many contexts runs one set of
// threads. Safe for concurrent use.
type Pool struct {
	mu   sync.Mutex
	pool *C.pq_pool // nil once closed
}

// NewPool creates a pool of threads worker threads (1..1024; 0: the
// hardware threads).
func NewPool(threads int) (*Pool, error) {
	if threads < 0 || threads > math.MaxInt32 {
		return nil, invalid("pq_pool_create", "threads is %d; expected 0..1024", threads)
	}
	p, err := newPool(threads)
	if err != nil {
		return nil, err
	}
	pool := &Pool{pool: p}
	runtime.SetFinalizer(pool, func(p *Pool) { p.Close() })
	return pool, nil
}

// Threads returns the number of worker threads.
func (p *Pool) Threads() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pool == nil {
		return 0, &Error{Op: "pq_pool_threads", Status: ErrBadState,
			Message: "pq_pool_threads: the pool is closed"}
	}
	return poolThreads(p.pool)
}

// Close releases this Pool's reference (pq_pool_destroy): the threads stop
// once no context uses the pool either. Idempotent; returns nil.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pool != nil {
		destroyPool(p.pool)
		p.pool = nil
		runtime.SetFinalizer(p, nil)
	}
	return nil
}
