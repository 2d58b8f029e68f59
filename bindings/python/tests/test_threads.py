"""Two sequences of one context driven from two Python threads at once give
the same results as one after the other, and library calls release the GIL."""
import sys
import threading

import numpy as np

import pqcache

LAYERS, Q, KV, DIM, TOKENS, STEPS = 2, 4, 2, 32, 600, 12


def options():
    return dict(kmeans_iterations=6, local_tokens=32, topk_tokens=48, seed=11)


def make_data(seq: int):
    rng = np.random.default_rng(seq)
    return (rng.standard_normal((LAYERS, TOKENS + STEPS, KV, DIM)).astype(np.float16),
            rng.standard_normal((LAYERS, TOKENS + STEPS, KV, DIM)).astype(np.float16),
            rng.standard_normal((STEPS, Q, DIM)).astype(np.float16))


def run_sequence(ctx: pqcache.Context, seq: int, data):
    """Prefill, then decode STEPS tokens on every layer; returns every selection
    and the fetched keys of the last step."""
    keys, values, queries = data
    ctx.add_sequence(seq)
    for layer in range(LAYERS):
        ctx.prefill(seq, layer, keys[layer, :TOKENS], values[layer, :TOKENS])
    selections = []
    for step in range(STEPS):
        p = TOKENS + step
        for layer in range(LAYERS):
            ctx.append(seq, layer, keys[layer, p:p + 1], values[layer, p:p + 1])
            selection = ctx.select(seq, layer, queries[step])
            fetched, _ = ctx.fetch(seq, layer, selection)
            selections.append([h.copy() for h in selection.heads()])
            for h, positions in enumerate(selection.heads()):
                np.testing.assert_array_equal(fetched[h, : len(positions)],
                                              keys[layer, positions, h])
    return selections


def test_two_sequences_from_two_threads_match_sequential_runs():
    data = {seq: make_data(seq) for seq in (1, 2)}
    with pqcache.Context(LAYERS, Q, KV, DIM, "f16", **options()) as ctx:
        expected = {seq: run_sequence(ctx, seq, data[seq]) for seq in (1, 2)}
    results, errors = {}, []
    start = threading.Barrier(2)

    def worker(seq):
        try:
            start.wait()
            results[seq] = run_sequence(shared, seq, data[seq])
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    with pqcache.Context(LAYERS, Q, KV, DIM, "f16", **options()) as shared:
        threads = [threading.Thread(target=worker, args=(seq,)) for seq in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert shared.sequence_count() == 2
    for seq in (1, 2):
        assert len(results[seq]) == len(expected[seq]) == LAYERS * STEPS
        for got, want in zip(results[seq], expected[seq]):
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)


def test_library_calls_release_the_gil():
    """With a switch interval far longer than the test, the main thread keeps
    the GIL unless a call releases it. A helper thread woken just before
    pq_wait_builds can then only see the call in progress if that call
    released the GIL; held, it would always see the call finished."""
    rng = np.random.default_rng(5)
    keys = rng.standard_normal((20000, KV, DIM)).astype(np.float32)
    state = ["before"]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    seen = []
    try:
        with pqcache.Context(1, Q, KV, DIM, "f32", kmeans_iterations=10) as ctx:
            ctx.add_sequence(1)
            for attempt in range(10):  # the helper may wake late: try a few builds
                ctx.prefill(1, 0, keys[:10000 + attempt], keys[:10000 + attempt])
                go = threading.Event()
                helper = threading.Thread(target=lambda: (go.wait(), seen.append(state[0])))
                helper.start()
                go.set()
                state[0] = "in the call"
                ctx.wait_builds()
                state[0] = "after the call"
                helper.join()
                if seen[-1] == "in the call":
                    break
    finally:
        sys.setswitchinterval(interval)
    assert "in the call" in seen, f"the helper only ran outside library calls: {seen}"
