"""ONNX op -> torch function for edge vision classifiers (MobileNetV3, EfficientNet, an
in-graph decision): the gates, an unfolded BatchNorm and the class pick. Same form as
:mod:`quantscope.finetune.ops` (input tensors, attribute dict), which lists them."""

from __future__ import annotations

from typing import Any

import torch

Tensor = torch.Tensor


def hard_sigmoid(x: list[Any], a: dict[str, Any]) -> Tensor:
    """``max(0, min(1, alpha * x + beta))`` (ONNX defaults 0.2, 0.5; torch's 1/6 differs)."""
    return torch.clamp(a.get("alpha", 0.2) * x[0] + a.get("beta", 0.5), 0.0, 1.0)


def hard_swish(x: list[Any], a: dict[str, Any]) -> Tensor:
    """``x * max(0, min(1, x / 6 + 0.5))``."""
    return x[0] * torch.clamp(x[0] / 6.0 + 0.5, 0.0, 1.0)


def batch_norm(x: list[Any], a: dict[str, Any]) -> Tensor:
    """Inference BatchNormalization: ``(x - mean) / sqrt(var + eps) * scale + B`` per channel
    (axis 1)."""
    data, scale, bias, mean, var = x[:5]
    shape = (1, -1) + (1,) * (data.dim() - 2)
    inv = scale / torch.sqrt(var + a.get("epsilon", 1e-5))
    return (data - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)


def arg_extreme(largest: bool) -> Any:
    def fn(x: list[Any], a: dict[str, Any]) -> Tensor:
        axis, keep = a.get("axis", 0), bool(a.get("keepdims", 1))
        data = x[0] if largest else -x[0]
        if a.get("select_last_index", 0):
            flipped = torch.flip(data, dims=(axis,))
            return data.shape[axis] - 1 - torch.argmax(flipped, dim=axis, keepdim=keep)
        return torch.argmax(data, dim=axis, keepdim=keep)
    return fn


def top_k(x: list[Any], a: dict[str, Any]) -> tuple[Tensor, Tensor]:
    k = int(x[1].reshape(-1)[0])
    values, indices = torch.topk(x[0], k, dim=a.get("axis", -1), largest=bool(a.get("largest", 1)),
                                 sorted=bool(a.get("sorted", 1)))
    return values, indices
