"""Differentiable fake quantization with the straight-through estimator (ONNX convention).

=====================  =================================================================
``fake_quant``         ``(clip(round(x / s) + zp, qmin, qmax) - zp) * s``: what a
                       QuantizeLinear -> DequantizeLinear pair computes; rounding passes
                       the gradient straight through, clipping stops it (so the gradient
                       of the scale is LSQ's: ``round(x/s) - x/s`` inside, the clip
                       bound outside); one autograd node keeping a byte per element
                       for the backward pass, equal to the composed
                       ``fake_quant_reference`` (forward to the bit, gradients tested)
``ActQuant``           an activation Q/DQ pair: starts at the writer's scale and
                       zero-point exactly; learns ``log(s / s0)`` and a zero-point
                       shift (rounded, straight-through); its range ``(lo, hi)`` is
                       written to the plan's ``pinned`` ranges, which ``encode`` turns
                       back into the same scale and zero-point
``WeightQuant``        a weight DequantizeLinear: the float weight is the parameter; its
                       per-channel scale is *recomputed from the current weight* each
                       step (min/max, as ``numerics.weight_encoding`` does, in float64),
                       so it equals what the QDQ writer derives from the written-back
                       weight; the scale itself gets no gradient
=====================  =================================================================
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from quantscope.types import QuantscopeError

Tensor = torch.Tensor

STORAGE = {  # zero-point ONNX type -> (bits, signed)
    onnx.TensorProto.INT4: (4, True), onnx.TensorProto.UINT4: (4, False),
    onnx.TensorProto.INT8: (8, True), onnx.TensorProto.UINT8: (8, False),
    onnx.TensorProto.INT16: (16, True), onnx.TensorProto.UINT16: (16, False),
}
_TINY = float(np.float32(1e-12))


def storage_bits(zp_type: int) -> tuple[int, bool]:
    try:
        return STORAGE[zp_type]
    except KeyError:
        name = onnx.TensorProto.DataType.Name(zp_type)
        raise QuantscopeError(f"finetune: zero-point type {name} is not supported") from None


def qlimits(bits: int, signed: bool) -> tuple[int, int]:
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


class _RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: Tensor) -> Tensor:  # noqa: ARG004
        return torch.round(x)  # half to even, as QuantizeLinear

    @staticmethod
    def backward(ctx: object, grad: Tensor) -> Tensor:  # noqa: ARG004
        return grad


def round_ste(x: Tensor) -> Tensor:
    return _RoundSTE.apply(x)


def fake_quant_reference(x: Tensor, scale: Tensor, zp: Tensor, qmin: int, qmax: int) -> Tensor:
    """:func:`fake_quant` composed of autograd ops (the definition its gradients follow)."""
    # Clamping x one step beyond the grid first changes no result but keeps x / scale
    # finite (an additive attention mask holds -3.4e38), so no inf * 0 = nan in backward.
    with torch.no_grad():
        lo, hi = (qmin - 1 - zp) * scale, (qmax + 1 - zp) * scale
    q = torch.clamp(round_ste(torch.clamp(x, lo, hi) / scale) + zp, qmin, qmax)
    return (q - zp) * scale


def _grid(x: Tensor, scale: Tensor, zp: Tensor, qmin: int,
          qmax: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``x / s`` (pre-clipped), its rounding, + zp, clipped, and the dequantized output:
    the ops of :func:`fake_quant_reference`'s forward, in its order."""
    lo, hi = (qmin - 1 - zp) * scale, (qmax + 1 - zp) * scale
    u = torch.clamp(x, lo, hi) / scale
    r = torch.round(u)
    v = r + zp
    q = torch.clamp(v, qmin, qmax)
    return u, r, v, q, (q - zp) * scale


