"""pqcache.sglang, the PQCache algorithm for SGLang's sparse attention, driven
the way SGLang's SparseCoordinator drives an algorithm, with SGLang's shapes.

The shapes and the call order come from sglang 0.5.23 (PyPI),
python/sglang/srt/mem_cache/sparsity/algorithms/base_algorithm.py
(BaseSparseAlgorithm: initialize_representation_pool, construct_representations,
update_representations, retrieve_topk returning selected_indices
[bs, max_selected] int32 padded with -1 and valid_lengths [bs] int32) and
core/sparse_coordinator.py (RequestTrackers: repr_constructed, prompt_lens,
last_constructed_page; attention_begin calls retrieve_topk(queries=...,
layer_id=..., req_pool_indices=..., sparse_mask=..., forward_batch=...,
attn_metadata=...) before a layer's attention, attention_end calls
construct_representations then update_representations with
k_buffer=token_to_kv_pool.get_key_buffer(layer_id) after it; ReqToTokenPool's
req_to_token is int32 [max_requests, max_context_len]; a key buffer is
[pool_slots, kv_heads, head_dim]). SGLang itself imports only with its GPU
packages, so the pools, the request table, the states and the forward batch
here are stand-ins with those shapes (numpy, or torch CPU tensors).

Each decode step is checked against the library's own selection: a separate
host-tier context fed the same keys selects for the same query with
select_multi(rows="per_request"); the adapter's row must be that selection
plus the positions not indexed yet (the step's own token, appended after
the select as SGLang's update comes after its retrieve).
"""
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest

import pqcache
from pqcache.sglang import SGLANG_BASE, PQCacheAlgorithm

LAYERS, Q, KV, DIM = 2, 4, 2, 32
LENGTHS = [900, 1300, 1700, 2100]
STEPS = 64
OPTIONS = dict(topk_tokens=48, sink_tokens=4, local_tokens=32, kmeans_iterations=6,
               worker_threads=2)


@dataclass
class SparseConfig:
    """sglang 0.5.23's SparseConfig (core/sparse_coordinator.py), the fields
    an algorithm reads."""
    page_size: int = 1
    algorithm: str = "pqcache"
    sparse_extra_config: dict = field(default_factory=dict)


class Mode:
    """ForwardBatch.forward_mode: is_extend() and is_decode_or_idle()."""

    def __init__(self, extend):
        self.extend = extend

    def is_extend(self):
        return self.extend

    def is_decode_or_idle(self):
        return not self.extend


class Arrays:
    """numpy or torch (CPU) versions of the engine's tensors."""

    def __init__(self, kind):
        self.torch = pytest.importorskip("torch") if kind == "torch" else None

    def __call__(self, array):
        return array if self.torch is None else self.torch.from_numpy(np.ascontiguousarray(array))

    def host(self, x):
        return np.asarray(x if self.torch is None else x.numpy())


def keys_for(tokens, seed):
    rng = np.random.default_rng(seed)
    dirs = rng.standard_normal((8, DIM)).astype(np.float32)
    keys = 0.3 * rng.standard_normal((tokens, KV, DIM)).astype(np.float32)
    t, h = np.meshgrid(np.arange(tokens), np.arange(KV), indexing="ij")
    return keys + dirs[(t * 7 + h) % 8]


