"""Which axis of an output the per-channel fidelity reads (:mod:`quantscope.emulate.channels`).

One place decides it, in this order:

1. the axis the output's task decides on (:class:`ClassAxis`, from the task's
   ``class_axes()``: a declared ``ctc`` layout's classes, a ``class`` layout's classes,
   a pitch tracker's bins, a ``detect`` layout's rows): a CTC recognizer's logits
   ``[N, T, 97]`` made by a MatMul + bias Add, whose graph axis is unknown or another,
   are read over their 97 classes, not over their T time steps;
2. the graph's channel axis (:func:`quantscope.model.axes.output_channel_axes`: a Conv's
   1, a weighted MatMul's last, a Concat's axis), moved to the sample-first arrays;
3. :func:`quantscope.numerics.default_channel_axis` (1 for ``N, C, ...``), unless the
   model declares that axis symbolic (a ``dim_param`` or an unknown dim: frames, tokens;
   :func:`quantscope.analyze.measure.output_symbolic_axes`, moved to the sample-first
   arrays): its indexes are positions, not channels, even on data of one length (padding
   frames FP32 holds near 0 read "collapsed"). The last static non-sample axis is read
   instead (``y [N, T, C]``: C); with none (``f0 [1, F]``) no per-channel figure is made
   along it and a note says so (:attr:`AxisRead.positions`, as for an axis whose length
   varies by sample: :class:`quantscope.emulate.channels.ChannelFidelity`).

A task may claim that the output has no channel axis (:attr:`ClassAxis.axis` None: a
single map ``[N, H, W]`` of a ``map`` layout, each value decided alone): no per-channel
figure is made, the output's worst-channel figure is its whole SQNR, and its entry says
so (``channel_axis_none``, :data:`NONE_KEY`; :func:`read_words`).

A claim that lands on the samples' axis or off the array (a ``ctc`` declared on a rank-2
output, which its task says it cannot decode) is not taken. The output's entry says which
axis was read, how many channels it holds and why (``channel_axis_read``: ``axis 2, 97
channels: the classes of the declared ctc layout``), and every place that prints the
output's per-channel figures (``evaluate``'s output line, ``run``'s verdict, the report)
says that one line beside them (:func:`read_words`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from quantscope.numerics import default_channel_axis
from quantscope.types import moved_axis

KEY = "channel_axis_read"  # the output entry's key holding the line
NONE_KEY = "channel_axis_none"  # the entry's key saying why an output has no channel axis
GRAPH = "the graph's channel axis of this output"
DEFAULT = "by default (the graph tells no channel axis of this output)"
STATIC = ("by default, the last axis of fixed length (the graph tells no channel axis of "
          "this output; axis {axis} is symbolic in the model ({dim!r}): positions)")


@dataclass(frozen=True)
class ClassAxis:
    """The axis an output's task reads its classes (or rows) on, of the output as the
    model declares it (-1 the last); ``sample_axis``: its samples' axis (``--batch-axis``);
    ``why``: what the axis is, said in the output's entry ("the classes of the declared
    ctc layout"); ``axis`` None: the task says the output has no channel axis (``why``
    says what it is instead: a single map); ``why_of``: the why given the count of
    channels on the axis, where the words count them (a detection's rows, some of which
    no box or score is read from), else ``why``."""

    axis: int | None
    sample_axis: int = 0
    why: str = ""
    why_of: Callable[[int], str] | None = None


@dataclass(frozen=True)
class AxisRead:
    """Which axis of an output's sample-first arrays the per-channel figures read
    (``axis``, None: none), the entry's line saying it and why (``read``), and, when that
    axis is one the model declares symbolic and no axis of fixed length is left to read,
    its declared name (``positions``: ``'F'``; the axis is then read as positions and
    no per-channel figure is made); ``none``: why the output's task says it has no
    channel axis (``axis`` None; a single map)."""

    axis: int | None
    read: str
    positions: str = ""
    none: str = ""


def read_axis(shape: tuple[int, ...], given: int | None, claim: ClassAxis | None = None,
              symbolic: Mapping[int, str] | None = None) -> AxisRead:
    """The axis the per-channel figures of an output of sample-first ``shape`` read: the
    task's ``claim`` when it lands on a non-sample axis of the arrays, else ``given`` (the
    graph's; negative counts from the end), else the default rule, where ``symbolic``
    (sample-first axis -> the model's name of its dim: ``'T'``, ``'?'`` unknown) moves it
    off an axis of positions (module doc)."""
    rank = len(shape)
    if claim is not None and claim.axis is None and rank > 1:
        return AxisRead(None, "", none=claim.why or "the output's task reads none")
    if claim is not None and claim.axis is not None and rank:
        a = moved_axis(claim.axis, claim.sample_axis, rank)
        if -rank <= a < rank and a % rank != 0:
            why = claim.why_of(shape[a]) if claim.why_of is not None else claim.why
            return AxisRead(a % rank, _said(shape, a % rank, why or "the axis the output's "
                                            "task decides on"))
    if given is not None:
        axis = given % rank if rank else None
        return AxisRead(axis, _said(shape, axis, GRAPH))
    axis = default_channel_axis(shape)
    open_dims = dict(symbolic or {})
    if any(not 0 < k < rank for k in open_dims):  # not the arrays' axes: the declared shape
        open_dims = {}                             # is another rank's, it tells nothing here
    if axis is None or axis not in open_dims:
        return AxisRead(axis, _said(shape, axis, DEFAULT))
    fixed = [k for k in range(1, rank) if k not in open_dims]
    if fixed:
        return AxisRead(fixed[-1], _said(shape, fixed[-1],
                                         STATIC.format(axis=axis, dim=open_dims[axis])))
    return AxisRead(axis, "", open_dims[axis])


def channel_axis_read(shape: tuple[int, ...], given: int | None,
                      claim: ClassAxis | None = None) -> tuple[int | None, str]:
    """(the axis of the sample-first arrays of ``shape`` the per-channel figures read,
    the entry's line saying it and why): :func:`read_axis` of an output whose model
    declares no symbolic axis; None (and "") when there is no channel axis."""
    got = read_axis(shape, given, claim)
    return got.axis, got.read


def _said(shape: tuple[int, ...], axis: int | None, why: str) -> str:
    if axis is None:
        return ""
    return f"axis {axis}, {shape[axis]} channel{'' if shape[axis] == 1 else 's'}: {why}"


def read_words(entry: Mapping[str, Any]) -> str:
    """What an output's per-channel figures are over, said beside them, from its entry's
    line (:data:`KEY`): ``per channel on axis 2, 97 channels: the classes of the declared
    ctc layout``; where its task says it has none (:data:`NONE_KEY`), ``no channel axis:
    a single map ..., so its worst channel is its whole SQNR``; "" for an entry without
    either (one value per sample, or positions)."""
    read, none = entry.get(KEY), entry.get(NONE_KEY)
    if read:
        return f"per channel on {read}"
    return f"no channel axis: {none}, so its worst channel is its whole SQNR" if none else ""
