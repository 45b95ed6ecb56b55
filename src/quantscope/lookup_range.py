"""Where a lookup's calibrated range came from (below :mod:`quantscope.types`, which
holds it in :class:`quantscope.types.TensorStats`; computed by
:mod:`quantscope.calibrate.lookup`)."""

from __future__ import annotations

from dataclasses import dataclass

# A table row whose largest magnitude is past this many times the median row's is left
# out of a lookup's range unless the calibration data picked it: an attention-sink or
# <mask> row the deployment never feeds would otherwise size the grid for every id (the
# tiny decoder's injected sink row: 400 against about 2, its decode phase's 8-bit step
# then 1.6; mpnet-base's <mask> row, 1.23 x the rest, stays in).
ROW_OUTLIER = 16.0


@dataclass(frozen=True)
class LookupRange:
    """A lookup's output whose range is its table's: the table, its rows along the
    lookup's axis, how many of them the calibration data picked, and the range of the
    values those rows gave (what the range would have been), and the table's outlier rows
    the data did not pick, left out of the range (``left_out``: ids that pick them clip)."""

    table: str
    rows: int
    picked: int
    data_min: float
    data_max: float
    left_out: int = 0
