"""Bad input raises, never crashes: library errors as pqcache.PQError with the
library's status and message, malformed arrays as TypeError / ValueError
before the library is called (so it cannot read or write out of bounds)."""
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import pqcache
from pqcache import pqcache_swig as raw


@pytest.fixture
def ctx():
    with pqcache.Context(2, 4, 2, 16, "f32", selector="exact", local_tokens=8) as context:
        context.add_sequence(1)
        yield context


def prefilled(ctx, tokens=64):
    data = np.random.default_rng(0).standard_normal((tokens, 2, 16)).astype(np.float32)
    ctx.prefill(1, 0, data, data)
    return data


def test_library_errors_carry_status_name_and_message(ctx):
    with pytest.raises(pqcache.PQError) as e:
        ctx.length(42, 0)
    assert e.value.status == raw.PQ_ERR_NOT_FOUND == -4
    assert e.value.status_name == "PQ_ERR_NOT_FOUND"
    assert "42" in e.value.message
    assert str(e.value) == f"PQ_ERR_NOT_FOUND: {e.value.message}"
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(pqcache.PQError) as e:
        ctx.length(1, 5)
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT" and "layer" in e.value.message
    with pytest.raises(pqcache.PQError) as e:
        ctx.add_sequence(1)
    assert e.value.status == raw.PQ_ERR_INVALID_ARGUMENT


def test_nan_and_wrong_heads_are_the_library_s_invalid_argument(ctx):
    bad = np.full((10, 2, 16), np.nan, np.float32)
    with pytest.raises(pqcache.PQError) as e:
        ctx.prefill(1, 0, bad, bad)
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT" and "NaN" in e.value.message
    wrong_heads = np.zeros((10, 3, 16), np.float32)
    with pytest.raises(pqcache.PQError) as e:
        ctx.prefill(1, 0, wrong_heads, wrong_heads)
    assert "heads" in e.value.message


def test_select_before_prefill_is_bad_state(ctx):
    with pytest.raises(pqcache.PQError) as e:
        ctx.select(1, 1, np.zeros((4, 16), np.float32), out=pqcache.SelectionResult(2, 8))
    assert e.value.status_name == "PQ_ERR_BAD_STATE"


def test_configuration_errors():
    with pytest.raises(pqcache.PQError) as e:
        pqcache.Context(1, 3, 2, 16)
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT" and "num_q_heads" in e.value.message
    with pytest.raises(pqcache.PQError) as e:
        pqcache.Context(1, 2, 2, 16, pq_bits=9)
    assert e.value.status_name == "PQ_ERR_UNSUPPORTED"
    with pytest.raises(TypeError, match="no_such_field"):
        pqcache.Context(1, 2, 2, 16, no_such_field=1)
    with pytest.raises(ValueError, match="selector"):
        pqcache.Context(1, 2, 2, 16, selector="nope")
    with pytest.raises(ValueError, match="dtype"):
        pqcache.Context(1, 2, 2, 16, "f64")
    with pytest.raises(OverflowError):
        pqcache.Context(1, 2, 2, 16, sink_tokens=2**40)


def _blocked_library(monkeypatch):
    """Makes every call into the native module fail the test: what raises
    with it raised before the library was called."""
    def called(*args):
        raise AssertionError("the library was called")
    for name in dir(raw):
        if name.startswith("pq_") and callable(getattr(raw, name)):
            monkeypatch.setattr(raw, name, called)


@pytest.mark.parametrize("dtype, given", [("f32", np.float16), ("f16", np.float32),
                                          ("bf16", np.float16), ("f16", np.uint16)])
