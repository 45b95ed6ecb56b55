"""Quantization-aware distillation: train the QDQ student against the FP32 teacher.

==================  ==================================================================
student             :class:`~.graph.GraphModule` converted from the QDQ graph the one
                    writer built (weights, biases and LayerNorm parameters learned;
                    activation scales and zero-points learned when ``learn_ranges``)
teacher             the FP32 graph converted the same way; its targets (e.g. pooled
                    embeddings) are computed once per batch and cached; tapped
                    intermediate tensors are recomputed per step (too big to cache)
data                unlabeled batches: ``train`` for the updates, ``holdout`` for the
                    held-out metric that picks the best step (early stopping)
optimiser           Adam, two learning rates (weights, ranges), linear warm-up then
                    cosine decay to zero over ``steps``; with ``average`` the held-out
                    metric and the kept state are those of an exponential moving
                    average of the learned parameters
checkpoint          ``torch.save`` of student, optimizer, scheduler, step, history and
                    the best state, every ``eval_every`` steps; resumed when it exists
device              ``device``: ``"cuda"`` when PyTorch sees a GPU, else ``"cpu"``
                    (or named); student, teacher and batches move there once
==================  ==================================================================
Nothing here is a reported number: the result's weights and ranges are written back and
measured in ONNX Runtime through the QDQ writer (:mod:`.apply`).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from quantscope.finetune.graph import GraphModule
from quantscope.finetune.objectives import (
    Batch,
    EmbeddingLoss,
    Objective,
    rank_bank,
    score_weights,
    tap_loss,
)
from quantscope.types import QuantscopeError


@dataclass(frozen=True)
class FinetuneConfig:
    steps: int = 200
    lr: float = 2e-5  # weight matrices
    vector_lr: float | None = None  # biases, LayerNorm scales and shifts (default: ``lr``)
    range_lr: float = 1e-3  # log-scale and zero-point shift of the activation grids
    learn_ranges: bool = True
    learn_weights: bool = True
    warmup: int = 10
    eval_every: int = 25
    taps: tuple[str, ...] = ()  # intermediate tensors distilled besides the objective
    tap_weight: float = 0.0
    mask_input: str | None = None  # padding mask for the tap loss
    score_loss: bool = False  # embeddings: weight errors as the similarity scores see them
    rank_weight: float = 0.0  # embeddings: + weight x KL of the similarity over a bank
    rank_tau: float = 0.02  # temperature of that similarity distribution
    average: float = 0.0  # > 0: evaluate and keep an exponential moving average (decay)
    seed: int = 0
    threads: int | None = None
    device: str | None = None  # torch device; None: "cuda" when available, else "cpu"
    max_seconds: float | None = None  # stop early (after an evaluation) past this wall time


@dataclass(frozen=True, eq=False)
class FinetuneResult:
    """What a fine-tune learned (weights by FP32 initializer name, ranges by tensor)."""

    weights: dict[str, np.ndarray]
    ranges: dict[str, tuple[float, float]]
    history: tuple[dict[str, float], ...]
    seconds: float
    steps: int
    samples: int  # training rows seen (with repeats)
    train_rows: int
    holdout_rows: int
    metric: str
    holdout_before: float
    holdout_best: float
    best_step: int
    config: FinetuneConfig = field(default_factory=FinetuneConfig)
    device: str = "cpu"

    def summary(self) -> str:
        return (f"finetune: {self.steps} steps, {self.samples} samples ({self.train_rows} "
                f"training rows, {self.holdout_rows} held out), {self.seconds:.0f} s on "
                f"{self.device}; held-out "
                f"{self.metric} {self.holdout_before:.5g} -> {self.holdout_best:.5g} "
                f"(best step {self.best_step})")


def resolve_device(name: str | None) -> torch.device:
    """The torch device a fine-tune runs on: ``name``, or CUDA when present, else the CPU."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise QuantscopeError(f"finetune: unknown device '{name}'; use cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise QuantscopeError(f"finetune: device '{name}' asked for, but PyTorch sees no CUDA "
                              "GPU here; use --device cpu (or leave it out)")
    if dev.type not in ("cpu", "cuda"):
        raise QuantscopeError(f"finetune: device '{name}' is not supported; use cpu or cuda")
    return dev


