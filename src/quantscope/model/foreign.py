"""Ops outside the ONNX standard domain: refused at load, in one line naming them.

ONNX Runtime's transformer optimiser (``onnxruntime.transformers.optimizer.optimize_model``)
fuses a BERT into ``com.microsoft`` contrib ops: ``EmbedLayerNormalization`` (the word,
position and token-type lookups, their sum and the LayerNorm in one node), ``Attention`` /
``MultiHeadAttention`` (the Q/K/V projections, scores, Softmax and context in one node),
``SkipLayerNormalization``, ``BiasGelu`` / ``FastGelu``. quantscope cannot group, quantize
or emulate a fused node (its weights and every intermediate tensor are inside it and would
stay float), and the NPU compilers it writes for take standard ONNX ops; a model with
them is refused before any work, never scored with float layers in it.
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