def test_a_wrong_element_type_is_a_type_error_before_the_library(monkeypatch, dtype, given):
    """As docs/bindings/python.md says: TypeError naming the argument, the
    expected and the given dtype; no C call. It is also a PQError with
    PQ_ERR_INVALID_ARGUMENT, the status the library reported for it before."""
    expected = {"f32": "float32", "f16": "float16", "bf16": "uint16 (bfloat16 bits)"}[dtype]
    given_name = np.dtype(given).name
    with pqcache.Context(1, 4, 2, 16, dtype, selector="exact") as context:
        context.add_sequence(1)
        selection = pqcache.SelectionResult(2, 8)
        wrong = np.zeros((10, 2, 16), given)
        wrong_query = np.zeros((4, 16), given)
        calls = [(lambda: context.prefill(1, 0, wrong, wrong), "keys"),
                 (lambda: context.append(1, 0, wrong, wrong), "keys"),
                 (lambda: context.prefill_queries(1, 0, wrong_query[None]), "queries"),
                 (lambda: context.select(1, 0, wrong_query), "query"),
                 (lambda: context.speculate(1, 0, wrong_query), "query"),
                 (lambda: context.attend(1, 0, wrong_query, selection), "query"),
                 (lambda: context.select_batch(0, [1], [wrong_query]), "queries[0]"),
                 (lambda: context.fetch(1, 0, selection, out=(wrong, wrong)),
                  "out[0] (keys)"),
                 (lambda: context.fetch_batch(0, [1], [selection], [wrong], [wrong]),
                  "out_keys[0]")]
        with monkeypatch.context() as blocked:
            _blocked_library(blocked)
            for call, argument in calls:
                with pytest.raises(TypeError) as e:
                    call()
                assert str(e.value) == f"PQ_ERR_INVALID_ARGUMENT: {e.value.message}"
                assert e.value.message == (f"{argument}: expected {expected} elements for the "
                                           f"context's dtype {dtype}, got {given_name}")
                assert isinstance(e.value, pqcache.DTypeError)
                assert isinstance(e.value, pqcache.PQError)
                assert e.value.status == raw.PQ_ERR_INVALID_ARGUMENT
                assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"


def test_the_raw_module_passes_a_wrong_dtype_to_the_library(ctx):
    """The raw module is the C API: the library's check, which names dtypes
    (not their numbers)."""
    half = np.zeros((10, 2, 16), np.float16)  # the context stores f32
    with pytest.raises(pqcache.PQError) as e:
        raw.pq_prefill_layer(ctx._ctx, 1, 0, half, half)
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"
    assert e.value.message == "pq_prefill_layer: keys.dtype is f16; the context stores f32"
    assert not isinstance(e.value, TypeError)


def test_malformed_tensors_are_rejected_before_the_call(ctx):
    good = np.zeros((10, 2, 16), np.float32)
    with pytest.raises(TypeError, match="buffer protocol"):
        ctx.prefill(1, 0, [[[0.0] * 16] * 2] * 10, good)
    with pytest.raises(TypeError, match="keys: expected float32 elements for the context's "
                                        "dtype f32, got float64"):
        ctx.prefill(1, 0, good.astype(np.float64), good)
    with pytest.raises(TypeError, match="unsupported element format 'd'"):  # the raw module
        raw.pq_prefill_layer(ctx._ctx, 1, 0, good.astype(np.float64), good)
    with pytest.raises(ValueError, match="3-D"):
        ctx.prefill(1, 0, good.reshape(20, 16), good)
    with pytest.raises(ValueError, match="last axis"):
        ctx.prefill(1, 0, np.zeros((10, 2, 32), np.float32)[:, :, ::2], good)
    with pytest.raises(ValueError, match="non-negative"):
        ctx.prefill(1, 0, good[::-1], good)
    with pytest.raises(TypeError, match=r"got >f4 \(not in native byte order\)"):
        ctx.prefill(1, 0, good.astype(">f4"), good)
    with pytest.raises(TypeError, match="byte order|format"):
        raw.pq_prefill_layer(ctx._ctx, 1, 0, good.astype(">f4"), good)


def test_malformed_selections_are_rejected(ctx):
    prefilled(ctx)
    query = np.zeros((1, 4, 16), np.float32)
    counts = np.zeros(2, np.int32)
    # One row for two kv heads would let the library write past the arrays.
    with pytest.raises(ValueError, match="kv heads"):
        raw.pq_decode_select(ctx._ctx, 1, 0, query, (np.zeros((1, 64), np.int32),
                                                     np.zeros(1, np.int32)))
    with pytest.raises(ValueError, match="rows"):
        raw.pq_decode_select(ctx._ctx, 1, 0, query, (np.zeros((2, 64), np.int32),
                                                     np.zeros(3, np.int32)))
    with pytest.raises(TypeError, match="int32"):
        raw.pq_decode_select(ctx._ctx, 1, 0, query, (np.zeros((2, 64), np.int64), counts))
    with pytest.raises(ValueError, match="C-contiguous"):
        raw.pq_decode_select(ctx._ctx, 1, 0, query,
                             (np.zeros((2, 128), np.int32)[:, ::2], counts))
    with pytest.raises(TypeError, match="positions, counts"):
        raw.pq_decode_select(ctx._ctx, 1, 0, query, np.zeros((2, 64), np.int32))
    with pytest.raises(ValueError, match="read-only"):
        positions = np.zeros((2, 64), np.int32)
        positions.flags.writeable = False
        raw.pq_decode_select(ctx._ctx, 1, 0, query, (positions, counts))
    # Too small a capacity is the library's check (PQ_ERR_BUFFER_TOO_SMALL
    # since 0.4): the caller's selection learns the capacity needed, and
    # nothing else is written.
    out = pqcache.SelectionResult(2, 3)
    with pytest.raises(pqcache.PQError) as e:
        ctx.select(1, 0, query[0], out=out)
    assert e.value.status == raw.PQ_ERR_BUFFER_TOO_SMALL == -8
    assert e.value.status_name == "PQ_ERR_BUFFER_TOO_SMALL" and "capacity" in e.value.message
    assert e.value.message.startswith("pq_decode_select")
    assert list(out.counts) == [ctx.capacity(1, 0)] * 2 and (out.positions == -1).all()


