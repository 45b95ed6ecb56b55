"""Run a list of repairs for a plan: the repaired FP32 model, fresh stats, updated plan.

:func:`run_repairs` is the one runner. It applies the requested repairs in the order of
:data:`~quantscope.repair.registry.REGISTRY` (each sees the previous one's model, stats
and plan) and for each one

=============  ==========================================================================
times          the repair's own seconds (``RepairRecord.seconds``)
checks FP32    where the registry says the repair keeps the FP32 function: the outputs on
               the calibration feeds against the model before it, max abs diff recorded
               (``fp32_check``); over :data:`~quantscope.repair.verify.FP32_RTOL` of the
               output's range (relative), the repair is not applied
skips          a repair that finds no site, or whose own check fails (:class:`RepairError`),
               is recorded with ``skipped`` (why); the command goes on
recalibrates   after a graph edit, so the stats match the model that is shipped
reuses         with a :class:`RepairMemo` (a search repairing many plans of one model):
               the leading steps that never read the plan (``reads_plan`` False:
               equalize, smooth, split) are taken from the memo when the same model,
               stats, feeds and scheme ran them before, with the model, fresh stats and
               FP32 outputs they left; the steps after them run for each plan
=============  ==========================================================================

The records go into the plan file's ``repairs`` entry (:meth:`RepairRecord.to_json`).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from quantscope.calibrate.collect import calibrate
from quantscope.kept import Kept
from quantscope.model.groups import find_groups
from quantscope.model.load import Model, load_proto
from quantscope.progress import say, track
from quantscope.repair import RepairError, RepairInput, RepairStep
from quantscope.repair.registry import DEFAULT_REPAIRS, REGISTRY, RepairSpec
from quantscope.repair.verify import FP32_RTOL, max_relative_diff, run_all
from quantscope.types import Plan, QuantScheme, QuantscopeError, Stats

REPAIRS = tuple(REGISTRY)  # the CLI names, in the order they run
Batch = dict[str, np.ndarray]
Outputs = list[list[np.ndarray]]


@dataclass(frozen=True)
class RepairRecord:
    """What one repair did (every repair, range choice included, has one)."""

    name: str  # the CLI / registry name
    reason: str
    changed: tuple[str, ...]  # edited tensors (or tensors whose range method changed)
    seconds: float  # the repair itself (not the runner's check)
    fp32_check: float | None  # max |after - before| of the FP32 outputs; None: not checked
    # (the repair changes the FP32 function on purpose, or changed nothing)
    skipped: str | None = None  # why nothing was applied; None: applied
    notes: tuple[str, ...] = ()  # sites left alone and why
    effect: tuple[tuple[str, float], ...] = ()  # the repair's measured numbers

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "reason": self.reason, "seconds": round(self.seconds, 2),
            "changed": list(self.changed), "fp32_check": self.fp32_check,
            "skipped": self.skipped, "notes": list(self.notes[:50]),
            "effect": dict(self.effect),
        }


@dataclass(frozen=True, eq=False)
class RepairRun:
    proto: onnx.ModelProto  # the repaired FP32 model (what the vendor compiler gets)
    stats: Stats  # calibrated on the repaired model
    plan: Plan  # the input plan plus what the repairs changed (range methods)
    records: tuple[RepairRecord, ...]


def _max_abs_diff(ref: Outputs, test: Outputs) -> float:
    return max((float(np.abs(t.astype(np.float64) - r).max())
                for rs, ts in zip(ref, test, strict=True) for r, t in zip(rs, ts, strict=True)),
               default=0.0)


def _fp32_verdict(step: RepairStep, inp: RepairInput, ref: Outputs | None
                  ) -> tuple[float | None, str | None, Outputs | None]:
    """(max abs diff, why it fails, FP32 outputs after) of a step that promises FP32."""
    if step.proto is None:
        return 0.0, None, ref  # graph untouched: the FP32 function is the same
    if not inp.feeds:
        return None, "no calibration feeds to check the FP32 function on: not applied", ref
    before = run_all(inp.model.proto, inp.feeds) if ref is None else ref
    after = run_all(step.proto, inp.feeds)
    diff, rel = _max_abs_diff(before, after), max_relative_diff(before, after)
    if not rel <= FP32_RTOL:
        return diff, (f"changed the FP32 outputs by {rel:.3g} (relative, limit "
                      f"{FP32_RTOL:g}): not function-preserving here, not applied"), before
    return diff, None, after


def _run_one(name: str, spec: RepairSpec, inp: RepairInput, ref: Outputs | None
             ) -> tuple[RepairRecord, RepairStep | None, Outputs | None]:
    """One repair's record, the step to apply (None: skipped) and the FP32 outputs after."""
    start = time.perf_counter()
    try:
        step = spec.run(inp)
    except RepairError as e:
        seconds = time.perf_counter() - start
        return RepairRecord(name, spec.help, (), seconds, None, str(e)), None, ref
    seconds = time.perf_counter() - start
    check, why, after = None, None, None
    if not step.changed:
        why = "nothing to change on this model" + (f" ({step.notes[0]})" if step.notes else "")
        after = ref
    elif spec.keeps_fp32:
        check, why, after = _fp32_verdict(step, inp, ref)
    record = RepairRecord(name, step.reason, () if why else step.changed, seconds, check, why,
                          step.notes, step.effect)
    return record, (None if why else step), after


