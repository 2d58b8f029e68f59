"""One layer for a batch of sequences: select_batch and fetch_batch give what
the per-sequence calls give, items fail on their own and are named, and
errors name the call the caller made."""
import numpy as np
import pytest

import pqcache
from pqcache import pqcache_swig as raw

KV, Q, DIM = 2, 4, 16
# Capacities 36, 9 and 30: 4 sinks + 16 top-k + 16 local, clipped to the length.
IDS, LENGTHS = [11, 7, 1000], [300, 9, 30]


@pytest.fixture
def ctx():
    with pqcache.Context(1, Q, KV, DIM, "f32", sink_tokens=4, local_tokens=16, topk_tokens=16,
                         pq_subspaces=2, pq_bits=4, kmeans_iterations=4, seed=7,
                         worker_threads=2) as context:
        rng = np.random.default_rng(5)
        for seq, n in zip(IDS, LENGTHS):
            context.add_sequence(seq)
            data = rng.standard_normal((2, n, KV, DIM)).astype(np.float32)
            context.prefill(seq, 0, data[0], data[1])
        context.wait_builds()
        yield context


@pytest.fixture
def queries():
    return list(np.random.default_rng(6).standard_normal((len(IDS), Q, DIM)).astype(np.float32))


def rows(selection):
    return [list(head) for head in selection.heads()]


def test_select_batch_equals_select_per_sequence(ctx, queries):
    want = [ctx.select(seq, 0, q) for seq, q in zip(IDS, queries)]
    assert [ctx.capacity(seq, 0) for seq in IDS] == [36, 9, 30]
    got = ctx.select_batch(0, IDS, queries)
    assert len(got) == len(IDS)
    for g, w in zip(got, want):
        assert rows(g) == rows(w) and g.counts.max() > 0
        assert g.positions.shape[1] >= g.counts.max()
    assert ctx.stats()["select_calls"] == 2 * len(IDS)
    assert ctx.select_batch(0, [], []) == []


def test_select_batch_grows_selections_on_a_fresh_context(ctx, queries):
    # No select ran yet: every selection starts too small, is grown to what
    # the library asked for and selected once more on its own.
    got = ctx.select_batch(0, IDS, queries)
    assert [int(g.counts[0]) for g in got] == [36, 9, 30]
    assert rows(got[2]) == rows(ctx.select(IDS[2], 0, queries[2]))


def test_fetch_batch_equals_fetch_per_sequence(ctx, queries):
    selections = [ctx.select(seq, 0, q) for seq, q in zip(IDS, queries)]
    want = [ctx.fetch(seq, 0, s) for seq, s in zip(IDS, selections)]
    got = ctx.fetch_batch(0, IDS, selections)
    for (gk, gv), (wk, wv) in zip(got, want):
        assert gk.tobytes() == wk.tobytes() and gv.tobytes() == wv.tobytes()
    # Into the caller's arrays, in place.
    out_k = [np.full_like(k, 7) for k, _ in want]
    out_v = [np.full_like(v, 7) for _, v in want]
    got = ctx.fetch_batch(0, IDS, selections, out_k, out_v)
    for (gk, gv), k, v, s, (wk, wv) in zip(got, out_k, out_v, selections, want):
        assert gk is k and gv is v
        for h, positions in enumerate(s.heads()):
            n = len(positions)
            assert k[h, :n].tobytes() == wk[h, :n].tobytes()
            assert v[h, :n].tobytes() == wv[h, :n].tobytes()
            assert (k[h, n:] == 7).all(), "rows past the count are left as they were"
    with pytest.raises(ValueError, match="both or neither"):
        ctx.fetch_batch(0, IDS, selections, out_k)


