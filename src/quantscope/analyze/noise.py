"""Per-tensor noise: SQNR of emulated activations against FP32, streamed over batches.

==============  ==========================================================================
cumulative      every group at the low precision: the noise a tensor carries in the
                fully quantized model (its own rounding plus everything upstream)
isolated        only the tensor's own group at the low precision, its inputs FP32:
                the rounding and weight noise that group adds by itself
SQNR            ``10 log10(sum ref^2 / sum (ref - test)^2)`` over all elements of all
                batches (:func:`quantscope.numerics.sqnr_db_from_powers`)
==============  ==========================================================================

Cumulative much lower than isolated means the tensor inherits noise; isolated low means
the group itself is the problem (its range, its outliers, its weights).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from quantscope.numerics import sqnr_db_from_powers


@dataclass
class NoiseAccumulator:
    """Running signal and noise power per tensor (mutable; :meth:`sqnr` freezes it)."""

    signal: dict[str, float] = field(default_factory=dict)
    noise: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, ref: np.ndarray, test: np.ndarray) -> None:
        r = np.asarray(ref, dtype=np.float64)
        d = r - np.asarray(test, dtype=np.float64)
        self.signal[name] = self.signal.get(name, 0.0) + float(np.sum(r * r))
        self.noise[name] = self.noise.get(name, 0.0) + float(np.sum(d * d))

    def sqnr(self) -> dict[str, float]:
        return {t: sqnr_db_from_powers(self.signal[t], self.noise[t]) for t in self.signal}


@dataclass(frozen=True)
class TensorNoise:
    tensor: str
    group: str
    sqnr_cumulative_db: float | None
    sqnr_isolated_db: float | None


def tensor_noise(
    tensors: list[tuple[str, str]], cumulative: dict[str, float], isolated: dict[str, float]
) -> tuple[TensorNoise, ...]:
    """One row per (tensor, group), in the given (topological) order."""
    return tuple(TensorNoise(t, g, cumulative.get(t), isolated.get(t)) for t, g in tensors)