def test_bad_fetch_and_observe_arguments(ctx):
    prefilled(ctx)
    selection = ctx.select(1, 0, np.ones((4, 16), np.float32))
    small = np.zeros((2, 3, 16), np.float32)  # fewer rows than selected
    with pytest.raises(pqcache.PQError) as e:
        ctx.fetch(1, 0, selection, out=(small, small.copy()))
    # INVALID_ARGUMENT, not the BUFFER_TOO_SMALL of a too-small selection:
    # the size needed is max(counts), which the caller holds (pqcache.h).
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"
    assert e.value.message == (f"pq_fetch_kv: out_keys.tokens is 3; expected at least "
                               f"{selection.counts.max()}")
    with pytest.raises(ValueError, match="shape"):
        ctx.observe_attention(1, 0, selection, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="probs"):
        raw.pq_observe_attention(ctx._ctx, 1, 0, selection.arrays, np.zeros(5, np.float32))
    selection.positions[0, 0] = 10_000  # past the sequence
    with pytest.raises(pqcache.PQError) as e:
        ctx.fetch(1, 0, selection)
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"


def test_index_buffers_are_checked():
    with pqcache.Context(1, 2, 2, 16, "f32", kmeans_iterations=2, pq_subspaces=2,
                         pq_bits=6) as pq:
        pq.add_sequence(1)
        data = np.random.default_rng(1).standard_normal((300, 2, 16)).astype(np.float32)
        pq.prefill(1, 0, data, data)
        with pytest.raises(ValueError, match="codes"):
            raw.pq_index_codes(pq._ctx, 1, 0, 0, 0, 10, np.zeros(19, np.uint8))
        with pytest.raises(pqcache.PQError):
            raw.pq_index_centroids(pq._ctx, 1, 0, 0, np.zeros(3, np.float32))
        assert pq.codes(1, 0, 0, 0, 10).shape == (10, 2)
        assert pq.centroids(1, 0, 0).shape == (2, 64, 8)


def test_a_closed_context_is_bad_state_as_in_every_binding(ctx):
    """The status and text Go and Java give a closed context too
    (docs/bindings/errors.md); the library is not called with NULL."""
    ctx.close()
    ctx.close()  # idempotent
    for call, op in [(lambda: ctx.length(1, 0), "pq_sequence_length"),
                     (lambda: ctx.add_sequence(2), "pq_sequence_add"),
                     (lambda: ctx.select(1, 0, np.zeros((4, 16), np.float32)),
                      "pq_decode_select"),
                     (lambda: ctx.select_batch(0, [1], [np.zeros((4, 16), np.float32)]),
                      "pq_decode_select_batch"),
                     (lambda: ctx.save(1), "pq_sequence_save_buffer"),
                     (ctx.stats, "pq_stats_get"), (ctx.wait_builds, "pq_wait_builds")]:
        with pytest.raises(pqcache.PQError) as e:
            call()
        assert e.value.status == raw.PQ_ERR_BAD_STATE == -3
        assert e.value.status_name == "PQ_ERR_BAD_STATE"
        assert e.value.message == f"{op}: the context is closed"
        assert str(e.value) == f"PQ_ERR_BAD_STATE: {op}: the context is closed"


def test_a_null_context_is_the_library_s_invalid_argument():
    # The raw module passes None on as NULL: the C API's answer.
    with pytest.raises(pqcache.PQError) as e:
        raw.pq_decode_select(None, 1, 0, np.zeros((1, 4, 16), np.float32),
                             (np.zeros((2, 8), np.int32), np.zeros(2, np.int32)))
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT" and "ctx" in e.value.message


