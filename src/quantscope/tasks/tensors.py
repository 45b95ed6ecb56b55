"""Tensor data: ``.npy`` / ``.npz`` files or a folder of them, checked against the model.

=============  ============================================================
``x.npy``      one array for a single-input model; first axis = samples
``x.npz``      one array per model input, keyed by input name
folder         every ``.npy``/``.npz`` inside (sorted); each file is one or
               more batches (files may differ in non-batch dims, e.g. length)
=============  ============================================================

The sample axis of each input (:func:`find_layout`) is axis 0 unless the model says
otherwise:

==============================  ==========================================================
``--batch-axis NAME=K``         declared: input (or output) ``NAME`` holds the samples on
                                axis ``K``
a static axis of size 1 the     that axis, whatever else is symbolic (``input [1, 3, H,
data fills (the one differing)  W]`` given ``[4, 3, 512, 512]``: axis 0, one at a time)
a symbolic dim shared by the    that dim's axis in each input (an LSTM: ``x [B, 16]``,
inputs                          ``h [1, B, 8]``: axes 0 and 1)
of several shared symbolic     the one a recurrent node's ``X`` reads as its samples
dims                            (``X [T, N, F]``: axis 1), else those every output keeps
a static model                  the one axis where the data's size differs from the model's
                                (``state [2, 1, 16]`` given ``[2, n, 16]``: axis 1), else
                                an axis of size 1 that holds as many samples as the other
                                inputs; the model then runs its static count of samples
                                (1) at a time
==============================  ==========================================================

Batches of such a model are :class:`quantscope.types.Feeds`: they carry each input's
sample axis and each output's, so every cut and join of samples (calibration chunks,
held-out halves, the analysis' row subsets) goes along the right axis, and outputs are
put sample-first before they are scored (:func:`quantscope.types.sample_first`).
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from quantscope.model.dynamic import refuse_unscorable_outputs
from quantscope.model.load import Model
from quantscope.model.mixing import sample_mixers
from quantscope.tasks.fixed_batch import BATCH_NAME
from quantscope.types import SHARED, Feeds, QuantscopeError

TENSOR_BATCH = 32  # samples per batch (fewer when the model takes fewer per run)

_ONNX_TO_NP = {
    onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32, onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.INT8: np.int8, onnx.TensorProto.BOOL: np.bool_,
}


def _files(path: Path) -> list[Path]:
    if not path.exists():
        raise QuantscopeError(f"data '{path}' does not exist: check the path")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in (".npy", ".npz"))
        if not files:
            from quantscope.tasks.pixels import IMAGE_SUFFIXES, MAKE_TENSORS

            if any(p.suffix.lower() in IMAGE_SUFFIXES for p in path.iterdir()):
                raise QuantscopeError(f"data folder '{path}' holds images, not tensors: "
                                      f"{MAKE_TENSORS} and give --data data.npz")
            raise QuantscopeError(f"data folder '{path}' has no .npy or .npz files: add some")
        special = [p for p in files if not p.is_file()]  # a FIFO would block the reader
        if special:
            raise QuantscopeError(f"data folder '{path}' holds '{special[0].name}', which is "
                                  "not a regular file (a FIFO, a device or a folder): remove "
                                  "it or move the data files to a folder of their own")
        return files
    if path.suffix.lower() not in (".npy", ".npz"):
        raise QuantscopeError(
            f"data '{path}' is not .npy/.npz: give tensors, a folder of them, or a task name"
        )
    return [path]


def _read(path: Path, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    if path.stat().st_size == 0:
        raise QuantscopeError(f"data file '{path}' is empty (0 bytes): save the arrays again "
                              "with numpy (np.save / np.savez)")
    with path.open("rb") as f:
        head = f.read(6)
    if head[:2] != b"PK" and head != b"\x93NUMPY":  # np.load would try it as a pickle
        raise QuantscopeError(f"data file '{path}' is not a NumPy file (it starts with "
                              f"{head!r}, not an .npz or .npy header): save the arrays with "
                              "numpy (np.savez / np.save)")
    try:
        if path.suffix.lower() == ".npy":
            if len(names) != 1:
                raise QuantscopeError(
                    f"'{path}' is a single array but the model has inputs {', '.join(names)}: "
                    "use an .npz with one array per input name"
                )
            return {names[0]: np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise QuantscopeError(f"cannot read data file '{path}' ({exc}): re-save it with numpy") from None


@dataclass(frozen=True)
class Layout:
    """Where the samples lie: ``axes`` (input -> sample axis), ``out_axes`` (each output's
    sample axis, in output order), ``limit`` (the most samples one run takes: the model's
    static size of the sample axis, or 1 when a node mixes the samples; None: any),
    ``how`` (input -> why that axis), ``mixes`` (the nodes that mix a run's samples:
    :func:`quantscope.model.mixing.sample_mixers`)."""

    axes: dict[str, int]
    out_axes: tuple[int, ...]
    limit: int | None
    how: dict[str, str]
    mixes: tuple[str, ...] = ()

    @property
    def plain(self) -> bool:
        """Every input and output sample-first, any sample count per run (the common case)."""
        return not any(self.axes.values()) and not any(self.out_axes) and self.limit is None

    def describe(self) -> str:
        """One sentence for the console: the inputs not batched on axis 0, and the limit."""
        parts = [f"'{k}' whole to every batch ({self.how.get(k, '')})" if a == SHARED
                 else f"'{k}' on axis {a} ({self.how.get(k, '')})"
                 for k, a in self.axes.items() if a]
        text = "samples: " + ("; ".join(parts) if parts else "axis 0 of every input")
        if self.limit is not None:
            text += f"; the model takes {self.limit} sample(s) per run ({limit_reason(self.mixes)})"
        return text


def limit_reason(mixes: tuple[str, ...]) -> str:
    """Why a model runs a few samples at a time: its static shape, or the nodes that mix
    the samples of a run (then one at a time, as a deployment runs it)."""
    if not mixes:
        return "static shape"
    more = f" and {len(mixes) - 2} more" if len(mixes) > 2 else ""
    return (f"{', '.join(mixes[:2])}{more} mixes the samples of a run, so each sample is run "
            "alone, as a deployment runs it")


def check_batch_axes(model: Model, declared: Mapping[str, int]) -> dict[str, int]:
    """``--batch-axis`` values checked against the model: a known input or output name,
    an axis within its rank (negative counts from the end) that the model does not fix at
    a size other than 1. Returns them normalised."""
    shapes = model.value_shapes()
    known = (*model.input_names(), *model.output_names())
    out = {}
    for name, axis in declared.items():
        if name not in known:
            raise QuantscopeError(
                f"--batch-axis: '{name}' is no input or output of the model (inputs: "
                f"{', '.join(model.input_names()) or 'none'}; outputs: "
                f"{', '.join(model.output_names())}): use one of those names"
                + _quote_hint(name, known))
        rank = len(shapes[name]) if name in shapes else None
        if rank is not None and not -rank <= axis < rank:
            raise QuantscopeError(
                f"--batch-axis {name}={axis}: '{name}' has {rank} axes "
                f"(shape {_shape_text(shapes[name])}): give an axis from 0 to {rank - 1}")
        out[name] = axis % rank if rank else axis
        fixed = shapes[name][out[name]] if rank else None
        if isinstance(fixed, int) and fixed != 1:
            raise QuantscopeError(
                f"--batch-axis {name}={axis}: the model fixes that axis of '{name}' at {fixed} "
                f"(shape {_shape_text(shapes[name])}), so it cannot hold the samples: give "
                "the axis that does (a symbolic one, or one of size 1)")
    return out


def _quote_hint(name: str, known: tuple[str, ...]) -> str:
    """How to name a tensor whose name holds ',' or '=' (when the given or a real name
    does): the name is read up to the last '=' before the axis, or quoted."""
    if not any(c in n for n in (name, *known) for c in ",="):
        return ""
    return ("; a name holding ',' or '=' is read up to the last '=' before the axis, or "
            "quote it: --batch-axis '\"a,b=c\"=1'")


def _shape_text(shape: tuple[int | str | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _candidates(names: tuple[str, ...], shapes: Mapping[str, tuple[int | str | None, ...]],
                model: Model | None) -> list[str]:
    """The symbolic dims that may count the samples: those every input that has a symbolic
    dim shares; of several (``X [T, N, F]``), the one a recurrent node reads as its
    samples, else the ones every output with a symbolic dim keeps (a time axis an encoder
    reduces is not one)."""
    syms = [[d for d in shapes.get(k) or () if isinstance(d, str)] for k in names]
    having = [s for s in syms if s]
    if not having:
        return []
    shared = [d for d in having[0] if all(d in s for s in having)]
    if len(shared) > 1 and model is not None:
        shared = _narrowed(shared, names, shapes, model)
    return shared


def _batch_symbol(names: tuple[str, ...],
                  shapes: Mapping[str, tuple[int | str | None, ...]],
                  model: Model | None = None) -> str | None:
    """The symbolic dim that counts the samples (of :func:`_candidates`): the first
    input's axis 0, else the lowest axes."""
    shared = _candidates(names, shapes, model)
    if not shared:
        return None
    first = shapes.get(names[0]) or ()
    if first and first[0] in shared:
        return str(first[0])
    return min(shared, key=lambda d: sum((shapes.get(k) or ()).index(d)
                                         for k in names if d in (shapes.get(k) or ())))


