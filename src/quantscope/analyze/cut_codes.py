"""The tensors crossing a cut, kept in the activation cache as their integer codes where
that is exact.

A quantized activation crossing a cut of the incremental engine is a ``DequantizeLinear``
output, ``float32(q - zero_point) * scale``, of a ``QuantizeLinear``'s codes ``q`` (4 to
16 bits). Each segment session also returns those codes (:func:`expose_codes` adds them
to its graph's outputs; emulation sessions run unoptimized, so nothing else changes), and
the cache keeps them (one or two bytes a value instead of four) with the scale and the
zero point, computing the product again when a plan starts from the cut
(:meth:`Coded.decode`). The first batch of each tensor of each segment session is checked
(the product equals ONNX Runtime's output bit for bit); a tensor that fails is kept as
float32 from then on, as every tensor was before. So a plan run from a cached cut reads
what it read before, and the same budget holds two to four times the cuts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from quantscope.types import Encoding


@dataclass(frozen=True, eq=False)
class Coded:
    """One tensor as its integer codes, scale and zero point (broadcast to it)."""

    codes: np.ndarray
    scale: np.ndarray  # float32
    zero_point: np.ndarray  # int32

    @property
    def nbytes(self) -> int:
        return int(self.codes.nbytes + self.scale.nbytes + self.zero_point.nbytes)

    def decode(self) -> np.ndarray:
        """The tensor: ``float32(codes - zero_point) * scale``, as DequantizeLinear."""
        return (self.codes.astype(np.int32) - self.zero_point).astype(np.float32) * self.scale


def _broadcast(values: np.ndarray, enc: Encoding, ndim: int) -> np.ndarray | None:
    """``values`` (0-d, or 1-d along ``enc.axis``) shaped to broadcast over a tensor of
    ``ndim`` dimensions; None where they cannot."""
    if values.ndim == 0:
        return values
    if enc.axis is None or values.ndim != 1 or not -ndim <= enc.axis < ndim:
        return None
    shape = [1] * ndim
    shape[enc.axis] = values.shape[0]
    return values.reshape(shape)


def coded(codes: np.ndarray, enc: Encoding | None, ndim: int) -> Coded | None:
    """``codes`` (a QuantizeLinear's output) on ``enc``'s grid, for a tensor of ``ndim``
    dimensions; None where it is no integer tensor or the grid does not fit it."""
    if enc is None or codes.dtype.kind not in "iu" or codes.itemsize > 2:
        return None
    scale = _broadcast(np.asarray(enc.scale, np.float32), enc, ndim)
    zp = _broadcast(np.asarray(enc.zero_point).astype(np.int32), enc, ndim)
    if scale is None or zp is None:
        return None
    return Coded(codes, scale, zp)


def decode(v: np.ndarray | Coded) -> np.ndarray:
    """A cached tensor as the segments read it."""
    return v.decode() if isinstance(v, Coded) else v


def expose_codes(proto: onnx.ModelProto, tensors: Sequence[str]) -> dict[str, str]:
    """Per tensor of ``tensors`` the graph makes as ``DequantizeLinear`` of a
    ``QuantizeLinear``'s output: that output's name, added to the graph's outputs."""
    made = {o: n for n in proto.graph.node for o in n.output}
    have = {o.name for o in proto.graph.output}
    out: dict[str, str] = {}
    for t in tensors:
        dq = made.get(t)
        if dq is None or dq.op_type != "DequantizeLinear" or not dq.input:
            continue
        q = made.get(dq.input[0])
        if q is None or q.op_type != "QuantizeLinear":
            continue
        out[t] = dq.input[0]
        if dq.input[0] not in have:
            proto.graph.output.append(onnx.helper.make_empty_tensor_value_info(dq.input[0]))
            have.add(dq.input[0])
    return out
