"""Tensor data: ``.npy`` / ``.npz`` files or a folder of them, checked against the model.

=============  ============================================================
``x.npy``      one array for a single-input model; first axis = samples
``x.npz``      one array per model input, keyed by input name
folder         every ``.npy``/``.npz`` inside (sorted); each file is one or
               more batches (files may differ in non-batch dims, e.g. length)
=============  ============================================================
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx

from quantscope.model.load import Model
from quantscope.types import QuantscopeError

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


def _check_dims(arrays: dict[str, np.ndarray], model: Model, where: Path) -> None:
    """The inputs agree on the samples and on every named (symbolic) dimension."""
    shapes, seen = model.value_shapes(), {}
    for name in model.input_names():
        want, arr = shapes.get(name) or (), arrays[name]
        dims = [("sample count", 0)] + [(f"dimension '{d}'", i)
                                            for i, d in enumerate(want) if isinstance(d, str)]
        for label, axis in dict(dims).items():
            if arr.ndim <= axis:
                continue
            size = arr.shape[axis]
            first = seen.setdefault(label, (name, size))
            if first[1] != size:
                raise QuantscopeError(
                    f"data '{where}': {label} is {first[1]} in input '{first[0]}' but {size} "
                    f"in input '{name}': give every input the same {label}")


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


def _check(arrays: dict[str, np.ndarray], model: Model, where: Path) -> None:
    shapes, types = model.value_shapes(), model.value_types()
    for name in model.input_names():
        if name not in arrays:
            raise QuantscopeError(
                f"data '{where}' has no array for model input '{name}' "
                f"(it has {', '.join(sorted(arrays)) or 'none'}): key the .npz by input name"
            )
        arr, want = arrays[name], shapes.get(name)
        expect = _ONNX_TO_NP.get(types.get(name, 0))
        if expect is not None and arr.dtype != expect:
            if not (np.issubdtype(arr.dtype, np.floating) and np.issubdtype(expect, np.floating)):
                raise QuantscopeError(
                    f"data '{where}' input '{name}' is {arr.dtype}, the model wants "
                    f"{np.dtype(expect)}: convert it (e.g. arr.astype('{np.dtype(expect)}'))"
                )
        if want is not None and (arr.ndim != len(want) or any(
            isinstance(d, int) and d != s for d, s in zip(want[1:], arr.shape[1:], strict=False)
        )):
            raise QuantscopeError(
                f"data '{where}' input '{name}' has shape {arr.shape}, the model wants "
                f"{tuple(d if isinstance(d, int) else '?' for d in want)}: reshape the data"
            )
        if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
            raise QuantscopeError(
                f"data '{where}' input '{name}' contains NaN or Inf: clean the data first"
            )
    _check_dims(arrays, model, where)
    check_token_ids(arrays, model, where)


def tensor_batches(
    path: str | Path, model: Model, *, batch_size: int = 32
) -> Iterator[dict[str, np.ndarray]]:
    """Yield checked feed dicts of at most ``batch_size`` samples, file by file."""
    names = model.input_names()
    types = model.value_types()
    for file in _files(Path(path)):
        arrays = _read(file, names)
        _check(arrays, model, file)
        n = len(arrays[names[0]])
        if n == 0:
            raise QuantscopeError(f"data file '{file}' holds zero samples: remove it")
        for start in range(0, n, batch_size):
            feed = {}
            for k in names:
                dt = _ONNX_TO_NP.get(types.get(k, 0), arrays[k].dtype)
                feed[k] = arrays[k][start : start + batch_size].astype(dt, copy=False)
            yield feed


def load_tensor_batches(
    path: str | Path, model: Model, *, batch_size: int = 32
) -> list[dict[str, np.ndarray]]:
    """All batches at once (validates everything before any work starts)."""
    return list(tensor_batches(path, model, batch_size=batch_size))