def _narrowed(shared: list[str], names: tuple[str, ...],
              shapes: Mapping[str, tuple[int | str | None, ...]], model: Model) -> list[str]:
    """Of several shared symbolic dims, those the graph says count the samples."""
    from quantscope.model.recurrent import recurrent_sample_axes

    said = {str(shapes[k][a]) for k, a in recurrent_sample_axes(model.proto).items()
            if k in names and len(shapes.get(k) or ()) > a}
    if [d for d in shared if d in said]:
        return [d for d in shared if d in said]
    outs = [[d for d in shapes.get(o) or () if isinstance(d, str)] for o in model.output_names()]
    kept = [d for d in shared if all(d in o for o in outs if o)]
    return kept or shared


def sample_dim_guess(model: Model, declared: Mapping[str, int] | None = None,
                     axes: Mapping[str, int] | None = None) -> str | None:
    """One line when the sample axis is a guess between symbolic dims the graph does not
    tell apart (a time-major ``x [T, N, F]`` Conv or Transformer: both kept by every
    output), naming the one taken and how to declare another; None otherwise, and where
    ``axes`` (each input's sample axis as the data was read: :attr:`Feeds.axes`, 0 where
    absent) shows the samples taken elsewhere (a static size-1 axis the data fills)."""
    names, shapes = model.input_names(), model.value_shapes()
    if declared and any(k in declared for k in names):
        return None
    shared = _candidates(names, shapes, model)
    sym = _batch_symbol(names, shapes, model)
    if len(shared) < 2 or sym is None or BATCH_NAME.fullmatch(sym):
        return None
    k = next(k for k in names if sym in (shapes.get(k) or ()))
    a = (shapes.get(k) or ()).index(sym)
    if axes is not None and axes.get(k, 0) != a:
        return None
    return (f"input '{k}' {_shape_text(shapes.get(k) or ())} has {len(shared)} symbolic dims "
            f"the graph does not tell apart ({', '.join(shared)}): the samples are taken on "
            f"axis {a} ('{sym}'); if another holds them, declare it: --batch-axis {k}=K")


