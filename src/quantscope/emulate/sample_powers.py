"""Per-sample signal and noise powers of an output, kept where a figure's noise is wanted.

The fidelity figures in dB are pooled over every sample (``sqnr_db``: the output's
summed FP32 power over its summed noise power; ``sqnr_db_channel_min``: the same per
channel, the lowest live channel's). Their sampling noise needs the sums per sample
(:mod:`quantscope.tasks.db_noise` leaves one sample out at a time), a few floats per
sample and channel, never the tensors. :class:`SamplePowers` accumulates them batch by
batch for one output; :func:`figure_columns` gives, for each dB figure, the columns whose
lowest pooled ratio is the figure (the same channels :func:`quantscope.numerics.signal_channels`
lets the figure read).

==================  ====================================================================
columns of an       a channel axis other than the samples' (axis 0): one column per
output              channel (``[samples, channels]``, channels grown with zeros where a
                    later batch has more, as :class:`quantscope.emulate.channels.ChannelFidelity`);
                    else (one value per sample, no channel axis) one column
``sqnr_db``         one column per scored output (its channels summed): the lowest is the
                    worst output's figure
``sqnr_db_channel_min``  every scored output's channels that have FP32 signal (one column
                    for an output without channels), those within 20 dB of the lowest
                    (at most 256: :func:`lowest_columns`)
none                an output whose arrays differ in shape from FP32's, or outputs of
                    different sample counts: no parts (the caller says no noise estimate)
==================  ====================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from quantscope.numerics import signal_channels

Powers = tuple[np.ndarray, np.ndarray]
"""(signal, noise): ``[samples, columns]`` float64 powers."""


class SamplePowers:
    """One output's powers per sample (axis 0) and column, summed batch by batch."""

    def __init__(self, axis: int | None) -> None:
        self.axis = axis  # the channel axis (None or 0: one column per sample)
        self.signal: list[np.ndarray] = []
        self.noise: list[np.ndarray] = []
        self.ok = True

    def add(self, ref: np.ndarray, test: np.ndarray) -> None:
        if ref.shape != test.shape or ref.ndim == 0:
            self.ok = False
            return
        r = np.asarray(ref, np.float64)
        d = r - np.asarray(test, np.float64)
        n = len(r)
        if self.axis is None or self.axis == 0 or self.axis >= r.ndim:
            r, d = r.reshape(n, 1, -1), d.reshape(n, 1, -1)
        else:
            c = r.shape[self.axis]
            r = np.moveaxis(r, self.axis, 1).reshape(n, c, -1)
            d = np.moveaxis(d, self.axis, 1).reshape(n, c, -1)
        # einsum: no squared copy of the batch beside the two float64 ones
        self.signal.append(np.einsum("ncx,ncx->nc", r, r))
        self.noise.append(np.einsum("ncx,ncx->nc", d, d))

    def powers(self) -> Powers | None:
        """``[samples, columns]`` signal and noise (None: nothing, or unusable)."""
        if not self.ok or not self.signal:
            return None
        width = max(s.shape[1] for s in self.signal)

        def stack(parts: list[np.ndarray]) -> np.ndarray:
            return np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1])))
                                   for p in parts])

        return stack(self.signal), stack(self.noise)


def figure_columns(powers: Mapping[str, Powers | None], scored: Sequence[str]
                   ) -> dict[str, Powers]:
    """For ``sqnr_db`` and ``sqnr_db_channel_min`` over the ``scored`` outputs, the
    columns whose lowest pooled ratio is the figure (see the module table); empty when an
    output has no usable powers or the outputs' sample counts differ."""
    got = [powers.get(name) for name in scored]
    if not got or any(p is None for p in got):
        return {}
    have: list[Powers] = [p for p in got if p is not None]
    if len({len(s) for s, _ in have}) != 1:
        return {}
    whole = (np.stack([s.sum(axis=1) for s, _ in have], axis=1),
             np.stack([n.sum(axis=1) for _, n in have], axis=1))
    live = [signal_channels(s.sum(axis=0)) for s, _ in have]
    channels = (np.concatenate([s[:, k] for (s, _), k in zip(have, live, strict=True)], axis=1),
                np.concatenate([n[:, k] for (_, n), k in zip(have, live, strict=True)], axis=1))
    return {"sqnr_db": whole, "sqnr_db_channel_min": lowest_columns(*channels)}


NEAR_DB = 20.0  # a column this far above the lowest cannot be the lowest with a sample out
MAX_COLUMNS = 256


def lowest_columns(signal: np.ndarray, noise: np.ndarray) -> Powers:
    """The columns a lowest-column figure can take its value from when one sample is left
    out: those within :data:`NEAR_DB` of the lowest pooled column (at most
    :data:`MAX_COLUMNS`, the lowest first), so a wide output (thousands of channels) keeps
    a few floats per sample, not one per channel. For a column 20 dB above to become the
    lowest, one sample must carry over 99 % of its signal or of the lowest column's noise
    (then the left-out figure is read as at most 20 dB higher: a spread already that wide
    is noise however it is counted)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        db = 10.0 * np.log10(signal.sum(axis=0) / noise.sum(axis=0))
    order = np.argsort(np.nan_to_num(db, nan=np.inf), kind="stable")
    keep = order[: MAX_COLUMNS]
    keep = keep[~(db[keep] > db[order[0]] + NEAR_DB)]
    return signal[:, np.sort(keep)], noise[:, np.sort(keep)]
