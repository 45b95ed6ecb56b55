"""ONNX graph -> torch module (an interpreter over the op registry in :mod:`.ops`).

The student is converted FROM the QDQ graph that ``emulate.qdq.build_qdq`` wrote, so
training and measurement agree on where and how every tensor is quantized:

=======================================  ============================================
QuantizeLinear -> DequantizeLinear pair  :class:`~.fakequant.ActQuant` keyed by the
                                         tensor name ``encode`` uses (``t`` for
                                         ``t_float -> Q -> DQ -> t``; ``x`` for a model
                                         input ``x -> Q -> DQ -> x_dq``)
DequantizeLinear of ``W_quantized``      the FP32 initializer ``W`` (the DQ output
                                         name) as a torch Parameter, fake-quantised by
                                         :class:`~.fakequant.WeightQuant`
float initializers                       Parameters (biases, LayerNorm scales …) unless
                                         ``trainable`` says no (default: embedding
                                         tables read by Gather and scalars stay fixed)
Constant nodes, integer initializers     fixed buffers
any other op                             the function registered in ``ops.OPS``
=======================================  ============================================
A converted FP32 graph (no Q/DQ) is the teacher.

On an accelerator (:meth:`GraphModule.place`) the float tensors and the feeds live on the
device while integer constants and the outputs of Shape stay on the CPU: shape arithmetic
(Shape -> Gather -> Concat -> Reshape …) then never waits for the device, and an op that
mixes the two (a Range of positions indexing a table) gets its CPU operands moved over.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from quantscope.finetune.fakequant import ActQuant, WeightQuant, storage_bits
from quantscope.finetune.ops import OPS, attributes
from quantscope.threads import default_threads
from quantscope.types import QuantScheme, QuantscopeError

Tensor = torch.Tensor
ACT_FQ, WEIGHT_FQ = "FakeQuant", "WeightFakeQuant"
FLOAT_SUFFIX = "\x00float"  # interpreter key of a quantized weight's float Parameter


@dataclass(frozen=True)
class Step:
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any]
    quant: int = -1  # index into the module's ActQuant / WeightQuant list


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for t in node.input:
            out.setdefault(t, []).append(node)
    return out


def _constant_value(node: onnx.NodeProto) -> np.ndarray:
    a = attributes(node)
    if "value" in a:
        return numpy_helper.to_array(a["value"])
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        if key in a:
            return np.asarray(a[key], dtype=dtype)
    raise QuantscopeError(f"finetune: Constant node '{node.name}' has no supported value")


def default_trainable(name: str, array: np.ndarray, gather_tables: set[str]) -> bool:
    """Train float tensors with more than one value, except embedding tables."""
    return array.size > 1 and name not in gather_tables


class GraphModule(nn.Module):
    """A torch interpreter of one ONNX graph (see the module docstring)."""

    def __init__(self, proto: onnx.ModelProto, *, float_weights: dict[str, np.ndarray] | None = None,
                 scheme: QuantScheme | None = None,
                 trainable: Callable[[str, np.ndarray, set[str]], bool] = default_trainable,
                 ) -> None:
        super().__init__()
        graph = proto.graph
        scheme = scheme or QuantScheme()
        inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        consumers = _consumers(graph)
        self.input_names = tuple(i.name for i in graph.input if i.name not in inits)
        self.output_names = tuple(o.name for o in graph.output)
        self.act_quants = nn.ModuleList()
        self.weight_quants = nn.ModuleList()
        self.steps: list[Step] = []
        qdq_params: set[str] = set()
        values: dict[str, np.ndarray] = {}
        skip: set[str] = set()  # outputs of DequantizeLinear nodes already paired
        for node in graph.node:
            if node.op_type == "DequantizeLinear" and node.output[0] in skip:
                continue
            if node.op_type == "Constant":
                values[node.output[0]] = _constant_value(node)
            elif node.op_type == "QuantizeLinear":
                self._act_pair(node, consumers, inits, skip, qdq_params)
            elif node.op_type == "DequantizeLinear":
                w = self._weight_dq(node, inits, float_weights, scheme, qdq_params)
                values[node.output[0] + FLOAT_SUFFIX] = w
            elif node.op_type in OPS:
                self.steps.append(Step(node.op_type, tuple(node.input), tuple(node.output),
                                       attributes(node)))
            else:
                raise QuantscopeError(
                    f"finetune: op {node.op_type} (node '{node.name}') has no torch converter; "
                    f"supported: {', '.join(sorted(OPS))}")
        self._register(inits, values, qdq_params, consumers, trainable)
        self.device = torch.device("cpu")

    # ------------------------------------------------------------------ conversion

    def _act_pair(self, q: onnx.NodeProto, consumers: dict[str, list[onnx.NodeProto]],
                  inits: dict[str, np.ndarray], skip: set[str], qdq_params: set[str]) -> None:
        users = consumers.get(q.output[0], [])
        if len(users) != 1 or users[0].op_type != "DequantizeLinear" or \
                list(users[0].input[1:]) != list(q.input[1:3]):
            raise QuantscopeError(f"finetune: QuantizeLinear '{q.name}' is not followed by its "
                                  "DequantizeLinear (not a graph the QDQ writer made)")
        dq = users[0]
        skip.add(dq.output[0])
        src, dst = q.input[0], dq.output[0]
        key = dst if src == f"{dst}_float" else src
        zp_type = self._init_type(q.input[2], inits)
        bits, signed = storage_bits(zp_type)
        axis = attributes(q).get("axis") if inits[q.input[1]].ndim == 1 else None
        self.act_quants.append(ActQuant(key, inits[q.input[1]], inits[q.input[2]].astype(np.int64),
                                        bits, signed, axis))
        qdq_params.update(q.input[1:3])
        self.steps.append(Step(ACT_FQ, (src,), (dst,), {}, len(self.act_quants) - 1))

    def _weight_dq(self, dq: onnx.NodeProto, inits: dict[str, np.ndarray],
                   float_weights: dict[str, np.ndarray] | None, scheme: QuantScheme,
                   qdq_params: set[str]) -> np.ndarray:
        codes, name = dq.input[0], dq.output[0]
        if codes not in inits:
            raise QuantscopeError(f"finetune: DequantizeLinear '{dq.name}' without its "
                                  "QuantizeLinear does not read an initializer")
        bits, signed = storage_bits(self._init_type(dq.input[2], inits))
        scale = inits[dq.input[1]]
        axis = attributes(dq).get("axis", 1) if scale.ndim == 1 else None
        if float_weights is not None and name in float_weights:
            w = np.asarray(float_weights[name], np.float32)
        else:  # no FP32 copy given: start from the dequantized codes
            shape = [1] * inits[codes].ndim
            if axis is not None:
                shape[axis] = -1
            zp = inits[dq.input[2]].astype(np.float32).reshape(shape)
            w = ((inits[codes].astype(np.float32) - zp) * scale.reshape(shape)).astype(np.float32)
        self.weight_quants.append(WeightQuant(name, bits, signed, axis, scheme.weight_symmetric))
        qdq_params.update([*dq.input[1:3], codes])
        self.steps.append(Step(WEIGHT_FQ, (name + FLOAT_SUFFIX,), (name,), {},
                               len(self.weight_quants) - 1))
        return w

    @staticmethod
    def _init_type(name: str, inits: dict[str, np.ndarray]) -> int:
        return onnx.helper.np_dtype_to_tensor_dtype(inits[name].dtype)

    def _register(self, inits: dict[str, np.ndarray], values: dict[str, np.ndarray],
                  qdq_params: set[str], consumers: dict[str, list[onnx.NodeProto]],
                  trainable: Callable[[str, np.ndarray, set[str]], bool]) -> None:
        gather = {n.input[0] for nodes in consumers.values() for n in nodes if n.op_type == "Gather"}
        consts = {**{k: v for k, v in inits.items() if k not in qdq_params}, **values}
        self.param_names: dict[str, str] = {}  # ONNX initializer name -> torch attribute
        self.env_names: dict[str, str] = {}  # interpreter key -> torch attribute
        for i, (key, arr) in enumerate(sorted(consts.items())):
            name = key.removesuffix(FLOAT_SUFFIX)
            attr = f"t{i}_{re.sub(r'[^0-9A-Za-z_]', '_', name)[-40:]}"
            tensor = torch.from_numpy(np.array(arr))
            if tensor.is_floating_point() and (key != name or trainable(name, arr, gather)):
                self.register_parameter(attr, nn.Parameter(tensor.float()))
                self.param_names[name] = attr
            else:
                self.register_buffer(attr, tensor)
            self.env_names[key] = attr

    def place(self, device: str | torch.device) -> GraphModule:
        """Move the module to ``device``; integer buffers stay on the CPU (see above)."""
        self.device = dev = torch.device(device)
        return self._apply(lambda t: t.to(dev) if t.is_floating_point() else t)

    # ------------------------------------------------------------------ running

    def trained_weights(self) -> dict[str, nn.Parameter]:
        """ONNX initializer name -> its Parameter."""
        return {name: getattr(self, attr) for name, attr in self.param_names.items()}

    @contextmanager
    def weights_held(self) -> Iterator[None]:
        """Inside, each weight is fake-quantised once and reused by every forward pass
        (one optimiser step's several passes, one backward over their summed loss): a
        decode step reads every weight for one token, so re-quantising them per pass
        would cost more than the pass."""
        for q in self.weight_quants:
            q.hold, q._held = True, None
        try:
            yield
        finally:
            for q in self.weight_quants:
                q.hold, q._held = False, None

    def quant_parameters(self) -> Iterable[nn.Parameter]:
        return self.act_quants.parameters()

    def ranges(self) -> dict[str, tuple[float, float]]:
        """Tensor -> learned ``(lo, hi)`` of every per-tensor activation Q/DQ pair."""
        return {q.key: q.range() for q in self.act_quants if q.s0.dim() == 0}

    def forward(self, feeds: dict[str, Any], taps: Iterable[str] = ()) -> tuple[list[Tensor],
                                                                               dict[str, Tensor]]:
        """Graph outputs in order, and the tapped intermediate tensors by name."""
        env: dict[str, Any] = {n: getattr(self, a) for n, a in self.env_names.items()}
        env[""] = None
        mixed = self.device.type != "cpu"
        for name in self.input_names:
            v = feeds[name]
            t = v if isinstance(v, torch.Tensor) else torch.from_numpy(np.asarray(v))
            env[name] = t.to(self.device) if mixed else t
        for step in self.steps:
            args = [env[t] for t in step.inputs]
            if mixed and step.op not in _SHAPE_OPERANDS:
                args = _one_device(args)
            if step.op == ACT_FQ:
                out: Any = self.act_quants[step.quant](args[0])
            elif step.op == WEIGHT_FQ:
                out = self.weight_quants[step.quant](args[0])
            else:
                out = OPS[step.op](args, step.attrs)
            outs = out if isinstance(out, tuple) else (out,)
            env.update(zip(step.outputs, outs, strict=False))
        return [env[n] for n in self.output_names], {t: env[t] for t in taps}


# ops left to run where their first operand is: the rest are read as Python ints (shapes,
# axes, bounds), or there is no other operand (the quantizers)
_SHAPE_OPERANDS = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Slice", "Expand", "Shape",
                             "ConstantOfShape", "Range", "CumSum", "Pad", ACT_FQ, WEIGHT_FQ})


def _one_device(args: list[Any]) -> list[Any]:
    """The operands of one op on one device: CPU tensors join an accelerator's."""
    dev = next((a.device for a in args if isinstance(a, Tensor) and a.device.type != "cpu"),
               None)
    if dev is None:
        return args
    return [a.to(dev) if isinstance(a, Tensor) and a.device != dev else a for a in args]


def to_torch(proto: onnx.ModelProto, *, float_weights: dict[str, np.ndarray] | None = None,
             scheme: QuantScheme | None = None) -> GraphModule:
    """Convert an ONNX graph (FP32, or QDQ from ``build_qdq`` plus its FP32 weights).

    ``$QUANTSCOPE_THREADS``, when set, sizes PyTorch's CPU pool (quantscope.threads)."""
    if threads := default_threads():
        torch.set_num_threads(threads)
    return GraphModule(proto, float_weights=float_weights, scheme=scheme)