def find_layout(model: Model, arrays: Mapping[str, np.ndarray],
                declared: Mapping[str, int] | None = None) -> Layout:
    """Each input's sample axis (see the module table), each output's, and the most
    samples one run takes. ``declared`` (``--batch-axis``) wins; it must agree with the
    model's static dims (a declared axis is symbolic or of static size 1)."""
    refuse_unscorable_outputs(model)  # a data-sized (NMS) output, integer outputs only
    names, shapes = model.input_names(), model.value_shapes()
    declared = check_batch_axes(model, declared or {})
    axes: dict[str, int] = {}
    how: dict[str, str] = {}
    for k in names:
        if k in declared:
            axes[k], how[k] = declared[k], "--batch-axis"
    for k in names:  # a rank-0 input (a sample rate) has no samples: given whole
        if k not in axes and shapes.get(k) == () and np.ndim(arrays[k]) == 0:
            axes[k], how[k] = SHARED, "rank 0: the same value for every sample"
    # the one static axis the data's size differs at, a size-1 axis it fills: the samples'
    # axis whatever else is symbolic (`[1, 3, H, W]`, a picture size free: H is not it)
    filled: set[str] = set()
    for k in names:
        want, arr = shapes.get(k), arrays[k]
        if k in axes or want is None or len(want) != np.ndim(arr):
            continue
        differ = [i for i, d in enumerate(want) if isinstance(d, int) and d != arr.shape[i]]
        if len(differ) == 1 and want[differ[0]] == 1:
            i = differ[0]
            axes[k], how[k] = i, f"static size 1, data {arr.shape[i]}"
            filled.add(k)
    sampled = tuple(k for k in names if axes.get(k) != SHARED)
    sym = _batch_symbol(tuple(k for k in sampled if k not in filled), shapes, model)
    for k, a in declared.items():
        if k in names and a != SHARED and len(shapes.get(k) or ()) > a:
            _outputs_keep(model, shapes, k, a, declared)
    for k in names:
        want = shapes.get(k) or ()
        if k not in axes and sym is not None and sym in want:
            axes[k], how[k] = want.index(sym), f"its dimension '{sym}'"
    rest = [k for k in names if k not in axes]
    counts = {arrays[k].shape[a] for k, a in axes.items() if a != SHARED and arrays[k].ndim > a}
    n = counts.pop() if len(counts) == 1 else None
    for k in list(rest):  # the model's own static shape while the others carry samples:
        want, arr = shapes.get(k), arrays[k]  # one value for every batch (an initial state)
        if (n is not None and want and all(isinstance(d, int) for d in want)
                and tuple(arr.shape) == tuple(want) and n not in tuple(want)):
            axes[k], how[k] = SHARED, "the model's static shape, the others' samples elsewhere"
            rest.remove(k)
    for k in rest:
        want, arr = shapes.get(k), arrays[k]
        axes[k], how[k] = 0, "axis 0"
        if want is None or len(want) != arr.ndim or n is None:
            continue
        # free axes (symbolic, unknown or of size 1) holding as many as the others: 0 first
        fits = [i for i, d in enumerate(want)
                if arr.shape[i] == n and (d == 1 or not isinstance(d, int))]
        if fits and 0 not in fits:
            axes[k], how[k] = fits[0], f"size {arr.shape[fits[0]]}, as many as the others"
    static, cut = [], False
    for k, a in axes.items():
        if a == SHARED:
            continue
        want, arr = shapes.get(k) or (), arrays[k]
        d = want[a] if a < len(want) else None
        if not isinstance(d, int):
            continue
        size = arr.shape[a] if arr.ndim > a else 0
        static.append(d)
        cut = cut or size != d
    limit = min(static) if static and cut else None
    axes = {k: axes[k] for k in names}
    out_axes = _output_axes(model, sym, axes, limit, declared)
    mixes = tuple(sample_mixers(model, tuple(k for k in names if axes[k] != SHARED), sym))
    if mixes and (limit is None or limit > 1):
        return Layout(axes=axes, out_axes=out_axes, limit=1, how=how, mixes=mixes)
    return Layout(axes=axes, out_axes=out_axes, limit=limit, how=how)


