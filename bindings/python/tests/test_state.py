"""Sequence state (0.5): truncate, fork, save and restore keep what a sequence
selects and fetches, and damaged states are refused."""
import numpy as np
import pytest

import pqcache
from reference_data import reference_values

KV, Q, DIM = 2, 4, 16
PROMPT = 600  # two full 256-token chunks and a partial one


def make_context():
    return pqcache.Context(1, Q, KV, DIM, "f32", sink_tokens=4, local_tokens=16, topk_tokens=16,
                           pq_subspaces=2, pq_bits=4, kmeans_iterations=8, seed=7,
                           worker_threads=1)


def select_and_fetch(ctx, seq, query):
    """seq's selection for query (positions per kv head) and the rows it fetches."""
    selection = ctx.select(seq, 0, query)
    keys, values = ctx.fetch(seq, 0, selection)
    return [h.tolist() for h in selection.heads()], keys, values


def add_prefilled(ctx, seq):
    """Adds seq with a PROMPT-token prefill and 4 decode steps (the state tests' sequence)."""
    ctx.add_sequence(seq)
    ctx.prefill(seq, 0, reference_values(61, PROMPT * KV * DIM).reshape(PROMPT, KV, DIM),
                reference_values(62, PROMPT * KV * DIM).reshape(PROMPT, KV, DIM))
    for step in range(4):
        ctx.append(seq, 0, reference_values(63 + 2 * step, KV * DIM).reshape(1, KV, DIM),
                   reference_values(64 + 2 * step, KV * DIM).reshape(1, KV, DIM))
    assert ctx.length(seq, 0) == PROMPT + 4


