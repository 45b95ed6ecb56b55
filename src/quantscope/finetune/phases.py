"""Quantization-aware distillation of a decoder's two phase graphs under one plan.

A decoder LLM is deployed as two subnets that read one set of weights (prefill over the
prompt, decode one token at a time on the KV cache), each with its own activation grids
(``plan.for_phase``). The fine-tune trains that one set of weights for both:

=====================  ==============================================================
students               each phase's QDQ graph (``quantize_model``, the one composition
                       the emulation measures) converted by :func:`~.graph.to_torch`;
                       the decode student's float weights are the prefill student's
                       Parameters (tied by initializer name), so one optimiser step
                       moves both graphs' weights; the activation grids stay the
                       calibrated ones (recalibrate after: :func:`~quantscope.tasks.
                       lm_phases.calibrate_phases`), or with ``learn_ranges`` each
                       phase's per-tensor grids learn too (LSQ's scale and zero-point,
                       ``range_lr``; the KV cache's held: prefill writes it, decode reads
                       it) and come back per phase (``PhaseTuneResult.ranges``: pin them),
                       or with ``regrid_every`` and a ``regrid`` callback (the phases'
                       calibration of the graphs with the current weights) they are set
                       to that fresh calibration's every that many steps
teacher                the FP32 prefill graph
loss                   per training window, the KL of the student prefill's next-token
                       distributions from the teacher's at every position, plus
                       ``decode_weight`` x the mean KL of ``decode_positions`` decode
                       steps, each fed the student prefill's own cache of the tokens
                       before it (detached: what the device's decode reads)
not trained            constants only one graph has (a KV prefix's keys and values:
                       recompute them from the trained weights), embedding tables
                       read by Gather, scalars
=====================  ==============================================================
Each step fake-quantises every weight once per student (:meth:`~.graph.GraphModule.
weights_held`) and sums the windows' losses for one backward pass. On CUDA when PyTorch
sees a GPU (``device``), the students and the teacher placed as the encoder fine-tune's
(:meth:`~.graph.GraphModule.place`); not yet run on one. Adam, a linear warm-up
over the first tenth of the schedule, then cosine. The schedule's progress is the share
of the steps taken or, under a time budget (``max_seconds``), of the budget spent,
whichever is larger: the rate anneals to zero within the budget on any machine, and
``steps`` is then a cap (the clock ends a CPU's run first; a GPU may reach the cap).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from quantscope.emulate.qdq import plan_encodings, quantize_model, scheme_for
from quantscope.finetune.apply import fp32_weights
from quantscope.finetune.distill import resolve_device
from quantscope.finetune.graph import GraphModule, to_torch
from quantscope.model.load import Model
from quantscope.model.phases import PAST_PREFIX
from quantscope.progress import track
from quantscope.tasks.lm import TokenWindows
from quantscope.types import Plan, QuantscopeError, Stats

Tensor = torch.Tensor


@dataclass(frozen=True)
class PhaseTuneConfig:
    steps: int = 60
    lr: float = 2e-5
    batch: int = 4  # windows per step (the phase graphs take one window per pass)
    decode_positions: int = 4  # decode steps per window, in its second half
    decode_weight: float = 1.0
    max_seconds: float | None = None
    seed: int = 0
    device: str | None = None  # None: CUDA when PyTorch sees a GPU, else the CPU
    learn_ranges: bool = False  # LSQ: each phase's per-tensor activation grids learn too
    range_lr: float = 1e-3  # their log-scale and zero-point shift (as the encoder's)
    regrid_every: int = 0  # > 0: the grids calibrated again every that many steps (``regrid``)


@dataclass(frozen=True)
class PhaseTuneResult:
    weights: dict[str, np.ndarray]  # initializer name -> trained FP32 array (both graphs)
    log: tuple[dict[str, float], ...]  # per step: the mean prefill and decode KL, lr, time
    steps: int
    seconds: float
    windows: int
    device: str = "cpu"
    # phase -> tensor -> learned (lo, hi), with ``learn_ranges`` (empty otherwise)
    ranges: dict[str, dict[str, tuple[float, float]]] = dataclasses.field(default_factory=dict)
    regrids: tuple[dict[str, int], ...] = ()  # per regrid: its step and the grids it changed

    def summary(self) -> str:
        first, last = self.log[0], self.log[-1]
        return (f"quantization-aware distillation of both phases: {self.steps} steps on "
                f"{self.windows} windows, {self.seconds:.0f} s on {self.device}; training KL prefill "
                f"{first['prefill_kl']:.4f} -> {last['prefill_kl']:.4f}, decode "
                f"{first['decode_kl']:.4f} -> {last['decode_kl']:.4f} (one step's windows "
                "each: noisy; the evaluation measures)")


def schedule(step: int, steps: int, spent: float = 0.0, budget: float | None = None) -> float:
    """The learning rate's factor at ``step`` (0-based) of ``steps``, ``spent`` seconds of
    a ``budget`` in: a linear warm-up over the first tenth of the progress, then cosine to
    zero, the progress being the larger share of steps or of the budget."""
    progress = step / steps
    if budget:
        progress = max(progress, spent / budget)
    progress = min(progress, 1.0)
    warm = max(0.1, 1 / steps)
    return min(1.0, (progress + 1 / steps) / warm) * 0.5 * (1 + math.cos(math.pi * progress))


def kl_logits(student: Tensor, teacher: Tensor) -> Tensor:
    """Mean over rows of KL(teacher || student) of the softmax over the last axis."""
    lt = F.log_softmax(teacher.float(), -1)
    return (lt.exp() * (lt - F.log_softmax(student.float(), -1))).sum(-1).mean()


def _students(models: dict[str, Model], stats: dict[str, Stats], plan: Plan
              ) -> tuple[GraphModule, GraphModule, list[str]]:
    """The phases' students, decode's float weights tied to prefill's; the tied names."""
    made = {}
    for phase, model in models.items():
        p = plan.for_phase(phase)
        q = quantize_model(model, stats[phase], p, scheme=scheme_for(p, None))
        made[phase] = to_torch(q.proto, float_weights=fp32_weights(model),
                               scheme=q.encodings.scheme)
    pre, dec = made["prefill"], made["decode"]
    tied = [n for n in dec.param_names if n in pre.param_names]
    for name in tied:
        setattr(dec, dec.param_names[name], getattr(pre, pre.param_names[name]))
    alone = [n for n in dec.param_names if n not in pre.param_names]
    if alone:
        raise QuantscopeError(f"finetune: the decode graph has weights the prefill graph has "
                              f"not (e.g. '{alone[0]}'): not one model's two phases")
    for name, p in pre.trained_weights().items():
        p.requires_grad_(name in tied)
    for q in (*pre.quant_parameters(), *dec.quant_parameters()):
        q.requires_grad_(False)
    return pre, dec, tied


