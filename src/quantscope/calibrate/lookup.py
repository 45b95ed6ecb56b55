"""A lookup's range is its table's: the one place a lookup's calibrated range is set.

A ``Gather`` of a constant float table by integer indices returns rows of the table and
nothing else, so the table's own min..max bounds every value it can return. Calibrated
from the rows the calibration data happened to pick, the range left out the rows it did
not pick, and held-out ids that picked them clipped silently (h45's transducer decoder,
``y [N, 2]`` ids into a 500-row table, 32 pairs to fit: 0.39 % of the lookup's held-out
values, at 8 and 16 bit alike).

==========================  ========================================================
a lookup                    a ``Gather`` (any axis) whose data input is a float
                            initializer and whose indices are not float (an integer
                            model input, directly or computed), whose output the
                            calibration taps (a group's output)
its range                   the table's min..max (``TensorStats.min``/``max``), under
                            every range method: the histogram holds only the picked
                            rows, so a clip chosen from it (``percentile``, ``mse``)
                            would cut the unpicked rows again
its channel maxima          the table's max ``|x|`` per column along the output's
                            channel axis when that axis is one of the table's; else
                            the table's max ``|x|`` (any row may land in any channel)
what is recorded            :class:`quantscope.lookup_range.LookupRange` in the
                            tensor's stats: the table, its rows, how many rows the
                            calibration data picked, the picked values' range, the
                            outlier rows left out (:data:`ROW_OUTLIER`); every
                            stage reads the stats, so every stage uses this range
said                        :func:`quantscope.emulate.ranges.lookup_note`
                            (``calibrate``'s output, the encodings' notes:
                            ``evaluate``, the analysis, ``run``)
==========================  ========================================================

The cost, measured on the built-in text encoders' word embeddings, and the rule (always:
a table's range is never narrower than the picked rows', and is the bound): docs/
architecture.md, "A lookup's range".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantscope.lookup_range import ROW_OUTLIER, LookupRange
from quantscope.model.load import FLOAT_TYPES, Model


@dataclass
class Lookup:
    """One lookup found in the graph, and the rows the calibration data picked."""

    output: str
    table: str
    axis: int
    indices: str
    picked: np.ndarray  # bool per row of the table
    index_rank: int = 1  # the indices' rank (the output's is the table's - 1 + this)


def find_lookups(model: Model, taps: set[str]) -> dict[str, Lookup]:
    """The lookups whose output is tapped (module table), by output tensor."""
    inits = {t.name: t for t in model.graph.initializer}
    types = model.value_types()
    found: dict[str, Lookup] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.output[0] not in taps:
            continue
        table = inits.get(node.input[0])
        if table is None or table.data_type not in FLOAT_TYPES or not table.dims:
            continue
        if types.get(node.input[1]) in FLOAT_TYPES or node.input[1] in inits:
            continue  # (a constant index picks the same rows on every sample)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % len(table.dims)
        found[node.output[0]] = Lookup(node.output[0], table.name, axis, node.input[1],
                                       np.zeros(int(table.dims[axis]), bool))
    return found


def index_taps(lookups: dict[str, Lookup], inputs: set[str]) -> list[str]:
    """The indices tensors to tap (those not fed: the feeds hold the rest)."""
    return list(dict.fromkeys(k.indices for k in lookups.values() if k.indices not in inputs))


def note_rows(lookups: dict[str, Lookup], values: dict[str, np.ndarray]) -> None:
    """Mark the rows one run's indices picked (negative indices count from the end)."""
    for k in lookups.values():
        ids = values.get(k.indices)
        if ids is None or np.size(ids) == 0:
            continue
        rows, k.index_rank = k.picked.size, np.ndim(ids)
        ids = np.asarray(ids).astype(np.int64).reshape(-1)
        k.picked[np.unique(ids[(ids >= -rows) & (ids < rows)] % rows)] = True




def table_bounds(table: np.ndarray, k: Lookup,
                 channel_axis: int) -> tuple[float, float, np.ndarray, int]:
    """The table's min, max and max ``|x|`` per channel of the lookup's output, over its
    rows but those past :data:`ROW_OUTLIER` times the median row's magnitude that the
    data did not pick, and how many rows were so left out: the output's trailing axes
    are the table's after ``axis``, so a channel axis among them is a table axis (its
    columns' maxima); any other gets the max ``|x|``."""
    t = np.moveaxis(np.asarray(table, np.float32), k.axis, 0)
    mags = np.abs(t).reshape(len(t), -1).max(axis=1)
    keep = k.picked | (mags <= ROW_OUTLIER * float(np.median(mags)))
    left_out = int(len(t) - np.count_nonzero(keep))
    t = np.moveaxis(t[keep], 0, k.axis)
    out_rank, axis = t.ndim - 1 + k.index_rank, k.axis
    lo, hi = float(t.min()), float(t.max())
    from_end = out_rank - 1 - channel_axis
    if 0 <= from_end < t.ndim - 1 - axis:
        a = t.ndim - 1 - from_end
        rest = tuple(i for i in range(t.ndim) if i != a)
        per = np.maximum(t.max(axis=rest), -t.min(axis=rest)) + np.float32(0.0)
    else:
        per = np.array([max(abs(lo), abs(hi))], np.float32)
    return lo, hi, per, left_out


def lookup_range(k: Lookup, data_min: float, data_max: float, left_out: int = 0) -> LookupRange:
    return LookupRange(table=k.table, rows=int(k.picked.size),
                       picked=int(np.count_nonzero(k.picked)),
                       data_min=float(data_min), data_max=float(data_max), left_out=left_out)