def _on(device: torch.device, batches: Sequence[Batch]) -> list[Batch]:
    """The batches as torch tensors on ``device`` (once, not per step)."""
    return [{k: (v if isinstance(v, torch.Tensor) else torch.from_numpy(np.asarray(v)))
             .to(device) for k, v in b.items()} for b in batches]


def _rows(batches: Sequence[Batch]) -> int:
    return sum(len(next(iter(b.values()))) for b in batches)


def _batch_index(step: int, n: int, seed: int) -> int:
    """Batch of ``step``: a fresh permutation per epoch (independent of the total steps)."""
    return int(np.random.default_rng((seed, step // n)).permutation(n)[step % n])


class _Progress:
    """tqdm on a terminal; one plain line per evaluation otherwise. With a time budget
    (``max_seconds``) the bar counts its seconds, so its ETA is the budget's end (or the
    last step's, when that comes first)."""

    def __init__(self, total: int, start: int, enabled: bool,
                 max_seconds: float | None = None) -> None:
        self.enabled, self.tty = enabled, sys.stderr.isatty()
        self.total, self.start, self.max_seconds = total, start, max_seconds
        self.t0, self.shown = time.perf_counter(), 0
        self.bar = None
        if enabled and self.tty:
            from tqdm import tqdm

            if max_seconds:
                self.bar = tqdm(total=int(math.ceil(max_seconds)), desc="finetune", unit="s",
                                file=sys.stderr)
            else:
                self.bar = tqdm(total=total, initial=start, desc="finetune", file=sys.stderr)

    def eta(self, step: int) -> float:
        """Seconds left: to the last step at this rate, or to the time budget's end."""
        spent = time.perf_counter() - self.t0
        done = max(step - self.start, 1)
        left = (self.total - step) * spent / done
        if self.max_seconds:
            left = min(left, max(self.max_seconds - spent, 0.0))
        return left

    def step(self, info: dict[str, float], evaluated: bool) -> None:
        step = int(info.get("step", 0))
        if self.bar is not None:
            if self.max_seconds:
                now = min(int(time.perf_counter() - self.t0), self.bar.total)
                self.bar.update(now - self.shown)
                self.shown = now
            else:
                self.bar.update(1)
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in info.items()
                                  if k != "step" or self.max_seconds})
        elif self.enabled and evaluated:
            text = "  ".join(f"{k} {v:.5g}" for k, v in info.items())
            print(f"finetune: {text}  ETA {self.eta(step):.0f} s", file=sys.stderr, flush=True)

    def started(self, holdout: float) -> None:
        """The held-out metric before training (a plain line: the first evaluation comes
        only after ``eval_every`` steps)."""
        if self.enabled and self.bar is None:
            limit = f" (up to {self.max_seconds:.0f} s)" if self.max_seconds else ""
            print(f"finetune: step {self.start}  holdout {holdout:.5g}, training {self.total}"
                  f" steps at most{limit}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Distiller:
    """One distillation run (state kept here so a checkpoint can resume it)."""

    def __init__(self, student: GraphModule, teacher: GraphModule, objective: Objective,
                 config: FinetuneConfig) -> None:
        self.student, self.teacher, self.obj, self.cfg = student, teacher, objective, config
        teacher.requires_grad_(False)
        weights = list(student.trained_weights().values()) if config.learn_weights else []
        vectors = [p for p in weights if p.dim() <= 1]
        matrices = [p for p in weights if p.dim() > 1]
        ranges = list(student.quant_parameters()) if config.learn_ranges else []
        for p in student.parameters():
            p.requires_grad_(False)
        for p in weights + ranges:
            p.requires_grad_(True)
        vector_lr = config.lr if config.vector_lr is None else config.vector_lr
        groups = [g for g in ({"params": matrices, "lr": config.lr},
                              {"params": vectors, "lr": vector_lr},
                              {"params": ranges, "lr": config.range_lr}) if g["params"]]
        if not groups:
            raise QuantscopeError("finetune: nothing to learn (weights and ranges both off)")
        self.opt = torch.optim.Adam(groups)
        self.started: float | None = None  # perf_counter origin of the run (resumes included)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, self._schedule)
        self.step, self.history = 0, []
        self.best: tuple[float, int, dict[str, torch.Tensor]] | None = None
        self._targets: dict[int, list[torch.Tensor]] = {}
        self.learned = [(n, p) for n, p in student.named_parameters() if p.requires_grad]
        self.ema = ({n: p.detach().clone() for n, p in self.learned}
                    if config.average > 0 else None)
        self._averaged_state: dict[str, torch.Tensor] | None = None  # of the last evaluation

    def _schedule(self, step: int) -> float:
        """Linear warm-up, then a cosine decay that reaches zero at the last step or at the
        end of the time budget (``max_seconds``), whichever comes first: a run stopped by
        the clock ends annealed instead of at a high learning rate."""
        if step < self.cfg.warmup:
            return (step + 1) / self.cfg.warmup
        span = max(self.cfg.steps - self.cfg.warmup, 1)
        done = min(step - self.cfg.warmup, span) / span
        if self.cfg.max_seconds and self.started is not None:
            done = max(done, min((time.perf_counter() - self.started) / self.cfg.max_seconds,
                                 1.0))
        return 0.5 * (1.0 + math.cos(math.pi * done))

    def _target(self, key: int, feeds: Batch) -> list[torch.Tensor]:
        if key not in self._targets:
            with torch.no_grad():
                self._targets[key] = self.obj.target(self.teacher(feeds)[0], feeds)
        return self._targets[key]

    def train_step(self, key: int, feeds: Batch) -> float:
        self.student.train()
        out, taps = self.student(feeds, self.cfg.taps)
        loss = self.obj.loss(self.obj.target(out, feeds), self._target(key, feeds))
        if self.cfg.taps and self.cfg.tap_weight:
            with torch.no_grad():
                _, t_taps = self.teacher(feeds, self.cfg.taps)
            loss = loss + self.cfg.tap_weight * tap_loss(taps, t_taps, feeds, self.cfg.mask_input)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sched.step()
        self.step += 1
        if self.ema is not None:
            # the usual warm-up of the decay: early averages are not dominated by the start
            decay = min(self.cfg.average, (1 + self.step) / (10 + self.step))
            with torch.no_grad():
                for n, p in self.learned:
                    self.ema[n].mul_(decay).add_(p.detach(), alpha=1.0 - decay)
        return float(loss.detach())

    def _swap_average(self) -> None:
        """Exchange the learned parameters with their moving average (twice: back)."""
        assert self.ema is not None
        with torch.no_grad():
            for n, p in self.learned:
                live = p.detach().clone()
                p.copy_(self.ema[n])
                self.ema[n] = live

    def evaluate(self, holdout: Sequence[Batch]) -> float:
        """Held-out metric of the student (of its moving average when ``average``); with an
        average, the best state remembered right after is the average's."""
        scores, rows = 0.0, 0
        if self.ema is not None:
            self._swap_average()
        with torch.no_grad():
            for i, feeds in enumerate(holdout):
                n = len(next(iter(feeds.values())))
                pred = self.obj.target(self.student(feeds)[0], feeds)
                scores += n * self.obj.score(pred, self._target(-1 - i, feeds))
                rows += n
        if self.ema is not None:
            self._averaged_state = {k: v.detach().clone()
                                    for k, v in self.student.state_dict().items()}
            self._swap_average()
        return scores / max(rows, 1)

    def remember_if_best(self, score: float) -> None:
        if self.best is None or score > self.best[0]:
            state = self._averaged_state if self.ema is not None else None
            if state is None:
                state = {k: v.detach().clone() for k, v in self.student.state_dict().items()}
            self.best = (score, self.step, state)

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save({"student": self.student.state_dict(), "optimizer": self.opt.state_dict(),
                    "scheduler": self.sched.state_dict(), "step": self.step,
                    "history": self.history, "best": self.best, "average": self.ema}, tmp)
        os.replace(tmp, path)

    def load(self, path: Path) -> None:
        try:
            ck = torch.load(path, weights_only=False, map_location=self.student.device)
            self.student.load_state_dict(ck["student"])
        except (OSError, RuntimeError, KeyError) as err:
            raise QuantscopeError(f"finetune: cannot resume from checkpoint {path}: {err}") from None
        self.opt.load_state_dict(ck["optimizer"])
        self.sched.load_state_dict(ck["scheduler"])
        self.step, self.history, self.best = ck["step"], ck["history"], ck["best"]
        if self.ema is not None and ck.get("average") is not None:
            self.ema = ck["average"]


def distill(student: GraphModule, teacher: GraphModule, objective: Objective,
            train: Sequence[Batch], holdout: Sequence[Batch], config: FinetuneConfig, *,
            checkpoint: str | Path | None = None, progress: bool = False) -> FinetuneResult:
    """Train ``student`` towards ``teacher`` on ``train``; keep the best held-out state."""
    if not train or not holdout:
        raise QuantscopeError("finetune: needs at least one training and one held-out batch")
    if not 0.0 <= config.average < 1.0:
        raise QuantscopeError(f"finetune: average is a decay in [0, 1), got {config.average}")
    if config.rank_weight < 0 or config.rank_tau <= 0:
        raise QuantscopeError("finetune: the ranking term needs rank_weight >= 0 and "
                              "rank_tau > 0")
    if config.threads:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    torch.manual_seed(config.seed)
    student.place(device)
    teacher.place(device)
    train, holdout = _on(device, train), _on(device, holdout)
    d = Distiller(student, teacher, objective, config)
    if config.score_loss or config.rank_weight:
        if not isinstance(objective, EmbeddingLoss):
            raise QuantscopeError("finetune: the score-weighted and ranking losses need an "
                                  "embedding model (a sentence encoder's pooled embeddings)")
        emb = torch.cat([d._target(k, feeds)[0] for k, feeds in enumerate(train)]).cpu().numpy()
        if config.score_loss:
            objective = objective.with_scores(score_weights(emb))
        if config.rank_weight:
            objective = objective.with_bank(rank_bank(emb, seed=config.seed), config.rank_tau,
                                            config.rank_weight)
        d.obj = objective
    ck = Path(checkpoint) if checkpoint else None
    if ck is not None and ck.is_file():
        d.load(ck)
    start = time.perf_counter() - (d.history[-1]["seconds"] if d.history else 0.0)
    d.started = start
    if not d.history:
        before = d.evaluate(holdout)
        d.history.append({"step": 0, "loss": float("nan"), "holdout": before, "seconds": 0.0})
        d.remember_if_best(before)
    bar = _Progress(config.steps, d.step, progress, config.max_seconds)
    bar.started(d.history[-1]["holdout"])
    losses: list[float] = []
    while d.step < config.steps:
        key = _batch_index(d.step, len(train), config.seed)
        losses.append(d.train_step(key, train[key]))
        late = config.max_seconds is not None and time.perf_counter() - start > config.max_seconds
        done = d.step % config.eval_every == 0 or d.step == config.steps or late
        info = {"step": float(d.step), "loss": float(np.mean(losses[-config.eval_every:]))}
        if done:
            info["holdout"] = d.evaluate(holdout)
            info["seconds"] = time.perf_counter() - start
            d.history.append(info)
            d.remember_if_best(info["holdout"])
            if ck is not None:
                d.save(ck)
        bar.step(info, done)
        if late:
            break
    bar.close()
    assert d.best is not None
    student.load_state_dict(d.best[2])
    student.place("cpu")  # handed back where it came from
    teacher.place("cpu")
    return FinetuneResult(
        weights={k: p.detach().cpu().numpy().copy()
                 for k, p in student.trained_weights().items()},
        ranges=student.ranges() if config.learn_ranges else {}, history=tuple(d.history),
        seconds=time.perf_counter() - start, steps=d.step,
        samples=sum(_rows([train[_batch_index(k, len(train), config.seed)]])
                    for k in range(d.step)),
        train_rows=_rows(train), holdout_rows=_rows(holdout), metric=objective.metric,
        holdout_before=d.history[0]["holdout"], holdout_best=d.best[0], best_step=d.best[1],
        config=config, device=str(device))
