"""Recurrent ops ONNX Runtime cannot run: refused at load, in one line naming them.

ONNX Runtime's CPU kernels for ``LSTM``, ``GRU`` and ``RNN`` take ``layout = 0`` only
(``X [T, N, F]``); a node with ``layout = 1`` (samples first, ``X [N, T, F]``, opset 14+)
fails when its session is created, with a message about a kernel's source line. Every
figure quantscope gives comes from ONNX Runtime, so such a model is refused before any
work, naming the nodes and the fix.
"""

from __future__ import annotations

import onnx

from quantscope.types import QuantscopeError

RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})


def batch_first_recurrent(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The graph's recurrent nodes with ``layout = 1``."""
    return [n for n in proto.graph.node if n.op_type in RECURRENT_OPS and n.domain in ("", "ai.onnx")
            and any(a.name == "layout" and a.i == 1 for a in n.attribute)]


def refuse_batch_first_recurrent(proto: onnx.ModelProto, source: str) -> None:
    """Raise one line naming every ``layout = 1`` recurrent node (and the fix) if any."""
    found = batch_first_recurrent(proto)
    if not found:
        return
    names = ", ".join(f"{n.op_type} '{n.name}'" if n.name else f"{n.op_type} (output '{n.output[0]}')"
                      for n in found[:5])
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    raise QuantscopeError(
        f"model '{source}' has {len(found)} recurrent node(s) with layout=1 (samples first, "
        f"X [N, T, F]): {names}{more}; ONNX Runtime, which computes every figure, runs "
        "LSTM/GRU/RNN with layout=0 only: export with layout=0 (torch.onnx does, even for "
        "batch_first=True, adding Transposes) or put Transposes around the node "
        "(X, initial_h/c perm [1, 0, 2]; Y [T, D, N, H] perm [2, 0, 1, 3]; Y_h/Y_c perm [1, 0, 2])"
    )


# the inputs of a recurrent node that carry the samples, and their sample axis at layout 0
# (layout 1 puts the samples first): X [T, N, F], sequence_lens [N], initial_h/c [D, N, H]
_SAMPLED_INPUTS = {0: (1, 0), 4: (0, 0), 5: (1, 0), 6: (1, 0)}


def recurrent_sample_axes(proto: onnx.ModelProto) -> dict[str, int]:
    """Graph input -> its sample axis, for the inputs a recurrent node reads directly
    (``X``, ``sequence_lens``, ``initial_h``, ``initial_c``): the graph's own word on which
    of two symbolic dims (``X [T, N, F]``) counts the samples."""
    inputs = {i.name for i in proto.graph.input}
    out: dict[str, int] = {}
    for n in proto.graph.node:
        if n.op_type not in RECURRENT_OPS or n.domain not in ("", "ai.onnx"):
            continue
        layout = next((a.i for a in n.attribute if a.name == "layout"), 0)
        for k, (at0, at1) in _SAMPLED_INPUTS.items():
            if k < len(n.input) and n.input[k] in inputs:
                out.setdefault(n.input[k], at1 if layout == 1 else at0)
    return out
