"""Keyformer against the authors' code: the score function of
scaled_multihead_dot_product_attention (d-matrix-ai/keyformer-llm,
models/mpt-keyformer-lib/attention.py at
f327831056a9909b133aaa14a48f2bd0722acede), re-typed below in numpy: the raw
logits with discarded keys set to the dtype's lowest value, torch's
gumbel_softmax(raw, tau=tau_init + itr_count * tau_delta) summed over the
query rows, added to the previous score (current[:, :-1] += score_fn), and
the score of discarded tokens multiplied by 0.

The noise is the one thing the reference draws itself (torch's
exponential_()); here it gets the library's documented stream
(keyformer_selector.cpp), recomputed in Python, so both see the same g.

Both run in lockstep on one layer of two heads: the prompt (every prompt row,
observation_window = the prompt), then decode steps where the query attends
to the library's selection and the library observes those probabilities.
At every selection, the library's middle must be the top k of the
reference's accumulated score among the tokens not dropped yet.

The one rule that differs (docs/selector-references.md): the authors' mask
drops the token that leaves the recent window before it can compete, which
freezes the key set chosen at the prompt; the library lets it compete with
its score. So the reference takes the library's kept set as its discard mask
each step, and the test checks the scores, the schedule and the choice the
library makes from them. (Checked: a reference whose temperature grows by
0.1 a step instead of 0.25, or that drops the noise or the accumulation,
fails.)"""
import math

import numpy as np

import pqcache

MASK = (1 << 64) - 1
SALT = 0x6B6579666F726D72  # "keyformr"
HEADS, DIM, PROMPT, LOCAL, K, STEPS = 2, 16, 48, 8, 12, 24
SEED, TAU, TAU_STEP = 7, 1.0, 0.25
LAYER = 0


def _splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def _mix_seed(seed, value):
    state = seed ^ ((value * 0xD1342543DE82EF95 + 0x2545F4914F6CDD1D) & MASK)
    state, _ = _splitmix64(state)
    _, out = _splitmix64(state)
    return out


def library_gumbel(layer, head, step, row, tokens):
    """The library's noise for `tokens` of one row (keyformer_selector.cpp)."""
    s = SEED ^ SALT
    for v in (layer, head, step, row):
        s = _mix_seed(s, v)
    u = np.array([((_mix_seed(s, t) >> 11) + 0.5) * 2.0 ** -53 for t in tokens])
    return -np.log(-np.log(u))


def gumbel_softmax(logits, gumbels, tau):
    """torch.nn.functional.gumbel_softmax(logits, tau, hard=False, dim=-1)
    with its drawn gumbels given."""
    y = (logits + gumbels) / tau
    y = y - y.max(axis=-1, keepdims=True)
    e = np.exp(y)
    return e / e.sum(axis=-1, keepdims=True)


class KeyformerScore:
    """The score function of the authors' attention, one layer, per head."""

    MIN = np.finfo(np.float32).min  # torch.finfo(q.dtype).min

    def __init__(self):
        self.score_fn = None
        self.itr_count = 0

    def step(self, raw, gumbels, discard_mask):
        """raw [heads, s_q, s_k] (causal entries already MIN), gumbels alike,
        discard_mask [heads, s_k] (1 = kept) or None at the prompt."""
        if discard_mask is not None:
            raw = raw * discard_mask[:, None, :] + (1 - discard_mask[:, None, :]) * self.MIN
        g = gumbel_softmax(raw, gumbels, TAU + self.itr_count * TAU_STEP)
        current = g.sum(1)  # (heads, k-tokens)
        if self.score_fn is not None:
            current[:, :-1] += self.score_fn
        self.score_fn = current
        self.itr_count += 1

    def discard(self, head, tokens):
        self.score_fn[head, list(tokens)] = 0.0  # score_fn * score_mask


