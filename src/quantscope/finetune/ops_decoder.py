"""ONNX op -> torch function for decoder LLM phase graphs (:mod:`quantscope.zoo.decoder`):
RoPE's angle tables, the halves it rotates, and RMSNorm (opset 23). Same form as
:mod:`quantscope.finetune.ops` (input tensors, attribute dict), which lists them."""

from __future__ import annotations

from typing import Any

import torch

Tensor = torch.Tensor


def rms_norm(x: list[Any], a: dict[str, Any]) -> Tensor:
    """``x / sqrt(mean(x^2 over axis..last) + epsilon) * scale`` (ONNX RMSNormalization;
    ``stash_type`` 1: computed in float32, which this is)."""
    axis = a.get("axis", -1) % x[0].dim()
    dims = tuple(range(axis, x[0].dim()))
    ms = x[0].pow(2).mean(dim=dims, keepdim=True)
    return x[0] * torch.rsqrt(ms + a.get("epsilon", 1e-5)) * x[1]


def split(x: list[Any], a: dict[str, Any]) -> tuple[Tensor, ...]:
    """Split along ``axis`` by the ``split`` input (sizes), or into ``num_outputs`` parts
    (the last one smaller when the axis does not divide, as ONNX says)."""
    axis = a.get("axis", 0)
    if len(x) > 1 and x[1] is not None:
        return tuple(torch.split(x[0], [int(v) for v in x[1].tolist()], dim=axis))
    n, size = int(a["num_outputs"]), x[0].shape[axis]
    return tuple(torch.split(x[0], -(-size // n), dim=axis))


def cos(x: list[Any], a: dict[str, Any]) -> Tensor:
    return torch.cos(x[0])


def sin(x: list[Any], a: dict[str, Any]) -> Tensor:
    return torch.sin(x[0])
