"""Context.close() racing calls on other threads (issue 39 audit): library
calls run without the GIL, so a close() that freed the context while a call
was in flight was a use-after-free (pq_fetch_kv reading a freed selector:
"num_kv_heads x capacity positions ... overflow the address space", or a
crash). close() now waits for the calls in flight, and a call that starts
once close() has begun raises PQError PQ_ERR_BAD_STATE "<C function>: the
context is closed", as in Go and Java (docs/bindings/errors.md)."""
import functools
import gc
import os
import random
import shutil
import socket
import subprocess
import threading

import numpy as np
import pytest

import pqcache
from pqcache import pqcache_swig as raw

KV, Q, DIM, TOKENS = 2, 4, 64, 2048
# Rounds of the stress test; each takes a few milliseconds (more under ASan).
ROUNDS = int(os.environ.get("PQ_CLOSE_RACE_ROUNDS", "50"))


def make_context():
    # "exact" scores every token, so select and fetch hold the library for a
    # while; 256-token K/V chunks of 256 KiB are mmap'd, so a read after
    # pq_destroy faults even without AddressSanitizer.
    ctx = pqcache.Context(1, Q, KV, DIM, "f32", selector="exact", topk_tokens=512,
                          local_tokens=64, worker_threads=1)
    ctx.add_sequence(1)
    data = np.random.default_rng(0).standard_normal((TOKENS, KV, DIM)).astype(np.float32)
    ctx.prefill(1, 0, data, data)
    return ctx


def assert_closed_error(error, op):
    """A call that met the close: exactly the closed-context error of `op`."""
    assert isinstance(error, pqcache.PQError), repr(error)
    assert (error.status, error.status_name, error.message) == (
        raw.PQ_ERR_BAD_STATE, "PQ_ERR_BAD_STATE", f"{op}: the context is closed"), repr(error)


def worker(ctx, kind, seq_base, state, start, outcomes):
    """Calls of one kind in a loop until one meets the close; records
    (C function of the failing call, the error) or a surprise."""
    query = np.random.default_rng(seq_base).standard_normal((Q, DIM)).astype(np.float32)
    op = None
    try:
        start.wait()
        op = "started"
        for i in range(100000):
            if kind == "decode":
                op = "pq_decode_select"
                selection = ctx.select(1, 0, query)
                op = "pq_fetch_kv"
                ctx.fetch(1, 0, selection)
                op = "pq_decode_attend"
                ctx.attend(1, 0, query, selection)
            elif kind == "save":
                op = "pq_sequence_save_buffer"
                ctx.save(1)
                op = "pq_sequence_length"
                ctx.length(1, 0)
            else:  # a restore in pieces into a sequence of its own
                seq = seq_base + i
                op = "pq_sequence_restore_begin"
                at = ctx.restore_begin(seq, state)
                op = "pq_sequence_restore_kv"
                while at < len(state):
                    at += ctx.restore_kv(seq, memoryview(state)[at:])
                op = "pq_sequence_remove"
                ctx.remove_sequence(seq)
        outcomes.append((kind, op, None))  # never met the close (it came late)
    except BaseException as error:  # judged by the main thread
        outcomes.append((kind, op, error))
        if op is None:  # failed before the barrier: the main thread goes on
            start.abort()


def close_while_running(ctx, workers, rng, most_s):
    """Runs each worker(start, outcomes) on a thread of its own, closes ctx
    from this thread at a random moment up to most_s after they all began,
    and returns their outcomes once all have ended."""
    start = threading.Barrier(len(workers) + 1)
    outcomes = []
    threads = [threading.Thread(target=work, args=(start, outcomes)) for work in workers]
    for thread in threads:
        thread.start()
    start.wait()
    threading.Event().wait(rng.uniform(0, most_s))  # let calls get under way
    ctx.close()
    for thread in threads:
        thread.join()
    assert len(outcomes) == len(workers)
    return outcomes