class Engine:
    """The engine's side: a key pool per layer whose slots are handed out in
    a shuffled order, req_to_token rows, the request states, and a
    host-tier reference context with one sequence per request."""

    def __init__(self, arrays, requests=6, max_context=2400, seed=0):
        self.arrays = arrays
        slots = sum(LENGTHS) + len(LENGTHS) * STEPS + 512
        self.free = list(np.random.default_rng(seed).permutation(slots))
        self.k = [np.full((slots, KV, DIM), 77, np.float32) for _ in range(LAYERS)]
        self.k_buffers = [arrays(k) for k in self.k]  # views of the same memory
        self.req_to_token = arrays(np.zeros((requests, max_context), np.int32))
        self.states = SimpleNamespace(
            repr_constructed=arrays(np.zeros(requests, bool)),
            prompt_lens=arrays(np.zeros(requests, np.int64)),
            last_constructed_page=arrays(np.zeros(requests, np.int64)))
        self.token_to_kv_pool = SimpleNamespace(get_key_buffer=lambda layer: self.k_buffers[layer])
        self.req_to_token_pool = SimpleNamespace(req_to_token=self.req_to_token)
        self.ref = pqcache.Context(LAYERS, Q, KV, DIM, "f32", kv_tier="host", **OPTIONS)
        self.table = arrays.host(self.req_to_token)  # the same memory as numpy

    def begin(self, idx, prompt_len):
        """on_request_begin: RequestTrackers.register."""
        self.states.repr_constructed[idx] = False
        self.states.prompt_lens[idx] = prompt_len
        self.states.last_constructed_page[idx] = 0

    def write(self, idx, first, keys_per_layer):
        """The attention backend's set_kv_buffer: positions first.. of row
        idx get new slots and their keys."""
        count = len(keys_per_layer[0])
        slots = [self.free.pop() for _ in range(count)]
        self.table[idx, first:first + count] = slots
        for layer in range(LAYERS):
            self.k[layer][slots] = keys_per_layer[layer]

    def batch(self, idxs, seq_lens, extend):
        a = self.arrays
        return SimpleNamespace(forward_mode=Mode(extend),
                               req_pool_indices=a(np.array(idxs, np.int64)),
                               seq_lens=a(np.array(seq_lens, np.int64)))


def make_algorithm(engine, **extra):
    config = SparseConfig(sparse_extra_config=dict(num_q_heads=Q, **OPTIONS, **extra))
    algorithm = PQCacheAlgorithm(config, "cpu")
    algorithm.initialize_representation_pool(0, LAYERS, engine.token_to_kv_pool,
                                             engine.req_to_token_pool, engine.states)
    return algorithm


def attention_end(algorithm, engine, fb, layer):
    """SparseCoordinator.attention_end."""
    k_buffer = engine.token_to_kv_pool.get_key_buffer(layer)
    algorithm.construct_representations(layer_id=layer, req_pool_indices=fb.req_pool_indices,
                                        seq_lens=fb.seq_lens, k_buffer=k_buffer,
                                        forward_batch=fb)
    algorithm.update_representations(layer_id=layer, req_pool_indices=fb.req_pool_indices,
                                     seq_lens=fb.seq_lens, k_buffer=k_buffer, forward_batch=fb)