def test_truncate_fork_save_and_restore_keep_selections_and_rows(tmp_path):
    with make_context() as ctx, make_context() as other:
        add_prefilled(ctx, 1)

        # Two rejected speculative tokens rolled back; more than the sequence
        # holds is refused.
        ctx.truncate(1, PROMPT + 2)
        assert ctx.length(1, 0) == PROMPT + 2
        with pytest.raises(pqcache.PQError) as e:
            ctx.truncate(1, PROMPT + 100)
        assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"
        with pytest.raises(pqcache.PQError) as e:
            ctx.truncate(99, 1)
        assert e.value.status_name == "PQ_ERR_NOT_FOUND"

        query = reference_values(71, Q * DIM).reshape(Q, DIM)
        want_sel, want_k, want_v = select_and_fetch(ctx, 1, query)

        # A fork selects what its parent selects.
        ctx.fork(1, 2)
        assert ctx.length(2, 0) == PROMPT + 2
        assert select_and_fetch(ctx, 2, query)[0] == want_sel
        with pytest.raises(pqcache.PQError) as e:
            ctx.fork(1, 2)
        assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"

        # Save to bytes and to a file (str or os.PathLike): the same bytes.
        state = ctx.save(1)
        assert isinstance(state, bytes) and ctx.state_size(1) == len(state)
        path = tmp_path / "state.bin"
        ctx.save_file(1, path)
        assert path.read_bytes() == state
        ctx.save_file(1, str(tmp_path / "again.bin"))
        assert (tmp_path / "again.bin").read_bytes() == state
        with pytest.raises(pqcache.PQError) as e:
            ctx.save(99)
        assert e.value.status_name == "PQ_ERR_NOT_FOUND"
        with pytest.raises(ValueError):
            ctx.save_file(1, "bad\0path")

        # The raw call into a caller's buffer, and its size check.
        buffer = bytearray(len(state))
        assert pqcache.pqcache_swig.pq_sequence_save_buffer(ctx._ctx, 1, buffer) == len(state)
        assert bytes(buffer) == state
        with pytest.raises(pqcache.PQError) as e:
            pqcache.pqcache_swig.pq_sequence_save_buffer(ctx._ctx, 1, bytearray(10))
        assert e.value.status_name == "PQ_ERR_BUFFER_TOO_SMALL"

        # Restored in this context (from bytes, a numpy array, the file) and
        # in a second one: the same length, selections and rows.
        ctx.restore(3, state)
        ctx.restore(4, np.frombuffer(state, np.uint8))
        ctx.restore_file(5, path)
        other.restore(1, memoryview(state))
        for context, seq in [(ctx, 3), (ctx, 4), (ctx, 5), (other, 1)]:
            assert context.length(seq, 0) == PROMPT + 2
            sel, k, v = select_and_fetch(context, seq, query)
            assert sel == want_sel, f"restored sequence {seq}"
            np.testing.assert_array_equal(k, want_k)
            np.testing.assert_array_equal(v, want_v)

        # Damaged states are refused and add nothing.
        count = ctx.sequence_count()
        flipped = bytearray(state)
        flipped[len(state) // 2] ^= 0xFF
        with pytest.raises(pqcache.PQError) as e:
            ctx.restore(6, flipped)
        assert e.value.status == pqcache.pqcache_swig.PQ_ERR_CORRUPT == -9
        assert e.value.status_name == "PQ_ERR_CORRUPT" and e.value.message
        assert str(e.value).startswith("PQ_ERR_CORRUPT: ")
        with pytest.raises(pqcache.PQError) as e:
            ctx.restore(6, state[: len(state) // 2])
        assert e.value.status_name in ("PQ_ERR_CORRUPT", "PQ_ERR_INVALID_ARGUMENT")
        assert ctx.sequence_count() == count
        with pytest.raises(pqcache.PQError) as e:
            ctx.restore(3, state)
        assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"
        with pytest.raises(pqcache.PQError) as e:
            ctx.restore_file(6, tmp_path / "missing.bin")
        assert e.value.status_name == "PQ_ERR_NOT_FOUND"
        with pytest.raises(TypeError):
            ctx.restore(6, "not bytes")


def test_new_statuses_are_named():
    assert pqcache.STATUS_NAMES[-9] == "PQ_ERR_CORRUPT"
    assert pqcache.STATUS_NAMES[-10] == "PQ_ERR_INCOMPATIBLE"


def test_restore_in_pieces_selects_before_the_kv_arrive():
    with make_context() as ctx, make_context() as other:
        add_prefilled(ctx, 1)
        query = reference_values(71, Q * DIM).reshape(Q, DIM)
        want_sel, want_k, want_v = select_and_fetch(ctx, 1, query)
        state = ctx.save(1)
        view = memoryview(state)

        # The description arrives first: grow the prefix until it is enough.
        prefix = 0
        while True:
            try:
                begun = other.restore_begin(1, view[:prefix])
                break
            except pqcache.PQError as e:
                assert e.status_name == "PQ_ERR_BUFFER_TOO_SMALL", e
                assert prefix < e.needed <= len(state), (prefix, e.needed)
                assert other.sequence_count() == 0  # a short begin adds nothing
                prefix = e.needed
        assert 0 < begun <= prefix and begun < len(state) // 2
        assert other.length(1, 0) == PROMPT + 4

        # It selects as the saved sequence does before any K/V; a fetch waits
        # for them.
        selection = other.select(1, 0, query)
        assert [h.tolist() for h in selection.heads()] == want_sel
        with pytest.raises(pqcache.PQError) as e:
            other.fetch(1, 0, selection)
        assert e.value.status_name == "PQ_ERR_BAD_STATE"

        # Then one section a call, each given all the rest; a short one reads
        # nothing and says how many bytes the section needs.
        with pytest.raises(pqcache.PQError) as e:
            other.restore_kv(1, view[begun:begun + 4])
        assert e.value.status_name == "PQ_ERR_BUFFER_TOO_SMALL" and e.value.needed > 4
        at, sections = begun, 0
        while at < len(state):
            at += other.restore_kv(1, view[at:])
            sections += 1
        assert at == len(state) and sections == 2  # one layer's K/V, then the end
        with pytest.raises(pqcache.PQError) as e:
            other.restore_kv(1, state[begun:])
        assert e.value.status_name == "PQ_ERR_BAD_STATE"

        sel, k, v = select_and_fetch(other, 1, query)
        assert sel == want_sel
        np.testing.assert_array_equal(k, want_k)
        np.testing.assert_array_equal(v, want_v)
