"""Metric inputs checked: the one error for input that cannot be measured honestly, and
rows as finite 2-D arrays (:mod:`quantscope.tasks.metrics`, :mod:`quantscope.tasks.decisions`)."""

from __future__ import annotations

import numpy as np

from quantscope import numerics
from quantscope.types import QuantscopeError


class MetricInputError(QuantscopeError, ValueError):
    """Metric input that cannot be measured honestly (non-finite values, bad shapes)."""


def _rows(x: np.ndarray, name: str, dtype: type | None = np.float64) -> np.ndarray:
    """``x`` as a finite 2-D ``[n, features]`` array of ``dtype`` (None: a float array
    keeps its own, so that a large one is not copied whole to float64: the caller then
    sums it a block at a time, :mod:`quantscope.numerics`)."""
    a = np.asarray(x)
    if a.ndim == 0 or a.size == 0:
        raise MetricInputError(f"{name}: expected a non-empty array, got shape {a.shape}")
    a = a.reshape(1, -1) if a.ndim == 1 else a.reshape(a.shape[0], -1)
    if dtype is None and not np.issubdtype(a.dtype, np.floating):
        dtype = np.float64
    if dtype is not None:
        a = a.astype(dtype, copy=False)
    bad = np.zeros(a.shape[0], bool)
    for b in numerics.column_blocks(a):  # a bool copy of a block, not of the array
        bad |= ~np.isfinite(a[:, b]).all(axis=1)
    if bad.any():
        raise MetricInputError(
            f"{name}: {int(bad.sum())} of {a.shape[0]} rows contain NaN/inf "
            f"(first at row {int(np.argmax(bad))}); the model output is broken"
        )
    return a


def _unit_rows(a: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm; all-zero rows stay zero (cosine 0 with anything)."""
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    return a / np.where(norms > 0, norms, 1).astype(a.dtype)


def _same_rows(a: np.ndarray, b: np.ndarray, what: str) -> None:
    if a.shape != b.shape:
        raise MetricInputError(f"{what}: shapes differ, {a.shape} vs {b.shape}")