def _outputs_keep(model: Model, shapes: Mapping[str, tuple[int | str | None, ...]],
                  k: str, a: int, declared: Mapping[str, int]) -> None:
    """Refuse a declared sample axis of input ``k`` whose symbolic dim an output does not
    keep while another symbolic dim of ``k`` is in every output (``X [T, N, F]`` declared
    on ``T``, the outputs ``[N, C]``): every cut of the samples would cut the outputs along
    another dim."""
    shape = shapes.get(k) or ()
    sym = shape[a]
    outs = [(o, shapes.get(o) or ()) for o in model.output_names() if o not in declared]
    outs = [(o, w) for o, w in outs if any(isinstance(d, str) for d in w)]
    lost = [(o, w) for o, w in outs if sym not in w]
    kept = [(i, d) for i, d in enumerate(shape)
            if i != a and isinstance(d, str) and outs and all(d in w for _, w in outs)]
    if not isinstance(sym, str) or not lost or not kept:
        return
    o, want = lost[0]
    raise QuantscopeError(
        f"--batch-axis {k}={a}: that is input '{k}''s dimension '{sym}', which output '{o}' "
        f"{_shape_text(want)} does not have, so its samples are not the outputs' samples; "
        f"declare the axis that holds them: --batch-axis {k}={kept[0][0]} (its dimension "
        f"'{kept[0][1]}', which every output has)")