def _learned_grids(*students: GraphModule) -> list[torch.nn.Parameter]:
    """The activation grids a phase learns alone: per-tensor, not the KV cache (prefill
    writes it, decode reads it: one format both must share)."""
    out = []
    for s in students:
        for q in s.act_quants:
            if q.s0.dim() == 0 and not _cache_tensor(q.key):
                for p in q.parameters():
                    p.requires_grad_(True)
                    out.append(p)
    return out


def _cache_tensor(name: str) -> bool:
    return name.startswith(("present.", PAST_PREFIX))


def _ranges(student: GraphModule) -> dict[str, tuple[float, float]]:
    return {k: v for k, v in student.ranges().items() if not _cache_tensor(k)}


Regrid = Callable[[dict[str, np.ndarray]], dict[str, Stats]]


def phase_regrid(open_phase: Callable[[str], Model], tokens: Sequence[int],
                 windows: TokenWindows, steps: int) -> Regrid:
    """The ``regrid`` a run passes: the unprefixed phase graphs (``open_phase``, a fresh
    graph per call) with the current weights written in, the KV prefix of ``tokens``
    computed again from them in FP32, both phases calibrated on ``windows`` as the run
    calibrates them (``steps`` decode positions per window)."""
    from quantscope.analyze.prefix import compute_prefix, prefixed_opener
    from quantscope.model.load import with_initializers
    from quantscope.tasks.lm_phases import calibrate_phases

    def regrid(weights: dict[str, np.ndarray]) -> dict[str, Stats]:
        def now(phase: str) -> Model:
            return with_initializers(open_phase(phase), weights, "fine-tune (regrid)")

        kv = compute_prefix(now("prefill"), tokens) if tokens else None
        return calibrate_phases(prefixed_opener(now, kv), windows, steps=steps)

    return regrid


def set_grids(student: GraphModule, model: Model, stats: Stats, plan: Plan) -> int:
    """Every activation grid of ``student`` set to the one ``stats`` gives under ``plan``
    (the encoding :func:`~quantscope.emulate.qdq.quantize_model` writes: what ONNX Runtime
    would run with that calibration); how many changed."""
    enc, _ = plan_encodings(model, stats, plan, scheme=scheme_for(plan, None))
    changed = 0
    with torch.no_grad():
        for q in student.act_quants:
            e = enc.activations.get(q.key)
            if e is None:
                continue
            scale = torch.as_tensor(np.asarray(e.scale, np.float32)).reshape(q.s0.shape)
            zp = torch.as_tensor(np.asarray(e.zero_point, np.float32)).reshape(q.z0.shape)
            changed += int(not (torch.equal(q.s0.cpu(), scale) and torch.equal(q.z0.cpu(), zp)))
            q.s0.copy_(scale)
            q.z0.copy_(zp)
    return changed


