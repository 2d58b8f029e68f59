"""The reference cycle of tests/reference_cycle.c, repeated in Python through
the binding, must print exactly what the C program prints."""
import os
import subprocess

import numpy as np
import pytest

import pqcache
from reference_data import fnv1a, reference_values

TOKENS, Q_HEADS, KV_HEADS, HEAD_DIM = 256, 4, 2, 16


def python_cycle() -> str:
    with pqcache.Context(1, Q_HEADS, KV_HEADS, HEAD_DIM, "f32", pq_subspaces=2, pq_bits=4,
                         kmeans_iterations=8, sink_tokens=4, local_tokens=16, topk_tokens=16,
                         seed=7, worker_threads=1) as ctx:
        ctx.add_sequence(1)
        shape = (TOKENS, KV_HEADS, HEAD_DIM)
        ctx.prefill(1, 0, reference_values(1, np.prod(shape)).reshape(shape),
                    reference_values(2, np.prod(shape)).reshape(shape))
        one = (1, KV_HEADS, HEAD_DIM)
        ctx.append(1, 0, reference_values(3, np.prod(one)).reshape(one),
                   reference_values(4, np.prod(one)).reshape(one))
        capacity = ctx.capacity(1, 0)
        selection = ctx.select(1, 0, reference_values(5, Q_HEADS * HEAD_DIM)
                               .reshape(Q_HEADS, HEAD_DIM))
        keys, values = ctx.fetch(1, 0, selection)
    lines = [f"capacity {capacity}"]
    hk = hv = 0xcbf29ce484222325
    for h, positions in enumerate(selection.heads()):
        lines.append(f"head {h} count {len(positions)} positions"
                     + "".join(f" {p}" for p in positions))
        hk = fnv1a(keys[h, : len(positions)].tobytes(), hk)
        hv = fnv1a(values[h, : len(positions)].tobytes(), hv)
    lines += [f"keys_fnv1a 0x{hk:016x}", f"values_fnv1a 0x{hv:016x}"]
    return "\n".join(lines) + "\n"


def test_matches_the_c_reference_program():
    program = os.environ.get("PQ_REFERENCE_CYCLE")
    if not program:
        pytest.fail("PQ_REFERENCE_CYCLE is not set: run through CTest (test python_binding), "
                    "which passes the path of pq_reference_cycle")
    expected = subprocess.run([program], check=True, capture_output=True, text=True).stdout
    assert python_cycle() == expected


def test_generator_matches_the_documented_formula():
    # value(0, 0): h = 0 -> 0 / 2^24 - 0.5; value(1, 0) worked by hand from the header.
    assert reference_values(0, 1)[0] == np.float32(-0.5)
    h = (0 * 2654435761 + 1 * 97531) % 2**32
    h ^= h >> 15
    h = (h * 2246822519) % 2**32
    h ^= h >> 13
    assert reference_values(1, 1)[0] == np.float32((h >> 8) / 16777216.0 - 0.5)
