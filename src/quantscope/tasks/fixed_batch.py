"""Which axis of an input holds the samples when its shape has a symbolic dim that is not
the samples' (a fixed batch of 1 beside a symbolic image width)."""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

# a dim named as the samples' (torch's 'batch_size', 'batch', 'N', 'B'): taken without a note
BATCH_NAME = re.compile(r"(?i)[nb]|bs|.*batch.*")


def static_samples_elsewhere(sym: str, names: tuple[str, ...],
                             shapes: Mapping[str, tuple[int | str | None, ...]],
                             arrays: Mapping[str, np.ndarray], axes: Mapping[str, int]) -> bool:
    """Whether the one symbolic dim ``sym`` is no sample axis because the samples lie on a
    static axis of size 1: each input that has ``sym`` (and no declared axis) differs from
    the model on exactly one static axis, of size 1 there (a batch fixed at 1, a symbolic
    image width: ``input1 [1, 1, 64, image_width]`` with data ``[48, 1, 64, 160]``). A dim
    named as the samples' (``batch_size``) stays the samples'."""
    if BATCH_NAME.fullmatch(sym):
        return False
    holding = [k for k in names if sym in (shapes.get(k) or ()) and k not in axes]
    if not holding:
        return False
    for k in holding:
        want, arr = shapes.get(k) or (), arrays[k]
        if len(want) != np.ndim(arr):
            return False
        differ = [i for i, d in enumerate(want) if isinstance(d, int) and d != arr.shape[i]]
        if len(differ) != 1 or want[differ[0]] != 1:
            return False
    return True
