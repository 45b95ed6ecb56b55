"""Verification from tensors with labels: an embedder's same-or-not decisions at a threshold.

A speaker encoder (or any embedder given as tensors) is deployed to decide whether two
samples are the same speaker (identity): the cosine of their embeddings at or above a
threshold. Its output's cosine to FP32 does not say how many of those decisions change.
Declared ``--layout OUT=verify:labels=NAME[,threshold=T]``, where ``NAME`` is an array of
the data file(s) that no model input takes, one label per sample in file order (a
speaker's id: int or str; arrays no input takes are not fed), every pair of samples
``i < j`` is decided by FP32 and by the quantized model at the same threshold:

=========================  ===========================================================
``decision_agreement``     (headline) the share of pairs decided as FP32 decides them,
                           over ``decision_agreement_items`` pairs (the effective count
                           clustered by sample: :func:`quantscope.tasks.shares.share_counts`)
``true_accept_rate``       the quantized model's accepts of same-label pairs at the threshold
``false_accept_rate``      its accepts of different-label pairs (lower is better)
``equal_error_rate``       its equal error rate over these pairs (at its own threshold)
``..._fp32``               FP32's three, at the same threshold
``verify_threshold``       the threshold used (cosine)
=========================  ===========================================================

The threshold is the one given (the model's, as deployed), else FP32's equal-error
threshold on these pairs, said in a note (Resemblyzer names none). The labels name the
ground truth only for TAR/FAR; the headline compares with FP32. The task scores pairs
across samples (not ``row_local``): ``run`` splits such data with its labels
(:func:`split_rows`: the first half's samples and labels fit, the second half's pairs are
the held-out figure), or evaluates on ``--eval-data`` (its own labels array).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quantscope.tasks.decisions import eer
from quantscope.tasks.shares import share_counts
from quantscope.types import Metrics, Outputs, QuantscopeError

AGREEMENT_RESEMBLES = 0.95  # fewer pairs decided as FP32: NOT LIKE FP32


def read_labels(data: str, name: str, text: str) -> np.ndarray:
    """The array ``name`` of the ``.npz`` file(s) at ``data`` (a folder's files in name
    order, concatenated), one label per sample; refused in one line naming ``text`` (the
    ``--layout`` value) when it is missing or not one value per sample."""
    path = Path(data)
    files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".npz") \
        if path.is_dir() else [path]
    parts = []
    for f in files:
        if f.suffix.lower() != ".npz":
            raise QuantscopeError(f"--layout '{text}': labels={name} are read from an .npz "
                                  f"data file, and '{f.name}' is not one: save the inputs and "
                                  f"the labels together (np.savez(f, INPUT=x, {name}=labels))")
        with np.load(f, allow_pickle=False) as z:
            if name not in z.files:
                raise QuantscopeError(
                    f"--layout '{text}': '{f.name}' has no array '{name}' (arrays: "
                    f"{', '.join(z.files)}): save one label per sample beside the inputs "
                    f"(np.savez(f, INPUT=x, {name}=labels))")
            parts.append(np.asarray(z[name]))
    if any(p.ndim != 1 for p in parts):
        raise QuantscopeError(f"--layout '{text}': '{name}' must hold one label per sample "
                              "(a 1-D array)")
    return np.concatenate(parts)


def _pairs(e: np.ndarray) -> np.ndarray:
    """Cosine of every pair ``i < j`` of the rows of ``e``."""
    norm = np.linalg.norm(e, axis=1, keepdims=True)
    u = e / np.where(norm > 0, norm, 1.0)
    return (u @ u.T)[np.triu_indices(len(e), 1)]


def equal_error_threshold(scores: np.ndarray, same: np.ndarray) -> float:
    """The cosine at which the false accepts (impostors at or above it) and false rejects
    (same-label pairs below it) are closest to equal."""
    cand = np.unique(scores)
    gen, imp = np.sort(scores[same]), np.sort(scores[~same])
    frr = np.searchsorted(gen, cand, side="left") / max(len(gen), 1)
    far = 1.0 - np.searchsorted(imp, cand, side="left") / max(len(imp), 1)
    return float(cand[int(np.argmin(np.abs(far - frr)))])


@dataclass(frozen=True, eq=False)
class VerifyTask:
    """An embedding output's pair decisions at a threshold (module docstring)."""

    name: str
    output: str
    labels: np.ndarray = field(repr=False)
    label_name: str = "labels"
    threshold: float | None = None
    headline: str = "decision_agreement"
    higher_is_better: bool = True
    goal_range: tuple[float, float] = (0.0, 1.0)
    row_local: bool = False

    def describe(self) -> str:
        at = (f"cosine >= {self.threshold:g}" if self.threshold is not None else
              "FP32's equal-error threshold on the data")
        return (f"an embedding, judged by verification: every pair of samples decided same "
                f"or not at {at}, labels from '{self.label_name}' "
                f"({len(np.unique(self.labels))} labels, {len(self.labels)} samples)")

    def _rows(self, out: Outputs) -> np.ndarray:
        i = out.names.index(self.output)
        return np.concatenate([np.asarray(b[i], np.float64).reshape(len(b[i]), -1)
                               for b in out.batches])

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        r, t = self._rows(ref), self._rows(test)
        if len(r) != len(self.labels):
            raise QuantscopeError(
                f"--layout {self.output}=verify: '{self.label_name}' holds "
                f"{len(self.labels)} labels and the data {len(r)} samples: give one label per "
                "sample, in the data's order")
        iu = np.triu_indices(len(r), 1)
        same = (self.labels[:, None] == self.labels[None, :])[iu]
        sr, st = _pairs(r), _pairs(t)
        if not same.any() or same.all():
            return Metrics(values={"decision_agreement": float("nan")}, notes=(
                f"output '{self.output}': '{self.label_name}' gives "
                + ("no two samples the same label" if not same.any() else "every sample one "
                   "label") + ": no same/different pairs to verify; give several samples of "
                "each of several labels",))
        thr = self.threshold if self.threshold is not None else equal_error_threshold(sr, same)
        dr, dt = sr >= thr, st >= thr
        agree = dr == dt
        rows_i = iu[0]
        hits = np.bincount(rows_i, weights=agree, minlength=len(r))[:-1]
        sizes = np.bincount(rows_i, minlength=len(r))[:-1]
        values = {"decision_agreement": float(agree.mean()),
                  **share_counts("decision_agreement", hits, sizes),
                  "true_accept_rate": float(dt[same].mean()),
                  "false_accept_rate": float(dt[~same].mean()),
                  "equal_error_rate": eer(st, same, higher_is_match=True),
                  "true_accept_rate_fp32": float(dr[same].mean()),
                  "false_accept_rate_fp32": float(dr[~same].mean()),
                  "equal_error_rate_fp32": eer(sr, same, higher_is_match=True),
                  "verify_threshold": thr}
        return Metrics(values=values, notes=tuple(self._notes(values, same, agree, thr)))

    def _notes(self, v: dict[str, float], same: np.ndarray, agree: np.ndarray,
               thr: float) -> list[str]:
        where = (f"cosine {thr:.4g}, given" if self.threshold is not None else
                 f"cosine {thr:.4g}, FP32's equal-error threshold on this data (give "
                 f"--layout {self.output}=verify:labels={self.label_name},threshold=T for "
                 "the model's own)")
        notes = [f"output '{self.output}': {int(same.sum())} same-label and "
                 f"{int((~same).sum())} different-label pairs decided at {where}: FP32 "
                 f"accepts {v['true_accept_rate_fp32']:.1%} of the same-label pairs and {v['false_accept_rate_fp32']:.1%} "
                 f"of the others, the quantized model {v['true_accept_rate']:.1%} and {v['false_accept_rate']:.1%}"]
        if v["decision_agreement"] < AGREEMENT_RESEMBLES:
            notes.append(f"NOT LIKE FP32: output '{self.output}': {int((~agree).sum())} of "
                         f"{agree.size} pair decisions flip (agreement "
                         f"{v['decision_agreement']:.1%} < {AGREEMENT_RESEMBLES:.0%}); false "
                         f"accepts {v['false_accept_rate_fp32']:.1%} -> {v['false_accept_rate']:.1%}, true accepts "
                         f"{v['true_accept_rate_fp32']:.1%} -> {v['true_accept_rate']:.1%}")
        return notes


