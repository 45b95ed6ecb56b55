"""A pitch tracker's bins (CREPE: 360 bins of 20 cents, a Sigmoid each): judged by the
pitch and the voicing the host reads from them, not by their cosine.

CREPE's host takes each frame's top bin, averages the bins' cents within 4 bins of it
weighted by their activations (the "weighted argmax" of CREPE and torchcrepe), and calls
the frame voiced when the top activation (the periodicity) reaches a threshold. A bin the
data never raises (a pitch no frame has) has a worst-channel SQNR near 0 dB at 8 bit and
moves nothing the host reads, while a pitch off by one bin is 20 cents. Declared
``--layout OUT=pitch[:cents=20,threshold=0.21,tol=50]`` (bins on the last axis; each
sample, or each position of ``[N, T, B]``, one frame):

=========================  ===========================================================
``pitch_agreement``        (headline) the share of the frames FP32 calls voiced whose
                           quantized pitch lies within ``tol`` cents of FP32's, over
                           ``pitch_agreement_items`` frames (clustered by sample)
``pitch_cents_error_mean``  the absolute pitch difference in cents over those frames
``pitch_cents_error_max``   its largest
``voicing_agreement``      the share of all frames whose voicing (top activation at or
                           above ``threshold``) is FP32's, over ``voicing_agreement_items``
``voiced_share_fp32``      the share of the frames FP32 calls voiced
=========================  ===========================================================

``cents`` is the width of one bin (CREPE's 20), ``threshold`` the voicing threshold on
the top activation (torchcrepe's examples: 0.21), ``tol`` the pitch difference a frame may
move (50 cents: a quarter tone, the raw pitch accuracy's tolerance). Viterbi decoding
(torchcrepe's default path) is not modelled: each frame is decoded alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantscope.emulate.channels import TopClasses
from quantscope.emulate.class_axes import ClassAxis
from quantscope.tasks.shares import share_counts
from quantscope.types import Metrics, Outputs

WINDOW = 4  # bins each side of the top one averaged (CREPE's local weighted average)
CENTS_PER_BIN = 20.0
VOICING = 0.21
TOLERANCE = 50.0
AGREEMENT_RESEMBLES = 0.95


def decode(acts: np.ndarray, cents_per_bin: float) -> tuple[np.ndarray, np.ndarray]:
    """(pitch in cents above bin 0, top activation) of each row of ``acts`` ``[F, B]``:
    the activation-weighted mean of the bins within :data:`WINDOW` of the top one."""
    top = acts.argmax(axis=1)
    idx = np.arange(acts.shape[1])[None, :]
    near = np.abs(idx - top[:, None]) <= WINDOW
    w = np.where(near, acts, 0.0)
    total = w.sum(axis=1)
    bins = np.where(total > 0, (w * idx).sum(axis=1) / np.where(total > 0, total, 1.0), top)
    return bins * cents_per_bin, acts.max(axis=1)


@dataclass(frozen=True, eq=False)
class PitchTask:
    """An output of pitch bins (module docstring)."""

    name: str
    output: str
    cents: float = CENTS_PER_BIN
    threshold: float = VOICING
    tol: float = TOLERANCE
    headline: str = "pitch_agreement"
    higher_is_better: bool = True
    goal_range: tuple[float, float] = (0.0, 1.0)
    row_local: bool = True

    def describe(self) -> str:
        return (f"pitch bins of {self.cents:g} cents on the last axis, decoded as the host "
                f"does (top bin, weighted mean of {WINDOW} bins each side; voiced at a top "
                f"activation >= {self.threshold:g}): pitch within {self.tol:g} cents of FP32's")

    def top_classes(self) -> dict[str, TopClasses]:
        """Each frame is decided by its top bin on the last axis (the voicing), and, when
        voiced, the :data:`WINDOW` bins each side of it (the weighted mean)."""
        return {self.output: TopClasses(-1, 0, WINDOW, self.threshold)}

    def class_axes(self) -> dict[str, ClassAxis]:
        """The per-channel figures read the bins (the last axis), not the frames."""
        return {self.output: ClassAxis(-1, 0, "the bins of the declared pitch layout")}

    def _frames(self, out: Outputs) -> tuple[np.ndarray, np.ndarray]:
        """(each frame's bins ``[F, B]``, each frame's sample index)."""
        i = out.names.index(self.output)
        parts, owners, seen = [], [], 0
        for b in out.batches:
            a = np.asarray(b[i], np.float64)
            per = int(np.prod(a.shape[1:-1], dtype=np.int64)) if a.ndim > 2 else 1
            parts.append(a.reshape(-1, a.shape[-1]))
            owners.append(np.repeat(np.arange(seen, seen + len(a)), per))
            seen += len(a)
        return np.concatenate(parts), np.concatenate(owners)

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        (r, owner), (t, _) = self._frames(ref), self._frames(test)
        pr, vr = decode(r, self.cents)
        pt, vt = decode(t, self.cents)
        voiced_r, voiced_t = vr >= self.threshold, vt >= self.threshold
        err = np.abs(pt - pr)[voiced_r]
        within = err <= self.tol
        samples = int(owner.max()) + 1 if owner.size else 0
        same = voiced_r == voiced_t
        values = {
            "pitch_agreement": float(within.mean()) if within.size else float("nan"),
            **share_counts("pitch_agreement", np.bincount(owner[voiced_r], weights=within,
                                                          minlength=samples),
                           np.bincount(owner[voiced_r], minlength=samples)),
            "pitch_cents_error_mean": float(err.mean()) if err.size else float("nan"),
            "pitch_cents_error_max": float(err.max()) if err.size else float("nan"),
            "voicing_agreement": float(same.mean()),
            **share_counts("voicing_agreement", np.bincount(owner, weights=same,
                                                            minlength=samples),
                           np.bincount(owner, minlength=samples)),
            "voiced_share_fp32": float(voiced_r.mean()),
        }
        return Metrics(values=values, notes=tuple(self._notes(values, within, same)))

    def _notes(self, v: dict[str, float], within: np.ndarray, same: np.ndarray) -> list[str]:
        o = f"output '{self.output}'"
        if not within.size:
            return [f"{o}: FP32 calls no frame voiced at {self.threshold:g}: no pitch to "
                    "compare (a wrong threshold, or data without a pitch)"]
        notes = [f"{o}: {within.size} of {same.size} frames voiced in FP32 (top activation "
                 f">= {self.threshold:g}); the quantized pitch moves by {v['pitch_cents_error_mean']:.1f} "
                 f"cents on average (largest {v['pitch_cents_error_max']:.0f})"]
        if v["pitch_agreement"] < AGREEMENT_RESEMBLES:
            notes.append(f"NOT LIKE FP32: {o}: {int((~within).sum())} of {within.size} voiced "
                         f"frames move by more than {self.tol:g} cents (agreement "
                         f"{v['pitch_agreement']:.1%} < {AGREEMENT_RESEMBLES:.0%})")
        if v["voicing_agreement"] < AGREEMENT_RESEMBLES:
            notes.append(f"NOT LIKE FP32: {o}: {int((~same).sum())} of {same.size} frames "
                         f"change voicing at {self.threshold:g} (agreement "
                         f"{v['voicing_agreement']:.1%} < {AGREEMENT_RESEMBLES:.0%})")
        return notes