def test_close_racing_calls_waits_for_them_or_reports_closed():
    """Calls on three threads (select, fetch and attend; save; a restore in
    pieces) while the main thread closes the context, ROUNDS times: each call
    completes or raises the closed-context error naming its C function;
    nothing crashes or reads freed memory. Before the fix every run of 50
    rounds failed: a wrong error from the freed context (PQ_ERR_NOT_FOUND for
    seq_id 1, PQ_ERR_CORRUPT, PQ_ERR_INTERNAL), a SIGSEGV, or under
    AddressSanitizer a heap-use-after-free."""
    rng = random.Random(39)
    for round_ in range(ROUNDS):
        ctx = make_context()
        state = ctx.save(1)
        workers = [functools.partial(worker, ctx, kind, 1000 * (t + 1), state)
                   for t, kind in enumerate(("decode", "decode", "save", "restore"))]
        for kind, op, error in close_while_running(ctx, workers, rng, 0.004):
            assert error is not None, f"round {round_}: {kind} never met the close"
            assert_closed_error(error, op)
        # A call after close() returned, and a second close(), as always.
        with pytest.raises(pqcache.PQError) as e:
            ctx.select(1, 0, np.zeros((Q, DIM), np.float32))
        assert_closed_error(e.value, "pq_decode_select")
        ctx.close()


class PathDuring:
    """An os.PathLike whose __fspath__ runs `during()` first: Python code run
    inside a library call (the native module converts the path after the
    call has begun), to hold a call in flight or to re-enter from it."""

    def __init__(self, path, during):
        self.path, self.during = path, during

    def __fspath__(self):
        self.during()
        return os.fspath(self.path)


def small_context():
    ctx = pqcache.Context(1, 4, 2, 16, "f32", selector="exact", local_tokens=8)
    ctx.add_sequence(1)
    data = np.random.default_rng(1).standard_normal((64, 2, 16)).astype(np.float32)
    ctx.prefill(1, 0, data, data)
    return ctx


def test_close_waits_for_a_call_in_flight_and_refuses_new_calls_meanwhile(tmp_path):
    """Deterministic: save_file is held inside the library call; two close()
    calls on other threads wait for it (neither frees the context under
    it), a new call raises the closed error at once, and the held save
    completes and writes the whole state."""
    ctx = small_context()
    expected = ctx.state_size(1)
    inside, go = threading.Event(), threading.Event()

    def during():
        inside.set()
        assert go.wait(30)

    saved = []
    caller = threading.Thread(
        target=lambda: saved.append(ctx.save_file(1, PathDuring(tmp_path / "s", during))))
    caller.start()
    assert inside.wait(30)
    closers = [threading.Thread(target=ctx.close) for _ in range(2)]
    for closer in closers:
        closer.start()
    for _ in range(3000):  # until a close() has begun
        try:
            ctx.length(1, 0)
        except pqcache.PQError as error:
            assert_closed_error(error, "pq_sequence_length")
            break
        threading.Event().wait(0.01)
    else:
        pytest.fail("close() did not begin")
    closers[0].join(0.2)
    assert all(closer.is_alive() for closer in closers), "close() did not wait for the save"
    go.set()
    caller.join(30)
    for closer in closers:
        closer.join(30)
        assert not closer.is_alive()
    assert saved == [None] and (tmp_path / "s").stat().st_size == expected
    with pytest.raises(pqcache.PQError) as e:
        ctx.save_file(1, tmp_path / "t")
    assert_closed_error(e.value, "pq_sequence_save_file")