def verify_task(output: str, labels: np.ndarray, label_name: str,
                threshold: float | None, text: str) -> VerifyTask:
    """The task of a ``verify`` layout (the threshold a cosine in [-1, 1])."""
    if threshold is not None and not (math.isfinite(threshold) and -1.0 <= threshold <= 1.0):
        raise QuantscopeError(f"--layout '{text}': threshold {threshold:g} is no cosine: give "
                              "one in [-1, 1] (same when the cosine is at or above it)")
    return VerifyTask(name=f"verify:{output}", output=output, labels=labels,
                      label_name=label_name, threshold=threshold)


def _labelled(task: object) -> list:
    """The tasks that read labels from the data file (a verify task's, an embedding's
    with ``labels=``), alone or among several outputs'."""
    return [t for t in getattr(task, "tasks", (task,))
            if isinstance(getattr(t, "labels", None), np.ndarray)]


def label_arrays(task: object) -> tuple[str, ...]:
    """The data arrays the task reads as labels (not fed, and not to be renamed)."""
    return tuple(t.label_name for t in _labelled(task))


def check_sample_count(task: object, samples: int) -> None:
    """Refuse, before any work, labels that are not one per sample of the data."""
    for t in _labelled(task):
        if len(t.labels) != samples:
            raise QuantscopeError(
                f"--layout {t.output}={t.name.split(':')[0]}: '{t.label_name}' holds "
                f"{len(t.labels)} labels and the data {samples} samples: give one label per "
                "sample, in the data's order")


def split_rows(task: object, start: int, stop: int) -> object:
    """The task on samples ``start:stop`` of its data (file order): a labelled task's
    labels sliced alike (also inside several outputs' tasks); any other task as it is."""
    import dataclasses

    if isinstance(getattr(task, "labels", None), np.ndarray):
        return dataclasses.replace(task, labels=task.labels[start:stop])  # type: ignore[attr-defined]
    inner = getattr(task, "tasks", None)
    if inner is not None and _labelled(task):
        return dataclasses.replace(task, tasks=tuple(split_rows(t, start, stop) for t in inner))
    return task


def splits_by_rows(task: object) -> bool:
    """Whether the task, not row-local, can still be split by samples (its labels go with
    them): a labelled task, alone or beside row-local ones."""
    labelled = _labelled(task)
    return bool(labelled) and all(
        t in labelled or getattr(t, "row_local", False)
        for t in getattr(task, "tasks", (task,)))