def test_a_failing_select_item_is_named_and_the_others_are_filled(ctx, queries):
    ids = [IDS[0], 999, IDS[2]]
    for detail in ["PQ_ERR_NOT_FOUND", "is not a sequence"]:
        # First on a fresh context: items[0], too small, is what the library
        # names, so the message for items[1] is built from its status; then
        # the selections are large enough and the library names items[1].
        with pytest.raises(pqcache.BatchError) as e:
            ctx.select_batch(0, ids, queries)
        error = e.value
        assert isinstance(error, pqcache.PQError)
        assert error.status == raw.PQ_ERR_NOT_FOUND and error.status_name == "PQ_ERR_NOT_FOUND"
        assert error.message.startswith("pq_decode_select_batch: items[1] (seq_id 999): ")
        assert detail in error.message, error.message
        assert error.statuses == [0, raw.PQ_ERR_NOT_FOUND, 0]
        assert error.results[1] is None
        assert rows(error.results[0]) == rows(ctx.select(IDS[0], 0, queries[0]))
        assert rows(error.results[2]) == rows(ctx.select(IDS[2], 0, queries[2]))


def test_a_failing_fetch_item_is_named_and_the_others_are_written(ctx, queries):
    selections = [ctx.select(seq, 0, q) for seq, q in zip(IDS, queries)]
    want = [ctx.fetch(seq, 0, s) for seq, s in zip(IDS, selections)]
    with pytest.raises(pqcache.BatchError) as e:
        ctx.fetch_batch(0, [IDS[0], 999, IDS[2]], selections)
    error = e.value
    assert error.status_name == "PQ_ERR_NOT_FOUND"
    assert error.message.startswith("pq_fetch_kv_batch: items[1] (seq_id 999): ")
    assert error.statuses == [0, raw.PQ_ERR_NOT_FOUND, 0] and error.results[1] is None
    for i in (0, 2):
        assert error.results[i][0].tobytes() == want[i][0].tobytes()
        assert error.results[i][1].tobytes() == want[i][1].tobytes()


def test_call_level_errors_raise_pqerror_and_run_no_item(ctx, queries):
    with pytest.raises(pqcache.PQError) as e:
        ctx.select_batch(0, [IDS[0], IDS[0]], queries[:2])
    assert type(e.value) is pqcache.PQError and not hasattr(e.value, "statuses")
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT" and "seq_id" in e.value.message
    with pytest.raises(pqcache.PQError) as e:
        ctx.select_batch(3, IDS, queries)
    assert "layer" in e.value.message
    # Malformed arguments are refused before the library runs.
    with pytest.raises(ValueError, match="one each"):
        ctx.select_batch(0, IDS, queries[:2])
    selection = ctx.select(IDS[0], 0, queries[0])
    with pytest.raises(ValueError, match="kv heads"):
        raw.pq_fetch_kv_batch(ctx._ctx, 0, [IDS[0]],
                              [(np.zeros((1, 36), np.int32), np.zeros(1, np.int32))],
                              [np.zeros((36, KV, DIM), np.float32)],
                              [np.zeros((36, KV, DIM), np.float32)])
    out = np.zeros((36, KV, DIM), np.float32)
    with pytest.raises(ValueError, match="read-only"):
        out.flags.writeable = False
        raw.pq_fetch_kv_batch(ctx._ctx, 0, [IDS[0]], [selection.arrays], [out], [out.copy()])
    with pytest.raises(OverflowError):
        ctx.select_batch(0, [-1], queries[:1])


def test_select_errors_name_pq_decode_select(ctx, queries):
    with pytest.raises(pqcache.PQError) as e:
        ctx.select(12345, 0, queries[0])
    assert e.value.status_name == "PQ_ERR_NOT_FOUND"
    assert e.value.message.startswith("pq_decode_select")
    assert "pq_selection_capacity" not in e.value.message


def test_capacity_for_matches_the_sequences_and_never_shrinks(ctx):
    for seq, n in zip(IDS, LENGTHS):
        assert ctx.capacity_for(0, n) == ctx.capacity(seq, 0)
    capacities = [ctx.capacity_for(0, n) for n in range(100)]
    assert capacities == sorted(capacities) and capacities[-1] == 36
    with pytest.raises(pqcache.PQError) as e:
        ctx.capacity_for(0, -1)
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"
