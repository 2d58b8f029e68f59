"""Arrays cross without copies: the library reads strided views and writes
into the caller's arrays in place; exports are released after every call."""
import sys

import numpy as np
import pytest

import pqcache

KV, Q, DIM = 2, 4, 16


@pytest.fixture
def ctx():
    with pqcache.Context(1, Q, KV, DIM, "f32", selector="window", local_tokens=8) as context:
        context.add_sequence(1)
        yield context


def test_fetch_writes_into_the_callers_arrays_in_place(ctx):
    keys = np.random.default_rng(0).standard_normal((100, KV, DIM)).astype(np.float32)
    ctx.prefill(1, 0, keys, keys * 2)
    selection = ctx.select(1, 0, np.ones((Q, DIM), np.float32))
    out_k = np.full((KV, selection.capacity, DIM), 7, np.float32)
    out_v = np.full((KV, selection.capacity, DIM), 7, np.float32)
    got_k, got_v = ctx.fetch(1, 0, selection, out=(out_k, out_v))
    assert got_k is out_k and got_v is out_v
    for h, positions in enumerate(selection.heads()):
        np.testing.assert_array_equal(out_k[h, : len(positions)], keys[positions, h])
        np.testing.assert_array_equal(out_v[h, : len(positions)], keys[positions, h] * 2)


def test_fetch_into_a_strided_view_of_a_larger_buffer(ctx):
    keys = np.arange(50 * KV * DIM, dtype=np.float32).reshape(50, KV, DIM)
    ctx.prefill(1, 0, keys, keys)
    selection = ctx.select(1, 0, np.ones((Q, DIM), np.float32))
    n = int(selection.counts.max())
    # A paged-cache style destination: every other row of a bigger block.
    block_k = np.zeros((KV, 2 * n, DIM + 4), np.float32)
    block_v = np.zeros((KV, 2 * n, DIM + 4), np.float32)
    view_k, view_v = block_k[:, ::2, :DIM], block_v[:, ::2, :DIM]
    ctx.fetch(1, 0, selection, out=(view_k, view_v))
    for h, positions in enumerate(selection.heads()):
        np.testing.assert_array_equal(block_k[h, ::2, :DIM][: len(positions)], keys[positions, h])
    assert not block_k[:, 1::2].any() and not block_k[:, :, DIM:].any()


def test_select_fills_a_reused_selection_in_place(ctx):
    keys = np.random.default_rng(1).standard_normal((64, KV, DIM)).astype(np.float32)
    ctx.prefill(1, 0, keys, keys)
    selection = pqcache.SelectionResult(KV, ctx.capacity(1, 0))
    positions, counts = selection.positions, selection.counts
    assert ctx.select(1, 0, np.ones((Q, DIM), np.float32), out=selection) is selection
    assert selection.positions is positions and selection.counts is counts
    # WINDOW: the 4 sinks, then the most recent tokens (top-k widens the window).
    assert list(counts) == [selection.capacity] * KV
    window = selection.capacity - 4
    np.testing.assert_array_equal(positions[:, :4], [[0, 1, 2, 3]] * KV)
    np.testing.assert_array_equal(positions[:, 4:], [np.arange(64 - window, 64)] * KV)


def test_head_major_and_strided_inputs_are_read_in_place(ctx):
    rng = np.random.default_rng(2)
    big = rng.standard_normal((KV, 300, DIM + 8)).astype(np.float32)
    keys = big[:, :, 4:4 + DIM]  # [heads][tokens][dim], rows 96 bytes apart
    assert not keys.flags.c_contiguous
    ctx.prefill(1, 0, keys, keys, layout="head_major")
    selection = ctx.select(1, 0, np.ones((Q, DIM), np.float32))
    k_out, _ = ctx.fetch(1, 0, selection)
    for h, positions in enumerate(selection.heads()):
        np.testing.assert_array_equal(k_out[h, : len(positions)], keys[h, positions])


def test_any_buffer_protocol_object_works(ctx):
    keys = np.random.default_rng(3).standard_normal((20, KV, DIM)).astype(np.float32)
    ctx.prefill(1, 0, memoryview(keys), memoryview(keys))
    assert ctx.length(1, 0) == 20


def test_non_contiguous_last_axis_is_rejected(ctx):
    wide = np.zeros((10, KV, 2 * DIM), np.float32)
    with pytest.raises(ValueError, match="last axis"):
        ctx.prefill(1, 0, wide[:, :, ::2], wide[:, :, ::2])
    selection = pqcache.SelectionResult(KV, 8)
    with pytest.raises(ValueError, match="last axis"):
        ctx.fetch(1, 0, selection, out=(wide[:, :, ::2].transpose(1, 0, 2),) * 2)
    assert ctx.length(1, 0) == 0  # nothing reached the library


def test_read_only_outputs_are_rejected(ctx):
    keys = np.ones((30, KV, DIM), np.float32)
    ctx.prefill(1, 0, keys, keys)
    selection = ctx.select(1, 0, np.ones((Q, DIM), np.float32))
    out = np.zeros((KV, selection.capacity, DIM), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        ctx.fetch(1, 0, selection, out=(out, out))


def test_buffers_are_released_after_success_and_failure(ctx):
    # An export still held would keep a reference to its array.
    keys = np.ones((30, KV, DIM), np.float32)
    bad = np.full((5, KV, DIM), np.nan, np.float32)
    query = np.ones((Q, DIM), np.float32)
    before = [sys.getrefcount(a) for a in (keys, bad, query)]
    ctx.prefill(1, 0, keys, keys)
    with pytest.raises(pqcache.PQError):
        ctx.prefill(1, 0, bad, bad)
    selection = ctx.select(1, 0, query)
    assert [sys.getrefcount(a) for a in (keys, bad, query)] == before
    out = np.zeros((KV, selection.capacity, DIM), np.float32)
    arrays = (out, selection.positions, selection.counts)
    before = [sys.getrefcount(a) for a in arrays]
    ctx.fetch(1, 0, selection, out=(out, out.copy()))
    with pytest.raises(pqcache.PQError):
        ctx.fetch(1, 0, selection, out=(out[:, :1], out[:, :1]))
    assert [sys.getrefcount(a) for a in arrays] == before


def misaligned(array):
    """The same values in a buffer that starts one byte off (numpy accepts
    such views; the library reads elements as bytes)."""
    raw = np.zeros(array.nbytes + 1, np.uint8)
    view = np.frombuffer(raw.data, dtype=array.dtype, count=array.size, offset=1)
    view = view.reshape(array.shape)
    view[...] = array
    assert not view.flags.aligned
    return view


def test_misaligned_arrays_work_like_aligned_ones():
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((200, KV, DIM)).astype(np.float32)
    query = rng.standard_normal((Q, DIM)).astype(np.float32)
    results = []
    for k, q in ((keys, query), (misaligned(keys), misaligned(query))):
        with pqcache.Context(1, Q, KV, DIM, "f32", selector="pq", pq_bits=4,
                             kmeans_iterations=3, local_tokens=8) as c:
            c.add_sequence(1)
            c.prefill(1, 0, k, k)
            selection = c.select(1, 0, q)
            out = misaligned(np.zeros((KV, selection.capacity, DIM), np.float32))
            c.fetch(1, 0, selection, out=(out, np.zeros_like(out)))
            results.append((selection.positions.copy(), np.array(out)))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