class _FakeQuant(torch.autograd.Function):
    """:func:`fake_quant_reference` as one autograd node: the same forward ops (the same
    bits) and the same gradients written out, keeping for the backward pass only a byte
    per element (where the rounding passes the gradient) plus, when the scale learns, the
    scale's per-element derivative; the composed form keeps four float intermediates per
    quantizer, which bound the student's memory and, on a GPU, its batch size."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, scale: Tensor, zp: Tensor, qmin: int,
                qmax: int) -> Tensor:
        u, r, v, q, out = _grid(x, scale, zp, qmin, qmax)
        # x beyond [lo, hi] lands on qmin - 1 or qmax + 1: outside, so one mask serves
        inside = q == v
        d = None
        if ctx.needs_input_grad[1]:  # LSQ: d out / d s = (q - zp) - [inside] x / s
            d = torch.where(inside, r - u, q - zp)
        ctx.save_for_backward(inside, d, scale)
        ctx.shapes = (scale.shape, zp.shape)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        inside, d, scale = ctx.saved_tensors
        gx = gs = gz = None
        if ctx.needs_input_grad[0]:
            gx = grad * inside
        if ctx.needs_input_grad[1]:
            gs = (grad * d).sum_to_size(ctx.shapes[0])
        if ctx.needs_input_grad[2]:  # d out / d zp = s ([inside] - 1) = -s [outside]
            outside = grad * ~inside
            gz = (outside.sum_to_size(ctx.shapes[1]) * -scale if scale.shape == ctx.shapes[1]
                  else (outside * -scale).sum_to_size(ctx.shapes[1]))
        return gx, gs, gz, None, None


def fake_quant(x: Tensor, scale: Tensor, zp: Tensor, qmin: int, qmax: int) -> Tensor:
    """``(clip(round(x / s) + zp, qmin, qmax) - zp) * s`` with the straight-through
    rounding and LSQ gradients of :func:`fake_quant_reference`, as one autograd node
    (without gradients, e.g. a held-out evaluation, the forward alone)."""
    if not torch.is_grad_enabled():
        return _grid_forward(x, scale, zp, qmin, qmax)
    return _FakeQuant.apply(x, scale, zp, qmin, qmax)


def _grid_forward(x: Tensor, scale: Tensor, zp: Tensor, qmin: int, qmax: int) -> Tensor:
    """:func:`_grid`'s output alone: one new tensor, every later op in place (the same ops
    in the same order, so the same bits). The pre-clip is left out: it only keeps ``x / s``
    finite for the backward pass, and beyond the grid ``x / s`` (even ``-inf``) rounds and
    clips to the same bound."""
    q = torch.div(x, scale)
    return q.round_().add_(zp).clamp_(qmin, qmax).sub_(zp).mul_(scale)


def _channel_shape(ndim: int, axis: int | None) -> list[int]:
    shape = [1] * ndim
    if axis is not None:
        shape[axis] = -1
    return shape


class ActQuant(nn.Module):
    """One activation Q/DQ pair; ``key`` is the tensor name the plan pins a range on."""

    def __init__(self, key: str, scale: np.ndarray, zp: np.ndarray, bits: int, signed: bool,
                 axis: int | None = None) -> None:
        super().__init__()
        self.key, self.bits, self.signed, self.axis = key, bits, signed, axis
        self.qmin, self.qmax = qlimits(bits, signed)
        self.register_buffer("s0", torch.tensor(np.asarray(scale, np.float32)))
        self.register_buffer("z0", torch.tensor(np.asarray(zp, np.float32)))
        self.log_scale = nn.Parameter(torch.zeros_like(self.s0))
        self.zp_shift = nn.Parameter(torch.zeros_like(self.s0))

    def scale_zp(self) -> tuple[Tensor, Tensor]:
        scale = self.s0 * torch.exp(self.log_scale)
        zp = torch.clamp(self.z0 + round_ste(self.zp_shift), self.qmin, self.qmax)
        return scale, zp

    def forward(self, x: Tensor) -> Tensor:
        scale, zp = self.scale_zp()
        if self.axis is not None and scale.dim() == 1:
            shape = _channel_shape(x.dim(), self.axis % x.dim())
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        return fake_quant(x, scale, zp, self.qmin, self.qmax)

    def range(self) -> tuple[float, float]:
        """Real ``(lo, hi)`` of the current grid; ``qparams(lo, hi)`` gives it back exactly."""
        if self.s0.dim() != 0:
            raise QuantscopeError(f"finetune: per-channel activation '{self.key}' has no range")
        with torch.no_grad():
            scale, zp = self.scale_zp()
        s, z = float(scale.item()), float(zp.item())
        return (self.qmin - z) * s, (self.qmax - z) * s


def weight_qparams(w: Tensor, axis: int | None, bits: int, signed: bool,
                   symmetric: bool) -> tuple[Tensor, Tensor]:
    """Scale and zero-point of ``w`` exactly as ``numerics.weight_encoding`` computes them."""
    qmin, qmax = qlimits(bits, signed)
    with torch.no_grad():
        if axis is None:
            lo, hi = w.min().double(), w.max().double()
        else:
            moved = w.movedim(axis, 0).reshape(w.shape[axis], -1)
            lo, hi = moved.min(dim=1).values.double(), moved.max(dim=1).values.double()
        lo, hi = torch.clamp(lo, max=0.0), torch.clamp(hi, min=0.0)
        if symmetric:
            half = (qmax - qmin) // 2
            scale = torch.clamp(torch.maximum(lo.abs(), hi.abs()) / half, min=_TINY)
            zp = torch.zeros_like(scale) if signed else torch.full_like(scale, (qmax + qmin + 1) // 2)
        else:
            scale = torch.clamp((hi - lo) / (qmax - qmin), min=_TINY)
            zp = torch.clamp(torch.round(qmin - lo / scale), qmin, qmax)
        shape = _channel_shape(w.dim(), axis)
        return scale.float().reshape(shape), zp.float().reshape(shape)


class WeightQuant(nn.Module):
    """A weight DequantizeLinear: fake-quantises the float weight it is given."""

    def __init__(self, name: str, bits: int, signed: bool, axis: int | None,
                 symmetric: bool) -> None:
        super().__init__()
        self.name, self.bits, self.signed, self.axis = name, bits, signed, axis
        self.symmetric = symmetric
        self.qmin, self.qmax = qlimits(bits, signed)
        self.hold = False  # GraphModule.weights_held: one fake-quantised copy per step
        self._held: Tensor | None = None

    def forward(self, w: Tensor) -> Tensor:
        if self._held is not None:
            return self._held
        axis = None if self.axis is None else self.axis % w.dim()
        scale, zp = weight_qparams(w, axis, self.bits, self.signed, self.symmetric)
        out = fake_quant(w, scale, zp, self.qmin, self.qmax)
        if self.hold:
            self._held = out
        return out