def _output_axes(model: Model, sym: str | None, axes: Mapping[str, int], limit: int | None,
                 declared: Mapping[str, int]) -> tuple[int, ...]:
    """Each output's sample axis: declared, else where the batch symbol is, else (static
    model) the first axis of the static sample count, else 0."""
    del axes
    shapes, out = model.value_shapes(), []
    for o in model.output_names():
        want = shapes.get(o) or ()
        if o in declared:
            out.append(declared[o])
        elif sym is not None and sym in want:
            out.append(want.index(sym))
        elif limit is not None and limit in want:
            out.append(want.index(limit))
        else:
            out.append(0)
    return tuple(out)


def _check_dims(arrays: dict[str, np.ndarray], model: Model, where: Path,
                layout: Layout) -> None:
    """The inputs agree on the samples (each along its own axis) and on every named
    (symbolic) dimension."""
    shapes, seen = model.value_shapes(), {}
    for name in model.input_names():
        want, arr = shapes.get(name) or (), arrays[name]
        axis0 = layout.axes.get(name, 0)
        if axis0 == SHARED:
            continue
        dims = [("sample count", axis0)] + [(f"dimension '{d}'", i)
                                            for i, d in enumerate(want) if isinstance(d, str)]
        for label, axis in dict(dims).items():
            if arr.ndim <= axis:
                continue
            size = arr.shape[axis]
            first = seen.setdefault(label, (name, size, axis))
            if first[1] != size:
                where_axes = (f" (axis {first[2]} of '{first[0]}', axis {axis} of '{name}')"
                              if label == "sample count" and (first[2] or axis) else "")
                fix = (f"give every input the same {label}" if label != "sample count"
                       or not where_axes else "give every input the same sample count, or "
                       "say each input's sample axis with --batch-axis NAME=AXIS")
                free = [i for i, d in enumerate(arr.shape) if d == first[1] and i != axis and (
                    i >= len(want) or not isinstance(want[i], int) or want[i] == 1)]
                if label == "sample count" and free:  # (silero VAD v5: state [2, '', 128])
                    fix += (f"; its axis {free[0]} holds {first[1]}, the others' count: "
                            f"--batch-axis {name}={free[0]}")
                raise QuantscopeError(
                    f"data '{where}': {label} is {first[1]} in input '{first[0]}' but {size} "
                    f"in input '{name}'{where_axes}: {fix}")


def check_token_ids(arrays: dict[str, np.ndarray], model: Model, where: str | Path) -> None:
    """Integer inputs that index a table (token ids into an embedding) stay in range."""
    tables = {t.name: tuple(t.dims) for t in model.graph.initializer if t.dims}
    for node in model.graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[0] not in tables:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        arr, rows = arrays.get(node.input[1]), tables[node.input[0]][axis]
        if arr is None or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
            continue
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= rows:
            bad = hi if hi >= rows else lo
            raise QuantscopeError(
                f"data '{where}' input '{node.input[1]}' holds id {bad}, outside 0..{rows - 1} "
                f"(the {rows} rows of '{node.input[0]}'): use the model's own tokenizer")