class RepairMemo(Kept[Hashable, tuple[Any, ...]]):
    """The plan-free leading steps of :func:`run_repairs`, for one search: up to ``size``
    entries, least recently used dropped first (each holds a repaired model's weights).
    ``hits`` / ``misses`` count the steps taken from it and run."""

    def __init__(self, size: int = 4) -> None:
        super().__init__(size)
        self.size = size


def _memo_key(name: str, inp: RepairInput) -> tuple[Any, ...]:
    """What a plan-free step reads, by identity (the entry holds the objects, so an id is
    not reused while it is kept)."""
    return (name, id(inp.model), id(inp.stats), tuple(id(f) for f in inp.feeds),
            inp.scheme, inp.proxy, id(inp.task))


def run_repairs(
    model: Model,
    stats: Stats,
    plan: Plan,
    feeds: Sequence[Batch],
    *,
    repairs: Sequence[str] = DEFAULT_REPAIRS,
    scheme: QuantScheme | None = None,
    proxy: str = "local",
    progress: bool = False,
    registry: Mapping[str, RepairSpec] = REGISTRY,
    task: object | None = None,
    memo: RepairMemo | None = None,
) -> RepairRun:
    """Run ``repairs`` (registry names) in the registry's order on ``model`` for ``plan``;
    ``memo``: reuse the leading plan-free steps another plan of the same search ran."""
    unknown = [r for r in repairs if r not in registry]
    if unknown:
        raise QuantscopeError(f"unknown repair '{unknown[0]}': use {', '.join(registry)}")
    feeds = list(feeds)
    records: list[RepairRecord] = []
    current, ref = model, None
    plan_free = memo is not None  # every step so far left the plan out
    for name in track([n for n in registry if n in repairs], "repair", unit="repair",
                      show=progress):
        say(f"repair: {name}", show=progress)
        spec = registry[name]
        inp = RepairInput(current, stats, plan, feeds, scheme=scheme, proxy=proxy, task=task)
        plan_free = plan_free and not spec.reads_plan
        key = _memo_key(name, inp) if plan_free else None
        kept = memo.get(key) if memo is not None and key is not None else None
        if kept is not None:
            record, current, stats, ref = kept[:4]
            records.append(record)
            continue
        record, step, ref = _run_one(name, spec, inp, ref)
        records.append(record)
        if step is not None and step.proto is not None:
            current = load_proto(step.proto, model.source)
            stats = calibrate(current, find_groups(current), iter(feeds), method=stats.method)
            ref = ref if spec.keeps_fp32 else None
        if step is not None and step.plan is not None:
            plan = step.plan
        if memo is not None and key is not None and (step is None or step.plan is None):
            memo.put(key, (record, current, stats, ref, inp.model, inp.stats, inp.feeds))
    return RepairRun(proto=current.proto, stats=stats, plan=plan, records=tuple(records))

