"""pqcache.redis (bindings/python/pqcache/redis.py) against a redis-server of
its own on a free loopback port, as the C tests in this folder do: a state put
by one context is got, whole or in steps, by another, which then selects and
fetches what the first does; damaged, missing and refused states raise
PQError with the library's status. CTest test python_redis; without
redis-server (Debian: redis-server, installed by scripts/setup.sh) it reports
SKIPPED with the reason."""
import gc
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import pqcache


def find_redis_server():
    """$PQ_REDIS_SERVER when set (none if it is not executable, as in
    redis_server.h), else redis-server on PATH, else Debian's /usr/bin."""
    named = os.environ.get("PQ_REDIS_SERVER")
    if named:
        return named if os.access(named, os.X_OK) else None
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None)


REDIS_SERVER = find_redis_server()
if not REDIS_SERVER:
    pytest.skip("redis-server is not installed (Debian package redis-server; scripts/setup.sh "
                "installs it)", allow_module_level=True)

import pqcache.redis as pqr  # noqa: E402  (after the skip: the import itself must not be skipped)

LAYERS, KV, Q, DIM = 2, 2, 4, 16
PROMPT = 600


def command(port, *args):
    """One Redis command over RESP, for what the binding does not do (damage a
    block); returns the raw reply."""
    payload = b"*%d\r\n" % len(args) + b"".join(
        b"$%d\r\n%s\r\n" % (len(a), a) for a in (x if isinstance(x, bytes) else str(x).encode() for x in args))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(payload)
        return s.recv(65536)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A redis-server without persistence; its port."""
    folder = tmp_path_factory.mktemp("redis")
    for _ in range(5):  # another process may take the free port first
        port = free_port()
        proc = subprocess.Popen([REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no", "--dir", str(folder)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if command(port, "PING").startswith(b"+PONG"):
                    yield port
                    proc.kill()
                    proc.wait()
                    return
            except OSError:
                time.sleep(0.05)
        proc.kill()
        proc.wait()
    pytest.fail(f"{REDIS_SERVER} did not answer PING on a loopback port in 5 tries")


def values(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def make_context():
    return pqcache.Context(LAYERS, Q, KV, DIM, "f32", sink_tokens=4, local_tokens=16, topk_tokens=16,
                           pq_subspaces=2, pq_bits=4, kmeans_iterations=8, seed=7, worker_threads=1)


def prefilled(seq):
    ctx = make_context()
    ctx.add_sequence(seq)
    for layer in range(LAYERS):
        ctx.prefill(seq, layer, values(10 + layer, (PROMPT, KV, DIM)), values(20 + layer, (PROMPT, KV, DIM)))
    return ctx


def selected(ctx, seq, layer, query):
    selection = ctx.select(seq, layer, query)
    keys, vals = ctx.fetch(seq, layer, selection)
    return [h.tolist() for h in selection.heads()], keys, vals


def same(a, b):
    assert a[0] == b[0]
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[2], b[2])


def test_the_library_is_the_one_this_build_made():
    expected = os.environ.get("PQ_EXPECT_REDIS_LIBRARY")
    if not expected:
        pytest.skip("PQ_EXPECT_REDIS_LIBRARY not set (CTest sets it to the built library)")
    assert os.path.realpath(pqr.library_path()) == os.path.realpath(expected)


def test_put_then_get_in_another_context_selects_and_fetches_the_same(server):
    query = values(30, (Q, DIM))
    with prefilled(5) as a, make_context() as b, pqr.Redis("127.0.0.1", server, 5000) as r:
        r.put(a, 5, "py:whole", block_bytes=4096)
        info = r.info("py:whole")
        state = a.state_size(5)
        assert info == {"state_bytes": state, "block_bytes": 4096, "block_count": -(-state // 4096)}
        assert info["block_count"] > 1  # the blocks are really exercised
        r.get(b, 9, "py:whole")
        assert b.length(9, 1) == PROMPT
        for layer in range(LAYERS):
            same(selected(b, 9, layer, query), selected(a, 5, layer, query))
        assert bytes(b.save(9)) == bytes(a.save(5))
        # Again into a sequence that exists: refused, nothing changed.
        with pytest.raises(pqcache.PQError) as e:
            r.get(b, 9, "py:whole")
        assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"
        r.delete("py:whole")
        with pytest.raises(pqcache.PQError) as e:
            r.info("py:whole")
        assert e.value.status_name == "PQ_ERR_NOT_FOUND" and "py:whole" in e.value.message


def test_streaming_get_selects_before_the_kv_arrive(server):
    query = values(31, (Q, DIM))
    with prefilled(1) as a, make_context() as b, pqr.Redis("127.0.0.1", server) as r:
        r.put(a, 1, "py:stream", block_bytes=2048)
        with r.get_begin(b, 2, "py:stream") as t:
            before = t.progress()
            assert before["state_bytes"] == a.state_size(1)
            assert before["layers_ready"] < LAYERS
            assert 0 < before["description_bytes"] <= before["fetched_bytes"] < before["state_bytes"]
            # The index is there: selection equals the saved sequence's now.
            assert b.select(2, 0, query).heads()[0].tolist() == a.select(1, 0, query).heads()[0].tolist()
            assert t.advance(1) in (False, True)
            t.finish()
            assert t.advance() is True  # done: nothing left
            assert t.progress()["layers_ready"] == LAYERS
        with pytest.raises(pqcache.PQError) as e:
            t.finish()
        assert e.value.status_name == "PQ_ERR_BAD_STATE" and "transfer is closed" in e.value.message
        for layer in range(LAYERS):
            same(selected(b, 2, layer, query), selected(a, 1, layer, query))


def test_abandoned_transfer_removes_its_sequence(server):
    with prefilled(1) as a, make_context() as b, pqr.Redis("127.0.0.1", server) as r:
        r.put(a, 1, "py:abandoned", block_bytes=2048)
        t = r.get_begin(b, 3, "py:abandoned")
        assert b.sequence_count() == 1
        t.close()
        assert b.sequence_count() == 0


@pytest.mark.parametrize("then", ["advance", "finish", "progress", "close", "collect", "redis_close"])
def test_a_transfer_whose_context_closed_first_is_bad_state(server, then):
    """Issue 39 R1: ctx.close() while a transfer is open, then any use of the
    transfer. Before the fix the C transfer removed its sequence from the
    freed context (AddressSanitizer: heap-use-after-free in
    Context::sequence_remove from pq_redis_transfer_free)."""
    with prefilled(1) as a, pqr.Redis("127.0.0.1", server) as r:
        r.put(a, 1, "py:owner", block_bytes=2048)
        ctx = make_context()
        t = r.get_begin(ctx, 2, "py:owner")
        ctx.close()
        if then in ("advance", "finish", "progress"):
            with pytest.raises(pqcache.PQError) as e:
                getattr(t, then)()
            assert e.value.status_name == "PQ_ERR_BAD_STATE"
            assert "pq_destroy" in e.value.message and "py:owner" in e.value.message
            t.close()
        elif then == "close":
            t.close()
        elif then == "collect":
            del t
            gc.collect()
        else:
            r.close()  # frees its open transfers
        # The connection (unless closed) and the other context go on.
        if then != "redis_close":
            assert r.info("py:owner")["state_bytes"] == a.state_size(1)
        assert a.length(1, 0) == PROMPT


def test_a_transfer_left_open_at_interpreter_exit_after_its_context_closed(server):
    """The same at interpreter exit, in a process of its own: the transfer
    and the connection are finalised after the context was closed."""
    script = textwrap.dedent(f"""
        import numpy as np, pqcache, pqcache.redis as pqr
        ctx = pqcache.Context(2, 4, 2, 16, "f32", sink_tokens=4, local_tokens=16, topk_tokens=16,
                              pq_subspaces=2, pq_bits=4, kmeans_iterations=8, worker_threads=1)
        ctx.add_sequence(1)
        rng = np.random.default_rng(1)
        for layer in range(2):
            kv = rng.standard_normal((300, 2, 16)).astype(np.float32)
            ctx.prefill(1, layer, kv, kv)
        r = pqr.Redis("127.0.0.1", {server})
        r.put(ctx, 1, "py:exit", block_bytes=2048)
        other = pqcache.Context(2, 4, 2, 16, "f32", sink_tokens=4, local_tokens=16, topk_tokens=16,
                                pq_subspaces=2, pq_bits=4, kmeans_iterations=8, worker_threads=1)
        t = r.get_begin(other, 2, "py:exit")
        other.close()
        print("left open")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=os.environ.copy())
    assert done.returncode == 0, done.stderr
    assert "left open" in done.stdout
    assert "Sanitizer" not in done.stderr, done.stderr


