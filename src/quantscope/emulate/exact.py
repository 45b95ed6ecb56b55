"""Outputs of a 32/64-bit integer or bool type (an ``ArgMax`` label, ``TopK``'s indices, a count):
compared exactly, never by cosine or SQNR.

A class label is a name, not a magnitude: label 3 against FP32's 7 is not "4 off", and a
cosine or SQNR of index tensors, or a decision "at threshold 0" of a label, measures
nothing. So (streamed, batch by batch):

=========================  ==============================================================
``exact_agreement``        the share of samples whose output equals FP32's at every
                           position (a label: the same class; ``TopK`` indices: the same
                           classes in the same order)
``exact_agreement_items``  the samples the share is over
``values_equal_share``     the share of single values equal to FP32's (a ``TopK``'s
                           indices that keep some of the top k)
=========================  ==============================================================

Below :data:`EXACT_MIN_AGREEMENT` of the samples the output reads NOT LIKE FP32.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from quantscope.model.dynamic import INDEX_TYPES
from quantscope.units import value

EXACT_MIN_AGREEMENT = 0.95  # fewer samples equal to FP32's: NOT LIKE FP32


EXACT_DTYPES = frozenset(np.dtype(helper.tensor_dtype_to_np_dtype(t)) for t in INDEX_TYPES)
"""The numpy side of :data:`quantscope.model.dynamic.INDEX_TYPES`: labels, indices,
counts, flags. An 8/16-bit integer output (an image Cast back to uint8) is a magnitude."""


def is_exact(a: np.ndarray) -> bool:
    """An output of a label or index type (compared exactly)."""
    return np.asarray(a).dtype in EXACT_DTYPES


class ExactFidelity:
    """One integer (or bool) output's equal samples and values."""

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = str(dtype)
        self.samples = self.equal = 0
        self.values = self.values_equal = 0

    def add(self, ref: np.ndarray, test: np.ndarray) -> None:
        n = len(ref) if np.ndim(ref) else 1
        r = np.asarray(ref).reshape(n, -1)
        self.samples += n
        self.values += r.size
        if np.shape(ref) != np.shape(test):  # no sample can equal FP32's
            return
        same = r == np.asarray(test).reshape(n, -1)
        self.equal += int(same.all(axis=1).sum())
        self.values_equal += int(same.sum())

    def table(self) -> dict[str, float]:
        if self.samples == 0:
            return {}
        return {"exact_agreement": self.equal / self.samples,
                "exact_agreement_items": float(self.samples),
                "values_equal_share": self.values_equal / max(self.values, 1)}

    def notes(self, name: str) -> tuple[list[str], bool]:
        """(the line saying how it was compared and what differs, whether NOT LIKE FP32)."""
        t = self.table()
        if not t:
            return [], False
        differ = self.samples - self.equal
        line = (f"output '{name}' is {self.dtype} (a label or an index): compared exactly, not "
                f"by cosine or SQNR: {value('exact_agreement', t['exact_agreement'])} of "
                f"{self.samples} samples equal FP32's ({differ} differ)")
        return [line], t["exact_agreement"] < EXACT_MIN_AGREEMENT
