"""An already-quantized model is refused at load, in one line saying what it is.

A user passes the output of ``onnxruntime.quantization`` (or of quantscope itself) by
mistake. quantscope quantizes a float model: on a quantized one it would put its own
Q/DQ around ops whose weights are already on an 8-bit grid (a silent double
quantization), and its FP32 reference would be the quantized model. Each form is named
with the tool that writes it, and the fix is the float model it was made from:

=====================  =============================================================
QDQ                    ``QuantizeLinear`` / ``DequantizeLinear`` pairs
                       (``quantize_static``, quantscope's ``quantized.qdq.onnx``)
dynamic                ``DynamicQuantizeLinear`` + ``MatMulInteger`` / ``ConvInteger``
                       (``quantize_dynamic``)
QOperator              ``QLinearConv``, ``QLinearMatMul``, ``com.microsoft.QGemm``,
                       ``QLinearAdd`` … (``quantize_static(quant_format=QOperator)``)
weight-only            ``com.microsoft.MatMulNBits`` … (``MatMulNBitsQuantizer``)
=====================  =============================================================
"""

from __future__ import annotations

from collections import Counter

import onnx

from quantscope.types import QuantscopeError

_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})
_DYNAMIC = frozenset({"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
                      "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLSTM"})
# QOperator ops not named QLinear*: the contrib domain's quantized kernels
_QOPERATOR = frozenset({"QGemm", "QAttention", "QEmbedLayerNormalization",
                        "QOrderedMatMul", "QOrderedAttention"})
_WEIGHT_ONLY = frozenset({"MatMulNBits", "MatMulBnb4", "GatherBlockQuantized"})


def _form(op_type: str) -> str | None:
    if op_type in _WEIGHT_ONLY:
        return "weight-only"
    if op_type.startswith("QLinear") or op_type in _QOPERATOR:
        return "QOperator"
    if op_type in _DYNAMIC:
        return "dynamic"
    if op_type in _QDQ:
        return "QDQ"
    return None


_WRITER = {
    "QOperator": "QOperator format, as onnxruntime.quantization.quantize_static("
                 "quant_format=QOperator) writes",
    "dynamic": "dynamically quantized, as onnxruntime.quantization.quantize_dynamic writes",
    "QDQ": "QDQ format, as onnxruntime.quantization.quantize_static or quantscope's "
           "quantized.qdq.onnx write",
    "weight-only": "weights in 4/8-bit blocks, as onnxruntime.quantization's "
                   "MatMulNBitsQuantizer writes",
}


def quantized_ops(proto: onnx.ModelProto) -> Counter[tuple[str, str]]:
    """(form, op type) -> count of the graph's nodes that only a quantized model has."""
    found: Counter[tuple[str, str]] = Counter()
    for node in proto.graph.node:
        form = _form(node.op_type)
        if form is not None:
            name = node.op_type if node.domain in ("", "ai.onnx") else \
                f"{node.domain}.{node.op_type}"
            found[(form, name)] += 1
    return found


def refuse_prequantized(proto: onnx.ModelProto, source: str) -> None:
    """Raise one line naming the model's quantized form and ops (and the fix) if it has
    any: the float model is what quantscope quantizes."""
    found = quantized_ops(proto)
    if not found:
        return
    forms = Counter[str]()
    for (form, _), k in found.items():
        forms[form] += k
    form = next(f for f in ("weight-only", "QOperator", "dynamic", "QDQ") if f in forms)
    ops = ", ".join(f"{op} x{k}" if k > 1 else op
                    for (_, op), k in sorted(found.items(), key=lambda x: (-x[1], x[0])))
    raise QuantscopeError(
        f"model '{source}' is already quantized ({_WRITER[form]}: {ops}); quantscope "
        "quantizes a float model itself and would quantize this one twice: pass the float "
        "model it was made from")
