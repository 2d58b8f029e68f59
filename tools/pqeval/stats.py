"""Intervals for the evaluation's figures: percentile bootstrap, seeded so a
report is reproducible.

- mean_ci: the mean of per-sample scores and its 95% interval;
- paired_diff_ci: the mean of a - b over the same samples (a selector against
  full attention on the same prompts) and its interval, which is much
  tighter than comparing two separate intervals;
- unpaired_diff_ci: the difference of two means over different samples
  (one task's prompts against another's), each resampled on its own;
- perplexity_ci: exp(mean NLL) with an interval from a block bootstrap over
  runs of consecutive tokens (neighbouring tokens' losses are correlated, so
  resampling single tokens would be too narrow), and the paired relative
  change against a reference.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


def _rng(seed: int = 7) -> np.random.Generator:
    return np.random.default_rng(seed)


def _interval(draws: np.ndarray) -> Tuple[float, float]:
    lo, hi = np.quantile(draws, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(lo), float(hi)


def mean_ci(values: Sequence[float], seed: int = 7) -> Tuple[float, float, float]:
    """(mean, low, high) of the values' mean."""
    v = np.asarray(values, np.float64)
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan")
    idx = _rng(seed).integers(0, len(v), (RESAMPLES, len(v)))
    return (float(v.mean()), *_interval(v[idx].mean(axis=1)))


def paired_diff_ci(a: Sequence[float], b: Sequence[float],
                   seed: int = 7) -> Tuple[float, float, float]:
    """(mean, low, high) of mean(a - b), resampling the pairs."""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    return mean_ci(d, seed)


def unpaired_diff_ci(a: Sequence[float], b: Sequence[float],
                     seed: int = 7) -> Tuple[float, float, float]:
    """(mean(a) - mean(b), low, high), a and b resampled independently."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if len(a) == 0 or len(b) == 0:
        return float("nan"), float("nan"), float("nan")
    rng = _rng(seed)
    draws = (a[rng.integers(0, len(a), (RESAMPLES, len(a)))].mean(axis=1)
             - b[rng.integers(0, len(b), (RESAMPLES, len(b)))].mean(axis=1))
    return (float(a.mean() - b.mean()), *_interval(draws))


def _blocks(nll: np.ndarray, block: int) -> np.ndarray:
    """[documents][tokens] -> [blocks][block]: consecutive runs within documents."""
    docs, tokens = nll.shape
    usable = tokens // block * block
    return nll[:, :usable].reshape(docs * (usable // block), block)


def perplexity_ci(nll: np.ndarray, block: int = 32,
                  seed: int = 7) -> Tuple[float, float, float]:
    """nll: [documents][tokens]. (perplexity, low, high)."""
    b = _blocks(np.asarray(nll, np.float64), block)
    idx = _rng(seed).integers(0, len(b), (RESAMPLES, len(b)))
    draws = np.exp(b[idx].mean(axis=(1, 2)))
    return (float(np.exp(np.asarray(nll).mean())), *_interval(draws))


def perplexity_change_ci(nll: np.ndarray, reference: np.ndarray, block: int = 32,
                         seed: int = 7) -> Tuple[float, float, float]:
    """Relative change of perplexity against the reference on the same tokens,
    in percent: (change, low, high), blocks resampled in pairs."""
    a = _blocks(np.asarray(nll, np.float64), block)
    r = _blocks(np.asarray(reference, np.float64), block)
    idx = _rng(seed).integers(0, len(a), (RESAMPLES, len(a)))
    draws = (np.exp(a[idx].mean(axis=(1, 2)) - r[idx].mean(axis=(1, 2))) - 1) * 100
    change = (np.exp(a.mean() - r.mean()) - 1) * 100
    return (float(change), *_interval(draws))
