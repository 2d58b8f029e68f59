package pqcache

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// prefillHooked adds sequence 7 with 300 tokens in each of the given layers
// and waits for the builds.
func prefillHooked(t *testing.T, ctx *Context, layers ...int) {
	t.Helper()
	prefillWithoutWaiting(t, ctx, layers...)
	if err := ctx.WaitBuilds(); err != nil {
		t.Fatal(err)
	}
}

// Hooks.Log gets the library's lines at its level and above; BuildDone
// runs once per layer's build, before Close returns.
func TestHooksLogAndBuildDone(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	var levels []LogLevel
	var done [][3]int
	cfg := refConfig()
	cfg.NumLayers = 2
	ctx, err := NewContextWithHooks(cfg, Hooks{
		Log: func(level LogLevel, message string) {
			mu.Lock()
			defer mu.Unlock()
			levels, lines = append(levels, level), append(lines, message)
		},
		LogLevel: LogDebug,
		BuildDone: func(seq uint64, layer int, status Status) {
			mu.Lock()
			defer mu.Unlock()
			done = append(done, [3]int{int(seq), layer, int(status)})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	prefillHooked(t, ctx, 0, 1)
	ctx.Close()
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(done, func(i, j int) bool { return done[i][1] < done[j][1] })
	if len(done) != 2 || done[0] != [3]int{7, 0, 0} || done[1] != [3]int{7, 1, 0} {
		t.Errorf("BuildDone calls %v, want (7, 0, OK) and (7, 1, OK)", done)
	}
	joined := strings.Join(lines, "\n")
	for _, want := range []string{"context created", "sequence added: seq_id 7", "index built: seq_id 7 layer 1"} {
		if !strings.Contains(joined, want) {
			t.Errorf("no log line with %q in:\n%s", want, joined)
		}
	}
	for _, l := range levels {
		if l < LogError || l > LogDebug {
			t.Errorf("log level %d", l)
		}
	}
}

// Hooks.BuildProgress hears every K-Means iteration and the encode of each
// build, its Fraction rising to 1, before the build's BuildDone.
func TestHooksBuildProgress(t *testing.T) {
	var mu sync.Mutex
	type event struct {
		done     bool
		progress BuildProgress
	}
	var events []event
	cfg := refConfig()
	cfg.NumLayers = 2
	cfg.KMeansIterations = 3
	cfg.KMeansTolerance = 0
	ctx, err := NewContextWithHooks(cfg, Hooks{
		BuildProgress: func(p BuildProgress) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, event{false, p})
		},
		BuildDone: func(seq uint64, layer int, status Status) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, event{true, BuildProgress{Seq: seq, Layer: layer}})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	prefillHooked(t, ctx, 0, 1)
	ctx.Close()
	mu.Lock()
	defer mu.Unlock()
	for layer := 0; layer < 2; layer++ {
		var steps []string
		last, lastFraction := event{}, 0.0
		for _, e := range events {
			if e.progress.Layer != layer {
				continue
			}
			last = e
			if e.done {
				continue
			}
			p := e.progress
			steps = append(steps, fmt.Sprintf("%d %d/%d", p.Stage, p.Done, p.Total))
			if p.Seq != 7 || p.Fraction < lastFraction || p.Fraction > 1 {
				t.Errorf("layer %d: progress %+v after fraction %g", layer, p, lastFraction)
			}
			lastFraction = p.Fraction
		}
		want := "0 1/3, 0 2/3, 0 3/3, 1 300/300"
		if got := strings.Join(steps, ", "); got != want {
			t.Errorf("layer %d: progress %q, want %q", layer, got, want)
		}
		if !last.done || lastFraction != 1 {
			t.Errorf("layer %d: BuildDone last (%v) with the fraction at 1 (%g)", layer, last.done, lastFraction)
		}
	}
}

// Two contexts on one Pool: each reports the pool's threads; the pool
// outlives its Close while they hold it; a closed pool is refused.
func TestHooksSharedPool(t *testing.T) {
	pool, err := NewPool(2)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := pool.Threads(); err != nil || n != 2 {
		t.Fatalf("Threads() = %d, %v; want 2", n, err)
	}
	var contexts []*Context
	for i := 0; i < 2; i++ {
		ctx, err := NewContextWithHooks(refConfig(), Hooks{Pool: pool})
		if err != nil {
			t.Fatal(err)
		}
		contexts = append(contexts, ctx)
	}
	pool.Close()
	for _, ctx := range contexts {
		if got := ctx.Config().WorkerThreads; got != 2 {
			t.Errorf("Config().WorkerThreads = %d, want the pool's 2", got)
		}
		prefillHooked(t, ctx, 0)
		ctx.Close()
	}
	_, err = NewContextWithHooks(refConfig(), Hooks{Pool: pool})
	wantError(t, err, ErrBadState, "pool is closed")
	_, err = pool.Threads()
	wantError(t, err, ErrBadState, "pool is closed")
	_, err = NewContextWithHooks(refConfig(), Hooks{LogLevel: 9})
	wantError(t, err, ErrInvalidArgument, "LogLevel")
}

// A BuildDone hook that calls the context while Close runs gets ErrBadState
// (or its answer, if it ran before): Close does not hold what the call needs
// while pq_destroy waits for the hook.
func TestHooksCallIntoAClosingContext(t *testing.T) {
	var ctxp atomic.Pointer[Context]
	results := make(chan error, 4)
	ctx, err := NewContextWithHooks(refConfig(), Hooks{
		BuildDone: func(seq uint64, layer int, status Status) {
			time.Sleep(50 * time.Millisecond) // let Close begin
			_, err := ctxp.Load().Stats()
			results <- err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctxp.Store(ctx)
	prefillHooked(t, ctx, 0)
	ctx.Close() // returns once the hook has run
	select {
	case err := <-results:
		var e *Error
		if err != nil && !(errors.As(err, &e) && e.Status == ErrBadState) {
			t.Errorf("Stats from the hook: %v; want nil or ErrBadState", err)
		}
	default:
		t.Error("Close returned before the BuildDone hook ran")
	}
}

// One worker thread: layer 0's BuildDone holds it while layer 1's build
// waits behind it, a goroutine waits for that build in WaitBuilds (a call in
// progress), and Close waits for that call. The hook's Stats must not queue
// behind Close, which waits for WaitBuilds, which waits for the worker the
// hook holds: it returns ErrBadState at once, and all three finish. Each
// step is waited for as an observable state (no sleep decides the order); a
// deadlock fails the test when the guard runs out.
func TestHooksCallIsNotQueuedBehindACloseThatWaitsForItsWorker(t *testing.T) {
	const guard = 60 * time.Second
	cfg := refConfig() // WorkerThreads 1
	cfg.NumLayers = 2
	var ctxp atomic.Pointer[Context]
	entered, arranged := make(chan struct{}), make(chan struct{})
	answer := make(chan error, 1)
	ctx, err := NewContextWithHooks(cfg, Hooks{
		BuildDone: func(seq uint64, layer int, status Status) {
			if layer != 0 {
				return
			}
			close(entered)
			<-arranged
			_, err := ctxp.Load().Stats()
			answer <- err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctxp.Store(ctx)
	prefillWithoutWaiting(t, ctx, 0, 1)
	receive(t, entered, guard, "layer 0's BuildDone did not run")
	if info, err := ctx.LayerInfo(7, 1); err != nil || !info.BuildPending {
		t.Fatalf("LayerInfo(7, 1) = %+v, %v; want layer 1's build pending behind the hook", info, err)
	}
	waited := make(chan error, 1)
	go func() { waited <- ctx.WaitBuilds() }()
	waitFor(t, guard, "WaitBuilds in progress", func() bool { return ctx.callsInProgress() == 1 })
	closed := make(chan struct{})
	go func() { ctx.Close(); close(closed) }()
	waitFor(t, guard, "Close waiting for WaitBuilds", ctx.closeIsWaiting)
	close(arranged)

	select {
	case err := <-answer:
		var e *Error
		if !errors.As(err, &e) || e.Status != ErrBadState || e.Message != "pq_stats_get: the context is closed" {
			t.Errorf("Stats from the hook while Close waits: %v; want ErrBadState "+
				"\"pq_stats_get: the context is closed\"", err)
		}
	case <-time.After(guard):
		t.Fatalf("deadlock: the hook's Stats still waits after %v (behind Close, which waits for "+
			"WaitBuilds, which waits for the build behind the hook)", guard)
	}
	receive(t, closed, guard, "Close did not return")
	if err := <-waited; err != nil {
		t.Errorf("WaitBuilds: %v", err)
	}
	_, err = ctx.Stats()
	wantError(t, err, ErrBadState, "pq_stats_get: the context is closed")
}

// prefillWithoutWaiting adds sequence 7 with 300 tokens in each of the given
// layers, each queueing an index build.
func prefillWithoutWaiting(t *testing.T, ctx *Context, layers ...int) {
	t.Helper()
	const tokens = 300
	kv := tokens * refKVHeads * refHeadDim
	if err := ctx.AddSequence(7); err != nil {
		t.Fatal(err)
	}
	for _, layer := range layers {
		keys := TensorF32(refGenerate(uint32(81+2*layer), kv), tokens, refKVHeads, refHeadDim)
		values := TensorF32(refGenerate(uint32(82+2*layer), kv), tokens, refKVHeads, refHeadDim)
		if err := ctx.PrefillLayer(7, layer, keys, values); err != nil {
			t.Fatal(err)
		}
	}
}

// receive waits for ch to be closed, failing the test after guard.
func receive(t *testing.T, ch <-chan struct{}, guard time.Duration, failure string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(guard):
		t.Fatalf("%s after %v", failure, guard)
	}
}

// waitFor polls cond until it holds, failing the test after guard; the
// polling only notices the state, it never decides the order of events.
func waitFor(t *testing.T, guard time.Duration, state string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(guard); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not reached after %v: %s", guard, state)
		}
	}
}

// callsInProgress is the number of calls Close would wait for.
func (c *Context) callsInProgress() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// closeIsWaiting tells whether a Close has begun and not yet taken the
// handle: it waits for the calls in progress.
func (c *Context) closeIsWaiting() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closing && c.handle != nil
}
