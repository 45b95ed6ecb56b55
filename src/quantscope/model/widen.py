"""A float16 (or bfloat16) model is emulated as its float32 form.

The emulator's Q/DQ pairs carry float32 scales, so a graph that computes in float16 (a
``model.half()`` export, or float16 inputs) failed in ONNX Runtime with a type error
("Type parameter (T1) of Optype (QuantizeLinear) bound to different types") that blamed
the runtime. An NPU quantizes the float model anyway; its float reference is the float32
computation of the same weights.

=========================  ===========================================================
float16 initializers       widened to float32 (exact)
float16 graph inputs,      declared float32 (float16 data is widened when it is fed)
outputs and value_info
``Cast``/``ConstantOfShape``/``Constant``/``dtype`` attributes
                           float16 made float32
=========================  ===========================================================

bfloat16 (``model.bfloat16()`` exports) is widened the same way (exactly too): without
it such a model was refused as having "nothing to quantize: no float input", which it has.
"""

from __future__ import annotations

import onnx
from onnx import numpy_helper

F16, F32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
NARROW = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16"}


def _widen_tensor(t: onnx.TensorProto) -> bool:
    if t.data_type not in NARROW:
        return False
    widened = numpy_helper.from_array(numpy_helper.to_array(t).astype("float32"), t.name)
    t.CopyFrom(widened)
    return True


def _widen_attributes(node: onnx.NodeProto) -> bool:
    changed = False
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR:
            changed |= _widen_tensor(attr.t)
        elif attr.type == onnx.AttributeProto.INT and attr.name in ("to", "dtype") \
                and attr.i in NARROW:
            attr.i = F32
            changed = True
    return changed


def widen_float16(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """``proto`` with every float16/bfloat16 tensor, type and cast made float32, and a
    note saying so (``proto`` itself, and no note, when it has neither)."""
    graph = proto.graph
    values = [*graph.input, *graph.output, *graph.value_info]
    found = ({t.data_type for t in graph.initializer}
             | {v.type.tensor_type.elem_type for v in values}
             | {a.t.data_type for n in graph.node for a in n.attribute
                if a.type == onnx.AttributeProto.TENSOR}
             | {a.i for n in graph.node for a in n.attribute if a.name in ("to", "dtype")})
    kinds = " and ".join(name for t, name in NARROW.items() if t in found)
    if not kinds:
        return proto, ()
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    weights = sum(_widen_tensor(t) for t in graph.initializer)
    nodes = sum(_widen_attributes(n) for n in graph.node)
    names = [v.name for v in graph.input if v.type.tensor_type.elem_type in NARROW]
    for v in [*graph.input, *graph.output, *graph.value_info]:
        if v.type.tensor_type.elem_type in NARROW:
            v.type.tensor_type.elem_type = F32
    note = (f"the model computes in {kinds}: emulated as its float32 form ({weights} "
            f"{kinds} initializer(s) widened exactly, {nodes} cast/constant node(s) made "
            "float32" + (f"; input(s) {', '.join(names)} fed as float32" if names else "")
            + "); the FP32 reference, the QDQ model and the model to compile are that form")
    return out, (note,)
