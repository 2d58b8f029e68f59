"""The .pqtrace writer and readers: Python round trip, and the C reader
(examples/pqtrace.h through pqtrace_dump) on a file Python wrote."""
import os
import subprocess

import numpy as np
import pytest

from pqeval import trace


def make(dtype=np.float32, layers=(0, 5), n=100, f=60, qh=4, kvh=2, hd=8):
    rng = np.random.default_rng(3)
    q = {l: rng.standard_normal((n - f, qh, hd)).astype(dtype) for l in layers}
    k = {l: rng.standard_normal((n, kvh, hd)).astype(dtype) for l in layers}
    v = {l: rng.standard_normal((n, kvh, hd)).astype(dtype) for l in layers}
    ids = rng.integers(0, 49152, n).astype(np.int32)
    return trace.Trace("tiny-model", "made-up.txt", ids, list(layers), q, k, v, f)


@pytest.mark.parametrize("dtype,name", [(np.float16, "f16"), (np.float32, "f32")])
def test_round_trip(tmp_path, dtype, name):
    t = make(dtype)
    path = tmp_path / "t.pqtrace"
    trace.write(path, t, name)
    back = trace.read(path)
    assert (back.model, back.text, back.layers, back.q_first) == (t.model, t.text, t.layers, 60)
    np.testing.assert_array_equal(back.token_ids, t.token_ids)
    for l in t.layers:
        np.testing.assert_array_equal(back.queries[l], t.queries[l])
        np.testing.assert_array_equal(back.keys[l], t.keys[l])
        np.testing.assert_array_equal(back.values[l], t.values[l])


def test_rejects_bad_shapes_and_names(tmp_path):
    t = make()
    t.keys[0] = t.keys[0][:-1]
    with pytest.raises(ValueError):
        trace.write(tmp_path / "bad.pqtrace", t)
    t = make()
    t.text = "has space"
    with pytest.raises(ValueError):
        trace.write(tmp_path / "bad.pqtrace", t)
    (tmp_path / "junk.pqtrace").write_bytes(b"NOPE\nend\n")
    with pytest.raises(ValueError):
        trace.read(tmp_path / "junk.pqtrace")


@pytest.mark.parametrize("dtype,name", [(np.float16, "f16"), (np.float32, "f32")])
def test_c_reader_agrees(tmp_path, dtype, name):
    exe = os.environ.get("PQ_TRACE_DUMP")
    if not exe:
        pytest.skip("PQ_TRACE_DUMP not set: run through CTest, which builds pqtrace_dump")
    t = make(dtype)
    path = tmp_path / "t.pqtrace"
    trace.write(path, t, name)
    out = subprocess.run([exe, str(path)], check=True, capture_output=True, text=True).stdout
    lines = dict(line.split(" ", 1) for line in out.splitlines() if not line.startswith("layer"))
    assert lines["tokens"] == "100" and lines["q_first"] == "60" and lines["dtype"] == name
    assert int(lines["token_id_sum"]) == int(t.token_ids.sum())
    for line in (l for l in out.splitlines() if l.startswith("layer")):
        parts = line.split()
        layer = int(parts[1])
        got = {parts[i]: float(parts[i + 1]) for i in (2, 4, 6)}
        want = {"q": t.queries[layer], "k": t.keys[layer], "v": t.values[layer]}
        for key, arr in want.items():
            assert got[key] == pytest.approx(float(arr.astype(np.float64).sum()), abs=1e-3)
    # A truncated file is refused with a message, not read past its end.
    raw = path.read_bytes()
    (tmp_path / "cut.pqtrace").write_bytes(raw[: len(raw) - 100])
    r = subprocess.run([exe, str(tmp_path / "cut.pqtrace")], capture_output=True, text=True)
    assert r.returncode == 1 and "truncated" in r.stderr
