"""ONNX op -> torch function, one small function per op (explicit registry below).

Each function takes the node's input tensors (``None`` for an omitted optional input)
and its attributes as a dict, and returns one tensor or a tuple of tensors. Shape
arithmetic (Shape, Gather on shapes, Concat, Range …) runs on int64 torch tensors, so
the same converted module serves every batch size and sequence length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import helper

from quantscope.finetune import ops_decoder as D
from quantscope.finetune import ops_vision as V
from quantscope.types import QuantscopeError

Tensor = torch.Tensor
OpFn = Callable[[list[Any], dict[str, Any]], Any]

_DTYPES = {
    onnx.TensorProto.FLOAT: torch.float32, onnx.TensorProto.DOUBLE: torch.float64,
    onnx.TensorProto.INT64: torch.int64, onnx.TensorProto.INT32: torch.int32,
    onnx.TensorProto.BOOL: torch.bool, onnx.TensorProto.UINT8: torch.uint8,
    onnx.TensorProto.INT8: torch.int8, onnx.TensorProto.FLOAT16: torch.float16,
}


def torch_dtype(onnx_type: int) -> torch.dtype:
    try:
        return _DTYPES[onnx_type]
    except KeyError:
        name = onnx.TensorProto.DataType.Name(onnx_type)
        raise QuantscopeError(f"finetune: tensor type {name} is not supported") from None


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _ints(t: Tensor) -> list[int]:
    return [int(v) for v in t.reshape(-1).tolist()]


def _reshape(x: list[Any], a: dict[str, Any]) -> Tensor:
    shape = _ints(x[1])
    if not a.get("allowzero", 0):
        shape = [x[0].shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x[0].reshape(shape)


def _unsqueeze(x: list[Any], a: dict[str, Any]) -> Tensor:
    axes = _ints(x[1]) if len(x) > 1 and x[1] is not None else list(a["axes"])
    out = x[0]
    rank = out.dim() + len(axes)
    for ax in sorted(v % rank for v in axes):
        out = out.unsqueeze(ax)
    return out


def _squeeze(x: list[Any], a: dict[str, Any]) -> Tensor:
    axes = _ints(x[1]) if len(x) > 1 and x[1] is not None else a.get("axes")
    if axes is None:
        return x[0].squeeze()
    return x[0].squeeze(tuple(v % x[0].dim() for v in axes))


def _slice(x: list[Any], a: dict[str, Any]) -> Tensor:
    data, starts, ends = x[0], _ints(x[1]), _ints(x[2])
    axes = _ints(x[3]) if len(x) > 3 and x[3] is not None else list(range(len(starts)))
    steps = _ints(x[4]) if len(x) > 4 and x[4] is not None else [1] * len(starts)
    index: list[slice] = [slice(None)] * data.dim()
    for s, e, ax, st in zip(starts, ends, axes, steps, strict=True):
        if st <= 0:
            raise QuantscopeError("finetune: Slice with a non-positive step is not supported")
        n = data.shape[ax]
        index[ax % data.dim()] = slice(max(min(s, n), -n), max(min(e, n), -n - 1), st)
    return data[tuple(index)]


def _gather(x: list[Any], a: dict[str, Any]) -> Tensor:
    axis = a.get("axis", 0) % x[0].dim()
    idx = x[1].long()
    idx = torch.where(idx < 0, idx + x[0].shape[axis], idx)
    if axis == 0 and x[0].is_floating_point() and idx.dim() >= 1 and x[0].dim() == 2:
        return F.embedding(idx, x[0])
    return x[0].index_select(axis, idx.reshape(-1)).reshape(
        (*x[0].shape[:axis], *idx.shape, *x[0].shape[axis + 1:]))


def _concat(x: list[Any], a: dict[str, Any]) -> Tensor:
    return torch.cat([t for t in x if t is not None and t.numel() > 0] or x[:1], dim=a["axis"])


def _expand(x: list[Any], a: dict[str, Any]) -> Tensor:
    shape = _ints(x[1])
    rank = max(len(shape), x[0].dim())
    src = [1] * (rank - x[0].dim()) + list(x[0].shape)
    shape = [1] * (rank - len(shape)) + shape
    target = [d if s == 1 else s for s, d in zip(shape, src, strict=True)]
    return x[0].reshape(src).expand(target)


def _layernorm(x: list[Any], a: dict[str, Any]) -> Tensor:
    axis = a.get("axis", -1) % x[0].dim()
    shape = x[0].shape[axis:]
    return F.layer_norm(x[0], shape, x[1], x[2] if len(x) > 2 else None, a.get("epsilon", 1e-5))


def _softmax(x: list[Any], a: dict[str, Any]) -> Tensor:
    return torch.softmax(x[0], dim=a.get("axis", -1))


def _transpose(x: list[Any], a: dict[str, Any]) -> Tensor:
    perm = a.get("perm") or list(reversed(range(x[0].dim())))
    return x[0].permute(*perm)


def _cast(x: list[Any], a: dict[str, Any]) -> Tensor:
    return x[0].to(torch_dtype(a["to"]))


def _constant_of_shape(x: list[Any], a: dict[str, Any]) -> Tensor:
    value = a.get("value")
    arr = onnx.numpy_helper.to_array(value) if value is not None else np.zeros(1, np.float32)
    return torch.full(_ints(x[0]), arr.reshape(-1)[0].item(), dtype=torch.from_numpy(arr.copy()).dtype)


def _range(x: list[Any], a: dict[str, Any]) -> Tensor:
    return torch.arange(x[0].item(), x[1].item(), x[2].item(), dtype=x[0].dtype)


def _cumsum(x: list[Any], a: dict[str, Any]) -> Tensor:
    dim = int(x[1].reshape(-1)[0].item())
    data = x[0].flip(dim) if a.get("reverse", 0) else x[0]
    out = torch.cumsum(data, dim=dim, dtype=data.dtype)
    if a.get("exclusive", 0):
        out = out - data
    return out.flip(dim) if a.get("reverse", 0) else out


def _min(x: list[Any], a: dict[str, Any]) -> Tensor:
    out = x[0]
    for other in x[1:]:
        out = torch.minimum(out, other)
    return out


def _reduce_mean(x: list[Any], a: dict[str, Any]) -> Tensor:
    axes = _ints(x[1]) if len(x) > 1 and x[1] is not None else a.get("axes")
    dims = tuple(axes) if axes is not None else tuple(range(x[0].dim()))
    return x[0].mean(dim=dims, keepdim=bool(a.get("keepdims", 1)))


def _reduce_sum(x: list[Any], a: dict[str, Any]) -> Tensor:
    """ReduceSum (axes an input since opset 13; none: every axis unless
    noop_with_empty_axes)."""
    axes = _ints(x[1]) if len(x) > 1 and x[1] is not None else a.get("axes")
    if axes is None and a.get("noop_with_empty_axes", 0):
        return x[0]
    dims = tuple(axes) if axes is not None else tuple(range(x[0].dim()))
    return x[0].sum(dim=dims, keepdim=bool(a.get("keepdims", 1)))


def _reduce_extreme(kind: str) -> Callable[[list[Any], dict[str, Any]], Tensor]:
    """ReduceMax / ReduceMin (axes as an input, opset 18, or an attribute; every axis when
    none; rowscale's row statistics)."""

    def run(x: list[Any], a: dict[str, Any]) -> Tensor:
        axes = _ints(x[1]) if len(x) > 1 and x[1] is not None else a.get("axes")
        dims = tuple(axes) if axes is not None else tuple(range(x[0].dim()))
        out = x[0]
        keep = bool(a.get("keepdims", 1))
        for d in sorted((d % x[0].dim() for d in dims), reverse=True):
            out = (out.amax if kind == "max" else out.amin)(dim=d, keepdim=keep)
        return out

    return run


def _flatten(x: list[Any], a: dict[str, Any]) -> Tensor:
    axis = a.get("axis", 1)
    axis = axis + x[0].dim() if axis < 0 else axis
    return x[0].reshape(int(np.prod(x[0].shape[:axis])), int(np.prod(x[0].shape[axis:])))


def _gemm(x: list[Any], a: dict[str, Any]) -> Tensor:
    A = x[0].t() if a.get("transA", 0) else x[0]
    B = x[1].t() if a.get("transB", 0) else x[1]
    out = a.get("alpha", 1.0) * (A @ B)
    if len(x) > 2 and x[2] is not None:
        out = out + a.get("beta", 1.0) * x[2]
    return out


def _conv(x: list[Any], a: dict[str, Any]) -> Tensor:
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise QuantscopeError("finetune: Conv with auto_pad is not supported")
    nd = x[1].dim() - 2
    pads = list(a.get("pads", [0] * 2 * nd))
    inp = x[0]
    if pads[:nd] != pads[nd:]:
        inp = F.pad(inp, [p for i in reversed(range(nd)) for p in (pads[i], pads[i + nd])])
        pads = [0] * 2 * nd
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    return fn(inp, x[1], x[2] if len(x) > 2 else None, stride=a.get("strides", 1),
              padding=pads[:nd], dilation=a.get("dilations", 1), groups=a.get("group", 1))


def _pool_pad(x: Tensor, a: dict[str, Any], value: float) -> tuple[Tensor, list[int]]:
    nd = x.dim() - 2
    pads = list(a.get("pads", [0] * 2 * nd))
    if pads[:nd] == pads[nd:] and all(2 * p <= k for p, k in zip(pads[:nd], a["kernel_shape"],
                                                                 strict=True)):
        return x, pads[:nd]
    padded = F.pad(x, [p for i in reversed(range(nd)) for p in (pads[i], pads[i + nd])],
                   value=value)
    return padded, [0] * nd


def _maxpool(x: list[Any], a: dict[str, Any]) -> Tensor:
    inp, pads = _pool_pad(x[0], a, float("-inf"))
    fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[inp.dim() - 2]
    return fn(inp, a["kernel_shape"], stride=a.get("strides", 1), padding=pads,
              dilation=a.get("dilations", 1), ceil_mode=bool(a.get("ceil_mode", 0)))


def _avgpool(x: list[Any], a: dict[str, Any]) -> Tensor:
    inp, pads = _pool_pad(x[0], a, 0.0)
    fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[inp.dim() - 2]
    return fn(inp, a["kernel_shape"], stride=a.get("strides", 1), padding=pads,
              ceil_mode=bool(a.get("ceil_mode", 0)),
              count_include_pad=bool(a.get("count_include_pad", 0)))


def _pad(x: list[Any], a: dict[str, Any]) -> Tensor:
    mode = a.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    pads = _ints(x[1])
    nd = x[0].dim()
    if len(x) > 3 and x[3] is not None:
        raise QuantscopeError("finetune: Pad with an axes input is not supported")
    value = float(x[2].item()) if len(x) > 2 and x[2] is not None and x[2].numel() else 0.0
    torch_pads = [p for i in reversed(range(nd)) for p in (pads[i], pads[i + nd])]
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}[mode]
    return F.pad(x[0], torch_pads, mode=mode, value=value if mode == "constant" else None)


