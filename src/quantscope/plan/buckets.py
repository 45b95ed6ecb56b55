"""Length buckets as numbers: which bucket a text runs on, and the exact choice of bucket
lengths and a candidate per bucket (``quantscope buckets``). Pure numpy: no model, no file.

Inputs of the choice, all over the selection texts (``n`` of them):

- ``lengths[t]``: text ``t``'s untruncated token count;
- ``errors[c, t]``: its error under candidate ``c`` (``1 − cosine`` to FP32: the same on
  every bucket that holds it, a text's output not depending on its padding);
- ``costs[c, j]``: candidate ``c``'s cost compiled at ``seq_lens[j]``;
- ``allowed[c, j]``: whether that (candidate, length) may be chosen (its legality).

An allocation is a list of ``(length index, candidate index)``, shortest bucket first; the
last bucket is always the longest length and takes every longer text (truncated there).

==================  ==============================================================
:func:`route`       the bucket of each text: the shortest that holds it
:func:`solve`       least Σ error + λ · Σ cost (a dynamic programme over the lengths)
:func:`solve_budget`  least Σ error with Σ cost within a budget (exact up to a grid of
                    :data:`COST_LEVELS` steps: each bucket's cost rounded up)
:func:`solve_legal`   :func:`solve_budget`, with legality asked lazily of the picks only
                    (illegal picks are forbidden and the choice solved again)
:func:`allocation_figures`  mean error and mean cost of an allocation
==================  ==============================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

CHOICE_LENGTHS = (16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)
MAX_BUCKETS = 6
COST_LEVELS = 600  # the budget's grid for the exact search: each bucket's cost rounded up

Picks = list[tuple[int, int]]  # (length index, candidate index) per bucket, shortest first


def route(lengths: np.ndarray, seq_lens: tuple[int, ...]) -> np.ndarray:
    """Index of the bucket each text runs on: the shortest that holds its token count, the
    longest for a text longer than every bucket (truncated there)."""
    idx = np.searchsorted(np.asarray(seq_lens), np.asarray(lengths), side="left")
    return np.minimum(idx, len(seq_lens) - 1)


def _spans(lengths: np.ndarray, errors: np.ndarray, seq_lens: tuple[int, ...]
           ) -> tuple[list[int], list[int], np.ndarray]:
    """``starts``, ``ends`` and the prefix sums of the errors over the texts in length
    order: a bucket ending at ``seq_lens[j - 1]`` after one ending at ``seq_lens[i - 1]``
    holds the sorted texts ``starts[i]:ends[j - 1]``; ``pref[c, hi] - pref[c, lo]`` is
    their Σ error under candidate ``c``."""
    order = np.argsort(lengths, kind="stable")
    sorted_len = lengths[order]
    # texts with length <= seq_lens[j]: the first ends[j] of the sorted texts (the last
    # bucket also takes the longer ones)
    ends = [int(np.searchsorted(sorted_len, s, side="right")) for s in seq_lens]
    ends[-1] = len(lengths)
    starts = [0, *ends]  # starts[j] = texts before the bucket ending at j, for i = j - 1
    pref = np.concatenate([np.zeros((errors.shape[0], 1)),
                           np.cumsum(errors[:, order], axis=1)], axis=1)
    return starts, ends, pref


def solve(lengths: np.ndarray, errors: np.ndarray, costs: np.ndarray, allowed: np.ndarray,
          seq_lens: tuple[int, ...], max_buckets: int, lam: float) -> tuple[float, Picks]:
    """Boundaries and a candidate per bucket minimising Σ error + lam · Σ cost over the
    texts (dynamic programme over the allowed lengths; the last bucket is always the
    longest length and takes every longer text, truncated): (objective, [(length index,
    candidate index), ...])."""
    n_len = len(seq_lens)
    starts, ends, pref = _spans(lengths, errors, seq_lens)
    inf = float("inf")
    best = np.full((n_len + 1, max_buckets + 1), inf)
    arg: dict[tuple[int, int], tuple[int, int]] = {}
    best[0][0] = 0.0  # nothing covered yet (position 0 = below the first length)
    for j in range(1, n_len + 1):  # a bucket ending at seq_lens[j - 1]
        for i in range(j):  # previous bucket ended at seq_lens[i - 1] (i = 0: none)
            lo, hi = starts[i], ends[j - 1]
            count = hi - lo
            opts = [(pref[c, hi] - pref[c, lo] + lam * count * costs[c, j - 1], c)
                    for c in range(errors.shape[0]) if allowed[c, j - 1]]
            if not opts:
                continue
            val, c = min(opts)
            for k in range(1, max_buckets + 1):
                if best[i][k - 1] + val < best[j][k]:
                    best[j][k] = best[i][k - 1] + val
                    arg[(j, k)] = (i, c)
    k = int(np.argmin(best[n_len]))
    total = float(best[n_len][k])
    if total == inf:
        return inf, []
    picks, j = [], n_len
    while k > 0:
        i, c = arg[(j, k)]
        picks.append((j - 1, c))
        j, k = i, k - 1
    return total, list(reversed(picks))


def solve_budget(lengths: np.ndarray, errors: np.ndarray, costs: np.ndarray,
                 allowed: np.ndarray, seq_lens: tuple[int, ...], max_buckets: int,
                 budget: float, levels: int = COST_LEVELS) -> tuple[float, Picks]:
    """Boundaries and a candidate per bucket with the least Σ error whose Σ cost over the
    texts is within ``budget`` (a dynamic programme over the lengths, the bucket count and
    the cost spent on a grid of ``levels`` steps; each bucket's cost is rounded up to the
    grid, so the allocation found is within the budget and its error at most that
    rounding away from the optimum): (Σ error, [(length index, candidate index), ...]);
    (inf, []) when nothing fits."""
    n_len, n_cand = len(seq_lens), errors.shape[0]
    starts, ends, pref = _spans(lengths, errors, seq_lens)
    step = budget / levels if budget > 0 else 1.0
    inf = float("inf")
    # best[j][k][c]: least error covering the texts up to seq_lens[j - 1] with k buckets
    # and at most c grid steps of cost; arg: (previous end, candidate) of the last bucket
    best = np.full((n_len + 1, max_buckets + 1, levels + 1), inf)
    arg_i = np.full((n_len + 1, max_buckets + 1, levels + 1), -1)
    arg_c = np.full((n_len + 1, max_buckets + 1, levels + 1), -1)
    best[0, 0, :] = 0.0

    def units(i: int, j: int, c: int) -> int:
        count = ends[j - 1] - starts[i]
        return int(np.ceil(count * costs[c, j - 1] / step - 1e-9)) if count else 0

    for j in range(1, n_len + 1):
        for i in range(j):
            lo, hi = starts[i], ends[j - 1]
            for c in range(n_cand):
                if not allowed[c, j - 1]:
                    continue
                u = units(i, j, c)
                if u > levels:
                    continue
                e = pref[c, hi] - pref[c, lo]
                for k in range(1, max_buckets + 1):
                    prev = best[i, k - 1]
                    cand = np.full(levels + 1, inf)
                    cand[u:] = prev[: levels + 1 - u] + e
                    better = cand < best[j, k]
                    if better.any():
                        best[j, k][better] = cand[better]
                        arg_i[j, k][better] = i
                        arg_c[j, k][better] = c
    finals = best[n_len, :, levels]
    k = int(np.argmin(finals))
    if finals[k] == inf:
        return inf, []
    total, picks, j, lvl = float(finals[k]), [], n_len, levels
    while k > 0:
        i, c = int(arg_i[j, k, lvl]), int(arg_c[j, k, lvl])
        picks.append((j - 1, c))
        lvl -= units(i, j, c)
        j, k = i, k - 1
    return total, list(reversed(picks))


@dataclass(frozen=True, eq=False)
class LegalChoice:
    """What :func:`solve_legal` found: the allocation (empty when nothing legal fits the
    budget) and the (candidate, length) pairs it was allowed to use."""

    picks: tuple[tuple[int, int], ...]
    allowed: np.ndarray  # [candidate, length]


def solve_legal(lengths: np.ndarray, errors: np.ndarray, costs: np.ndarray,
                seq_lens: tuple[int, ...], max_buckets: int, budget: float,
                is_legal: Callable[[int, int], bool]) -> LegalChoice:
    """:func:`solve_budget` over every (candidate, length), asking ``is_legal(candidate,
    length index)`` of the chosen pairs only: an illegal pick is forbidden and the choice
    solved again, until every pick is legal (or nothing fits)."""
    allowed = np.ones_like(costs, dtype=bool)
    while True:
        _, picks = solve_budget(lengths, errors, costs, allowed, seq_lens, max_buckets, budget)
        if not picks:
            return LegalChoice(picks=(), allowed=allowed)
        bad = [(ci, j) for j, ci in picks if not is_legal(ci, j)]
        if not bad:
            return LegalChoice(picks=tuple(picks), allowed=allowed)
        for ci, j in bad:
            allowed[ci, j] = False


def cheapest(lengths: np.ndarray, costs: np.ndarray, allowed: np.ndarray,
             seq_lens: tuple[int, ...], max_buckets: int) -> float | None:
    """The least mean cost of any allowed allocation; None when no (candidate, length)
    is allowed at the longest length."""
    errors = np.zeros((costs.shape[0], len(lengths)))
    _, picks = solve(lengths, errors, costs, allowed, seq_lens, max_buckets, 1.0)
    if not picks:
        return None
    return allocation_figures(picks, lengths, errors, costs, seq_lens)[1]


def allocation_figures(picks: Picks, lengths: np.ndarray, err: np.ndarray,
                       costs: np.ndarray, seq_lens: tuple[int, ...]) -> tuple[float, float]:
    """Mean error and mean cost of an allocation over the texts."""
    which = route(lengths, tuple(seq_lens[j] for j, _ in picks))
    cand = np.asarray([ci for _, ci in picks])[which]
    col = np.asarray([j for j, _ in picks])[which]
    return (float(np.mean(err[cand, np.arange(len(lengths))])),
            float(np.mean(costs[cand, col])))
