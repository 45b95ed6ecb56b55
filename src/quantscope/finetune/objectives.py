"""What the student is trained to reproduce: the part of the output the task uses.

==================  ==================================================================
``EmbeddingLoss``   sentence encoders: token embeddings mean-pooled over the attention
                    mask and L2-normalised (as ``tasks.text.pool``); loss
                    ``1 - cosine`` (times ``COSINE_SCALE``) plus optionally the MSE of
                    the normalised embeddings; held-out metric: mean cosine. With
                    ``scores`` (see :func:`score_weights`) the error ``d`` of an
                    embedding is weighted as the similarity scores see it:
                    ``d' C d / 2`` (``C``: the teacher embeddings' second moment,
                    trace = width; ``C = I`` is exactly ``1 - cosine``); held-out metric
                    ``1 - d' C d / 2``. With ``bank`` (see :func:`rank_bank`) a ranking
                    term is added: each row's similarity distribution over a bank of
                    teacher embeddings, ``softmax(x . bank / tau)``, distilled by KL from
                    the teacher's (the neighbours whose order top-1 retrieval decides);
                    held-out metric ``1 - loss / 100``
``OutputsLoss``     tensor models: every float output, MSE normalised by the teacher's
                    variance; held-out metric: output SQNR in dB
intermediate taps   optional: tensors named in both graphs (e.g. every LayerNorm output,
                    the block outputs of an encoder), MSE normalised by the teacher's
                    variance, padded tokens left out when the batch has a mask
==================  ==================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from quantscope.model.load import Model

Tensor = torch.Tensor
Batch = dict[str, Any]  # input name -> numpy array or torch tensor
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
    v = feeds[name]
    return (v if isinstance(v, Tensor) else torch.as_tensor(np.asarray(v))).float()


def score_weights(embeddings: np.ndarray) -> np.ndarray:
    """``C`` of the score-weighted loss: the second moment of the (teacher's) normalised
    embeddings, scaled so its trace is the width.

    Retrieval ranks documents by ``q . d``; an error ``e`` in ``d`` moves the score by
    ``q . e``, whose mean square over the queries is ``e' E[q q'] e``. Sentence embeddings
    are anisotropic (minilm-l6 on stdlib-docs: ~38 effective dimensions of 384), so an
    error inside the embeddings' own subspace moves scores, and flips top-1 results, far
    more than its cosine says; this weight makes the loss see that.
    """
    x = np.asarray(embeddings, dtype=np.float64)
    if x.ndim != 2 or len(x) < 2:
        raise ValueError("score_weights needs a [rows, width] array of at least two rows")
    m = x.T @ x / len(x)
    return (m * (x.shape[1] / max(float(np.trace(m)), 1e-30))).astype(np.float32)


def rank_bank(embeddings: np.ndarray, rows: int = 4096, seed: int = 0) -> np.ndarray:
    """The bank of the ranking term: up to ``rows`` of the teacher's normalised training
    embeddings (a fixed random subset when there are more)."""
    x = np.asarray(embeddings, dtype=np.float32)
    if x.ndim != 2 or len(x) < 2:
        raise ValueError("rank_bank needs a [rows, width] array of at least two rows")
    if len(x) > rows:
        x = x[np.sort(np.random.default_rng(seed).choice(len(x), rows, replace=False))]
    return x


@dataclass(frozen=True)
class EmbeddingLoss:
    output_index: int
    mask_input: str | None
    mse_weight: float = 0.0
    metric: str = "embedding_cosine"
    scores: np.ndarray | None = field(default=None, compare=False, repr=False)
    bank: np.ndarray | None = field(default=None, compare=False, repr=False)
    rank_tau: float = 0.02
    rank_weight: float = 0.0

    def with_bank(self, bank: np.ndarray, tau: float, weight: float) -> EmbeddingLoss:
        """This loss plus ``weight`` x the KL divergence of the rows' similarity
        distributions over ``bank`` (temperature ``tau``) from the teacher's."""
        if tau <= 0 or weight <= 0:
            raise ValueError("the ranking term needs a positive temperature and weight")
        return EmbeddingLoss(self.output_index, self.mask_input, self.mse_weight,
                             "embedding_cosine_rank", self.scores,
                             np.asarray(bank, np.float32), float(tau), float(weight))

    def _rank_kl(self, student: list[Tensor], teacher: list[Tensor]) -> Tensor:
        assert self.bank is not None
        bank = torch.from_numpy(self.bank).to(student[0].device, student[0].dtype)
        t_sim = teacher[0] @ bank.T
        own = t_sim > 1.0 - 1e-5  # the row itself (or an exact duplicate) in the bank
        t_log = torch.log_softmax((t_sim / self.rank_tau).masked_fill(own, -1e9), dim=1)
        s_log = torch.log_softmax(((student[0] @ bank.T) / self.rank_tau).masked_fill(own, -1e9),
                                  dim=1)
        return (t_log.exp() * (t_log - s_log)).sum(dim=1)

    def with_scores(self, weights: np.ndarray) -> EmbeddingLoss:
        """This loss with errors weighted as the similarity scores see them."""
        return EmbeddingLoss(self.output_index, self.mask_input, self.mse_weight,
                             "embedding_score_cosine", np.asarray(weights, np.float32),
                             self.bank, self.rank_tau, self.rank_weight)

    def _score_error(self, student: list[Tensor], teacher: list[Tensor]) -> Tensor:
        assert self.scores is not None
        d = student[0] - teacher[0]
        return 0.5 * ((d @ torch.from_numpy(self.scores).to(d.device, d.dtype)) * d).sum(dim=1)

    def target(self, outputs: Sequence[Tensor], feeds: Batch) -> list[Tensor]:
        out = outputs[self.output_index].float()
        mask = _mask(feeds, self.mask_input)
        if out.dim() == 3:
            m = mask.to(out.device)[:, :, None] if mask is not None else \
                torch.ones_like(out[:, :, :1])
            out = (out * m).sum(dim=1) / torch.clamp(m.sum(dim=1), min=1e-9)
        return [out / torch.clamp(out.norm(dim=1, keepdim=True), min=1e-12)]

    def loss(self, student: list[Tensor], teacher: list[Tensor]) -> Tensor:
        if self.scores is not None:
            loss = COSINE_SCALE * self._score_error(student, teacher).mean()
        else:
            cos = (student[0] * teacher[0]).sum(dim=1)
            loss = COSINE_SCALE * (1.0 - cos).mean()
        if self.mse_weight:
            dim = student[0].shape[1]
            loss = loss + self.mse_weight * dim * ((student[0] - teacher[0]) ** 2).mean()
        if self.bank is not None:
            loss = loss + self.rank_weight * self._rank_kl(student, teacher).mean()
        return loss

    def score(self, student: list[Tensor], teacher: list[Tensor]) -> float:
        if self.bank is not None:
            return float(1.0 - self.loss(student, teacher) / COSINE_SCALE)
        if self.scores is not None:
            return float(1.0 - self._score_error(student, teacher).mean())
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
    """Mean over taps of the MSE normalised by the teacher's variance (padding left out).

    A tap with no elements for this batch is left out: a token-split encoder's second
    chunk is empty when the texts are shorter than the split (its mean would be NaN)."""
    mask = _mask(feeds, mask_input)
    terms = []
    for name, t in teacher.items():
        s = student[name]
        if t.numel() == 0:
            continue
        err = (s - t) ** 2
        if mask is not None and t.dim() == 3 and t.shape[:2] == mask.shape:
            w = mask.to(t.device)[:, :, None]
            mse = (err * w).sum() / torch.clamp(w.sum() * t.shape[2], min=1.0)
            var = ((t - (t * w).sum() / torch.clamp(w.sum() * t.shape[2], min=1.0)) ** 2 * w
                   ).sum() / torch.clamp(w.sum() * t.shape[2], min=1.0)
        else:
            mse, var = err.mean(), t.var()
        terms.append(mse / torch.clamp(var, min=1e-12))
    if not terms:
        return next(iter(student.values())).new_zeros(()) if student else torch.zeros(())
    return torch.stack(terms).mean()


def objective_for(model: Model, task: Any) -> tuple[Objective, str | None]:
    """The objective of a dataset's task (``Task.objective()``: a pooled embedding, or
    None for every float output), and the attention-mask input if any."""
    from quantscope.tasks.headline import objective_of

    del model
    spec = objective_of(task)
    if spec is None:
        return OutputsLoss(), None
    return EmbeddingLoss(spec.output_index, spec.mask), spec.mask


def layernorm_outputs(model: Model) -> tuple[str, ...]:
    """Every LayerNormalization output: the block outputs of a post-LN encoder."""
    return tuple(n.output[0] for n in model.graph.node if n.op_type == "LayerNormalization")