def test_bad_attend_arguments(ctx):
    query = np.ones((4, 16), np.float32)
    with pytest.raises(pqcache.PQError) as e:
        ctx.attend(1, 0, query, pqcache.SelectionResult(2, 8))
    assert e.value.status_name == "PQ_ERR_BAD_STATE"
    assert e.value.message.startswith("pq_decode_attend")
    prefilled(ctx)
    selection = ctx.select(1, 0, query)
    with pytest.raises(pqcache.PQError) as e:
        ctx.attend(1, 0, query, selection, scale=-1.0)
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"
    assert e.value.message.startswith("pq_decode_attend") and "scale" in e.value.message
    with pytest.raises(pqcache.PQError) as e:
        ctx.attend(1, 0, np.ones((2, 16), np.float32), selection)  # kv heads, not q heads
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT"
    assert e.value.message.startswith("pq_decode_attend") and "query" in e.value.message
    with pytest.raises(TypeError) as e:
        ctx.attend(1, 0, query.astype(np.float16), selection)  # the context stores f32
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT" and "dtype f32" in e.value.message
    with pytest.raises(pqcache.PQError) as e:
        ctx.attend(42, 0, query, selection)
    assert e.value.status_name == "PQ_ERR_NOT_FOUND"
    # The raw module checks the output arrays against the context first.
    out, lse = np.zeros((4, 16), np.float32), np.zeros(4, np.float32)
    raw.pq_decode_attend(ctx._ctx, 1, 0, query[np.newaxis], selection.arrays, 0.0, out, None)
    with pytest.raises(ValueError, match="out: 63 float32"):
        raw.pq_decode_attend(ctx._ctx, 1, 0, query[np.newaxis], selection.arrays, 0.0,
                             out.reshape(-1)[:63], lse)
    with pytest.raises(ValueError, match="out_lse"):
        raw.pq_decode_attend(ctx._ctx, 1, 0, query[np.newaxis], selection.arrays, 0.0, out,
                             lse[:3])
    with pytest.raises(TypeError, match="float32"):
        raw.pq_decode_attend(ctx._ctx, 1, 0, query[np.newaxis], selection.arrays, 0.0,
                             out.astype(np.float64), lse)
    selection.positions[0, 0] = 10_000  # past the sequence
    with pytest.raises(pqcache.PQError) as e:
        ctx.attend(1, 0, query, selection)
    assert e.value.status_name == "PQ_ERR_INVALID_ARGUMENT" and "positions" in e.value.message


# Imports pqcache.transformers as if the module `blocked` were not installed
# (sys.modules[name] = None makes `import name` fail so), without touching the venv.
_IMPORT_BLOCKED = """
import sys
sys.modules[sys.argv[1]] = None
try:
    import pqcache.transformers
except ImportError as e:
    print(type(e).__name__, isinstance(e, ModuleNotFoundError), e.name, e, sep="\\n")
else:
    print("imported")
"""


