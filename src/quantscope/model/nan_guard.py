"""The NaN guard an SDPA export writes after each attention Softmax, taken out at load.

``torch.onnx.export`` of a Hugging Face encoder whose attention is PyTorch's
``scaled_dot_product_attention`` (transformers' default ``attn_implementation="sdpa"``:
DistilBERT, RoBERTa, ALBERT ... exported the way optimum and users do) decomposes it into
``MatMul -> Add(mask) -> Softmax`` and then guards the probabilities against a row whose
every key is masked:

    p = Softmax(s)
    y = Where(IsNaN(p), 0, p)         (read by the context MatMul)

The guard is not attention as the rewrites (``headsplit``, ``rowscale``) and the target
rules know it (the Softmax is read by ``IsNaN`` and ``Where``, not by one MatMul), it puts
an ``IsNaN`` and a ``Where`` layer into the compiled graph that no Hailo layer name or
precision reaches, and it changes nothing for a text with at least one token: a row is NaN
only when every key is masked, which a tokenizer's attention mask never makes (it always
keeps the first token). :func:`drop_softmax_nan_guards` makes the ``Where``'s readers read
the Softmax output and drops the ``IsNaN`` and ``Where`` (a load note says how many); the
function differs only for a row with every key masked (NaN instead of 0).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper


def _zero(name: str, consts: dict[str, onnx.TensorProto]) -> bool:
    t = consts.get(name)
    if t is None or int(np.prod(t.dims, dtype=np.int64)) > 1:
        return False
    value = numpy_helper.to_array(t)
    return bool(value.size == 1 and float(value.reshape(())) == 0.0)


def drop_softmax_nan_guards(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """The model with every ``Where(IsNaN(p), 0, p)`` after a ``Softmax`` ``p`` taken out
    (its readers read ``p``), and the note saying so; the model as given when it has none."""
    graph = proto.graph
    consts: dict[str, onnx.TensorProto] = {t.name: t for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and not n.input:
            value = next((a.t for a in n.attribute if a.name == "value"), None)
            if value is not None:
                consts[n.output[0]] = value
    nodes = list(graph.node)
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    readers: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    outputs = {o.name for o in graph.output}
    renamed: dict[str, str] = {}  # the guard's output -> the Softmax output
    dropped: set[int] = set()
    for w in nodes:
        if w.op_type != "Where" or len(w.input) != 3:
            continue
        cond, zero, p = w.input
        soft = nodes[producer[p]] if p in producer else None
        isnan = nodes[producer[cond]] if cond in producer else None
        if (soft is None or soft.op_type != "Softmax" or isnan is None
                or isnan.op_type != "IsNaN" or list(isnan.input) != [p]
                or not _zero(zero, consts) or readers.get(cond, 0) != 1
                or w.output[0] in outputs or cond in outputs):
            continue
        renamed[w.output[0]] = p
        dropped.update((producer[w.output[0]], producer[cond]))
    if not renamed:
        return proto, ()
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    kept = [n for k, n in enumerate(nodes) if k not in dropped]
    del out.graph.node[:]
    for n in kept:
        copy = out.graph.node.add()
        copy.CopyFrom(n)
        for k, i in enumerate(copy.input):
            if i in renamed:
                copy.input[k] = renamed[i]
    gone = set(renamed)
    keep_vi = [v for v in out.graph.value_info if v.name not in gone]
    del out.graph.value_info[:]
    out.graph.value_info.extend(keep_vi)
    note = (f"{len(renamed)} attention Softmax NaN guard(s) of an SDPA export "
            "(Where(IsNaN(p), 0, p)) taken out: the context MatMul reads the Softmax; the "
            "function differs only for a row with every key masked, which no tokenized "
            "text has")
    return out, (note,)