def test_every_selection_is_the_top_k_of_the_authors_accumulated_score():
    rng = np.random.default_rng(11)
    total = PROMPT + STEPS
    keys = rng.normal(size=(total, HEADS, DIM)).astype(np.float32)
    queries = (2 * rng.normal(size=(total, HEADS, DIM))).astype(np.float32)
    # Decode queries share a direction that every other generated key
    # follows: those tokens gather mass while local and outbid prompt
    # tokens when they reach the middle, so the decode steps' scores (and
    # the temperature's schedule) decide what is kept, not the prompt alone.
    u = rng.normal(size=(HEADS, DIM)).astype(np.float32)
    queries[PROMPT:] += 2 * u
    keys[PROMPT::2] += u
    scale = 1 / math.sqrt(DIM)
    ref = KeyformerScore()
    with pqcache.Context(1, HEADS, HEADS, DIM, "f32", selector="keyformer", sink_tokens=0,
                         local_tokens=LOCAL, topk_tokens=K, observation_window=PROMPT,
                         seed=SEED, keyformer_tau=TAU, keyformer_tau_step=TAU_STEP) as ctx:
        ctx.add_sequence(0)
        ctx.prefill(0, LAYER, keys[:PROMPT], keys[:PROMPT])
        ctx.prefill_queries(0, LAYER, queries[:PROMPT])
        raw = np.einsum("qhd,khd->hqk", queries[:PROMPT], keys[:PROMPT]).astype(np.float64) * scale
        raw[:, np.triu_indices(PROMPT, 1)[0], np.triu_indices(PROMPT, 1)[1]] = KeyformerScore.MIN
        noise = np.stack([np.stack([library_gumbel(LAYER, h, 0, r, range(PROMPT))
                                    for r in range(PROMPT)]) for h in range(HEADS)])
        ref.step(raw, noise, None)

        dropped = [set() for _ in range(HEADS)]
        outbid = 0  # steps where the token entering the middle was kept
        for step in range(STEPS):
            n = PROMPT + step + 1
            ctx.append(0, LAYER, keys[n - 1:n], keys[n - 1:n])
            sel = ctx.select(0, LAYER, queries[n - 1])
            middle_end = n - LOCAL
            for h, row in enumerate(sel.heads()):
                middle = sorted(p for p in row.tolist() if p < middle_end)
                score = np.append(ref.score_fn[h], 0.0)  # the new token: no score yet
                candidates = [p for p in range(middle_end) if p not in dropped[h]]
                ranked = sorted(candidates, key=lambda p: (score[p], p), reverse=True)
                want = sorted(ranked[:K])
                assert middle == want, (
                    f"step {step}, head {h}: the library kept {sorted(set(middle) - set(want))} "
                    f"where the reference's top {K} has {sorted(set(want) - set(middle))}")
                if len(ranked) > K:  # no near tie decides it
                    assert score[ranked[K - 1]] - score[ranked[K]] > 1e-5
                newly = set(candidates) - set(middle)
                outbid += step > 0 and middle_end - 1 not in newly
                dropped[h] |= newly
                ref.discard(h, newly)

            # The step: the query attends to the selection; the library gets
            # the probabilities, the reference the logits and the mask.
            probs = np.zeros((HEADS, sel.capacity), np.float32)
            mask = np.zeros((HEADS, n))
            raw = np.full((HEADS, 1, n), 0.0)
            for h, row in enumerate(sel.heads()):
                logits = keys[row, h] @ queries[n - 1, h] * scale
                p = np.exp(logits - logits.max())
                probs[h, :len(row)] = p / p.sum()
                mask[h, row] = 1
                raw[h, 0] = keys[:n, h] @ queries[n - 1, h] * scale
            ctx.observe_attention(0, LAYER, sel, probs)
            noise = np.stack([library_gumbel(LAYER, h, step + 1, 0, range(n))[None, :]
                              for h in range(HEADS)])
            ref.step(raw, noise, mask)
        assert outbid > 0, "the key set never moved: the test would not see the decode steps"
