"""An undeclared output that is an L2-normalised embedding, said to be judged by fidelity.

A speaker encoder (Resemblyzer: an LSTM, a Linear, a ReLU, then ``x / ||x||``), a face or
an image embedder given as tensors: what a deployment decides with it is a comparison (same
speaker or not at the model's threshold, the nearest enrolled identity), which tensor data
alone cannot score: it carries no labels. Undeclared, its output gets the fidelity figures
(cosine, SQNR, per channel) and this note, naming the ``verify`` layout that scores the
decisions from labels saved beside the inputs (:mod:`quantscope.tasks.verify`) and the
``embedding`` layout that needs none (each sample's nearest other sample,
:mod:`quantscope.tasks.neighbours`), so a user does not read a cosine as a verification
figure. Found
from the graph: the output is made (through Reshape, Flatten, Squeeze, Identity) by an
``LpNormalization`` with ``p = 2``, or by a ``Div`` whose divisor comes from a ``ReduceL2``
(through Clip, Max, Add, Expand, Unsqueeze, Reshape: an epsilon guard or a broadcast).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from quantscope.model.load import Model

MARK = "judged by fidelity alone (cosine, SQNR, per channel): tensor data carries no labels"
_CARRY = frozenset({"Reshape", "Flatten", "Squeeze", "Identity"})
_GUARD = frozenset({"Clip", "Max", "Add", "Expand", "Unsqueeze", "Reshape", "Identity", "Sqrt"})


def _through(producer: Mapping[str, onnx.NodeProto], name: str,
             ops: frozenset[str]) -> onnx.NodeProto | None:
    node = producer.get(name)
    while node is not None and node.op_type in ops and node.input:
        node = producer.get(node.input[0])
    return node


def _normalised(model: Model, output: str) -> bool:
    producer = {o: n for n in model.graph.node for o in n.output}
    node = _through(producer, output, _CARRY)
    if node is None:
        return False
    if node.op_type == "LpNormalization":
        return all(a.name != "p" or a.i == 2 for a in node.attribute)
    if node.op_type != "Div" or len(node.input) < 2:
        return False
    den = _through(producer, node.input[1], _GUARD)
    return den is not None and den.op_type == "ReduceL2"


def embedding_hint(model: Model, outputs: Sequence[str],
                   samples: Mapping[str, int] | None) -> str | None:
    """One note naming the undeclared ``outputs`` that are L2-normalised embeddings
    ``[N, D]`` (module docstring); None when there are none."""
    shapes = model.value_shapes()
    found = [o for o in outputs
             if (samples is None or samples.get(o, 0) == 0)
             and len(shapes.get(o) or ()) == 2 and _normalised(model, o)]
    if not found:
        return None
    names = ", ".join(f"'{o}'" for o in found)
    many = len(found) > 1
    return (f"output{'s' if many else ''} {names} {'are' if many else 'is an'} L2-normalised "
            f"embedding{'s' if many else ''}, {MARK}, so the decisions made with it (same "
            "speaker or identity at the model's threshold, the nearest enrolled one) are not "
            f"scored: save one label per sample beside the inputs and declare --layout "
            f"{found[0]}=verify:labels=NAME[,threshold=T] (every pair decided as FP32 "
            f"decides it), or without labels --layout {found[0]}=embedding (each sample's "
            "nearest other sample as FP32's)")
