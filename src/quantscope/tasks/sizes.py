"""The input sizes tensor data fixes: ``run`` without ``--input-shape``, and data of
several sizes.

A model with symbolic sizes besides the samples (an image's ``H``, ``W``; a signal's
``T``) cannot have its size rules (``hailo.super_defuse``, the 16-bit width rules) judged
until it has a size: the planner keeps what they touch at 8 bit, and the compiler needs
one anyway; so does a graph whose shapes ONNX cannot fold without a concrete batch (a
``flatten`` exported as ``Shape``, ``Slice``, ``Concat``, ``Reshape``). When every batch of the fit data gives an input the same size (an ``.npz`` of
fixed-size images), that is the size the model was calibrated, planned and measured at:
:func:`at_data_shapes` takes it, as if given with ``--input-shape``, and says so in one
line.

The analysis compares the samples' outputs row by row, so it needs one size per input:
:func:`check_one_size` refuses data of several sizes (a folder of 320 and 640 px images)
in one line before any work (``evaluate`` and ``calibrate`` take it batch by batch).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quantscope.model.load import Model
from quantscope.types import SHARED, QuantscopeError, sample_axis

Shapes = tuple[tuple[str, tuple[int, ...]], ...]


def _open(d: object) -> bool:
    return not (isinstance(d, int) and d > 0)


def _open_inside(model: Model) -> bool:
    """Some tensor of the graph has an open dim besides its first: a Reshape whose target
    is computed from ``Shape(x)`` (a torch ``flatten``) that ONNX shape inference cannot
    fold without a concrete batch; or no shape at all (a ``GroupNormalization``-21, which
    ONNX's inference does not follow: with every input concrete, ONNX Runtime gives it)."""
    shapes = model.value_shapes()
    if any(any(_open(d) for d in shape[1:]) for shape in shapes.values() if shape):
        return True
    return any(t not in shapes for n in model.graph.node for t in n.output if t)


def _free(model: Model, name: str, *, inside: bool) -> bool:
    """``name`` has a dim the model leaves open, besides a leading sample dim (also that
    one when ``inside``: a concrete batch lets the graph's shapes be folded)."""
    shape = model.value_shapes().get(name)
    return shape is not None and any(_open(d) for d in shape[0 if inside else 1:])


def data_shapes(model: Model, batches: list[Any]) -> tuple[Shapes, dict[str, list[str]]]:
    """(the shape each open input has in every batch, one sample: ``(1, ...)``; the inputs
    whose sizes differ between batches, with the sizes seen). Inputs with no open dim
    (the sample dim counts only where the graph has tensors of unknown size), without
    samples or not in the data are left out."""
    seen: dict[str, set[tuple[int, ...]]] = {}
    inside = _open_inside(model)
    for batch in batches:
        for name in model.input_names():
            if name not in batch or not _free(model, name, inside=inside):
                continue
            axis = sample_axis(batch, name)
            arr = batch[name]
            if axis == SHARED or np.ndim(arr) == 0:
                continue
            dims = list(np.shape(arr))
            dims[axis] = 1
            seen.setdefault(name, set()).add(tuple(int(d) for d in dims))
    fixed = tuple((k, next(iter(v))) for k, v in seen.items() if len(v) == 1)
    differ = {k: sorted("x".join(map(str, s)) for s in v) for k, v in seen.items() if len(v) > 1}
    return fixed, differ


def shapes_line(fixed: Shapes) -> str | None:
    """The one line :func:`at_data_shapes` says (None when no input has an open size)."""
    if not fixed:
        return None
    given = ", ".join(f"{k}={'x'.join(map(str, s))}" for k, s in fixed)
    return (f"input-shape: {given}, the size of every sample in the data (plan, check and "
            "compile at it; give --input-shape NAME=DxDx… for another)")


def at_data_shapes(model: Model, fit: Any) -> tuple[Shapes, str | None]:
    """The input shapes to run at when none is given, and the line that says so: every
    open input's size when every batch of ``fit`` agrees on all of them, else none (data
    of several sizes: :func:`check_one_size` refuses it)."""
    fixed, differ = data_shapes(model, [*fit.calibration, *fit.evaluation])
    return ((), None) if differ else (fixed, shapes_line(fixed))


def check_one_size(model: Model, fit: Any, spec: str, command: str) -> None:
    """Refuse, in one line, tensor data whose batches give an input several sizes."""
    _, differ = data_shapes(model, [*fit.calibration, *fit.evaluation])
    if differ:
        name, sizes = next(iter(differ.items()))
        raise QuantscopeError(
            f"data '{spec}' gives input '{name}' in several sizes ({', '.join(sizes[:3])}"
            f"{' …' if len(sizes) > 3 else ''}), and {command} compares the samples' outputs "
            "row by row: give data of one size (the size you compile for), e.g. one folder "
            "per size")


def other_size_line(model: Model, fit: Any, given: Shapes) -> str | None:
    """The warning when ``--input-shape`` gives an input another size than every sample of
    the data has (a recognizer compiled 640 px wide, measured on 320 px lines): the
    figures are the data's size's, the rules and the compiler's the given one's; None when
    they agree (the sample axis aside) or the data gives no one size."""
    batches = [*fit.calibration, *fit.evaluation]
    fixed, differ = data_shapes(model, batches)
    data = dict(fixed)
    other = []
    for name, shape in given:
        have = data.get(name)
        if name in differ or have is None or len(have) != len(shape):
            continue
        samples = next(sample_axis(b, name) for b in batches if name in b)
        axes = [k for k, (a, b) in enumerate(zip(have, shape, strict=True))
                if a != b and k != samples]
        if axes:
            other.append(f"{name}={'x'.join(map(str, shape))} (the data's "
                         f"{'x'.join(map(str, have))}, axis {', '.join(map(str, axes))})")
    if not other:
        return None
    return (f"warning: --input-shape {', '.join(other)}: the figures are measured at the "
            "data's size, the size rules checked and the compiler given --input-shape's; give "
            "data of the size you compile for to measure what ships")