def test_close_inside_a_call_on_the_same_thread_raises_instead_of_hanging(tmp_path):
    """close() from code that runs inside a call on the same context on the
    same thread (here the path's __fspath__; a finalizer or a signal handler
    alike) cannot wait for that call: PQError PQ_ERR_BAD_STATE, and the
    context stays open."""
    ctx = small_context()
    errors = []

    def during():
        try:
            ctx.close()
        except pqcache.PQError as error:
            errors.append(error)

    thread = threading.Thread(target=ctx.save_file, args=(1, PathDuring(tmp_path / "s", during)),
                              daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "close() inside a call on the same thread hung"
    assert len(errors) == 1
    error = errors[0]
    assert (error.status, error.status_name) == (raw.PQ_ERR_BAD_STATE, "PQ_ERR_BAD_STATE")
    assert error.message.startswith("pq_destroy: close() cannot run inside a call on the same "
                                    "context")
    assert (tmp_path / "s").stat().st_size == ctx.state_size(1)  # the call went on
    ctx.close()
    with pytest.raises(pqcache.PQError) as e:
        ctx.length(1, 0)
    assert_closed_error(e.value, "pq_sequence_length")


def test_collected_contexts_free_themselves_quietly():
    """__del__ still closes: a context never closed, one whose __init__ failed
    (before the library was called) and one already closed."""
    with pytest.raises(ValueError):
        pqcache.Context(1, 2, 2, 16, "f64")
    with pytest.raises(pqcache.PQError):
        pqcache.Context(1, 3, 2, 16)  # refused by pq_create
    open_ctx, closed_ctx = small_context(), small_context()
    closed_ctx.close()
    del open_ctx, closed_ctx
    gc.collect()


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory):
    """A redis-server of this test's own on a free loopback port (as
    tests/redis does), answering once pqcache.redis connects to it."""
    executable = shutil.which("redis-server")
    if executable is None:
        pytest.skip("redis-server is not installed (Debian package redis-server)")
    try:
        import pqcache.redis as pqr
    except ImportError as error:
        pytest.skip(str(error))
    folder = tmp_path_factory.mktemp("redis")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([executable, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(folder)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        for _ in range(200):
            try:
                pqr.Redis("127.0.0.1", port, 1000).close()
                break
            except pqcache.PQError:
                if proc.poll() is not None:
                    pytest.skip(f"redis-server exited ({proc.returncode}): port {port} taken?")
                threading.Event().wait(0.05)
        else:
            pytest.fail(f"redis-server on port {port} did not answer in 10 s")
        yield port
    finally:
        proc.kill()
        proc.wait()


def redis_worker(pqr, port, ctx, kind, seq_base, start, outcomes):
    """pqcache.redis calls on ctx until one meets the close; records as
    worker does. A transfer met by the close reports the C library's
    PQ_ERR_BAD_STATE (its context destroyed) and is still freed."""
    op, transfer = None, None
    try:
        with pqr.Redis("127.0.0.1", port, 5000) as conn:
            start.wait()
            op = "started"
            for i in range(100000):
                seq = seq_base + i
                if kind == "put":
                    op = "pq_redis_put"
                    conn.put(ctx, 1, f"close-race:{seq_base}", block_bytes=2048)
                    continue
                if kind == "get":
                    op = "pq_redis_get"
                    conn.get(ctx, seq, "close-race")
                else:
                    op = "pq_redis_get_begin"
                    transfer = conn.get_begin(ctx, seq, "close-race")
                    op = "transfer"
                    transfer.advance(1)
                    transfer.finish()
                    transfer.close()
                op = "pq_sequence_remove"
                ctx.remove_sequence(seq)
        outcomes.append((kind, op, None))
    except BaseException as error:
        outcomes.append((kind, op, error))
        if op is None:
            start.abort()
    finally:
        if transfer is not None:
            transfer.close()


def test_redis_calls_racing_close_wait_for_it_or_report_closed(redis_port):
    """pqcache.redis put, get and a streaming get (get_begin, advance, finish,
    close) on three threads while the main thread closes their context, 20
    times: each completes, raises the closed-context error naming its C
    function, or (a transfer begun before the close) the C library's
    PQ_ERR_BAD_STATE for a destroyed context; no crash."""
    import pqcache.redis as pqr
    with small_context() as source, pqr.Redis("127.0.0.1", redis_port) as conn:
        conn.put(source, 1, "close-race", block_bytes=1024)
    rng = random.Random(391)
    for round_ in range(20):
        ctx = small_context()
        workers = [functools.partial(redis_worker, pqr, redis_port, ctx, kind, 1000 * (t + 1))
                   for t, kind in enumerate(("put", "get", "stream"))]
        for kind, op, error in close_while_running(ctx, workers, rng, 0.01):
            assert error is not None, f"round {round_}: {kind} never met the close"
            if op == "transfer":
                assert isinstance(error, pqcache.PQError), repr(error)
                assert error.status_name == "PQ_ERR_BAD_STATE", repr(error)
                assert "pq_destroy" in error.message and "close-race" in error.message
            else:
                assert_closed_error(error, op)
