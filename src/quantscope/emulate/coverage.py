"""What a QDQ build quantized, and what it left float and why (never silent).

=========================  ==========================================================
weights quantized          initializers the plan stores on the integer grid
weights left float         float initializers of two or more dimensions read by an op
                           whose weight the emulator does not quantize (LSTM/GRU/RNN,
                           Einsum with a constant operand, …) or by a group the plan
                           keeps at ``float``; 1-D tensors (biases, norm scales) are
                           float by design and not listed
lookup tables              float tables read by Gather (embeddings): the lookup's
                           output is quantized as an activation, the table is not
activations quantized      tensors with a Q/DQ pair (group outputs, model inputs)
ops left float             ops the emulator cannot quantize (control flow, already
                           quantized ops), ops with an implicit weight it keeps float
                           (``STFT``/``DFT``: the DFT basis, a device's Conv weights or
                           the host's work; their output is quantized) and groups the
                           plan keeps at ``float``
=========================  ==========================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from quantscope.model.groups import UNSUPPORTED
from quantscope.model.load import FLOAT_TYPES, Model
from quantscope.model.recurrent import RECURRENT_OPS
from quantscope.types import Encodings, Groups, Plan, Precision

RECURRENT = RECURRENT_OPS
# ops whose weights are implicit (no initializer to quantize): computed in float inside
# their group, only their group's output is quantized
IMPLICIT_WEIGHTS = {
    "STFT": "its DFT basis (and window) are not quantized by the emulator: the numbers do "
            "not include the 8/16-bit error of a device computing it as a Conv with quantized "
            "basis weights; check the target supports the op, or compute it on the host",
    "DFT": "its DFT basis is not quantized by the emulator: the numbers do not include the "
           "8/16-bit error of a device computing it as a MatMul with quantized basis weights; "
           "check the target supports the op, or compute it on the host",
}


@dataclass(frozen=True)
class Coverage:
    """Counts and the (tensor or node, op type, why) rows of everything left float."""

    weights_quantized: int
    activations_quantized: int
    weights_float: tuple[tuple[str, str, str], ...]
    lookup_tables: tuple[str, ...]
    ops_float: tuple[tuple[str, str, str], ...]

    @property
    def complete(self) -> bool:
        return not self.weights_float and not self.ops_float

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights_quantized": self.weights_quantized,
            "activations_quantized": self.activations_quantized,
            "weights_float": [{"tensor": t, "op_type": o, "why": w}
                              for t, o, w in self.weights_float],
            "lookup_tables": list(self.lookup_tables),
            "ops_float": [{"node": n, "op_type": o, "why": w} for n, o, w in self.ops_float],
        }

    def lines(self) -> list[str]:
        head = (f"coverage: {self.weights_quantized} weight(s) and "
                f"{self.activations_quantized} activation tensor(s) quantized")
        if self.lookup_tables:
            head += f"; {len(self.lookup_tables)} lookup table(s) float (outputs quantized)"
        out = [head + ("" if self.complete else "; LEFT FLOAT:")]
        out += [f"  weight {t} ({o}) left float: {w}" for t, o, w in self.weights_float[:12]]
        out += [f"  op {n} ({o}) left float: {w}" for n, o, w in self.ops_float[:12]]
        more = len(self.weights_float) + len(self.ops_float) - 24
        if more > 0:
            out.append(f"  … and {more} more (see the JSON 'coverage')")
        return out


WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
CONSTANT_ONLY = (
    "every operand is a constant: the op computes a constant (e.g. DeBERTa's relative "
    "position embeddings times its projection), not a layer on the data path; the emulator "
    "computes it in float, and the error of a device storing the result at 8/16 bit is not "
    "in the figures")


def _why_weight(op_type: str) -> str:
    if op_type in RECURRENT:
        return (f"{op_type} weights are not quantized by the emulator: the numbers do not "
                "include their 8/16-bit error; check the target supports the op at all")
    return f"{op_type} is not a weighted op the emulator quantizes (Conv/Gemm/MatMul)"


def coverage(model: Model, groups: Groups, plan: Plan, encodings: Encodings) -> Coverage:
    """Coverage of one build: what is on the grid, what stays float and why."""
    floats = {t.name: t for t in model.graph.initializer if t.data_type in FLOAT_TYPES}
    owner = {n: g for g in groups.groups for n in g.nodes}
    weights_float: dict[str, tuple[str, str, str]] = {}
    tables: list[str] = []
    ops_float: list[tuple[str, str, str]] = []
    for node in model.graph.node:
        g = owner.get(node.name)
        if node.op_type in UNSUPPORTED:
            ops_float.append((node.name, node.op_type, "not quantizable by the emulator"))
        elif node.op_type in IMPLICIT_WEIGHTS and g is not None:
            ops_float.append((node.name, node.op_type, IMPLICIT_WEIGHTS[node.op_type]))
        for i, t in enumerate(node.input):
            if t not in floats or t in encodings.weights or t in weights_float:
                continue
            if len(floats[t].dims) < 2 or int(np.prod(floats[t].dims)) < 2:
                continue
            if node.op_type == "Gather" and i == 0:
                tables.append(t)
            elif g is not None and plan.precision_of(g.name) is Precision.FLOAT:
                weights_float[t] = (t, node.op_type, f"group {g.name} is float in the plan")
            elif node.op_type in WEIGHTED and g is not None:
                continue  # a weighted group's weight at a precision without weight bits
            elif node.op_type in WEIGHTED and all(not x or x in floats for x in node.input):
                weights_float[t] = (t, node.op_type, CONSTANT_ONLY)
            else:
                weights_float[t] = (t, node.op_type, _why_weight(node.op_type))
    for g in groups.groups:
        if plan.precision_of(g.name) is Precision.FLOAT:
            ops_float.append((g.name, g.op_type, "the plan keeps this group float"))
    return Coverage(
        weights_quantized=len(encodings.weights),
        activations_quantized=len(encodings.activations),
        weights_float=tuple(weights_float.values()),
        lookup_tables=tuple(dict.fromkeys(tables)),
        ops_float=tuple(ops_float),
    )


