"""The index-only tier (kv_tier="caller", 0.10) through the binding: a
serving engine keeps K/V in its own pool and the library the index. Its
selections equal a host-tier context's, with keys given dense, through a
shuffled block table or through a slot map; what needs K/V raises
PQ_ERR_UNSUPPORTED; several query tokens select in one call (select_multi);
and tensor-parallel ranks (kv_head_offset) select what one context does.
tests/test_api_index_only.cpp is the C reference of the same behaviour."""
import numpy as np
import pytest

import pqcache

Q, KV, DIM = 4, 2, 32
SEQ = 3


def keys_for(tokens, kv=KV, seed=0):
    """Keys with structure (a few directions per head plus noise), so the
    PQ index has clusters to find: [tokens][kv][dim] float32."""
    rng = np.random.default_rng(seed)
    dirs = rng.standard_normal((8, DIM)).astype(np.float32)
    keys = 0.3 * rng.standard_normal((tokens, kv, DIM)).astype(np.float32)
    t, h = np.meshgrid(np.arange(tokens), np.arange(kv), indexing="ij")
    return keys + dirs[(t * 7 + h) % 8]


def queries_for(tokens, q=Q, seed=0):
    return np.random.default_rng(seed).standard_normal((tokens, q, DIM)).astype(np.float32)


def context(tier, q=Q, kv=KV, **options):
    ctx = pqcache.Context(1, q, kv, DIM, "f32", kv_tier=tier, topk_tokens=40, local_tokens=64,
                          kmeans_iterations=8, worker_threads=2, **options)
    ctx.add_sequence(SEQ)
    return ctx


def rows(selection):
    return [list(row) for row in selection.heads()]


