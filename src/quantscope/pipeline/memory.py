"""Each heavy stage's memory estimate, said before its work and kept in ``run.json``.

A :class:`~quantscope.pipeline.StageSpec`'s ``memory`` entry: a function of the run's
context giving the stage's :class:`~quantscope.analyze.stage_memory.StageMemory` (what
it is made of is computed there). :func:`say_estimate` says it (``[stage] memory: ~N GB
peak (...)``), hands it to :func:`~quantscope.progress.note_memory_estimate` (``run``
keeps it in ``run.json`` before the work, so a rerun after the kernel's OOM killer quotes
it, and beside the stage's measured peak once it finishes) and, where it passes the memory
available, says so in one line with what lowers it. The analysis says its own
(:func:`quantscope.analyze.memory.plan_memory`, from inside its sweeps).
"""

from __future__ import annotations

from quantscope.analyze.stage_memory import (
    StageMemory,
    calibrate_memory,
    deploy_memory,
    evaluate_memory,
    plan_search_memory,
)
from quantscope.pipeline.context import Context
from quantscope.progress import note_memory_estimate, say


def calibrate_estimate(ctx: Context) -> StageMemory:
    from quantscope.calibrate.collect import MAX_ROWS, TAP_BUDGET, tap_names
    from quantscope.model.groups import find_groups

    model = ctx.model()
    batches = list(ctx.data().fit.calibration)
    return calibrate_memory(model, batches, tap_names(model, find_groups(model)),
                            max_rows=MAX_ROWS, budget=TAP_BUDGET)


def plan_estimate(ctx: Context) -> StageMemory:
    from quantscope.calibrate.collect import tap_names
    from quantscope.model.groups import find_groups
    from quantscope.pipeline.steps import plan_scope
    from quantscope.repair.apply import RepairMemo

    model, fit = ctx.model(), ctx.data().fit
    feeds = list(fit.calibration)[: ctx.opts.repair_batches] if plan_scope(ctx).repairs else []
    return plan_search_memory(model, list(fit.evaluation), repair_feeds=feeds,
                              taps=tap_names(model, find_groups(model)) if feeds else (),
                              memo=RepairMemo().size if feeds else 0)


def evaluate_estimate(ctx: Context) -> StageMemory:
    from quantscope.analyze.measure import saturation_batches
    from quantscope.calibrate.collect import MAX_ROWS, TAP_BUDGET, tap_names
    from quantscope.model.groups import find_groups

    model, batches = ctx.model(), list(ctx.data().held_out.evaluation)
    return evaluate_memory(model, batches, tap_names(model, find_groups(model)),
                           checked=saturation_batches(batches)[0], max_rows=MAX_ROWS,
                           budget=TAP_BUDGET, read_repaired="repaired" not in ctx._cache)


def deploy_estimate(ctx: Context) -> StageMemory | None:
    """The compiled lengths' estimate, or None when the stage measures nothing (lengths
    off, or one compiled model decided: :func:`quantscope.stages.lengths.decide_lengths`)."""
    from quantscope.pipeline.data import widest_text_batch
    from quantscope.stages.buckets import CANDIDATES_CACHE_CAP
    from quantscope.stages.lengths import decide_lengths

    mode, fit = ctx.opts.length_choice(), ctx.data().fit
    if mode is None:
        return None
    model = ctx.model()
    decision = decide_lengths(model, ctx.target(), fit.token_lengths,
                              longest=ctx.opts.seq_len or widest_text_batch(fit),
                              given=mode or None)
    if not decision.buckets:
        return None
    return deploy_memory(model, list(fit.evaluation), cache_cap=CANDIDATES_CACHE_CAP)


def say_estimate(name: str, memory: StageMemory, *, show: bool) -> None:
    """The estimate said, kept, and its overflow said (nothing refused)."""
    text = memory.text()
    say(f"[{name}] memory: {text}", show=show)
    note_memory_estimate(f"{text} ({name})", memory.peak)
    over = memory.over_line()
    if over is not None:
        say(f"[{name}] {over}", show=show)
