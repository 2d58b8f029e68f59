"""The ctypes binding against the C library: struct layouts, the full
prefill / select / fetch cycle checked against numpy, errors as PQError."""
import os
import subprocess

import numpy as np
import pytest

import pqcache


def c_layout():
    exe = os.environ.get("PQ_STRUCT_LAYOUT")
    if not exe:
        pytest.skip("PQ_STRUCT_LAYOUT not set: run through CTest, which builds pq_struct_layout")
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    layout = {}
    for line in out.splitlines():
        struct, field, value = line.split()
        layout.setdefault(struct, {})[field] = int(value)
    return layout


def test_struct_layouts_match_the_c_compiler():
    layout = c_layout()
    assert set(layout) == set(pqcache.STRUCTS)
    for name, cls in pqcache.STRUCTS.items():
        fields = dict(layout[name])
        assert fields.pop("sizeof") == pqcache.ctypes.sizeof(cls), name
        py = {f: getattr(cls, f).offset for f, _ in cls._fields_}
        assert py == fields, name


def test_config_struct_size_agrees_with_the_library():
    cfg = pqcache.Config()
    pqcache.lib().pq_config_default(pqcache.ctypes.byref(cfg))
    assert cfg.struct_size == pqcache.ctypes.sizeof(pqcache.Config)
    assert (cfg.pq_subspaces, cfg.pq_bits, cfg.sink_tokens) == (2, 6, 4)


def test_prefill_select_fetch_round_trip():
    rng = np.random.default_rng(1)
    tokens, kv, q_heads, dim = 600, 2, 4, 32
    keys = rng.standard_normal((tokens, kv, dim)).astype(np.float16)
    values = rng.standard_normal((tokens, kv, dim)).astype(np.float16)
    with pqcache.Context(1, q_heads, kv, dim, "f16", kmeans_iterations=4, local_tokens=16,
                         selector="exact") as ctx:
        ctx.add_sequence(3)
        ctx.prefill(3, 0, keys, values)
        query = rng.standard_normal((q_heads, dim)).astype(np.float16)
        sel = ctx.select(3, 0, query)
        k_out, v_out = ctx.fetch(3, 0, sel)
        for h, positions in enumerate(sel.heads()):
            assert np.all(np.diff(positions) > 0)
            assert list(positions[:4]) == [0, 1, 2, 3]
            assert list(positions[-16:]) == list(range(tokens - 16, tokens))
            np.testing.assert_array_equal(k_out[h, : len(positions)], keys[positions, h])
            np.testing.assert_array_equal(v_out[h, : len(positions)], values[positions, h])
            # EXACT: the middle choice is the top-k of the max-free mean... check
            # against numpy with the library's default combine (sum of softmax).
            group = query[h * 2:(h + 1) * 2].astype(np.float32)
            mid = np.arange(4, tokens - 16)
            logits = group @ keys[mid, h].astype(np.float32).T / np.sqrt(dim)
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            score = (p / p.sum(axis=1, keepdims=True)).sum(axis=0)
            k = len(positions) - 4 - 16
            want = set(mid[np.argsort(-score, kind="stable")[:k]])
            got = set(positions[4:-16])
            assert len(got & want) >= k - 2  # float rounding may swap near ties


def test_head_major_input_and_strided_views_need_no_copy():
    rng = np.random.default_rng(2)
    keys = rng.standard_normal((2, 300, 16)).astype(np.float32)  # [heads][tokens][dim]
    with pqcache.Context(1, 2, 2, 16, "f32", selector="window", local_tokens=8) as ctx:
        ctx.add_sequence(1)
        ctx.prefill(1, 0, keys, keys, layout="head_major")
        sel = ctx.select(1, 0, np.ones((2, 16), np.float32))
        k_out, _ = ctx.fetch(1, 0, sel)
        for h, positions in enumerate(sel.heads()):
            np.testing.assert_array_equal(k_out[h, : len(positions)], keys[h, positions])


def test_errors_raise_with_the_library_message():
    with pqcache.Context(2, 2, 2, 16, "f32") as ctx:
        with pytest.raises(pqcache.PQError) as e:
            ctx.length(42, 0)
        assert e.value.name == "PQ_ERR_NOT_FOUND" and "42" in e.value.message
        ctx.add_sequence(1)
        with pytest.raises(pqcache.PQError) as e:
            ctx.length(1, 5)
        assert e.value.name == "PQ_ERR_INVALID_ARGUMENT" and "layer" in e.value.message
        bad = np.full((10, 2, 16), np.nan, np.float32)
        with pytest.raises(pqcache.PQError) as e:
            ctx.prefill(1, 0, bad, bad)
        assert "NaN" in e.value.message
    with pytest.raises(pqcache.PQError) as e:
        pqcache.Context(1, 3, 2, 16)
    assert "num_q_heads" in e.value.message
    with pytest.raises(TypeError):
        pqcache.Context(1, 2, 2, 16, no_such_field=1)
