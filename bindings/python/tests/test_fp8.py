"""fp8 K/V (0.10): uint8 codes in, the same codes out of fetch, queries in
f32/f16, the scales reach the library (a bad one is its error), and the
attention over one token reads each code as its bit fields say, times the
scale."""
import numpy as np
import pytest

import pqcache


def decode_e5m2(codes):
    """e5m2 is the top byte of a binary16: the reference by numpy's float16."""
    return (codes.astype(np.uint16) << 8).view(np.float16).astype(np.float32)


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_codes_round_trip_and_queries_stay_float(dtype):
    rng = np.random.default_rng(5)
    tokens, kv, q_heads, dim = 300, 2, 4, 16
    # Finite codes of both formats: exponent field below its top value.
    keys = rng.integers(0, 0x70, (tokens, kv, dim), dtype=np.uint8)
    values = rng.integers(0, 0x70, (tokens, kv, dim), dtype=np.uint8) | 0x80
    with pqcache.Context(1, q_heads, kv, dim, dtype, selector="exact", worker_threads=1,
                         kv_scale_count=1, kv_scales=[0.5, 2.0]) as ctx:
        assert ctx.config()["kv_scale_count"] == 1 and ctx.dtype == dtype
        ctx.add_sequence(1)
        ctx.prefill(1, 0, keys, values)
        query = rng.standard_normal((q_heads, dim)).astype(np.float16)
        selection = ctx.select(1, 0, query)
        k_out, v_out = ctx.fetch(1, 0, selection)
        assert k_out.dtype == np.uint8
        for h, positions in enumerate(selection.heads()):
            np.testing.assert_array_equal(k_out[h, :len(positions)], keys[positions, h])
            np.testing.assert_array_equal(v_out[h, :len(positions)], values[positions, h])
        if dtype == "fp8_e5m2":  # one token: the output is its value row times the V scale
            one = pqcache.SelectionResult(kv, 1)
            one.positions[:, 0], one.counts[:] = 7, 1
            out, _ = ctx.attend(1, 0, query.astype(np.float32), one)
            np.testing.assert_array_equal(out[0], decode_e5m2(values[7, 0]) * np.float32(2.0))
        with pytest.raises(pqcache.DTypeError):
            ctx.select(1, 0, keys[:1, :1].repeat(q_heads, 1)[0])  # fp8 codes as a query


def test_fp8_scales_are_checked_by_the_library():
    with pytest.raises(pqcache.PQError) as e:
        pqcache.Context(1, 2, 2, 16, "fp8_e4m3", kv_scale_count=1, kv_scales=[0.5, -1.0])
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT" and "kv_scales[1]" in e.value.message
    with pytest.raises(pqcache.PQError) as e:
        pqcache.Context(1, 2, 2, 16, "f16", kv_scale_count=1, kv_scales=[1.0, 1.0])
    assert "fp8 dtypes only" in e.value.message


def test_torch_float8_tensors_are_taken_as_their_codes():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8")
    tokens, kv, q_heads, dim = 64, 1, 2, 8
    keys = torch.randn(tokens, kv, dim).to(torch.float8_e4m3fn)
    with pqcache.Context(1, q_heads, kv, dim, "fp8_e4m3", selector="exact") as ctx:
        ctx.add_sequence(1)
        ctx.prefill(1, 0, keys, keys)
        selection = ctx.select(1, 0, np.ones((q_heads, dim), np.float32))
        k_out, _ = ctx.fetch(1, 0, selection)
        codes = keys.view(torch.uint8).numpy()
        positions = selection.heads()[0]
        np.testing.assert_array_equal(k_out[0, :len(positions)], codes[positions, 0])