def test_a_damaged_block_is_corrupt_and_adds_nothing(server):
    with prefilled(1) as a, make_context() as b, pqr.Redis("127.0.0.1", server) as r:
        r.put(a, 1, "py:damaged", block_bytes=4096)
        reply = command(server, "SETRANGE", "py:damaged:blk:1", 10, b"\xff\x00\xff")
        assert reply.startswith(b":"), reply
        with pytest.raises(pqcache.PQError) as e:
            r.get(b, 1, "py:damaged")
        assert e.value.status == pqcache.pqcache_swig.PQ_ERR_CORRUPT
        assert e.value.status_name == "PQ_ERR_CORRUPT"
        assert "py:damaged:blk:1" in e.value.message
        assert b.sequence_count() == 0


def test_errors_are_pqerrors_with_the_librarys_status(server):
    with prefilled(1) as a, pqr.Redis("127.0.0.1", server) as r:
        with pytest.raises(pqcache.PQError) as e:
            r.put(a, 77, "py:unknown")
        assert e.value.status_name == "PQ_ERR_NOT_FOUND"
        with pytest.raises(pqcache.PQError) as e:
            r.put(a, 1, "py:x", block_bytes=0)
        assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"
        with pytest.raises(pqcache.PQError) as e:
            r.put(a, 1, "")
        assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"
        with pytest.raises(pqcache.PQError) as e:
            r.get(a, 2, "py:never-put")
        assert e.value.status_name == "PQ_ERR_NOT_FOUND"
        with pytest.raises(pqcache.PQError) as e:
            r.delete("py:never-put")
        assert e.value.status_name == "PQ_ERR_NOT_FOUND"
        # Checked here, before ctypes could wrap or truncate them.
        with pytest.raises(OverflowError):
            r.put(a, -1, "py:x")
        with pytest.raises(TypeError):
            r.put(a, 1.0, "py:x")
        with pytest.raises(ValueError):
            r.put(a, 1, "py:\0x")
        with pytest.raises(TypeError):
            r.put(object(), 1, "py:x")
    # Closed: BAD_STATE, as pqcache.Context says it.
    with pytest.raises(pqcache.PQError) as e:
        r.info("py:x")
    assert e.value.status_name == "PQ_ERR_BAD_STATE" and e.value.message == "pq_redis_info: the connection is closed"
    with pytest.raises(pqcache.PQError) as e, pqr.Redis("127.0.0.1", server) as r2:
        r2.put(a, 1, "py:x")
    assert e.value.status_name == "PQ_ERR_BAD_STATE" and e.value.message == "pq_redis_put: the context is closed"


def test_a_refused_connection_is_backend_with_host_and_port():
    port = free_port()  # bound a moment ago, now closed: nobody listens
    with pytest.raises(pqcache.PQError) as e:
        pqr.Redis("127.0.0.1", port, 2000)
    assert e.value.status_name == "PQ_ERR_BACKEND"
    assert f"127.0.0.1:{port}" in e.value.message
    with pytest.raises(pqcache.PQError) as e:
        pqr.Redis("127.0.0.1", 0)
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"
