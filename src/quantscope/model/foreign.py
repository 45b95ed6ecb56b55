"""Ops outside the ONNX standard domain: refused at load, in one line naming them.

ONNX Runtime's transformer optimiser (``onnxruntime.transformers.optimizer.optimize_model``)
fuses a BERT into ``com.microsoft`` contrib ops: ``EmbedLayerNormalization`` (the word,
position and token-type lookups, their sum and the LayerNorm in one node), ``Attention`` /
``MultiHeadAttention`` (the Q/K/V projections, scores, Softmax and context in one node),
``SkipLayerNormalization``, ``BiasGelu`` / ``FastGelu``. quantscope cannot group, quantize
or emulate a fused node (its weights and every intermediate tensor are inside it and would
stay float), and the NPU compilers it writes for take standard ONNX ops; a model with
them is refused before any work, never scored with float layers in it.

A node in the standard domain whose op type ONNX does not define is refused the same way
(:func:`refuse_unknown_ops`), before the ONNX checker's "No Op registered": ``tf2onnx
--tflite`` writes a TFLite custom op it has no handler for as it is, prefixed ``TFL_``
(MediaPipe's ``Convolution2DTransposeBias`` in its selfie segmentation), and says so only
in its log. The line names the node and what to put in its place.
"""

from __future__ import annotations

from collections import Counter

import onnx

from quantscope.types import QuantscopeError

STANDARD_DOMAINS = frozenset({"", "ai.onnx"})


def foreign_ops(proto: onnx.ModelProto) -> Counter[tuple[str, str]]:
    """(domain, op type) -> count of the graph's nodes outside the standard domain (a call
    of a function the model defines itself, as torch's exporter writes, is not one)."""
    local = {(f.domain, f.name) for f in proto.functions}
    return Counter((n.domain, n.op_type) for n in proto.graph.node
                   if n.domain not in STANDARD_DOMAINS and (n.domain, n.op_type) not in local)


# custom ops of converted TFLite models whose ONNX form is known: what to put in their place
KNOWN_CUSTOM = {
    "Convolution2DTransposeBias": (
        "MediaPipe's Convolution2DTransposeBias is a ConvTranspose (its stride, 2 in "
        "MediaPipe's models, and kernel; the TFLite weight [out, kh, kw, in] transposed to "
        "ONNX's [in, out, kh, kw]) with its bias as the ConvTranspose's B, on the NCHW "
        "tensor before the Transpose that feeds it"),
}


def unknown_ops(proto: onnx.ModelProto) -> dict[str, list[str]]:
    """Op type -> names of the nodes in the standard domain whose op type ONNX does not
    define (a model-local function is not one)."""
    local = {(f.domain, f.name) for f in proto.functions}
    found: dict[str, list[str]] = {}
    for n in proto.graph.node:
        if (n.domain in STANDARD_DOMAINS and (n.domain, n.op_type) not in local
                and not onnx.defs.has(n.op_type)):
            found.setdefault(n.op_type, []).append(n.name or n.output[0])
    return found


def refuse_unknown_ops(proto: onnx.ModelProto, source: str) -> None:
    """Raise one line naming each node whose op is no ONNX op, and the fix."""
    found = unknown_ops(proto)
    if not found:
        return
    ops = ", ".join(f"{op} ('{names[0]}'" + (f" and {len(names) - 1} more)" if len(names) > 1
                                              else ")") for op, names in sorted(found.items()))
    tflite = [op.removeprefix("TFL_") for op in found if op.startswith("TFL_")]
    what = (" (TFLite custom ops the converter left as they are: tf2onnx --tflite writes one "
            "it has no handler for with a TFL_ prefix and says so only in its log, "
            "'Unsupported ops')" if tflite else "")
    known = [KNOWN_CUSTOM[op] for op in tflite if op in KNOWN_CUSTOM]
    fix = ("; ".join(known) + ": replace the node with those ONNX ops" if known else
           "replace each with standard ONNX ops computing the same, or export the model "
           "without it")
    raise QuantscopeError(
        f"model '{source}' has {sum(len(v) for v in found.values())} node(s) whose op ONNX "
        f"{onnx.__version__} does not define: {ops}{what}; ONNX Runtime and the NPU "
        f"compilers cannot run them: {fix}"
    )


def refuse_foreign_ops(proto: onnx.ModelProto, source: str) -> None:
    """Raise one line naming every non-standard op (and the fix) if the graph has any."""
    found = foreign_ops(proto)
    if not found:
        return
    ops = ", ".join(f"{d}.{op} x{k}" if k > 1 else f"{d}.{op}"
                    for (d, op), k in sorted(found.items()))
    if any(d == "com.microsoft" for d, _ in found):
        fix = ("give the model as exported, before ONNX Runtime's transformer optimiser "
               "(onnxruntime.transformers.optimizer) fused it, with standard ONNX ops")
    else:
        fix = "re-export the model with standard ONNX ops only"
    raise QuantscopeError(
        f"model '{source}' has {sum(found.values())} op(s) outside the ONNX standard "
        f"domain ({ops}) that quantscope cannot quantize or emulate and NPU compilers do "
        f"not take: {fix}"
    )