class Pool:
    """An engine's pool: `tokens` positions scattered over blocks in a random
    order, token-major [slot][kv][dim], spare blocks filled with junk."""

    def __init__(self, keys, block_size=16, seed=5):
        tokens = len(keys)
        blocks = -(-tokens // block_size)
        order = np.random.default_rng(seed).permutation(blocks * 2 + 3).astype(np.int32)
        self.block_size, self.block_table = block_size, order[:blocks]
        p = np.arange(tokens)
        self.slots = self.block_table[p // block_size].astype(np.int64) * block_size + \
            p % block_size
        self.pool = np.full((len(order) * block_size, KV, DIM), 99, np.float32)
        self.pool[self.slots] = keys


PROMPT, DECODE = 1500, 40


def test_index_only_dense_and_paged_keys_select_what_the_host_tier_selects():
    keys = keys_for(PROMPT + DECODE, seed=11)
    pool = Pool(keys)
    with context("host") as host, context("caller") as dense, context("caller") as blocks, \
            context("caller") as slots:
        assert dense.config()["kv_tier"] == pqcache.KV_TIERS["caller"] == 2
        host.prefill(SEQ, 0, keys[:PROMPT], keys[:PROMPT])
        dense.prefill(SEQ, 0, keys[:PROMPT])                       # values None
        blocks.prefill_layer_paged(SEQ, 0, pool.pool, block_table=pool.block_table,
                                   block_size=pool.block_size, tokens=PROMPT)
        slots.prefill_layer_paged(SEQ, 0, pool.pool, slots=pool.slots[:PROMPT])
        assert slots.length(SEQ, 0) == blocks.length(SEQ, 0) == PROMPT
        for step in range(DECODE):
            query = queries_for(1, seed=100 + step)[0]
            want = rows(host.select(SEQ, 0, query))
            assert rows(dense.select(SEQ, 0, query)) == want, step
            assert rows(blocks.select(SEQ, 0, query)) == want, step
            assert rows(slots.select(SEQ, 0, query)) == want, step
            t = PROMPT + step
            host.append(SEQ, 0, keys[t:t + 1], keys[t:t + 1])
            dense.append(SEQ, 0, keys[t:t + 1], None)
            blocks.decode_append_paged(SEQ, 0, pool.pool, block_table=pool.block_table,
                                       block_size=pool.block_size, tokens=1)
            # tokens left out: every mapped position past the layer's length
            slots.decode_append_paged(SEQ, 0, pool.pool, slots=pool.slots[:t + 1])
        assert slots.length(SEQ, 0) == PROMPT + DECODE


def test_paged_maps_and_pools_in_other_forms():
    keys = keys_for(700, seed=3)
    pool = Pool(keys, block_size=8, seed=2)
    with context("host") as host, context("caller") as ctx, context("caller") as dense:
        host.prefill(SEQ, 0, keys, keys)
        # slots as int32 (SGLang's req_to_token) and a list: converted to int64
        ctx.prefill_layer_paged(SEQ, 0, pool.pool, slots=pool.slots[:400].astype(np.int32))
        ctx.prefill_layer_paged(SEQ, 0, pool.pool, slots=list(pool.slots))  # a second chunk
        dense.prefill_layer_paged(SEQ, 0, keys)                              # the dense map
        assert ctx.length(SEQ, 0) == dense.length(SEQ, 0) == 700
        with pytest.raises(ValueError, match="not both"):
            ctx.prefill_layer_paged(SEQ, 0, pool.pool, slots=pool.slots,
                                    block_table=pool.block_table, block_size=8)
        with pytest.raises(ValueError, match="tokens"):
            ctx.decode_append_paged(SEQ, 0, pool.pool, block_table=pool.block_table,
                                    block_size=8)
        with pytest.raises(TypeError, match="integers"):
            ctx.decode_append_paged(SEQ, 0, pool.pool, slots=pool.slots.astype(np.float64))
        with pytest.raises(pqcache.DTypeError):
            ctx.decode_append_paged(SEQ, 0, pool.pool.astype(np.float16), slots=pool.slots)
        bad = pool.slots.copy()
        bad[7] = -1
        with pytest.raises(pqcache.PQError, match=r"slots\[7\]") as e:
            fresh = context("caller")
            fresh.prefill_layer_paged(SEQ, 0, pool.pool, slots=bad[:100])
        assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"
        assert fresh.length(SEQ, 0) == 0  # a refused call stores nothing
        fresh.close()
        # A context that stores K/V needs the values: paged keys are refused.
        with pytest.raises(pqcache.PQError, match="values") as e:
            host.decode_append_paged(SEQ, 0, pool.pool, slots=pool.slots, tokens=1)
        assert e.value.status_name == "PQ_ERR_UNSUPPORTED"
        query = queries_for(1, seed=9)[0]
        want = rows(host.select(SEQ, 0, query))
        assert rows(dense.select(SEQ, 0, query)) == want


def test_paged_keys_from_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    keys = keys_for(600, seed=4)
    pool = Pool(keys)
    with context("caller") as ctx, context("caller") as ref:
        ctx.prefill_layer_paged(SEQ, 0, torch.from_numpy(pool.pool),
                                slots=torch.from_numpy(pool.slots).to(torch.int32))
        ref.prefill(SEQ, 0, keys)
        query = queries_for(1, seed=1)[0]
        want = ref.select_multi(SEQ, 0, query, rows="per_request")
        got = ctx.select_multi(SEQ, 0, torch.from_numpy(query), rows="per_request")
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
        if torch.cuda.is_available():
            with pytest.raises(TypeError, match="host memory"):
                ctx.decode_append_paged(SEQ, 0, torch.from_numpy(pool.pool).cuda(),
                                        slots=pool.slots)


def test_what_needs_kv_raises_unsupported():
    keys = keys_for(600, seed=16)
    with context("caller") as ctx:
        ctx.prefill(SEQ, 0, keys, None)
        sel = ctx.select(SEQ, 0, queries_for(1, seed=1)[0])
        for call in (lambda: ctx.fetch(SEQ, 0, sel),
                     lambda: ctx.attend(SEQ, 0, queries_for(1, seed=2)[0], sel),
                     lambda: ctx.save(SEQ)):
            with pytest.raises(pqcache.PQError, match="index-only") as e:
                call()
            assert e.value.status_name == "PQ_ERR_UNSUPPORTED"
            assert e.value.status == pqcache.pqcache_swig.PQ_ERR_UNSUPPORTED
    # Selectors that read keys or values the tier does not keep, at creation.
    with pytest.raises(pqcache.PQError, match="selector") as e:
        pqcache.Context(1, Q, KV, DIM, "f32", kv_tier="caller", selector="exact")
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"
    # values None where the context stores K/V
    with context("host") as host, pytest.raises(pqcache.PQError) as e:
        host.prefill(SEQ, 0, keys)
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"


def union(lists):
    return sorted(set().union(*map(set, lists)))


@pytest.mark.parametrize("tier", ["host", "caller"])
def test_select_multi_rows_per_token_per_head_and_per_request(tier):
    n, tokens = 1800, 3
    keys = keys_for(n, seed=18)
    with context(tier) as ctx:
        ctx.prefill(SEQ, 0, keys, keys if tier == "host" else None)
        queries = queries_for(tokens, seed=21)
        single = [rows(ctx.select(SEQ, 0, queries[t])) for t in range(tokens)]  # [token][head]
        wants = {
            "per_token": [head for token in single for head in token],
            "per_head": [union(token[h] for token in single) for h in range(KV)],
            "per_request": [union(head for token in single for head in token)],
        }
        for form, want in wants.items():
            count, capacity = ctx.selection_capacity_multi(SEQ, 0, tokens, form)
            assert count == len(want), form
            positions, counts = ctx.select_multi(SEQ, 0, queries, rows=form)
            assert positions.dtype == counts.dtype == np.int32
            assert positions.shape == (count, capacity) and counts.shape == (count,)
            for r, row in enumerate(want):
                assert list(positions[r, :counts[r]]) == row, (form, r)
                assert (positions[r, counts[r]:] == -1).all(), "padded with -1"
        # The per-request union is wider than a single selection, and padded.
        positions, counts = ctx.select_multi(SEQ, 0, queries, rows="per_request")
        assert counts[0] > max(len(head) for token in single for head in token)
        # One token, [q_heads][dim]: what select returns, per kv head.
        positions, counts = ctx.select_multi(SEQ, 0, queries[0])
        assert [list(positions[h, :counts[h]]) for h in range(KV)] == single[0]
        # Raw module: the rows the form writes are checked before the library.
        bad = (np.zeros((1, capacity), np.int32), np.zeros(1, np.int32))
        with pytest.raises(ValueError, match="rows"):
            pqcache.pqcache_swig.pq_decode_select_multi(
                ctx._ctx, SEQ, 0, queries, pqcache.SELECT_ROWS["per_token"], bad, None, None,
                None, 0)
        # Too small: PQ_ERR_BUFFER_TOO_SMALL with the capacity in every count.
        small = (np.zeros((1, 3), np.int32), np.zeros(1, np.int32))
        with pytest.raises(pqcache.PQError) as e:
            pqcache.pqcache_swig.pq_decode_select_multi(
                ctx._ctx, SEQ, 0, queries, pqcache.SELECT_ROWS["per_request"], small, None,
                None, None, 0)
        assert e.value.status_name == "PQ_ERR_BUFFER_TOO_SMALL"
        assert small[1][0] == ctx.selection_capacity_multi(SEQ, 0, tokens, "per_request")[1]
        with pytest.raises(ValueError, match="rows"):
            ctx.select_multi(SEQ, 0, queries, rows="per_layer")
        with pytest.raises(pqcache.PQError, match="query_tokens"):
            ctx.selection_capacity_multi(SEQ, 0, 0)


def test_rerank_reads_exact_keys_from_the_pool():
    n = 2000
    keys = keys_for(n, seed=15)
    pool = Pool(keys, seed=9)
    with context("caller", pq_rerank=1.0) as index, context("host", pq_rerank=1.0) as host:
        index.prefill_layer_paged(SEQ, 0, pool.pool, block_table=pool.block_table,
                                  block_size=pool.block_size, tokens=n)
        host.prefill(SEQ, 0, keys, keys)
        query = queries_for(1, seed=8)[0]
        with pytest.raises(pqcache.PQError, match="pq_rerank") as e:
            index.select(SEQ, 0, query)
        assert e.value.status_name == "PQ_ERR_BAD_STATE"
        paged = pqcache.PagedKeys(pool.pool, block_table=pool.block_table,
                                  block_size=pool.block_size)
        positions, counts = index.select_multi(SEQ, 0, query, keys=paged)
        got = [list(positions[h, :counts[h]]) for h in range(KV)]
        assert got == rows(host.select(SEQ, 0, query))


def test_kv_head_offset_round_trip():
    with pqcache.Context(1, Q, KV, DIM, "f32", kv_head_offset=6) as ctx:
        assert ctx.config()["kv_head_offset"] == 6
    with pytest.raises(pqcache.PQError, match="kv_head_offset") as e:
        pqcache.Context(1, Q, KV, DIM, "f32", kv_head_offset=65535)
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"


@pytest.mark.parametrize("selector", ["pq", "random"])
def test_tensor_parallel_ranks_select_what_one_context_selects(selector):
    kv, q_heads, half, n = 4, 8, 2, 1700
    keys = keys_for(n, kv=kv, seed=19)
    with context("caller", q=q_heads, kv=kv, selector=selector) as whole, \
            context("caller", q=q_heads // 2, kv=half, selector=selector) as rank0, \
            context("caller", q=q_heads // 2, kv=half, selector=selector,
                    kv_head_offset=half) as rank1:
        whole.prefill(SEQ, 0, keys)
        ranks = [rank0, rank1]
        for r, rank in enumerate(ranks):
            rank.prefill(SEQ, 0, np.ascontiguousarray(keys[:, r * half:(r + 1) * half]))
        for step in range(3):
            query = queries_for(1, q=q_heads, seed=60 + step)[0]
            want = rows(whole.select(SEQ, 0, query))
            for r, rank in enumerate(ranks):
                part = query[r * (q_heads // 2):(r + 1) * (q_heads // 2)]
                assert rows(rank.select(SEQ, 0, part)) == want[r * half:(r + 1) * half], \
                    (selector, r, step)