def _erf(x: list[Any], a: dict[str, Any]) -> Tensor:
    # In float64, then back: torch's float32 erf was seen 1.5e-4 off (in about 1 of 40
    # processes started under CPU load, on its first call; exact to 6e-8 otherwise), which
    # moved the FP32 conversion of an Erf-GELU block off ORT's by 1.4e-4.
    return torch.erf(x[0].double()).to(x[0].dtype)


def _binary(fn: Callable[[Tensor, Tensor], Tensor]) -> OpFn:
    return lambda x, a: fn(x[0], x[1])


def _unary(fn: Callable[[Tensor], Tensor]) -> OpFn:
    return lambda x, a: fn(x[0])


def _div(x: list[Any], a: dict[str, Any]) -> Tensor:
    if x[0].is_floating_point():
        return x[0] / x[1]
    return torch.div(x[0], x[1], rounding_mode="trunc")


OPS: dict[str, OpFn] = {
    "Add": _binary(torch.add), "Sub": _binary(torch.sub), "Mul": _binary(torch.mul),
    "Div": _div, "Pow": _binary(torch.pow), "MatMul": _binary(torch.matmul),
    "Equal": _binary(torch.eq), "Greater": _binary(torch.gt), "Less": _binary(torch.lt),
    "GreaterOrEqual": _binary(torch.ge), "LessOrEqual": _binary(torch.le),
    "And": _binary(torch.logical_and), "Or": _binary(torch.logical_or),
    "Not": _unary(torch.logical_not), "Sqrt": _unary(torch.sqrt), "Erf": _erf,
    "Exp": _unary(torch.exp), "Log": _unary(torch.log), "Min": _min, "CumSum": _cumsum,
    "Tanh": _unary(torch.tanh), "Sigmoid": _unary(torch.sigmoid),
    "Relu": _unary(torch.relu), "Neg": _unary(torch.neg), "Abs": _unary(torch.abs),
    "Identity": _unary(lambda t: t),
    "Where": lambda x, a: torch.where(x[0], x[1], x[2]),
    "PRelu": lambda x, a: torch.where(x[0] >= 0, x[0], x[0] * x[1]),
    "Shape": lambda x, a: torch.tensor(list(x[0].shape), dtype=torch.int64),
    "Gather": _gather, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Slice": _slice,
    "Concat": _concat, "Reshape": _reshape, "Expand": _expand, "Transpose": _transpose,
    "Cast": _cast, "ConstantOfShape": _constant_of_shape, "Range": _range,
    "Flatten": _flatten, "ReduceMean": _reduce_mean,
    "ReduceMax": _reduce_extreme("max"), "ReduceMin": _reduce_extreme("min"),
    "ReduceSum": _reduce_sum, "Softmax": _softmax,
    "LayerNormalization": _layernorm, "Gemm": _gemm, "Conv": _conv,
    "MaxPool": _maxpool, "AveragePool": _avgpool, "Pad": _pad,
    "GlobalAveragePool": lambda x, a: x[0].mean(dim=tuple(range(2, x[0].dim())), keepdim=True),
    "HardSigmoid": V.hard_sigmoid, "HardSwish": V.hard_swish,
    "BatchNormalization": V.batch_norm, "ArgMax": V.arg_extreme(True),
    "ArgMin": V.arg_extreme(False), "TopK": V.top_k,
    "RMSNormalization": D.rms_norm, "Split": D.split, "Cos": D.cos, "Sin": D.sin,
}
