"""The ONNX checker and shape inference on a model without its weights' data.

Both take a model as bytes: ``onnx.checker.check_model`` serializes the whole proto and
parses it in C++, ``shape_inference.infer_shapes`` does that and serializes and parses the
result again: four copies of every weight for facts that do not read them (minilm-l3,
69 MB: 610 ms a load, and a run loads 28 models: each rewrite, repair and candidate).
Here both run on a light copy (:func:`light_proto`): each initializer of more than
:data:`KEEP_VALUES` values becomes a typed graph input of its shape, which is all shape
inference and the graph's checks read of it (data propagation reads only the small ones:
shape constants). What the checker checks of a tensor itself (one value field, of at
least the bytes its shape and type need) is checked on each left-out one
(:func:`_raw_data_fits`; anything else by ``onnx.checker.check_tensor``, the checker's
own words). The inferred graph gets its initializers back in their order: the same
proto as inference on the whole model gives (tests/test_weightless.py).

ONNX's version converter (:func:`convert_version`) likewise: a model below opset 21 is
raised to it at every load (16-bit Q/DQ), and the converter's copies of minilm-l3's
weights took 0.85 s of each of a run's loads; its adapters rewrite attributes and small
constant inputs (a Reshape's shape, a Split's sizes), never a layer's weights.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import shape_inference

KEEP_VALUES = 4096  # initializers up to this many values stay in the light copy
LIGHT_CONVERT_BYTES = 8 * 2**20  # below this, the copies cost less than the light copy
_VALUE_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data",
                 "uint64_data")
_SUB_BYTE = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4}  # two values a byte


def copy_fields(src: Any, dst: Any, *, skip: tuple[str, ...]) -> None:
    """Copy every set field of protobuf message ``src`` into ``dst`` except ``skip``
    (so the weights are copied once, not copied and then dropped)."""
    for fd, value in src.ListFields():
        if fd.name in skip:
            continue
        if fd.is_repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.type == fd.TYPE_MESSAGE:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def light_proto(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, list[onnx.TensorProto]]:
    """``proto`` without its large initializers (more than :data:`KEEP_VALUES` values, data
    in the file): each one not already a graph input becomes a typed one, appended after
    the model's inputs; and those left out. Every other field is copied."""
    light = onnx.ModelProto()
    copy_fields(proto, light, skip=("graph",))
    copy_fields(proto.graph, light.graph, skip=("initializer",))
    declared = {i.name for i in proto.graph.input}
    held: list[onnx.TensorProto] = []
    for t in proto.graph.initializer:
        if math.prod(t.dims) <= KEEP_VALUES or t.data_location == onnx.TensorProto.EXTERNAL:
            light.graph.initializer.append(t)
            continue
        held.append(t)
        if t.name not in declared:
            light.graph.input.append(
                onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    return light, held


def _raw_data_fits(t: onnx.TensorProto) -> bool:
    """True where the checker's rules on a tensor surely hold: raw data only, at least as
    many bytes as its shape and fixed-size type need (False: let the checker say)."""
    if (t.data_type in _SUB_BYTE or t.data_type in (onnx.TensorProto.STRING,
                                                     onnx.TensorProto.UNDEFINED)
            or t.HasField("segment") or any(d < 0 for d in t.dims)
            or any(len(getattr(t, f)) for f in _VALUE_FIELDS)):
        return False
    try:
        size = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return False
    return len(t.raw_data) >= math.prod(t.dims) * size


def check_model(proto: onnx.ModelProto) -> None:
    """``onnx.checker.check_model(proto)`` without serializing the weights; raises the
    checker's ``ValidationError``. IR versions before 4 (every initializer must be a graph
    input) are checked whole."""
    if proto.ir_version < 4:
        onnx.checker.check_model(proto)
        return
    light, held = light_proto(proto)
    onnx.checker.check_model(light)
    for t in held:
        if not _raw_data_fits(t):
            onnx.checker.check_tensor(t)


def infer_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)`` on the
    light copy, its initializers put back in their order (a new proto; ``proto`` as it
    was)."""
    light, held = light_proto(proto)
    if not held:
        return shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    inferred = shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
    del inferred.graph.input[len(proto.graph.input):]
    del inferred.graph.initializer[:]
    inferred.graph.initializer.extend(proto.graph.initializer)
    return inferred


def convert_version(proto: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """``onnx.version_converter.convert_version(proto, target)`` on the light copy, the
    left-out initializers put back where they were (the ones the converter added after
    them); raises what the converter raises. IR versions before 4 are converted whole."""
    from onnx import version_converter

    light, held = light_proto(proto)
    if proto.ir_version < 4 or sum(len(t.raw_data) for t in held) < LIGHT_CONVERT_BYTES:
        return version_converter.convert_version(proto, target)
    converted = version_converter.convert_version(light, target)
    held_by_name = {t.name: t for t in held}
    inputs = {i.name for i in proto.graph.input}
    kept = [i for i in converted.graph.input
            if i.name in inputs or i.name not in held_by_name]
    del converted.graph.input[:]
    converted.graph.input.extend(kept)
    new = {t.name: t for t in converted.graph.initializer}  # what the converter kept or added
    names = [t.name for t in proto.graph.initializer]
    out = [held_by_name[n] if n in held_by_name else new.pop(n)
           for n in names if n in held_by_name or n in new]
    out += new.values()  # the ones it added, in its order
    del converted.graph.initializer[:]
    converted.graph.initializer.extend(out)
    return converted


__all__ = ["KEEP_VALUES", "check_model", "convert_version", "copy_fields", "infer_shapes",
           "light_proto"]
