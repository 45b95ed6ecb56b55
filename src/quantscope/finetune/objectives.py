"""What the student is trained to reproduce: the part of the output the task uses.

==================  ==================================================================
``EmbeddingLoss``   sentence encoders: token embeddings mean-pooled over the attention
                    mask and L2-normalised (as ``tasks.text.pool``); loss
                    ``1 - cosine`` (times ``COSINE_SCALE``) plus optionally the MSE of
                    the normalised embeddings; held-out metric: mean cosine
``OutputsLoss``     tensor models: every float output, MSE normalised by the teacher's
                    variance; held-out metric: output SQNR in dB
intermediate taps   optional: tensors named in both graphs (e.g. every LayerNorm output,
                    the block outputs of an encoder), MSE normalised by the teacher's
                    variance, padded tokens left out when the batch has a mask
==================  ==================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from quantscope.model.load import Model

Tensor = torch.Tensor
Batch = dict[str, np.ndarray]
COSINE_SCALE = 100.0  # 1 - cos is ~1e-3 when close: scaled so Adam's epsilon does not bite


class Objective(Protocol):
    metric: str

    def target(self, outputs: Sequence[Tensor], feeds: Batch) -> list[Tensor]:
        """The compact part of the outputs the loss compares (cached for the teacher)."""
        ...

    def loss(self, student: list[Tensor], teacher: list[Tensor]) -> Tensor: ...

    def score(self, student: list[Tensor], teacher: list[Tensor]) -> float:
        """Held-out metric of one batch (higher is better)."""
        ...


def _mask(feeds: Batch, name: str | None) -> Tensor | None:
    if name is None or name not in feeds:
        return None
    return torch.as_tensor(np.asarray(feeds[name])).float()


@dataclass(frozen=True)
class EmbeddingLoss:
    output_index: int
    mask_input: str | None
    mse_weight: float = 0.0
    metric: str = "embedding_cosine"

    def target(self, outputs: Sequence[Tensor], feeds: Batch) -> list[Tensor]:
        out = outputs[self.output_index].float()
        mask = _mask(feeds, self.mask_input)
        if out.dim() == 3:
            m = mask[:, :, None] if mask is not None else torch.ones_like(out[:, :, :1])
            out = (out * m).sum(dim=1) / torch.clamp(m.sum(dim=1), min=1e-9)
        return [out / torch.clamp(out.norm(dim=1, keepdim=True), min=1e-12)]

    def loss(self, student: list[Tensor], teacher: list[Tensor]) -> Tensor:
        cos = (student[0] * teacher[0]).sum(dim=1)
        loss = COSINE_SCALE * (1.0 - cos).mean()
        if self.mse_weight:
            dim = student[0].shape[1]
            loss = loss + self.mse_weight * dim * ((student[0] - teacher[0]) ** 2).mean()
        return loss

    def score(self, student: list[Tensor], teacher: list[Tensor]) -> float:
        return float((student[0] * teacher[0]).sum(dim=1).mean())


@dataclass(frozen=True)
class OutputsLoss:
    metric: str = "output_sqnr_db"

    def target(self, outputs: Sequence[Tensor], feeds: Batch) -> list[Tensor]:
        return [o.float() for o in outputs if o.is_floating_point()]

    def loss(self, student: list[Tensor], teacher: list[Tensor]) -> Tensor:
        terms = [((s - t) ** 2).mean() / torch.clamp(t.var(), min=1e-12)
                 for s, t in zip(student, teacher, strict=True)]
        return torch.stack(terms).mean()

    def score(self, student: list[Tensor], teacher: list[Tensor]) -> float:
        noise = sum(float(((s - t) ** 2).sum()) for s, t in zip(student, teacher, strict=True))
        signal = sum(float((t**2).sum()) for t in teacher)
        return 10.0 * float(np.log10(max(signal, 1e-30) / max(noise, 1e-30)))


def tap_loss(student: dict[str, Tensor], teacher: dict[str, Tensor], feeds: Batch,
             mask_input: str | None) -> Tensor:
    """Mean over taps of the MSE normalised by the teacher's variance (padding left out)."""
    mask = _mask(feeds, mask_input)
    terms = []
    for name, t in teacher.items():
        s = student[name]
        err = (s - t) ** 2
        if mask is not None and t.dim() == 3 and t.shape[:2] == mask.shape:
            w = mask[:, :, None]
            mse = (err * w).sum() / torch.clamp(w.sum() * t.shape[2], min=1.0)
            var = ((t - (t * w).sum() / torch.clamp(w.sum() * t.shape[2], min=1.0)) ** 2 * w
                   ).sum() / torch.clamp(w.sum() * t.shape[2], min=1.0)
        else:
            mse, var = err.mean(), t.var()
        terms.append(mse / torch.clamp(var, min=1e-12))
    return torch.stack(terms).mean()


def objective_for(model: Model, task: Any) -> tuple[Objective, str | None]:
    """The objective matching a dataset's task, and the attention-mask input if any."""
    from quantscope.tasks.registry import RetrievalTask

    if isinstance(task, RetrievalTask):
        mask = task.encoder.input_name("attention_mask")
        return EmbeddingLoss(task.encoder.output_index, mask), mask
    del model
    return OutputsLoss(), None


def layernorm_outputs(model: Model) -> tuple[str, ...]:
    """Every LayerNormalization output: the block outputs of a post-LN encoder."""
    return tuple(n.output[0] for n in model.graph.node if n.op_type == "LayerNormalization")
