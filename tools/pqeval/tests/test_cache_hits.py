"""Block-cache hit rates on the committed real trace (tools/pqeval/cache_hits.py):
the cache's bookkeeping runs on the CPU backend, so CI checks that a larger
cache holds more of what PQ fetches, and that a cache as large as the middle
of the context holds nearly all of it after the first steps.

Measured when the floors were set (2026-11-22, layers 3/15/27, all 384 decode
steps, top-k 1/5, blocks of 32): hit rate 0.204 with 128 tokens, 0.361 with
256, 0.588 with 512, 0.858 with 1024; LRU and LFU equal when k_cache is the
slot count, LRU 0.512 / LFU 0.494 at 512 tokens with k_cache 4.
"""
from pathlib import Path

import pytest

from pqeval import cache_hits, trace

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "data" / "smollm2_sotu_2k.pqtrace"


@pytest.fixture(scope="module")
def t():
    return trace.read(FIXTURE)


def test_hit_rate_grows_with_the_cache(t):
    rates = [cache_hits.hit_rate(t, tokens, 32, "lru", steps=128)["rate"]
             for tokens in (128, 512, 1024)]
    assert rates[0] < rates[1] < rates[2], rates
    assert rates[0] > 0.1, rates
    assert rates[2] > 0.75, rates


def test_every_fetched_middle_token_is_counted(t):
    r = cache_hits.hit_rate(t, 256, 32, "lfu", steps=16, layers=[15])
    q_heads, kv_heads, _ = t.geometry
    assert r["hits"] + r["misses"] > 0
    # Each step fetches the same top-k of every kv head (1/5 of the middle),
    # so the count is a multiple of the kv heads.
    assert (r["hits"] + r["misses"]) % kv_heads == 0


def test_the_policy_matters_only_below_the_slot_count(t):
    same = [cache_hits.hit_rate(t, 512, 32, p, steps=128)["rate"] for p in ("lru", "lfu")]
    assert same[0] == pytest.approx(same[1])
    few = [cache_hits.hit_rate(t, 512, 32, p, steps=128, update_blocks=4)["rate"]
           for p in ("lru", "lfu")]
    assert few[0] != pytest.approx(few[1]), few