def _import_without(blocked: str):
    done = subprocess.run([sys.executable, "-c", _IMPORT_BLOCKED, blocked], capture_output=True,
                          text=True, env=os.environ, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.rstrip("\n").split("\n", 3)


@pytest.mark.parametrize("blocked", ["torch", "transformers"])
def test_the_transformers_integration_without_torch_says_what_to_install(blocked):
    # Where torch is not installed at all (the wheel's test venv), it is the
    # module found missing whichever is blocked.
    missing = blocked if importlib.util.find_spec("torch") else "torch"
    kind, is_not_found, name, message = _import_without(blocked)
    assert (kind, is_not_found, name) == ("ModuleNotFoundError", "True", missing)
    assert message.startswith(f"pqcache.transformers needs torch and transformers, and "
                              f"'{missing}' is not installed: pip install torch==")
    assert "pip install -r requirements-eval.txt" in message
    assert "`import pqcache` works without them" in message


def test_the_install_hint_names_the_versions_requirements_eval_pins():
    requirements = pathlib.Path(__file__).resolve().parents[3] / "requirements-eval.txt"
    if not requirements.is_file():  # the wheel test runs a copy of the tests
        pytest.skip(f"SKIPPED: no source tree here ({requirements} does not exist)")
    pins = dict(re.findall(r"^(torch|transformers)==(\S+)", requirements.read_text(), re.M))
    assert set(pins) == {"torch", "transformers"}, pins
    message = _import_without("torch")[3]
    assert (f"pip install torch=={pins['torch']} transformers=={pins['transformers']} "
            in message), message


def test_the_install_hint_takes_a_venv_where_the_system_manages_python(monkeypatch, tmp_path):
    from pqcache import _install_hint
    requirements = ("torch==2.15.0", "transformers==5.23.0")
    stdlib = tmp_path / "lib" / "python3"
    stdlib.mkdir(parents=True)
    monkeypatch.setattr(_install_hint.sysconfig, "get_path", lambda name: str(stdlib))
    monkeypatch.setattr(_install_hint.sys, "prefix", "/usr")
    monkeypatch.setattr(_install_hint.sys, "base_prefix", "/usr")
    monkeypatch.setattr(_install_hint.sys, "executable", "/usr/bin/python3")
    assert _install_hint.install_command(requirements) == "pip install torch==2.15.0 transformers==5.23.0"
    assert _install_hint.pip() == "pip"
    # Debian's python3: pip refuses, so the hint makes a venv and installs with its pip.
    (stdlib / "EXTERNALLY-MANAGED").write_text("[externally-managed]\n")
    hint = _install_hint.install_command(requirements)
    assert "PEP 668" in hint and "not even with --user" in hint, hint
    assert ("so in a venv: /usr/bin/python3 -m venv --system-site-packages ~/pqcache-venv && "
            "~/pqcache-venv/bin/pip install torch==2.15.0 transformers==5.23.0, "
            "then run ~/pqcache-venv/bin/python") in hint, hint
    assert _install_hint.pip() == "~/pqcache-venv/bin/pip"
    # Without python3-venv, Debian's python3 has no ensurepip and venv fails: install it first.
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(_install_hint.importlib.util, "find_spec",
                        lambda name, *args: None if name == "ensurepip" else find_spec(name, *args))
    minor = sys.version_info.minor
    assert (f"so in a venv: sudo apt install python3.{minor}-venv && /usr/bin/python3 -m venv "
            in _install_hint.install_command(requirements))
    monkeypatch.setattr(_install_hint.sys, "prefix", "/home/u/venv")  # inside a venv: pip may
    assert _install_hint.install_command(requirements).startswith("pip install ")


# Imports pqcache.redis from the copy of the package in argv[1]; prints the
# ImportError's message, or where the module found its library.
_IMPORT_REDIS = """
import sys
sys.path.insert(0, sys.argv[1])
import pqcache
assert pqcache.__file__.startswith(sys.argv[1]), pqcache.__file__
try:
    import pqcache.redis
except ImportError as e:
    print(e)
else:
    print("imported", pqcache.redis.library_path())
"""


def test_pqcache_redis_without_its_library_says_what_to_install(tmp_path):
    # The package as the wheel has it: pqcache/redis.py, but no
    # libpqcache_redis.so.N beside it (the build stages a link there).
    shutil.copytree(pathlib.Path(pqcache.__file__).parent, tmp_path / "pqcache",
                    ignore=shutil.ignore_patterns("libpqcache_redis.so*", "__pycache__"))
    major = pqcache.version().split(".")[0]
    soname = f"libpqcache_redis.so.{major}"
    env = {k: v for k, v in os.environ.items() if k != "PQCACHE_REDIS_LIBRARY"}

    def import_redis():
        done = subprocess.run([sys.executable, "-c", _IMPORT_REDIS, str(tmp_path)],
                              capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    message = import_redis()
    if message.startswith("imported"):
        pytest.skip(f"SKIPPED: the dynamic loader finds {soname} here ({message})")
    assert message.startswith(f"pqcache.redis needs {soname} (the Redis tier, docs/redis.md): "
                              f"install the package libpqcache-redis{major} (Debian) or "
                              f"libpqcache_redis{major} (RPM), or set PQCACHE_REDIS_LIBRARY"), message
    assert "No module named" not in message
    env["PQCACHE_REDIS_LIBRARY"] = str(tmp_path / soname)  # named, but absent
    message = import_redis()
    assert message.startswith(f"pqcache.redis: $PQCACHE_REDIS_LIBRARY={tmp_path / soname} "
                              "does not load: "), message
    assert message.endswith(f"(name a built {soname}, or unset it to use the one the package "
                            f"libpqcache-redis{major} installs)"), message


def test_pqerror_is_named_after_the_package_it_is_raised_from(ctx):
    import pickle
    import traceback
    assert pqcache.PQError.__module__ == "pqcache" and pqcache.PQError.__name__ == "PQError"
    assert pqcache.PQError.__qualname__ == "PQError"
    with pytest.raises(pqcache.PQError) as e:
        ctx.length(42, 0)
    assert type(e.value).__module__ == "pqcache", type(e.value).__module__
    assert repr(type(e.value)) == "<class 'pqcache.PQError'>"
    assert "pqcache_swig" not in repr(type(e.value)) + repr(e.value)
    line = traceback.format_exception_only(type(e.value), e.value)[-1]
    assert line.startswith("pqcache.PQError: PQ_ERR_NOT_FOUND: "), line
    assert type(pickle.loads(pickle.dumps(e.value))) is pqcache.PQError

