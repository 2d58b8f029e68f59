"""The hooks of pq_create_with_hooks from Python: log lines at a level, a
callable when an index build ends and as it advances, a pool shared by contexts; an exception
in a hook is reported and goes no further; bad arguments are named."""
import sys
import threading
import time

import numpy as np
import pytest

import pqcache

Q, KV, DIM, N = 4, 2, 32, 600


def filled(ctx, layers=(0,), wait=True):
    """Sequence 7 with N tokens in each of layers, each queueing a build;
    waits for the builds unless told not to."""
    rng = np.random.default_rng(1)
    ctx.add_sequence(7)
    for layer in layers:
        kv = rng.standard_normal((2, N, KV, DIM)).astype(np.float32)
        ctx.prefill(7, layer, kv[0], kv[1])
    if wait:
        ctx.wait_builds()


def test_log_lines_arrive_at_their_level():
    lines = []
    lock = threading.Lock()

    def log(level, message):
        with lock:
            lines.append((level, message))

    ctx = pqcache.Context(1, Q, KV, DIM, "f32", log=log, log_level="debug")
    filled(ctx)
    ctx.close()
    levels = {level for level, _ in lines}
    assert levels <= set(pqcache.LOG_LEVELS.values()) and pqcache.LOG_LEVELS["info"] in levels
    assert any("index built: seq_id 7 layer 0" in m for _, m in lines), lines
    assert any("sequence" in m and "7" in m for level, m in lines
               if level == pqcache.LOG_LEVELS["debug"]), lines
    # At "error" only failed calls log: an unknown sequence is one.
    errors = []
    with pqcache.Context(1, Q, KV, DIM, "f32", log=lambda l, m: errors.append((l, m)),
                         log_level="error") as quiet:
        filled(quiet)
        with pytest.raises(pqcache.PQError):
            quiet.length(99, 0)
    assert errors and all(level == pqcache.LOG_LEVELS["error"] for level, _ in errors)


def test_build_done_runs_for_every_layer():
    done = []
    ctx = pqcache.Context(2, Q, KV, DIM, "f32",
                          on_build_done=lambda seq, layer, status: done.append((seq, layer, status)))
    filled(ctx, layers=(0, 1))
    ctx.close()  # waits for the builds' hooks
    assert sorted(done) == [(7, 0, 0), (7, 1, 0)]


def test_build_progress_rises_to_one_before_build_done():
    events = []
    lock = threading.Lock()

    def progress(p):
        with lock:
            events.append(p)

    def done(seq, layer, status):
        with lock:
            events.append(("done", seq, layer, status))

    ctx = pqcache.Context(2, Q, KV, DIM, "f32", kmeans_iterations=3, kmeans_tolerance=0.0,
                          on_build_progress=progress, on_build_done=done)
    filled(ctx, layers=(0, 1))
    ctx.close()
    for layer in (0, 1):
        mine = [e for e in events
                if (e[2] if isinstance(e, tuple) and e[0] == "done" else e.layer) == layer]
        assert mine[-1] == ("done", 7, layer, 0), mine
        steps = mine[:-1]
        assert all(isinstance(p, pqcache.BuildProgress) and p.seq_id == 7 for p in steps)
        assert [(p.stage, p.done, p.total) for p in steps] == [
            ("kmeans", 1, 3), ("kmeans", 2, 3), ("kmeans", 3, 3), ("encode", N, N)], steps
        fractions = [p.fraction for p in steps]
        assert fractions == sorted(fractions) and fractions[-1] == 1.0
    with pytest.raises(TypeError, match="on_build_progress must be callable"):
        pqcache.Context(1, Q, KV, DIM, "f32", on_build_progress=3)


