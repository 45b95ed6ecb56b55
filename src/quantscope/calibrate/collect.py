"""Calibration: stream batches through ORT with taps on the tensors we quantize."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np
import onnx

from quantscope.calibrate.lookup import (
    Lookup,
    find_lookups,
    index_taps,
    lookup_range,
    note_rows,
    table_bounds,
)
from quantscope.calibrate.observe import Observer
from quantscope.emulate.ranges import METHODS
from quantscope.emulate.session import make_session, run_on_data
from quantscope.model.axes import channel_axes
from quantscope.model.groups import find_mask_adds
from quantscope.model.load import Model
from quantscope.numerics import SameSamples
from quantscope.progress import feed_size, track
from quantscope.types import (
    SHARED,
    Groups,
    QuantscopeError,
    Stats,
    TensorStats,
    batch_rows,
    keep_inputs,
    sample_axis,
    take_rows,
)


def tap_names(model: Model, groups: Groups) -> list[str]:
    """Tensors whose statistics encode() needs: model inputs, group outputs, mask scores."""
    names = list(groups.model_inputs)
    for g in groups.groups:
        names.extend(g.outputs)
    names.extend(m.scores for m in find_mask_adds(model))
    return list(dict.fromkeys(names))


def _mask_fills(model: Model) -> set[str]:
    """Tensors whose ``-inf`` is an attention mask's fill: each mask Add's output, and the
    row shift ``Sub(masked scores, row max)`` an Exp reads (``rowscale``'s Softmax)."""
    masks = {m.output for m in find_mask_adds(model)}
    exps = {n.input[0] for n in model.graph.node if n.op_type == "Exp" and n.input}
    return masks | {n.output[0] for n in model.graph.node
                    if n.op_type == "Sub" and n.input and n.input[0] in masks
                    and n.output[0] in exps}


def tapped_model(model: Model, taps: list[str]) -> onnx.ModelProto:
    """A copy of the model whose graph outputs also expose ``taps``."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    existing = {o.name for o in proto.graph.output}
    for name in taps:
        if name not in existing:
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
    return proto


# what one run's tapped tensors may hold (all of them are alive at once); the rows per run
# follow from the first run's bytes per input value
TAP_BUDGET = 256 * 2**20
MAX_ROWS = 8  # rows one run takes at most


def fixed_rows(session: Any, feeds: dict[str, np.ndarray]) -> bool:
    """True when an input of ``session`` has a static size along its sample axis in
    ``feeds``: the model takes only whole batches of that size (one run per batch)."""
    for inp in session.get_inputs():
        if inp.name not in feeds:
            continue
        axis = sample_axis(feeds, inp.name)
        if axis != SHARED and axis < len(inp.shape) and isinstance(inp.shape[axis], int):
            return True
    return False


def rows_per_run(feeds: dict[str, np.ndarray], bytes_per_value: float | None, max_rows: int,
                 budget: int = TAP_BUDGET) -> int:
    """How many rows of ``feeds`` one run takes: as many as keep its tapped tensors within
    ``budget`` at ``bytes_per_value`` tap bytes per input value (measured on the first
    run), between 1 and ``max_rows``; 1 before anything is measured."""
    if bytes_per_value is None:
        return 1
    per_row = bytes_per_value * feed_size(feeds) / max(batch_rows(feeds), 1)
    return int(min(max_rows, max(1, budget // max(per_row, 1.0))))


def calibrate(
    model: Model,
    groups: Groups,
    batches: Iterable[dict[str, np.ndarray]],
    *,
    method: str = "minmax",
    progress: bool = False,
    max_rows: int = MAX_ROWS,
    budget: int = TAP_BUDGET,
) -> Stats:
    """Run every batch once; fold each tapped tensor into a constant-size observer.

    Batches are run a few samples at a time: every tapped tensor of a run is alive at once
    (attention maps of a [32, 12, 256, 256] batch are 100 MB each), so peak memory scales
    with the rows per run, never with the number of batches. The first run takes one row
    and measures what its taps hold; each later run takes as many rows as fit ``budget``
    (:func:`rows_per_run`, at most ``max_rows``). The observers fold exactly, so the
    statistics do not depend on the split but for the floor cluster (``bulk_min``,
    ``floor_count``: merged approximately where there is no sentinel fill; tests).
    mpnet-base at 256 tokens holds ~350 MB of taps per row: 8 rows a run peaked 3.5 GB over
    the model, 1 row 1.7 GB, no slower.
    """
    if method not in METHODS:
        raise QuantscopeError(
            f"unknown calibration method '{method}': use one of {', '.join(METHODS)}"
        )
    taps = tap_names(model, groups)
    if not taps:  # ORT runs every output when asked for none: nothing would match
        raise QuantscopeError(
            f"{model.source}: nothing to quantize: no float input and no float tensor on the "
            "data path (quantscope measures a float model's quantization): give the float "
            "ONNX model"
        )
    lookups = find_lookups(model, set(taps))  # its indices tapped: the rows picked
    ids = index_taps(lookups, {i.name for i in model.graph.input})
    session = make_session(tapped_model(model, taps + ids), optimize=True, arena=False)
    inputs = {i.name for i in session.get_inputs()}
    axes = channel_axes(model)
    masks = _mask_fills(model)
    observers = {t: Observer(t, axes.get(t), mask=t in masks) for t in taps}
    same = {t: SameSamples() for t in model.output_names() if t in observers}
    same_in: dict[str, SameSamples] = {}  # the inputs too: are the samples themselves alike?
    n_batches = n_samples = 0
    per_value: float | None = None  # tap bytes per input value, from the first run
    for batch in track(batches, "calibrate", unit="batch", show=progress, cost=feed_size):
        feeds = keep_inputs(batch, inputs)
        n, start, whole = batch_rows(feeds), 0, fixed_rows(session, feeds)
        while start < n:  # consecutive row slices, each as long as the budget allows
            k = n if whole else rows_per_run(feeds, per_value, max_rows, budget)
            part = feeds if start == 0 and k >= n else take_rows(feeds, slice(start, start + k))
            start += k
            values = run_on_data(session, taps + ids, part)
            note_rows(lookups, {**part, **dict(zip(ids, values[len(taps):], strict=True))})
            del values[len(taps):]
            for name, value in part.items():
                same_in.setdefault(name, SameSamples()).add(value)
            if per_value is None:
                per_value = sum(getattr(v, "nbytes", 0) for v in values) / feed_size(part)
                got = dict(zip(taps, values, strict=True))
                rest = [o for o in model.output_names() if o not in got]
                if rest:  # an output no group taps (a Reshape's): run once for its shape
                    got.update(zip(rest, session.run(rest, part), strict=True))
                refuse_misdeclared_outputs(model, got)
            for name, value in zip(taps, values, strict=True):
                observers[name].update(value)
                if name in same:
                    same[name].add(value)
            del values
        n_batches += 1
        n_samples += batch_rows(batch)
    if n_batches == 0:
        raise QuantscopeError("calibration data is empty: give at least one batch")
    _refuse_nonfinite_outputs(model, observers)
    _refuse_constant_outputs(model, same, same_in)
    return Stats(
        tensors={t: _frozen(model, o, lookups.get(t)) for t, o in observers.items()},
        method=method,
        num_batches=n_batches,
        num_samples=n_samples,
    )


def _frozen(model: Model, observer: Observer, lookup: Lookup | None) -> TensorStats:
    """The tensor's stats; a lookup's range its table's (:mod:`quantscope.calibrate.lookup`:
    the one place it is set), with where it came from."""
    if lookup is None or observer.count == 0:
        return observer.freeze()
    data_min, data_max = observer.lo, observer.hi
    *bounds, left_out = table_bounds(model.initializer_array(lookup.table), lookup,
                                     observer.axis)
    observer.bound(*bounds)
    return replace(observer.freeze(), lookup=lookup_range(lookup, data_min, data_max, left_out))


def refuse_misdeclared_outputs(model: Model, values: dict[str, np.ndarray]) -> None:
    """An output the file declares of another rank, or of another static size, than ONNX
    Runtime returns (ddddocr's ``387``: declared ``[1, seqlen]``, computed ``[T, 1, 8210]``)
    would be read along the declared axes: its samples cut on the wrong axis (an internal
    IndexError in the analysis), a task's axes misread. Refused at the first FP32 run,
    naming both shapes and the fix."""
    shapes = model.value_shapes()
    for name in model.output_names():
        want, got = shapes.get(name), values.get(name)
        if not want or got is None:
            continue
        if len(want) == np.ndim(got) and all(
                not isinstance(d, int) or d in (n, 1) for d, n in zip(want, got.shape, strict=True)):
            continue  # (a static 1 may be the samples' axis, run several at a time)
        text = "[" + ", ".join("?" if d is None else str(d) for d in want) + "]"
        raise QuantscopeError(
            f"output '{name}' is declared {text} in the model file, but ONNX Runtime returns "
            f"{list(got.shape)} on the data: quantscope reads the samples and the axes from "
            "the declaration, so it would read this output wrongly; declare the shape the "
            f"graph computes in the file (onnx: graph.output '{name}''s shape as "
            f"{list(got.shape)}, a dim that varies with the input as a name) and give it again")


def _refuse_nonfinite_outputs(model: Model, observers: dict[str, Observer]) -> None:
    """A graph output that FP32 itself makes NaN or inf has nothing a quantized output could
    be compared with: refused here, at the first FP32 run of every command, naming it (the
    observers leave such values out of the ranges, which would otherwise hide them)."""
    broken = [(t, observers[t].nonfinite) for t in model.output_names()
              if t in observers and observers[t].nonfinite]
    if broken:
        said = ", ".join(f"{t!r} ({n:,} values)" for t, n in broken)
        plural = len(broken) > 1
        raise QuantscopeError(
            f"FP32 output{'s' if plural else ''} {said} {'are' if plural else 'is'} NaN or "
            "inf on the calibration data (the model itself, "
            "before any quantization): nothing to compare a quantized output with; drop the "
            "samples it breaks on from the data, or fix the model")


def nonfinite_note(stats: Stats) -> str | None:
    """One line naming the tensors inside the graph where FP32 met NaN or inf on the
    calibration data (the outputs are refused, :func:`_refuse_nonfinite_outputs`): their
    ranges hold the finite values only, so nothing here shows them otherwise. None when
    there are none. Said by ``calibrate``, the analysis notes and ``run``'s verdict."""
    bad = sorted(((t, ts) for t, ts in stats.tensors.items() if ts.nonfinite),
                 key=lambda p: -p[1].nonfinite)
    if not bad:
        return None
    shown = ", ".join(f"{t!r} ({ts.nonfinite:,} of {ts.count:,} values)"
                      for t, ts in bad[:MAX_NAMED])
    more = f" and {len(bad) - MAX_NAMED} more" if len(bad) > MAX_NAMED else ""
    return (f"NaN or inf inside the graph on the calibration data (FP32, before any "
            f"quantization) in {len(bad)} tensor(s): {shown}{more}; left out of their "
            "calibrated ranges, which hold the finite values only: find the op that makes "
            "them (a division by 0, a log of 0 ...) and guard it, or drop the samples it "
            "breaks on from the data")


MAX_NAMED = 6  # tensors named in the note (the rest counted)


def _refuse_constant_outputs(model: Model, same: dict[str, SameSamples],
                             inputs: dict[str, SameSamples]) -> None:
    """When every output FP32 gives is the same on every calibration sample, the model does
    not depend on its input here: no figure of a quantized model could mean anything (and
    each layer's sensitivity is 0 / 0). Not when the samples themselves are all alike (zeros,
    one sample repeated): the model is not at fault there, and the analysis notes an
    all-zero calibration. One output of several that is constant is said by
    the evaluation instead (:mod:`quantscope.emulate.evaluate`)."""
    if same and all(s.constant for s in same.values()):
        names = ", ".join(repr(t) for t in same)
        if inputs and all(s.constant for s in inputs.values()):
            return  # the samples are alike, not the model: the analysis notes say so
        raise QuantscopeError(
            f"every output of model '{model.source}' ({names}) is the same on every sample of "
            "the calibration data: FP32 does not depend on the input there, so no "
            "quantization error can be measured; check the model's outputs and the data")
