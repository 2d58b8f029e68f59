"""The idiomatic API over a full cycle: prefill / select / fetch checked
against numpy, the configuration, statistics and index introspection."""
import numpy as np
import pytest

import pqcache


def test_version_and_enumerations():
    assert pqcache.version().count(".") == 2
    assert pqcache.version() == pqcache.pqcache_swig.PQ_VERSION_STRING
    assert pqcache.STATUS_NAMES[-1] == "PQ_ERR_INVALID_ARGUMENT"
    assert pqcache.STATUS_NAMES[-8] == "PQ_ERR_BUFFER_TOO_SMALL"
    assert pqcache.STATUS_NAMES[0] == "PQ_OK" and len(pqcache.STATUS_NAMES) == 11
    for status, name in pqcache.STATUS_NAMES.items():  # the library's own names
        assert pqcache.pqcache_swig.pq_status_string(status).startswith(name + ":")
    assert pqcache.SELECTORS["pq"] == 0 and pqcache.SELECTORS["pyramidkv"] == 10


def test_cpu_level_names_the_kernels_and_follows_the_environment():
    import os
    import subprocess
    import sys
    assert pqcache.cpu_level() in {"avx512+bf16", "avx512", "avx2", "portable"}
    # PQ_CPU_LEVEL is read once per process: ask a fresh one.
    env = dict(os.environ, PQ_CPU_LEVEL="portable")
    out = subprocess.run([sys.executable, "-c", "import pqcache; print(pqcache.cpu_level())"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "portable"
    # PQ_CPU_FEATURES switches AVX512_BF16 off: the report drops "+bf16"
    # and keeps the level.
    env = dict(os.environ, PQ_CPU_FEATURES="-avx512bf16")
    out = subprocess.run([sys.executable, "-c", "import pqcache; print(pqcache.cpu_level())"],
                         env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == pqcache.cpu_level().replace("+bf16", "")


def test_config_defaults_and_named_options():
    with pqcache.Context(2, 4, 2, 16, "f16", selector="quest", gqa_combine="max",
                         kmeans_init="random", cache_policy="lfu", worker_threads=0,
                         key_rotary="half", pooling="avg") as ctx:
        config = ctx.config()
        # The index chosen from head_dim 16 (0.7): one subspace of 2^8 centroids.
        assert (config["pq_subspaces"], config["pq_bits"], config["sink_tokens"]) == (1, 8, 4)
        assert config["key_rotary"] == pqcache.KEY_ROTARY["half"]
        assert config["pooling"] == pqcache.POOLING["avg"] and config["pq_rerank"] == 0.0
        assert config["selector"] == pqcache.SELECTORS["quest"]
        assert config["gqa_combine"] == pqcache.GQA_COMBINE["max"]
        assert config["cache_policy"] == pqcache.CACHE_POLICIES["lfu"]
        assert config["worker_threads"] >= 1  # 0 resolved to the hardware threads
        assert config["cuda_plugin_path"] is None
        assert ctx.backend() == "cpu"
        assert ctx.dtype == "f16"


def test_cuda_plugin_path_is_copied_into_the_config():
    config = pqcache.pqcache_swig.pq_config()
    config.cuda_plugin_path = "/nonexistent/libpqcache_cuda.so"
    config.cuda_plugin_path = "/elsewhere/libpqcache_cuda.so"  # the old copy is freed
    assert config.cuda_plugin_path == "/elsewhere/libpqcache_cuda.so"
    config.cuda_plugin_path = None
    assert config.cuda_plugin_path is None
    with pytest.raises(pqcache.PQError) as e:
        pqcache.Context(1, 2, 2, 16, backend="cuda",
                        cuda_plugin_path="/nonexistent/libpqcache_cuda.so")
    assert e.value.status_name == "PQ_ERR_NOT_FOUND"


def test_disk_tier_rows_come_back_as_prefilled(tmp_path):
    # 600 tokens: past the sink (4), the local window (16) and one 256-token
    # chunk, so a chunk goes to the file; k = every token, every row compared.
    rng = np.random.default_rng(5)
    tokens, kv, q_heads, dim = 600, 2, 4, 16
    keys = rng.standard_normal((tokens, kv, dim)).astype(np.float32)
    values = rng.standard_normal((tokens, kv, dim)).astype(np.float32)
    with pqcache.Context(1, q_heads, kv, dim, "f32", selector="exact", sink_tokens=4,
                         local_tokens=16, topk_tokens=tokens, worker_threads=1,
                         kv_tier="disk", kv_disk_path=tmp_path) as ctx:
        config = ctx.config()
        assert config["kv_tier"] == pqcache.KV_TIERS["disk"] and config["kv_disk_path"] is None
        ctx.add_sequence(1)
        ctx.prefill(1, 0, keys, values)
        selection = ctx.select(1, 0, rng.standard_normal((q_heads, dim)).astype(np.float32))
        k_out, v_out = ctx.fetch(1, 0, selection)
        for h, positions in enumerate(selection.heads()):
            assert list(positions) == list(range(tokens))
            np.testing.assert_array_equal(k_out[h, :tokens], keys[:, h])
            np.testing.assert_array_equal(v_out[h, :tokens], values[:, h])


def test_disk_tier_needs_a_directory():
    with pytest.raises(pqcache.PQError) as e:
        pqcache.Context(1, 2, 2, 16, kv_tier="disk")
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT" and "kv_disk_path" in e.value.message
    with pytest.raises(ValueError):  # as os functions refuse it
        pqcache.Context(1, 2, 2, 16, kv_tier="disk", kv_disk_path="dir\0ectory")


def test_prefill_select_fetch_round_trip_against_numpy():
    rng = np.random.default_rng(1)
    tokens, kv, q_heads, dim = 600, 2, 4, 32
    keys = rng.standard_normal((tokens, kv, dim)).astype(np.float16)
    values = rng.standard_normal((tokens, kv, dim)).astype(np.float16)
    with pqcache.Context(1, q_heads, kv, dim, "f16", local_tokens=16, selector="exact") as ctx:
        ctx.add_sequence(3)
        ctx.prefill(3, 0, keys, values)
        assert ctx.length(3, 0) == tokens
        query = rng.standard_normal((q_heads, dim)).astype(np.float16)
        selection = ctx.select(3, 0, query)
        k_out, v_out = ctx.fetch(3, 0, selection)
        assert k_out.dtype == np.float16 and k_out.shape == (kv, selection.capacity, dim)
        for h, positions in enumerate(selection.heads()):
            assert np.all(np.diff(positions) > 0)
            assert list(positions[:4]) == [0, 1, 2, 3]
            assert list(positions[-16:]) == list(range(tokens - 16, tokens))
            np.testing.assert_array_equal(k_out[h, : len(positions)], keys[positions, h])
            np.testing.assert_array_equal(v_out[h, : len(positions)], values[positions, h])
            # EXACT with the default combine: per query head softmax over the
            # middle tokens, summed over the group; the top-k of that score.
            group = query[h * 2:(h + 1) * 2].astype(np.float32)
            middle = np.arange(4, tokens - 16)
            logits = group @ keys[middle, h].astype(np.float32).T / np.sqrt(dim)
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            score = (p / p.sum(axis=1, keepdims=True)).sum(axis=0)
            k = len(positions) - 4 - 16
            want = set(middle[np.argsort(-score, kind="stable")[:k]])
            assert len(set(positions[4:-16]) & want) >= k - 2  # f16 rounding near ties


def test_decode_append_stats_and_layer_info():
    rng = np.random.default_rng(4)
    keys = rng.standard_normal((400, 2, 16)).astype(np.float32)
    with pqcache.Context(1, 2, 2, 16, "f32", kmeans_iterations=3, local_tokens=8,
                         pq_subspaces=2, pq_bits=6) as ctx:
        ctx.add_sequence(9)
        ctx.prefill(9, 0, keys[:399], keys[:399])
        ctx.append(9, 0, keys[399:], keys[399:])
        ctx.wait_builds()
        info = ctx.layer_info(9, 0)
        assert info["tokens"] == 400 and info["prefill_tokens"] == 399
        assert info["index_ready"] == 1 and info["kmeans_iterations"] == 3
        assert "struct_size" not in info
        selection = ctx.select(9, 0, np.ones((2, 16), np.float32))
        ctx.fetch(9, 0, selection)
        stats = ctx.stats()
        assert stats["select_calls"] == 1 and stats["fetch_calls"] == 1
        assert stats["sequences"] == 1 and stats["tokens"] == 400
        assert ctx.sequence_stats(9)["select_calls"] == 1
        codes = ctx.codes(9, 0, 1, 0, 100)
        assert codes.dtype == np.uint8 and codes.shape == (100, 2) and codes.max() < 64
        centroids = ctx.centroids(9, 0, 1)
        assert centroids.shape == (2, 64, 8) and np.isfinite(centroids).all()
        ctx.remove_sequence(9)
        assert ctx.sequence_count() == 0


def test_bf16_is_passed_as_uint16_bits():
    rng = np.random.default_rng(6)
    as_f32 = rng.standard_normal((50, 2, 16)).astype(np.float32)
    bits = (as_f32.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16 by truncation
    with pqcache.Context(1, 2, 2, 16, "bf16", selector="window", local_tokens=8) as ctx:
        ctx.add_sequence(1)
        ctx.prefill(1, 0, bits, bits)
        query = (np.ones((2, 16), np.float32).view(np.uint32) >> 16).astype(np.uint16)
        selection = ctx.select(1, 0, query)
        k_out, _ = ctx.fetch(1, 0, selection)
        assert k_out.dtype == np.uint16
        for h, positions in enumerate(selection.heads()):
            np.testing.assert_array_equal(k_out[h, : len(positions)], bits[positions, h])


def test_h2o_learns_from_observed_attention():
    rng = np.random.default_rng(7)
    keys = rng.standard_normal((200, 2, 16)).astype(np.float32)
    with pqcache.Context(1, 2, 2, 16, "f32", selector="h2o", local_tokens=8,
                         topk_tokens=4) as ctx:
        ctx.add_sequence(1)
        ctx.prefill(1, 0, keys, keys)
        everything = pqcache.SelectionResult(2, 200)
        everything.positions[:] = np.arange(200, dtype=np.int32)
        everything.counts[:] = 200
        probs = np.zeros((2, 200), np.float32)
        probs[:, [50, 60, 70, 80]] = 1.0  # the heavy hitters
        ctx.observe_attention(1, 0, everything, probs)
        selection = ctx.select(1, 0, np.ones((2, 16), np.float32))
        for positions in selection.heads():
            assert {50, 60, 70, 80} <= set(positions)


def test_cuda_stream_argument():
    with pqcache.Context(1, 2, 2, 16, "f32") as ctx:
        ctx.add_sequence(1)
        ctx.set_stream(1, None)  # the context's own stream
        with pytest.raises(pqcache.PQError) as e:
            ctx.set_stream(1, 0x1234)  # a stream on the CPU backend
        assert e.value.status_name == "PQ_ERR_UNSUPPORTED"
        with pytest.raises(TypeError):
            ctx.set_stream(1, "stream")


def _attention_over(query, selection, keys, values, scale):
    """softmax(scale * q.K) V and the log-sum-exp, in float64, over the rows
    fetch gathered ([kv_heads][capacity][dim]); GQA: query head q uses kv head
    q // (q_heads // kv_heads)."""
    q_heads, kv_heads = query.shape[0], keys.shape[0]
    out, lse = np.zeros(query.shape), np.full(q_heads, -np.inf)
    for q in range(q_heads):
        h = q // (q_heads // kv_heads)
        n = selection.counts[h]
        if n == 0:
            continue
        logits = scale * (keys[h, :n].astype(np.float64) @ query[q].astype(np.float64))
        peak = logits.max()
        w = np.exp(logits - peak)
        out[q] = w @ values[h, :n].astype(np.float64) / w.sum()
        lse[q] = peak + np.log(w.sum())
    return out, lse


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_attend_equals_softmax_over_the_fetched_rows(dtype):
    rng = np.random.default_rng(8)
    tokens, kv, q_heads, dim = 300, 2, 4, 32
    np_dtype = {"f32": np.float32, "f16": np.float16}[dtype]
    keys = rng.standard_normal((tokens, kv, dim)).astype(np_dtype)
    values = rng.standard_normal((tokens, kv, dim)).astype(np_dtype)
    query = (3 * rng.standard_normal((q_heads, dim))).astype(np_dtype)  # a peaked softmax
    with pqcache.Context(1, q_heads, kv, dim, dtype, local_tokens=16, topk_tokens=24) as ctx:
        ctx.add_sequence(5)
        ctx.prefill(5, 0, keys, values)
        selection = ctx.select(5, 0, query)
        k_out, v_out = ctx.fetch(5, 0, selection)
        for scale, effective in [(None, 1 / np.sqrt(dim)), (0.0, 1 / np.sqrt(dim)),
                                 (0.05, 0.05)]:
            out, lse = ctx.attend(5, 0, query, selection, scale=scale)
            assert out.dtype == np.float32 and out.shape == (q_heads, dim)
            assert lse.dtype == np.float32 and lse.shape == (q_heads,)
            want_out, want_lse = _attention_over(query, selection, k_out, v_out, effective)
            np.testing.assert_allclose(out, want_out, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(lse, want_lse, rtol=1e-4, atol=1e-5)
        # A kv head with nothing selected: zeros and -inf for its query heads.
        selection.counts[1] = 0
        out, lse = ctx.attend(5, 0, query[np.newaxis], selection)  # [1][q_heads][dim] works too
        assert (out[2:] == 0).all() and np.isneginf(lse[2:]).all()
        np.testing.assert_allclose(lse[:2], _attention_over(query, selection, k_out, v_out,
                                                            1 / np.sqrt(dim))[1][:2],
                                   rtol=1e-4, atol=1e-5)


def test_fastgen_keeps_the_special_tokens_it_is_told_of():
    """At a recovery ratio this low every kv head takes the special-token
    policy: its middle is exactly the tokens token_classes marked special
    (one given before the K/V, one after)."""
    rng = np.random.default_rng(11)
    n = 64
    keys = rng.standard_normal((n, 2, 16)).astype(np.float32)
    window = rng.standard_normal((8, 4, 16)).astype(np.float32)
    with pqcache.Context(1, 4, 2, 16, "f32", selector="fastgen", fastgen_recovery=1e-6,
                         local_tokens=16, topk_tokens=16) as ctx:
        ctx.add_sequence(1)
        classes = np.zeros(n, np.uint8)
        classes[10] = pqcache.TOKEN_SPECIAL
        ctx.token_classes(1, 0, classes)
        ctx.prefill(1, 0, keys, keys)
        ctx.token_classes(1, 30, [pqcache.TOKEN_SPECIAL | pqcache.TOKEN_PUNCTUATION])
        ctx.prefill_queries(1, 0, window)
        selection = ctx.select(1, 0, window[-1])
        want = list(range(4)) + [10, 30] + list(range(n - 16, n))
        for positions in selection.heads():
            assert list(positions) == want
        with pytest.raises(pqcache.PQError) as e:
            ctx.token_classes(1, 0, [0, 3, 4])
        assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"
        assert "classes[2] is 4" in str(e.value)
        with pytest.raises(ValueError, match=r"classes\[1\] is 300"):
            ctx.token_classes(1, 0, [0, 300])
        with pytest.raises(TypeError, match="integers"):
            ctx.token_classes(1, 0, [0.5])


def test_speculate_is_a_hint_the_next_select_counts():
    """A speculation for the query the select then uses is that selection,
    and the select counts it as covered; a speculation is not a select."""
    rng = np.random.default_rng(12)
    keys = rng.standard_normal((96, 2, 16)).astype(np.float32)
    window = rng.standard_normal((8, 4, 16)).astype(np.float32)
    with pqcache.Context(1, 4, 2, 16, "f32", selector="infinigen", local_tokens=16,
                         topk_tokens=16) as ctx:
        ctx.add_sequence(1)
        ctx.prefill(1, 0, keys, keys)
        ctx.prefill_queries(1, 0, window)
        hint = ctx.speculate(1, 0, window[-1])
        assert ctx.stats()["select_calls"] == 0
        chosen = ctx.select(1, 0, window[-1])
        for a, b in zip(hint.heads(), chosen.heads()):
            assert list(a) == list(b)
        stats = ctx.stats()
        assert stats["hint_tokens"] > 0 and stats["hint_covered"] == stats["hint_tokens"]


def test_config_names_its_enum_fields_and_still_equals_their_numbers():
    with pqcache.Context(1, 4, 2, 16, "f16", selector="exact", key_rotary="half",
                         cache_policy="lfu") as ctx:
        config = ctx.config()
        assert config["selector"] == pqcache.SELECTORS["exact"] and config["selector"].name == "exact"
        assert config["dtype"] == pqcache.DTYPE_F16 and config["dtype"].name == "f16"
        assert config["key_rotary"].name == "half" and config["cache_policy"].name == "lfu"
        assert config["backend"].name == "cpu" and config["kv_tier"].name == "host"
        assert "<selector.exact: %d>" % pqcache.SELECTORS["exact"] in repr(config)
        assert isinstance(config["num_layers"], int) and not hasattr(config["num_layers"], "name")
        # A config pickles (multiprocessing does), its enum fields as their numbers.
        import pickle
        assert pickle.loads(pickle.dumps(config)) == config
        # The members go back in as they came out.
        with pqcache.Context(1, 4, 2, 16, "f16", selector=config["selector"],
                             key_rotary=config["key_rotary"]) as again:
            assert again.config()["selector"].name == "exact"


def test_config_names_every_enum_field_of_the_library():
    # The library's own list of pq_config's enum fields (the ENUM rows of its
    # field table), so that a field added later without an IntEnum here fails.
    import enum
    import re
    from test_selectors import source_dir
    table = source_dir() / "src/config/config_fields.h"
    if not table.is_file():
        pytest.skip(f"no source tree here ({table} does not exist)")
    enum_fields = re.findall(r"^\s*ENUM\((\w+),", table.read_text(), re.M)
    assert {"dtype", "selector", "kv_tier", "tail_estimate"} <= set(enum_fields), enum_fields
    with pqcache.Context(1, 4, 2, 16, "f16", selector="pq", tail_estimate="code_means") as ctx:
        config = ctx.config()
    for field in enum_fields:
        assert isinstance(config[field], enum.IntEnum), (field, config[field])
        assert repr(config[field]).startswith(f"<{field}."), repr(config[field])
    assert config["tail_estimate"].name == "code_means"
    named = sorted(field for field, value in config.items() if isinstance(value, enum.IntEnum))
    assert named == sorted(enum_fields)