def test_a_pool_serves_several_contexts():
    with pqcache.Pool(2) as pool:
        assert pool.threads == 2
        contexts = [pqcache.Context(1, Q, KV, DIM, "f32", pool=pool) for _ in range(2)]
    for ctx in contexts:  # the pool outlives its Python object while contexts hold it
        assert ctx.config()["worker_threads"] == 2
        filled(ctx)
        ctx.close()
    with pytest.raises(pqcache.PQError, match="closed"):
        pool.threads  # noqa: B018


def test_an_exception_in_a_hook_is_reported_not_raised():
    seen = []
    old = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(u.exc_type)
    try:
        def broken(seq, layer, status):
            raise RuntimeError("hook failed")
        ctx = pqcache.Context(1, Q, KV, DIM, "f32", on_build_done=broken)
        filled(ctx)
        assert ctx.length(7, 0) == N  # the context goes on
        ctx.close()
    finally:
        sys.unraisablehook = old
    assert seen == [RuntimeError]


def test_bad_hook_arguments_are_named():
    with pytest.raises(ValueError, match="log_level"):
        pqcache.Context(1, Q, KV, DIM, "f32", log=print, log_level="loud")
    with pytest.raises(TypeError, match="on_build_done"):
        pqcache.Context(1, Q, KV, DIM, "f32", on_build_done=3)
    pool = pqcache.Pool(1)
    pool.close()
    with pytest.raises(pqcache.PQError, match="pool is closed"):
        pqcache.Context(1, Q, KV, DIM, "f32", pool=pool)


def wait_for(state, condition, guard_s):
    """Polls condition until it holds; the polling only notices the state, it
    never decides the order of events. Fails after guard_s seconds."""
    deadline = time.monotonic() + guard_s
    while not condition():
        assert time.monotonic() < deadline, f"not reached after {guard_s} s: {state}"
        time.sleep(0.001)


def test_a_hook_call_is_not_queued_behind_a_close_that_waits_for_its_worker():
    """One worker thread: layer 0's on_build_done holds it while layer 1's
    build waits behind it, a thread waits for that build in wait_builds() (a
    call in flight), and close() waits for that call. The hook's stats() must
    not queue behind close(), which waits for wait_builds(), which waits for
    the worker the hook holds: it raises the closed-context error at once,
    and all three finish. Each step is waited for as an observable state; a
    deadlock fails the test when the guard runs out."""
    guard_s = 60
    entered, arranged = threading.Event(), threading.Event()
    answers = []
    holder = {}

    def done(seq, layer, status):
        if layer != 0:
            return
        entered.set()
        arranged.wait()
        try:
            answers.append(holder["ctx"].stats())
        except pqcache.PQError as error:
            answers.append(error)

    ctx = holder["ctx"] = pqcache.Context(2, Q, KV, DIM, "f32", worker_threads=1,
                                          on_build_done=done)
    filled(ctx, layers=(0, 1), wait=False)
    assert entered.wait(guard_s), "layer 0's on_build_done did not run"
    assert ctx.layer_info(7, 1)["build_pending"], "layer 1's build should wait behind the hook"
    waited = []

    def wait():
        try:
            ctx.wait_builds()
            waited.append("returned")
        except pqcache.PQError as error:
            waited.append(error)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    wait_for("wait_builds() in flight", lambda: sum(ctx._callers.values()) == 1, guard_s)
    closer = threading.Thread(target=ctx.close, daemon=True)
    closer.start()
    wait_for("close() waiting for wait_builds()",
             lambda: ctx._closer is not None and ctx._ctx is not None, guard_s)
    arranged.set()
    closer.join(guard_s)
    assert not closer.is_alive(), (
        f"deadlock: close() still waits after {guard_s} s (the hook's stats() behind it, "
        "wait_builds() behind the hook)")
    waiter.join(guard_s)
    assert waited == ["returned"], waited
    assert len(answers) == 1 and isinstance(answers[0], pqcache.PQError), answers
    assert (answers[0].status_name, answers[0].message) == (
        "PQ_ERR_BAD_STATE", "pq_stats_get: the context is closed"), answers