def retrieve(algorithm, engine, fb, layer, queries, mask):
    """SparseCoordinator._handle_sparse_retrieve's call."""
    a = engine.arrays
    return algorithm.retrieve_topk(queries=a(queries), layer_id=layer,
                                   req_pool_indices=fb.req_pool_indices,
                                   sparse_mask=a(np.array(mask, bool)), forward_batch=fb,
                                   attn_metadata=None)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_decode_of_four_requests_selects_what_the_library_selects(kind):
    arrays = Arrays(kind)
    engine = Engine(arrays)
    algorithm = make_algorithm(engine)
    idxs = [4, 1, 3, 0]  # req_to_token rows, not in batch order
    keys = [[keys_for(n + STEPS, seed=10 * i + layer) for layer in range(LAYERS)]
            for i, n in enumerate(LENGTHS)]
    # Prefill: one extend forward of the four prompts.
    for i, (idx, n) in enumerate(zip(idxs, LENGTHS)):
        engine.begin(idx, n)
        engine.write(idx, 0, [keys[i][layer][:n] for layer in range(LAYERS)])
        engine.ref.add_sequence(i)
        for layer in range(LAYERS):
            engine.ref.prefill(i, layer, keys[i][layer][:n], keys[i][layer][:n])
    fb = engine.batch(idxs, LENGTHS, extend=True)
    queries = np.zeros((sum(LENGTHS), Q, DIM), np.float32)  # an extend's tokens
    for layer in range(LAYERS):
        indices, lengths = retrieve(algorithm, engine, fb, layer, queries, [True] * 4)
        assert (arrays.host(lengths) == 0).all(), "a prefill attends densely"
        attention_end(algorithm, engine, fb, layer)
    assert algorithm.ctx.sequence_count() == 4
    assert arrays.host(engine.states.repr_constructed)[idxs].all()
    assert list(arrays.host(engine.states.last_constructed_page)[idxs]) == LENGTHS
    # Decode: each step writes every request's token, then per layer
    # retrieve (attention_begin) and update (attention_end).
    lens = list(LENGTHS)
    rng = np.random.default_rng(1)
    selected = 0
    for step in range(STEPS):
        for i, idx in enumerate(idxs):
            engine.write(idx, lens[i], [keys[i][layer][lens[i]:lens[i] + 1]
                                        for layer in range(LAYERS)])
        seq_lens = [n + 1 for n in lens]
        fb = engine.batch(idxs, seq_lens, extend=False)
        mask = [True, True, step % 8 != 3, True]  # SGLang may leave a request dense
        for layer in range(LAYERS):
            queries = rng.standard_normal((4, Q, DIM)).astype(np.float32)
            # SGLang also passes [bs, q_heads * head_dim]
            given = queries.reshape(4, Q * DIM) if step % 2 else queries
            indices, lengths = retrieve(algorithm, engine, fb, layer, given, mask)
            if kind == "torch":
                assert indices.dtype == arrays.torch.int32 and lengths.dtype == arrays.torch.int32
            indices, lengths = arrays.host(indices), arrays.host(lengths)
            assert indices.dtype == lengths.dtype == np.int32
            assert indices.ndim == 2 and indices.shape[0] == 4 and lengths.shape == (4,)
            assert indices.shape[1] == max(lengths.max(), 1)
            for i in range(4):
                row = indices[i, :lengths[i]]
                assert (indices[i, lengths[i]:] == -1).all(), "padded with -1"
                if not mask[i]:
                    assert lengths[i] == 0
                    continue
                positions, counts = engine.ref.select_multi(i, layer, queries[i],
                                                            rows="per_request")
                want = list(positions[0, :counts[0]]) + [lens[i]]  # + the step's own token
                assert list(row) == want, (step, layer, i)
                assert (np.diff(row) > 0).all()
                selected += lengths[i]
            attention_end(algorithm, engine, fb, layer)
            for i in range(4):
                engine.ref.append(i, layer, keys[i][layer][lens[i]:lens[i] + 1],
                                  keys[i][layer][lens[i]:lens[i] + 1])
        lens = seq_lens
    for i, idx in enumerate(idxs):
        assert algorithm.ctx.length(algorithm._requests[idx].seq, 1) == lens[i]
    # Selective: far fewer than every token of every request.
    assert 0 < selected < 0.2 * STEPS * LAYERS * sum(lens)
    # Requests free their sequences when they finish (sglang 0.5.23's Req
    # keeps its row as req.kv.req_pool_idx).
    algorithm.on_request_end(SimpleNamespace(kv=SimpleNamespace(req_pool_idx=idxs[0])))
    algorithm.on_request_end(SimpleNamespace(req_pool_idx=idxs[1]))
    assert algorithm.ctx.sequence_count() == 2
    algorithm.close()
    engine.ref.close()


