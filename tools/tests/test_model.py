"""Smoke tests of the numpy forward pass (skipped without the model file)."""

import numpy as np
import pytest


def test_config(model):
    c = model.cfg
    assert (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab) == \
        (30, 576, 9, 3, 64, 1536, 49152)
    assert c.rope_theta == 100000.0 and abs(c.rms_eps - 1e-5) < 1e-9 and c.n_ctx == 8192
    assert model.out_w is model.tok_embd          # tied embeddings


def test_file_tensor_types(model):
    assert model.reader.type_summary() == {"Q8_0": 1, "F32": 61, "Q4_1": 210}


def test_perplexity_512(model, tokenizer, text):
    # Measured 27.70 on the first 512 tokens (13.60 on all 1501). A wrong RoPE
    # layout (rotate-half instead of adjacent pairs) gives ~226; a broken
    # tokenizer or weight orientation gives hundreds or more.
    ids = tokenizer.encode(text)[:512]
    ppl = model.perplexity(ids)
    print(f"perplexity over {len(ids)} tokens: {ppl:.3f}")
    assert 5.0 < ppl < 40.0


def test_decode_matches_prefill_and_select(model, tokenizer, text):
    ids = tokenizer.encode(text)[:96]
    full = model.prefill(ids, model.new_cache(96), logits="all", chunk=32)   # chunked attention
    cache = model.new_cache(100)
    model.prefill(ids[:90], cache, chunk=512)
    for t in ids[90:95]:
        model.decode_step(t, cache)
    calls = []

    def select_all(layer, q, k, v):
        calls.append((layer, q.shape, k.shape))
        return np.tile(np.arange(k.shape[1]), (k.shape[0], 1))        # [n_kv, n]

    last = model.decode_step(ids[95], cache, select=select_all)
    assert cache.n == 96
    np.testing.assert_allclose(last, full[-1], atol=2e-3, rtol=0)
    assert [c[0] for c in calls] == list(range(30))
    assert calls[0][1] == (9, 64) and calls[0][2] == (3, 96, 64)

    # restricting attention changes the output; per-head lists of different lengths work
    c2 = model.new_cache(100)
    model.prefill(ids[:95], c2)
    seen = []
    part = model.decode_step(ids[95], c2, select=lambda l, q, k, v: [np.array([0, 95]), np.arange(90, 96), [95]],
                             observe=lambda l, pos, probs: seen.append([p.shape for p in probs]))
    assert not np.allclose(part, full[-1], atol=1e-2)
    assert seen[0] == [(3, 2), (3, 6), (3, 1)]


def test_greedy_generation(model, tokenizer):
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    out = model.generate(tokenizer.encode(prompt), 12, stop=[tokenizer.eos_id])
    assert "Paris" in tokenizer.decode(out)
