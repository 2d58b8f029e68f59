"""Scissorhands against the implementation it follows: cold-compress's
KVCacheHeavyHitter with attn_thresholding (AnswerDotAI/cold-compress,
cache.py at 15bb3005c5661e0d97e295c71c6e5fced1a863cc), its update_state and
_eviction_idx re-typed below in numpy: a ring of the last m steps of
"attention >= 1 / tokens in the cache" per slot, a count of steps recorded
per slot, and one eviction per step of the slot with the lowest average,
the global (sink) and recent (local) tokens protected.

Both are driven with the same attention: a prompt that fills the cache
exactly (cold-compress's cache size = sinks + k + local), its prompt taken
as one step of attention averaged over the queries, then decode steps whose
attention over the kept tokens is random. Every step the library drops
exactly one middle token, and the reference must agree that it had the
lowest average; the tie-break differs (cold-compress takes the first slot,
the library the older position), so the reference then evicts the token
the library dropped and both go on from the same cache."""
import numpy as np

import pqcache

SINK, LOCAL, K, WINDOW = 4, 8, 10, 6
CACHE = SINK + K + LOCAL


class ColdCompressHeavyHitter:
    """update_state and _eviction_idx of KVCacheHeavyHitter (one batch row,
    one head, attn_thresholding=True, history_window_size=WINDOW)."""

    def __init__(self, size, window, global_tokens, recent_window):
        self.pos = np.full(size, -1)
        self.num = np.zeros((size, window), bool)
        self.denom = np.zeros(size, np.int64)
        self.counter = 0
        self.window, self.global_tokens, self.recent = window, global_tokens, recent_window

    def update_state(self, attn):  # attn over the slots, 0 for empty ones
        cache_cts = int((self.pos >= 0).sum())
        self.num[:, self.counter % self.window] = attn >= 1 / cache_cts
        self.denom += 1
        self.counter += 1

    def averages(self, input_pos):
        avg = self.num.sum(-1) / np.clip(self.denom, 1, self.window)
        protected = (self.pos < self.global_tokens) | (self.pos >= input_pos - self.recent)
        avg = np.where(protected & (self.pos >= 0), 1.0, avg)
        return np.where(self.pos == -1, 0.0, avg)

    def evict(self, slot, new_pos):  # what _eviction_idx then the insert do to the slot
        self.num[slot] = False
        self.denom[slot] = 0
        self.pos[slot] = new_pos


def test_each_eviction_is_the_lowest_average_of_the_reference():
    rng = np.random.default_rng(7)
    steps = 40
    keys = rng.normal(size=(CACHE + steps, 1, 8)).astype(np.float32)
    with pqcache.Context(1, 1, 1, 8, "f32", selector="scissorhands", sink_tokens=SINK,
                         local_tokens=LOCAL, topk_tokens=K, history_window=WINDOW) as ctx:
        ctx.add_sequence(0)
        ctx.prefill(0, 0, keys[:CACHE], keys[:CACHE])
        # cold-compress protects the recent_window tokens before the one it
        # inserts: LOCAL - 1 of them plus the new token are the library's window.
        ref = ColdCompressHeavyHitter(CACHE, WINDOW, SINK, LOCAL - 1)
        ref.pos[:] = np.arange(CACHE)
        # The prompt: causal attention averaged over the queries that see each token.
        prompt = rng.dirichlet(np.ones(CACHE), size=CACHE) * np.tri(CACHE)
        prompt /= prompt.sum(1, keepdims=True)
        mean = (prompt.sum(0) / (CACHE - np.arange(CACHE))).astype(np.float32)
        everything = pqcache.SelectionResult(1, CACHE)
        everything.positions[0] = np.arange(CACHE)
        everything.counts[:] = CACHE
        ctx.observe_attention(0, 0, everything, mean[None, :])
        ref.update_state(mean)
        kept = set(range(CACHE))
        ties = 0
        for step in range(steps):
            n = CACHE + step + 1
            ctx.append(0, 0, keys[n - 1:n], keys[n - 1:n])
            sel = ctx.select(0, 0, np.zeros((1, 8), np.float32))
            now = set(sel.heads()[0].tolist())
            assert len(now) == CACHE and n - 1 in now
            dropped = kept - now
            assert len(dropped) == 1, f"step {step}: dropped {sorted(dropped)}"
            gone = dropped.pop()
            avg = ref.averages(n - 1)
            slot = int(np.flatnonzero(ref.pos == gone)[0])
            assert avg[slot] == avg.min(), (
                f"step {step}: the library dropped {gone} (average {avg[slot]}), the reference's "
                f"lowest is {ref.pos[int(avg.argmin())]} ({avg.min()})")
            ties += int(ref.pos[int(avg.argmin())] != gone)
            ref.evict(slot, n - 1)
            kept = now
            # The step's attention over the kept tokens, the same for both.
            probs = rng.dirichlet(np.full(CACHE, 0.5)).astype(np.float32)
            ctx.observe_attention(0, 0, sel, probs[None, :])
            by_pos = dict(zip(sel.heads()[0].tolist(), probs.tolist()))
            ref.update_state(np.array([by_pos[p] for p in ref.pos], np.float32))
        assert ties < steps, "every eviction was a tie: the test would not tell the rules apart"
