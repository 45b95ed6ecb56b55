"""Calibration: stream batches through ORT with taps on the tensors we quantize."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx

from quantscope.calibrate.observe import Observer
from quantscope.emulate.ranges import METHODS
from quantscope.emulate.session import make_session
from quantscope.model.axes import channel_axes
from quantscope.model.groups import find_mask_adds
from quantscope.model.load import Model
from quantscope.progress import feed_size, track
from quantscope.types import Groups, QuantscopeError, Stats, batch_rows, keep_inputs, take_rows


def tap_names(model: Model, groups: Groups) -> list[str]:
    """Tensors whose statistics encode() needs: model inputs, group outputs, mask scores."""
    names = list(groups.model_inputs)
    for g in groups.groups:
        names.extend(g.outputs)
    names.extend(m.scores for m in find_mask_adds(model))
    return list(dict.fromkeys(names))


def tapped_model(model: Model, taps: list[str]) -> onnx.ModelProto:
    """A copy of the model whose graph outputs also expose ``taps``."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    existing = {o.name for o in proto.graph.output}
    for name in taps:
        if name not in existing:
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
    return proto


def _row_chunks(feeds: dict[str, np.ndarray], max_rows: int) -> list[dict[str, np.ndarray]]:
    n = batch_rows(feeds)
    if n <= max_rows:
        return [feeds]
    return [take_rows(feeds, slice(i, i + max_rows)) for i in range(0, n, max_rows)]


def calibrate(
    model: Model,
    groups: Groups,
    batches: Iterable[dict[str, np.ndarray]],
    *,
    method: str = "minmax",
    progress: bool = False,
    max_rows: int = 8,
) -> Stats:
    """Run every batch once; fold each tapped tensor into a constant-size observer.

    Batches are run ``max_rows`` samples at a time: every tapped tensor of a run is alive
    at once (attention maps of a [32, 12, 256, 256] batch are 100 MB each), so peak memory
    scales with the rows per run, never with the number of batches.
    """
    if method not in METHODS:
        raise QuantscopeError(
            f"unknown calibration method '{method}': use one of {', '.join(METHODS)}"
        )
    taps = tap_names(model, groups)
    session = make_session(tapped_model(model, taps), optimize=True, arena=False)
    inputs = {i.name for i in session.get_inputs()}
    axes = channel_axes(model)
    observers = {t: Observer(t, axes.get(t)) for t in taps}
    n_batches = n_samples = 0
    for batch in track(batches, "calibrate", unit="batch", show=progress, cost=feed_size):
        feeds = keep_inputs(batch, inputs)
        for part in _row_chunks(feeds, max_rows):
            values = session.run(taps, part)
            for name, value in zip(taps, values, strict=True):
                observers[name].update(value)
            del values
        n_batches += 1
        n_samples += batch_rows(batch)
    if n_batches == 0:
        raise QuantscopeError("calibration data is empty: give at least one batch")
    return Stats(
        tensors={t: o.freeze() for t, o in observers.items()},
        method=method,
        num_batches=n_batches,
        num_samples=n_samples,
    )
