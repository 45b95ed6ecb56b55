"""Where a lookup's calibrated range came from (below :mod:`quantscope.types`, which
holds it in :class:`quantscope.types.TensorStats`; computed by
:mod:`quantscope.calibrate.lookup`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LookupRange:
    """A lookup's output whose range is its table's: the table, its rows along the
    lookup's axis, how many of them the calibration data picked, and the range of the
    values those rows gave (what the range would have been)."""

    table: str
    rows: int
    picked: int
    data_min: float
    data_max: float