def test_a_reused_row_gets_a_new_sequence_and_chunks_append():
    arrays = Arrays("numpy")
    engine = Engine(arrays)
    algorithm = make_algorithm(engine)
    keys = [keys_for(1000, seed=50 + layer) for layer in range(LAYERS)]
    # A prompt in two chunks (chunked prefill: the second extend's seq_len
    # covers both), then one decode step.
    engine.begin(2, 1000)
    engine.write(2, 0, [k[:600] for k in keys])
    for layer in range(LAYERS):
        attention_end(algorithm, engine, engine.batch([2], [600], extend=True), layer)
    engine.write(2, 600, [k[600:] for k in keys])
    for layer in range(LAYERS):
        attention_end(algorithm, engine, engine.batch([2], [1000], extend=True), layer)
    first = algorithm._requests[2].seq
    assert [algorithm.ctx.length(first, layer) for layer in range(LAYERS)] == [1000, 1000]
    # The same chunks in an index-only context of the library select the same.
    with pqcache.Context(LAYERS, Q, KV, DIM, "f32", kv_tier="caller", **OPTIONS) as ref:
        ref.add_sequence(9)
        for layer in range(LAYERS):
            ref.prefill(9, layer, keys[layer][:600])
            ref.prefill(9, layer, keys[layer][600:])
        query = np.random.default_rng(3).standard_normal((1, Q, DIM)).astype(np.float32)
        indices, lengths = retrieve(algorithm, engine, engine.batch([2], [1000], extend=False),
                                    1, query, [True])
        positions, counts = ref.select_multi(9, 1, query, rows="per_request")
        assert list(indices[0, :lengths[0]]) == list(positions[0, :counts[0]])
    # The request ends without on_request_end; SGLang registers the next
    # request in the same row (repr_constructed back to False): a new
    # sequence, the old one freed.
    engine.begin(2, 300)
    engine.write(2, 0, [k[:300] for k in keys])
    for layer in range(LAYERS):
        attention_end(algorithm, engine, engine.batch([2], [300], extend=True), layer)
    second = algorithm._requests[2].seq
    assert second != first and algorithm.ctx.sequence_count() == 1
    assert algorithm.ctx.length(second, 0) == 300
    # on_request_begin frees a row's sequence too.
    algorithm.on_request_begin(SimpleNamespace(req_pool_idx=2))
    assert algorithm.ctx.sequence_count() == 0
    # A decode of a row never prefilled is left dense, and not indexed.
    indices, lengths = retrieve(algorithm, engine, engine.batch([5], [10], extend=False), 0,
                                np.zeros((1, Q, DIM), np.float32), [True])
    assert list(lengths) == [0] and list(indices[0]) == [-1]
    algorithm.close()
    engine.ref.close()


def test_page_size_and_configuration():
    arrays = Arrays("numpy")
    engine = Engine(arrays)
    keys = [keys_for(700, seed=70 + layer) for layer in range(LAYERS)]
    config = SparseConfig(page_size=16, sparse_extra_config=dict(num_q_heads=Q, **OPTIONS))
    algorithm = PQCacheAlgorithm(config, "cpu", topk_tokens=24)  # keywords over the JSON
    algorithm.initialize_representation_pool(0, LAYERS, engine.token_to_kv_pool,
                                             engine.req_to_token_pool, engine.states)
    assert algorithm.ctx.config()["topk_tokens"] == 24
    assert algorithm.ctx.config()["kv_tier"] == pqcache.KV_TIERS["caller"]
    engine.begin(0, 700)
    engine.write(0, 0, [k[:700] for k in keys])
    for layer in range(LAYERS):
        attention_end(algorithm, engine, engine.batch([0], [700], extend=True), layer)
    query = np.random.default_rng(4).standard_normal((1, Q, DIM)).astype(np.float32)
    positions, counts = algorithm.ctx.select_multi(algorithm._requests[0].seq, 0, query,
                                                   rows="per_request")
    indices, lengths = retrieve(algorithm, engine, engine.batch([0], [700], extend=False), 0,
                                query, [True])
    # Pages: the logical pages of the selected positions, ascending, the
    # last (partial) page among them.
    want = sorted(set(int(p) // 16 for p in positions[0, :counts[0]]))
    assert list(indices[0, :lengths[0]]) == want and want[-1] == 699 // 16
    algorithm.close()
    engine.ref.close()
    with pytest.raises(ValueError, match="num_q_heads"):
        PQCacheAlgorithm(SparseConfig(), "cpu").initialize_representation_pool(
            0, LAYERS, engine.token_to_kv_pool, engine.req_to_token_pool, engine.states)


def test_subclasses_sglangs_base_where_sglang_imports():
    if SGLANG_BASE is None:
        pytest.skip("sglang does not import here (it needs its GPU packages): the stand-in "
                    "base class is used")
    assert issubclass(PQCacheAlgorithm, SGLANG_BASE)
