"""Which points of a ``points`` output are judged: those where another output's score
passes a threshold (``where=OUT:K>T``), as a host draws them.

MTCNN's P-Net writes a box regression map ``boxes [N, 4, h, w]`` beside a face map
``prob [N, 2, h, w]``; the host draws a box only where the face channel passes 0.6, so
the box error at the other positions (most of a photo) is no error any box carries.
``--layout boxes=points:order=channels,where=prob:1>0.6`` judges the points at the
positions where FP32's ``prob`` channel 1 passes 0.6. FP32's score decides (the points
a host keeps from the reference); whether the quantized score decides the same is the
score output's own judgement (``--layout prob=map:threshold=0.6,channel=1``).

The gate output's channel ``K`` is read on axis 1; what is left, per sample, is either
one value (O-Net's ``prob [N, 2]``: every point of a sample is judged or none) or one
value per position of a map read ``order=channels`` (each position's points follow one
another, so each gate value covers the same number of points).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from quantscope.types import Outputs, QuantscopeError

WHERE = re.compile(r"^(?P<output>.+):\s*(?P<channel>\d+)\s*(?P<op>>=|>)\s*(?P<threshold>\S+)$")
WHERE_SYNTAX = "where=OUT:K>T (the points where FP32's output OUT, channel K, passes T)"
KEPT = ": the points a host keeps; the other "  # in the note counting the points judged
NONE_KEPT = ": no point judged: "  # ... and in its note when the gate keeps none


@dataclass(frozen=True)
class PointsGate:
    """``where=OUT:K>T`` (``>=`` too): a point is judged where FP32's ``output[:, K]`` at
    its position (or its sample) passes ``threshold``."""

    output: str
    channel: int
    threshold: float
    inclusive: bool = False  # >= instead of >

    def text(self) -> str:
        return f"{self.output}:{self.channel}{'>=' if self.inclusive else '>'}{self.threshold:g}"

    def words(self) -> str:
        """The condition in words: ``FP32's 'prob' channel 1 > 0.6``."""
        return (f"FP32's '{self.output}' channel {self.channel} "
                f"{'>=' if self.inclusive else '>'} {self.threshold:g}")

    def values(self, ref: Outputs) -> list[np.ndarray]:
        """Each batch's gate values ``[samples, g]`` (channel K of axis 1, the rest flat)."""
        i = ref.names.index(self.output)
        out = []
        for b in ref.batches:
            a = np.asarray(b[i], dtype=np.float64)
            if a.ndim < 2 or not 0 <= self.channel < a.shape[1]:
                raise QuantscopeError(f"--layout where={self.text()}: output '{self.output}' "
                                      f"of shape {a.shape} has no channel {self.channel} on "
                                      "axis 1: give one of its channels")
            out.append(a[:, self.channel].reshape(len(a), -1))
        return out

    def kept(self, ref: Outputs, points: int, positions: int) -> tuple[np.ndarray, int]:
        """Which of each sample's ``points`` points are judged, ``[samples, points]``, and
        the points each gate value covers; ``positions``: the positions the points are
        read at (a map read ``order=channels``; 1: a sample's points are one run). One
        line when the gate's values are neither one per sample nor one per position."""
        g = np.concatenate(self.values(ref))
        size = g.shape[1]
        if size not in (1, positions) or points % size:
            raise QuantscopeError(
                f"--layout where={self.text()}: output '{self.output}' gives {size} values per "
                f"sample on its channel {self.channel}, and the points are read at "
                f"{positions} position(s): gate a map's points by position (order=channels, "
                "the same positions) or by a score of one value per sample")
        passed = g >= self.threshold if self.inclusive else g > self.threshold
        each = points // size
        return np.repeat(passed, each, axis=1), each


def parse_where(raw: str) -> PointsGate | None:
    """``OUT:K>T`` -> the gate (the output's existence is checked against the model
    elsewhere); None when it is not of that form."""
    m = WHERE.match(raw.strip())
    if m is None:
        return None
    try:
        threshold = float(m["threshold"])
    except ValueError:
        return None
    if not np.isfinite(threshold):
        return None
    return PointsGate(output=m["output"].strip(), channel=int(m["channel"]),
                      threshold=threshold, inclusive=m["op"] == ">=")