def _axis_order(shape: tuple[int, ...], want: tuple, samples: int) -> tuple[int, ...] | None:
    """The permutation of ``shape``'s axes that gives the model's fixed dims ``want`` (the
    sample axis kept in place; equal dims keep their order), when one does and it is not
    the identity; None otherwise."""
    if any(not isinstance(d, int) for i, d in enumerate(want) if i != samples):
        return None
    free = [j for j in range(len(shape)) if j != samples]
    perm = []
    for i, d in enumerate(want):
        if i == samples:
            perm.append(samples)
            continue
        j = next((j for j in free if shape[j] == d), None)
        if j is None:
            return None
        free.remove(j)
        perm.append(j)
    return tuple(perm) if perm != list(range(len(shape))) else None


def _check(arrays: dict[str, np.ndarray], model: Model, where: Path,
           declared: Mapping[str, int] | None = None) -> Layout:
    shapes, types = model.value_shapes(), model.value_types()
    for name in model.input_names():
        if name not in arrays:
            raise QuantscopeError(
                f"data '{where}' has no array for model input '{name}' "
                f"(it has {', '.join(sorted(arrays)) or 'none'}): key the .npz by input name"
            )
        arr = arrays[name]
        expect = _ONNX_TO_NP.get(types.get(name, 0))
        if expect is not None and arr.dtype != expect:
            if not (np.issubdtype(arr.dtype, np.floating) and np.issubdtype(expect, np.floating)):
                raise QuantscopeError(
                    f"data '{where}' input '{name}' is {arr.dtype}, the model wants "
                    f"{np.dtype(expect)}: convert it (e.g. arr.astype('{np.dtype(expect)}'))"
                )
    layout = find_layout(model, arrays, declared)
    for name in model.input_names():
        arr, want, axis = arrays[name], shapes.get(name), layout.axes.get(name, 0)
        if want is not None and (arr.ndim != len(want) or any(
            isinstance(d, int) and d != s and i != axis
            for i, (d, s) in enumerate(zip(want, arr.shape, strict=False))
        )):
            rest = [d for i, d in enumerate(want) if i != axis]
            if arr.ndim == len(want) - 1 and all(
                    not isinstance(d, int) or d == n for d, n in zip(rest, arr.shape, strict=True)):
                fix = (f"it is one sample without the sample axis: save it as "
                       f"np.expand_dims(x, {axis}) or stack several samples on axis {axis}")
            elif arr.ndim == len(want) and (perm := _axis_order(arr.shape, want, axis)):
                fix = (f"its axes are the model's in another order (e.g. NHWC images for an "
                       f"NCHW input, as a TFLite model converted to ONNX takes them): save "
                       f"np.transpose(x, {perm})")
            elif arr.ndim == len(want):
                bad = [f"axis {i} is {n}, the model's {d}" for i, (d, n) in
                       enumerate(zip(want, arr.shape, strict=True))
                       if isinstance(d, int) and d != n and i != axis]
                fix = (f"{'; '.join(bad)}: pad or crop the data to the model's size (or "
                       "export the model with that dim symbolic)")
            else:
                fix = f"it has {arr.ndim} axes, the model's input {len(want)}: reshape the data"
            raise QuantscopeError(
                f"data '{where}' input '{name}' has shape {arr.shape}, the model wants "
                f"{_shape_text(want)}: {fix}"
            )
        if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
            raise QuantscopeError(
                f"data '{where}' input '{name}' contains NaN or Inf: clean the data first"
            )
        _refuse_empty_axis(arr, name, want, axis, where)
    _check_dims(arrays, model, where, layout)
    check_token_ids(arrays, model, where)
    return layout


def _refuse_empty_axis(arr: np.ndarray, name: str, want: tuple | None, samples: int,
                       where: Path) -> None:
    """An axis other than the samples' that holds nothing (``[8, 0, 24]``): every sample is
    empty, so there is no value to run, calibrate or score (a zero sample count is
    :func:`tensor_batches`'s "zero samples")."""
    empty = [i for i, n in enumerate(arr.shape) if n == 0 and i != samples]
    if empty:
        dim = want[empty[0]] if want is not None and empty[0] < len(want) else None
        its = f" (the model's '{dim}')" if isinstance(dim, str) else ""
        raise QuantscopeError(
            f"data '{where}' input '{name}' has shape {arr.shape}: axis {empty[0]}{its} is "
            "empty (0 long), so no sample holds a value: give data with at least one value "
            "on every axis")