def _window_loss(ids: np.ndarray, pre: GraphModule, dec: GraphModule, teacher: GraphModule,
                 prefix: int, positions: Sequence[int], decode_weight: float
                 ) -> tuple[Tensor, float, float]:
    feeds = {"input_ids": torch.from_numpy(ids[None])}
    with torch.no_grad():
        ref = dict(zip(teacher.output_names, teacher(feeds)[0], strict=True))["logits"][0]
    out = dict(zip(pre.output_names, pre(feeds)[0], strict=True))
    loss = kl_logits(out["logits"][0, :-1], ref[:-1])
    dl_sum, pl = 0.0, float(loss.detach())
    past = [n for n in dec.input_names if n.startswith(PAST_PREFIX)]
    for t in positions:
        step = {"input_ids": feeds["input_ids"][:, t:t + 1]}
        for n in past:  # the student prefill's own cache of the tokens before t
            step[n] = out["present." + n[len(PAST_PREFIX):]][:, :, :prefix + t].detach()
        logits = dict(zip(dec.output_names, dec(step)[0], strict=True))["logits"][0, 0]
        dl = kl_logits(logits[None], ref[t][None])
        dl_sum += float(dl.detach())
        loss = loss + decode_weight * dl / len(positions)
    return loss, pl, dl_sum / max(len(positions), 1)


def distill_phases(models: dict[str, Model], stats: dict[str, Stats], plan: Plan,
                   windows: Sequence[np.ndarray], config: PhaseTuneConfig = PhaseTuneConfig(),
                   *, prefix: int = 0, progress: bool = False, regrid: Regrid | None = None
                   ) -> PhaseTuneResult:
    """Train the weights both of ``models`` (``prefill``, ``decode``; the prefill graph with
    its constant KV prefix of ``prefix`` positions, if any) share under ``plan``, on token
    ``windows`` (disjoint from what will measure the result). See the module docstring.
    ``regrid``: given the current weights (by initializer name), both phases' calibration
    of the graphs with them; every ``config.regrid_every`` steps the students' grids are
    set from it (:func:`set_grids`), so the steps see the grids the result will be
    measured with."""
    seq = min(len(w) for w in windows)
    if seq < 4 or len(windows) < config.batch:
        raise QuantscopeError(f"finetune: {len(windows)} window(s) of {seq} tokens: needs at "
                              f"least {config.batch} of 4 tokens or more")
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    device = resolve_device(config.device)
    pre, dec, tied = _students(models, stats, plan)
    teacher = to_torch(models["prefill"].proto)
    if device.type != "cpu":  # tied Parameters stay tied: their data moves in place
        for module in (pre, dec, teacher):
            module.place(device)
    for p in teacher.parameters():
        p.requires_grad_(False)
    weights = pre.trained_weights()
    grids = _learned_grids(pre, dec) if config.learn_ranges else []
    opt = torch.optim.Adam([g for g in ({"params": [weights[n] for n in tied], "lr": config.lr},
                                        {"params": grids, "lr": config.range_lr})
                            if g["params"]])
    budget = config.max_seconds
    k = min(config.decode_positions, seq - 1 - seq // 2)
    log: list[dict[str, float]] = []
    regrids: list[dict[str, int]] = []
    start = time.perf_counter()
    order: list[int] = []
    limit = f", stopped at {config.max_seconds:.0f} s" if config.max_seconds else ""
    # under a time budget the steps are a cap: counted, no ETA from them
    steps = iter(range(config.steps)) if budget else range(config.steps)
    for step in track(steps, f"finetune (both phases{limit})", unit="step", show=progress):
        spent = time.perf_counter() - start
        if budget is not None and spent > budget:
            break
        if regrid is not None and config.regrid_every and step and step % config.regrid_every == 0:
            fresh = regrid({n: weights[n].detach().cpu().numpy() for n in tied})
            moved = sum(set_grids(st, models[ph], fresh[ph], plan.for_phase(ph))
                        for ph, st in (("prefill", pre), ("decode", dec)))
            regrids.append({"step": step, "grids_changed": moved})
        factor = schedule(step, config.steps, spent, budget)
        lr = config.lr * factor
        for g, base_lr in zip(opt.param_groups, (config.lr, config.range_lr), strict=False):
            g["lr"] = base_lr * factor
        if len(order) < config.batch:
            order = rng.sample(range(len(windows)), len(windows))
        picked, order = order[:config.batch], order[config.batch:]
        opt.zero_grad()
        total, pls, dls = None, 0.0, 0.0
        with pre.weights_held(), dec.weights_held():
            for i in picked:
                positions = rng.sample(range(seq // 2, seq - 1), k)
                loss, pl, dl = _window_loss(windows[i][:seq], pre, dec, teacher, prefix,
                                            positions, config.decode_weight)
                total = loss if total is None else total + loss
                pls, dls = pls + pl, dls + dl
            assert total is not None
            (total / len(picked)).backward()
        opt.step()
        log.append({"step": step + 1, "prefill_kl": pls / len(picked),
                    "decode_kl": dls / len(picked), "lr": lr,
                    "seconds": round(time.perf_counter() - start, 1)})
    if not log:
        raise QuantscopeError("finetune: the time budget ended before the first step")
    ranges = {"prefill": _ranges(pre), "decode": _ranges(dec)} if config.learn_ranges else {}
    return PhaseTuneResult({n: weights[n].detach().cpu().numpy().copy() for n in tied},
                           tuple(log), len(log), time.perf_counter() - start, len(windows),
                           str(device), ranges, tuple(regrids))


__all__ = ["PhaseTuneConfig", "PhaseTuneResult", "Regrid", "distill_phases", "kl_logits",
           "phase_regrid", "schedule", "set_grids"]
