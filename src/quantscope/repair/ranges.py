"""Range method per tensor, chosen by measured effect instead of one global method.

=============  ======================================================================
candidates     ``minmax``, ``percentile``, ``mse`` (see :mod:`quantscope.emulate.ranges`)
``local``      per tensor, the expected squared error of its own histogram under each
               candidate's grid (no model runs; ``mse`` usually wins by construction)
``output``     greedy coordinate descent with the whole plan emulated, starting from the
               best single global method (so never worse than it on ``feeds``): for each tensor
               in graph order, every candidate is tried with the others fixed and the
               one with the lowest output error (``score``, default relative MSE of
               the model outputs against FP32) is kept; candidates whose encoding equals
               the current one are not re-run. Cost: up to ``len(candidates) - 1`` emulated
               runs over ``feeds`` per tensor
masks          the attention-mask handling of :func:`encode` is kept (each candidate
               encoding comes from ``encode`` itself)
=============  ======================================================================
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx

from quantscope.emulate.encode import encode
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.emulate.ranges import METHODS
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.numerics import fake_quant
from quantscope.repair import RepairInput, RepairStep, as_model
from quantscope.repair.verify import Batch, run_all
from quantscope.types import Encoding, Encodings, Groups, Plan, QuantScheme, QuantscopeError, Stats

Outputs = list[list[np.ndarray]]
Score = Callable[[Outputs, Outputs], float]


@dataclass(frozen=True)
class RangeChoice:
    """Chosen method per activation tensor, and the error each candidate measured."""

    methods: tuple[tuple[str, str], ...]
    errors: tuple[tuple[str, tuple[tuple[str, float], ...]], ...]
    proxy: str
    default: str
    seconds: float = 0.0

    def mapping(self) -> dict[str, str]:
        return dict(self.methods)


def relative_mse(ref: Outputs, test: Outputs) -> float:
    noise = sum(
        float(np.sum((t.astype(np.float64) - r) ** 2))
        for rs, ts in zip(ref, test, strict=True)
        for r, t in zip(rs, ts, strict=True)
    )
    power = sum(float(np.sum(r.astype(np.float64) ** 2)) for rs in ref for r in rs)
    return noise / max(power, 1e-30)


def encode_with_methods(
    model: Model,
    groups: Groups,
    stats: Stats,
    plan: Plan,
    methods: Mapping[str, str],
    *,
    scheme: QuantScheme | None = None,
) -> Encodings:
    """Like :func:`encode`, with a range method per activation tensor (others: stats.method)."""
    wanted = {stats.method, *methods.values()}
    if not wanted <= set(METHODS):
        raise QuantscopeError(f"unknown range method in {sorted(wanted)}: use {', '.join(METHODS)}")
    scheme = scheme_for(plan, scheme)
    by = {m: encode(model, groups, stats, plan, scheme=scheme, method=m) for m in wanted}
    base = by[stats.method]
    acts = {t: by[methods.get(t, stats.method)].activations[t] for t in base.activations}
    return Encodings(activations=acts, weights=base.weights, scheme=base.scheme, notes=base.notes)


def _hist_error(stats: Stats, name: str, enc: Encoding) -> float:
    ts = stats.tensors[name]
    edges = np.linspace(-ts.hist_range, ts.hist_range, ts.hist.size + 1)
    c = ((edges[:-1] + edges[1:]) / 2).astype(np.float32)
    lo, hi = enc.range()
    inside = (c >= lo) & (c <= hi)
    err = np.where(inside, float(enc.scale) ** 2 / 12.0, (fake_quant(c, enc) - c) ** 2)
    return float((err * ts.hist).sum() / max(ts.hist.sum(), 1))


def _same(a: Encoding, b: Encoding) -> bool:
    return bool(np.array_equal(a.scale, b.scale) and np.array_equal(a.zero_point, b.zero_point))


def choose_range_methods(
    model: Model | onnx.ModelProto,
    stats: Stats,
    plan: Plan,
    feeds: Sequence[Batch] = (),
    *,
    proxy: str = "output",
    scheme: QuantScheme | None = None,
    candidates: Sequence[str] = METHODS,
    score: Score = relative_mse,
) -> RangeChoice:
    """Pick a range method for every activation tensor the plan quantizes."""
    if proxy not in ("local", "output"):
        raise QuantscopeError(f"unknown range proxy '{proxy}': use 'local' or 'output'")
    if proxy == "output" and not feeds:
        raise QuantscopeError("the 'output' range proxy needs sample inputs (feeds)")
    start = time.perf_counter()
    m = as_model(model)
    groups = find_groups(m)
    scheme = scheme_for(plan, scheme)
    by = {c: encode(m, groups, stats, plan, scheme=scheme, method=c) for c in candidates}
    tensors = list(by[candidates[0]].activations)
    if proxy == "local":
        errors = {
            t: {c: _hist_error(stats, t, by[c].activations[t]) for c in candidates} for t in tensors
        }
        chosen = {t: min(e, key=e.get) for t, e in errors.items()}
    else:
        chosen, errors = _greedy(m, groups, stats, plan, scheme, by, tensors, feeds, score)
    return RangeChoice(
        methods=tuple(chosen.items()),
        errors=tuple((t, tuple(e.items())) for t, e in errors.items()),
        proxy=proxy,
        default=stats.method,
        seconds=time.perf_counter() - start,
    )


def _greedy(
    m: Model,
    groups: Groups,
    stats: Stats,
    plan: Plan,
    scheme: QuantScheme,
    by: dict[str, Encodings],
    tensors: list[str],
    feeds: Sequence[Batch],
    score: Score,
) -> tuple[dict[str, str], dict[str, dict[str, float]]]:
    ref = run_all(m.proto, feeds)

    def run(choice: dict[str, str]) -> float:
        # the plan's own per-tensor methods win, as in ``by`` (encode honours plan.ranges)
        ranges = tuple(sorted({**choice, **dict(plan.ranges)}.items()))
        q = quantize_model(m, stats, replace(plan, ranges=ranges), scheme=scheme, groups=groups)
        return score(ref, run_all(q.proto, feeds))

    uniform = {c: run(dict.fromkeys(tensors, c)) for c in by}  # start from the best global one
    start = min(uniform, key=uniform.get)
    chosen, best = dict.fromkeys(tensors, start), uniform[start]
    errors: dict[str, dict[str, float]] = {}
    for t in tensors:
        errors[t] = {chosen[t]: best}
        for c in by:
            if c == chosen[t] or _same(by[c].activations[t], by[chosen[t]].activations[t]):
                continue
            err = run({**chosen, t: c})
            errors[t][c] = err
            if err < best:
                best, chosen[t] = err, c
    return chosen, errors


def ranges_step(inp: RepairInput) -> RepairStep:
    """The registry's ``ranges``: the chosen methods that differ from the stats' go into
    the plan's ``ranges`` (no graph edit)."""
    choice = choose_range_methods(inp.model, inp.stats, inp.plan, inp.feeds, proxy=inp.proxy,
                                  scheme=inp.scheme)
    changed = {t: m for t, m in choice.methods if m != inp.stats.method}
    ranges = tuple(sorted({**dict(inp.plan.ranges), **changed}.items()))
    return RepairStep(
        reason=f"per-tensor range method by measured {choice.proxy} error",
        changed=tuple(sorted(changed)),
        plan=replace(inp.plan, ranges=ranges),
        notes=tuple(f"{t}: {inp.stats.method} measured best" for t, m in choice.methods
                    if m == inp.stats.method),
    )
