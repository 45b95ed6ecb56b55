"""The floor cluster (``Observer._update_floor``) was three masked reductions
(``np.min(x, where=mask)``), which branch on every value: 3.3-3.9 ms per 196,608 values of
a ReLU's or GELU's output (half its values in the cluster), 17 ns a value, the largest part
of a calibration's observer time. ``floor_cluster`` gives the same three figures without
them; here it is held to the masked reductions on the kinds of tensors calibration meets."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quantscope.calibrate.observe import Observer, floor_cluster


def _masked(x: np.ndarray, m: float) -> tuple[int, float, float]:
    rest = x > m / 2 if m < 0 else x != m
    k = x.size - int(np.count_nonzero(rest))
    above = float(np.min(x, where=rest, initial=math.inf)) if k < x.size else math.inf
    top = float(np.max(x, where=~rest, initial=-math.inf)) if k else -math.inf
    return k, above, top


def _tensors():
    r = np.random.default_rng(0)
    z = r.standard_normal((4, 32, 96))
    yield "normal", (z * 2).astype(np.float32)
    yield "relu", np.maximum(z, 0).astype(np.float32)
    yield "gelu", (z * 0.5 * (1 + np.tanh(0.79788456 * (z + 0.044715 * z**3)))).astype(np.float32)
    fill = np.where(r.random((4, 1, 32, 32)) > 0.3, 0, np.finfo(np.float32).min)
    yield "mask fill", (fill + r.standard_normal((4, 1, 32, 32))).astype(np.float32)
    yield "constant", np.full((5, 7), 3.0, np.float32)
    yield "negative constant", np.full((5, 7), -3.0, np.float32)
    yield "signed zeros", np.array([0.0, -0.0, 1e-45, -1e-45, 2.0, -0.0], np.float32)
    yield "subnormal", (r.standard_normal(1000) * 1e-40).astype(np.float32)
    yield "extremes", np.array([np.finfo(np.float32).min, np.finfo(np.float32).max, -1.7e38,
                                1.0], np.float32)
    yield "transposed", np.maximum(z, 0).astype(np.float32).transpose(2, 0, 1)
    for i in range(400):
        n = int(r.integers(1, 300))
        kind = i % 4
        if kind == 0:
            x = r.standard_normal(n)
        elif kind == 1:
            x = np.maximum(r.standard_normal(n), 0)
        elif kind == 2:
            x = r.choice(np.array([-5, -2.5, -2.4, 0, -0.0, 1, 3]), n)
        else:
            x = r.standard_normal(n) * 10.0 ** float(r.integers(-40, 38))
        x = x.astype(np.float32)
        yield f"random {i}", x[np.isfinite(x)] if np.isfinite(x).any() else np.zeros(1, np.float32)


@pytest.mark.parametrize("name,x", list(_tensors()), ids=lambda v: v if isinstance(v, str) else "")
def test_the_floor_cluster_is_what_the_masked_reductions_give(name: str, x: np.ndarray) -> None:
    m = float(x.min())
    assert floor_cluster(x, m) == _masked(x, m), name


def test_an_observer_folds_the_same_statistics_as_with_the_masked_reductions(monkeypatch) -> None:
    from quantscope.calibrate import observe

    r = np.random.default_rng(1)
    batches = [np.maximum(r.standard_normal((2, 16, 8)), 0).astype(np.float32) - 0.5 * i
               for i in range(3)] + [(r.standard_normal((2, 16, 8)) * 3).astype(np.float32)]

    def fold():
        obs = Observer("t")
        for b in batches:
            obs.update(b)
        return obs.freeze()

    fast = fold()
    monkeypatch.setattr(observe, "floor_cluster", _masked)
    slow = fold()
    for field in ("min", "max", "count", "bulk_min", "floor_count", "floor_max"):
        assert getattr(fast, field) == getattr(slow, field), field
    assert np.array_equal(fast.hist, slow.hist) and fast.floor_count > 0