def tensor_batches(
    path: str | Path, model: Model, *, batch_size: int = TENSOR_BATCH,
    batch_axes: Mapping[str, int] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Yield checked feed dicts of at most ``batch_size`` samples (at most the model's
    static sample count), file by file, each input cut along its own sample axis
    (:func:`find_layout`; ``batch_axes``: the ones declared with ``--batch-axis``)."""
    names = model.input_names()
    types = model.value_types()
    for file in _files(Path(path)):
        arrays = _read(file, names)
        layout = _check(arrays, model, file, batch_axes)
        first = next((k for k in names if layout.axes.get(k, 0) != SHARED), names[0])
        n = arrays[first].shape[layout.axes.get(first, 0)] if arrays[first].ndim else 0
        if n == 0:
            raise QuantscopeError(f"data file '{file}' holds zero samples: remove it")
        size = min(batch_size, layout.limit or batch_size)
        for start in range(0, n, size):
            feed = {}
            for k in names:
                dt = _ONNX_TO_NP.get(types.get(k, 0), arrays[k].dtype)
                axis = layout.axes.get(k, 0)
                cut = (() if axis == SHARED
                       else (slice(None),) * axis + (slice(start, start + size),))
                feed[k] = np.asarray(arrays[k][cut]).astype(dt, copy=False)
            yield feed if layout.plain else Feeds(feed, layout.axes, layout.out_axes,
                                                  layout.limit, mixes=layout.mixes)


def unused_arrays(path: str | Path, model: Model) -> list[str]:
    """The arrays of the ``.npz`` file(s) at ``path`` that no model input takes (a label
    array, or a misspelt optional input: either way they are not fed), ``'name' (file)``."""
    names = set(model.input_names())
    out: list[str] = []
    for file in _files(Path(path)):
        if file.suffix.lower() == ".npz":
            with np.load(file, allow_pickle=False) as z:
                out += [f"'{k}' ({file.name})" for k in z.files if k not in names]
    return out


def _dtypes(file: Path, names: tuple[str, ...]) -> dict[str, np.dtype]:
    """Each array's dtype in a checked data file, from its header (no data read)."""
    if file.suffix.lower() == ".npy":
        return {names[0]: np.load(file, mmap_mode="r", allow_pickle=False).dtype}
    out = {}
    with zipfile.ZipFile(file) as zf:
        for entry in zf.namelist():
            with zf.open(entry) as f:
                version = np.lib.format.read_magic(f)
                read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                        else np.lib.format.read_array_header_2_0)
                out[entry.removesuffix(".npy")] = read(f)[2]
    return out


def cast_note(path: str | Path, model: Model) -> str | None:
    """What :func:`tensor_batches` casts that the model's input type cannot hold exactly
    (float64 data fed to a float32 input: its digits beyond float32 dropped), once per
    input over every file; None when nothing is."""
    names, types = tuple(model.input_names()), model.value_types()
    cast: dict[str, tuple[str, str]] = {}
    for file in _files(Path(path)):
        for k, dt in _dtypes(file, names).items():
            want = _ONNX_TO_NP.get(types.get(k, 0)) if k in names else None
            if want is not None and k not in cast and not np.can_cast(dt, want, "safe"):
                cast[k] = (np.dtype(dt).name, np.dtype(want).name)
    if not cast:
        return None
    parts = [f"input '{k}' is {a} in the data, fed as {b}" for k, (a, b) in cast.items()]
    return (f"{'; '.join(parts)} (the model's input type: what it cannot hold is rounded, "
            "in every figure, FP32's too)")


def load_tensor_batches(
    path: str | Path, model: Model, *, batch_size: int = TENSOR_BATCH,
    batch_axes: Mapping[str, int] | None = None,
) -> list[dict[str, np.ndarray]]:
    """All batches at once (validates everything before any work starts)."""
    return list(tensor_batches(path, model, batch_size=batch_size, batch_axes=batch_axes))
