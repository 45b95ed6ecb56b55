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

import hashlib
import math
from typing import Any

import numpy as np
import onnx
from onnx import shape_inference

from quantscope.kept import Kept

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


def append_copies(container: Any, messages: Any) -> None:
    """``container.extend(messages)``, each message copied into a new element by
    ``CopyFrom``: the same elements, 3x faster where they hold weights (upb's ``extend``
    copied minilm-l3's 69 MB of weights in 0.12-0.17 s, ``add().CopyFrom`` in 0.04-0.06 s;
    1 us slower a message on tiny ones)."""
    for m in messages:
        container.add().CopyFrom(m)


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


def _size(t: onnx.TensorProto) -> int:
    """``t``'s bytes by its shape and type (its raw data's length, not copied to be
    measured: ``len(t.raw_data)`` copies it), or that length where the type has no
    fixed size."""
    try:
        return math.prod(t.dims) * np.dtype(
            onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return len(t.raw_data)


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
    append_copies(inferred.graph.initializer, proto.graph.initializer)
    return inferred


KEPT_CONVERSIONS_BYTES = 64 * 2**20  # converted graphs kept by content, at most this much
_CONVERTED: Kept[tuple[str, int], bytes] = Kept(budget=KEPT_CONVERSIONS_BYTES, weigh=len)


def _converted(proto: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """``onnx.version_converter.convert_version(proto, target)``, a new proto each call,
    the converter run once per content: a graph is converted at each of its loads, and a
    run loads the model it was given at each stage (the suite: ~70 s of its CPU in the
    converter, most of it the same tiny graphs again). The converter reads nothing but the
    proto, so its bytes are the key; the last ones are kept up to
    :data:`KEPT_CONVERSIONS_BYTES`. What it raises is raised again, each time."""
    from onnx import version_converter

    data = proto.SerializeToString()
    key = (hashlib.sha256(data).hexdigest(), target)
    out = _CONVERTED.get(key)
    if out is None:  # the converter's own C entry takes these bytes (its Python face
        cpp = getattr(version_converter, "C", None)  # serialises the proto again)
        out = _CONVERTED.put(key, cpp.convert_version(data, target) if cpp is not None else
                             version_converter.convert_version(proto, target)
                             .SerializeToString())
    converted = onnx.ModelProto()
    converted.ParseFromString(out)
    return converted


def convert_version(proto: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """``onnx.version_converter.convert_version(proto, target)`` on the light copy, the
    left-out initializers put back where they were (the ones the converter added after
    them); raises what the converter raises. IR versions before 4 are converted whole.
    Each graph converted once per process (:func:`_converted`)."""
    light, held = light_proto(proto)
    if proto.ir_version < 4 or sum(map(_size, held)) < LIGHT_CONVERT_BYTES:
        return _converted(proto, target)
    converted = _converted(light, target)
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
    append_copies(converted.graph.initializer, out)
    return converted


__all__ = ["KEEP_VALUES", "append_copies", "check_model", "convert_version", "copy_fields",
           "infer_shapes", "light_proto"]
