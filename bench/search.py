"""Benchmark: plans measured per minute by the planner's evaluators, against the issue's "today".

One realistic sequence of planner plans on a built-in text model: from uniform a8_w8,
``--plans`` times promote one random group (not promoted yet) to a16_w16 and measure the
plan; keep the promotion when the metric does not drop (a measured greedy search, as the
refine steps of ``quantscope plan`` measure one changed plan after another, and as its
one-at-a-time drops compare each candidate with the incumbent). Every variant measures
the same sequence in this process (ratios against the baseline, run first); each prints
its wall time, plans per minute, and whether it took the same decisions and measured the
same values (largest difference) as the baseline, and the chosen plan. Then the part the
incremental evaluator changes, alone: the emulated outputs of the same plans by one full
QDQ graph each vs the runner (the scoring left out).

The variants are the registry :data:`VARIANTS` (name -> a factory of ``plan -> value``):

* ``today`` (the baseline): the issue's "today", reproduced: one full QDQ graph and
  session per plan (``evaluate_plan``, FP32's outputs once) with every metric scored as
  the code before the reference's memo and the Gram-matrix effective rank scored it: the
  collapse indicators of FP32's embeddings recomputed for every plan (the memo emptied
  before each) and both effective ranks by an SVD (:func:`effective_rank_svd`);
* ``naive``: the same full pass per plan, scored as the code scores now;
* ``incremental``: the planner's evaluator as the docs first measured it
  (:mod:`quantscope.analyze.incremental`, each plan run from its first changed segment),
  scored with the SVD effective rank (the reference's memoised);
* ``incremental+cheap``: the planner's evaluator as ``plan`` runs it now: incremental,
  and scored as the planner reads it (only the metric it ranks by:
  ``evaluate_plan(..., only=metric)``, against FP32's pooled rows, the collapse indicators skipped, every other
  figure of a plan measured again in full by ``evaluate``);
* ``incremental+cheap-floats``: the same with the activation cache holding every tensor
  crossing a cut as float32, as before the codes (:mod:`quantscope.analyze.cut_codes`:
  a quantized tensor kept as its integer codes where they give it back bit for bit);
* ``incremental+cheap+race``: that, with each candidate first raced against the
  incumbent on prefixes of the pairs (``plan --race``'s racer,
  :class:`quantscope.stages.race.PlanRacer`, as ``plan/refine.py`` races its drops), every
  racing plan by a full QDQ session (the racer before it ran on the engine:
  ``incremental=False``); a candidate stopped there is not measured and not kept (its
  value is NaN in the row);
* ``incremental+cheap+race-on-engine``: the same race on the incremental engine, as
  ``plan --race`` runs it now (:class:`quantscope.stages.race.RaceRuns`: per chunk of
  pairs between two looks, each plan from its first changed segment after the
  incumbent's cached cut tensors, the sessions shared with the evaluator's engine);
* ``screen`` (asked for by name; an approximation measured and not adopted): the
  planner's evaluator on a random ``--screen-fraction`` of the pairs (fewer pairs per
  candidate, the issue's other way to more evaluations a minute), the walk's chosen plan
  then measured on every pair (``confirmed_in_ort``);
* ``torch`` (asked for by name, not in the default list): the planner's ``--rank-engine
  torch`` evaluator (:class:`quantscope.finetune.rank.TorchMeasure`) on ``--torch-device``
  (``cuda`` by default), its build inside the timing; the walk's chosen plan is measured
  again in ORT after the timing (``confirmed_in_ort``, and its difference from the
  baseline's chosen figure), as ``plan`` confirms a torch-ranked choice.

    .venv/bin/python bench/search.py --model minilm-l3 --pairs 64 --seq-len 128 --plans 16
    python bench/search.py --variants today,incremental+cheap,torch --torch-device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from quantscope import stages
from quantscope.analyze.incremental import IncrementalConfig, IncrementalEngine, IncrementalRunner
from quantscope.analyze.measure import (
    evaluate_plan,
    headline,
    qdq_for_plan,
    reference_kept_outputs,
)
from quantscope.emulate.evaluate import run_model
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.plan.race import RaceRule
from quantscope.stages.race import PlanRacer
from quantscope.tasks import metrics
from quantscope.tasks.registry import at_length
from quantscope.types import Dataset, Outputs, Plan, Precision, QuantScheme, Stats

Evaluate = Callable[[Plan], float]


@dataclass(frozen=True, eq=False)
class Setup:
    """What every variant measures with: the model, the data, the statistics, the metric
    and FP32's outputs on the evaluation texts (computed once, outside the timings)."""

    model: Model
    data: Dataset
    stats: Stats
    metric: str
    reference: Outputs | None  # FP32's outputs per token (None: only the cheap variant runs)
    reference_kept: Outputs | None = None  # as the task keeps them: what the planner holds


def _svd_scoring() -> None:
    """The scoring before the Gram form: every effective rank by an SVD."""
    metrics.effective_rank = metrics.effective_rank_svd  # restored by _gram_scoring


def _gram_scoring() -> None:
    metrics.effective_rank = _GRAM


_GRAM = metrics.effective_rank


def today(s: Setup) -> Evaluate:
    def run(plan: Plan) -> float:
        _svd_scoring()
        metrics._REF_INDICATORS.clear()  # the code before the memo: FP32's recomputed
        return float(evaluate_plan(s.model, s.data, s.stats, plan, reference_outputs=s.reference,
                                   saturation=False)["metrics"][s.metric])

    return run


def naive(s: Setup) -> Evaluate:
    def run(plan: Plan) -> float:
        _gram_scoring()
        return float(evaluate_plan(s.model, s.data, s.stats, plan, reference_outputs=s.reference,
                                   saturation=False)["metrics"][s.metric])

    return run


def incremental(s: Setup) -> Evaluate:
    engine = IncrementalEngine(s.model, s.data.evaluation)

    def run(plan: Plan) -> float:
        _svd_scoring()
        return float(evaluate_plan(s.model, s.data, s.stats, plan, reference_outputs=s.reference,
                                   saturation=False, engine=engine)["metrics"][s.metric])

    run.engine = engine  # type: ignore[attr-defined]  # its counts, for the printout
    return run


def cheap(s: Setup, *, codes: bool = True) -> Evaluate:
    engine = IncrementalEngine(s.model, s.data.evaluation,
                               config=IncrementalConfig(cut_codes=codes))

    def run(plan: Plan) -> float:
        _gram_scoring()
        return float(evaluate_plan(s.model, s.data, s.stats, plan, reference_outputs=s.reference,
                                   saturation=False, engine=engine, only=s.metric,
                                   reference_kept=s.reference_kept)["metrics"][s.metric])

    run.engine = engine  # type: ignore[attr-defined]
    return run


def cheap_floats(s: Setup) -> Evaluate:
    """The planner's evaluator with the cut tensors cached as floats (before the codes)."""
    return cheap(s, codes=False)


def raced(s: Setup, *, on_engine: bool = False) -> Evaluate:
    measure = cheap(s)
    racer = PlanRacer(s.model, s.data, s.stats, s.metric, RaceRule(), scheme=QuantScheme(),
                      engine=measure.engine if on_engine else None,  # type: ignore[attr-defined]
                      incremental=on_engine)
    state: dict[str, Plan] = {}

    def run(plan: Plan) -> float:
        incumbent = state.get("incumbent")
        if incumbent is not None and racer([incumbent, plan]).entries[1].stopped:
            return float("nan")  # stopped on a prefix: not measured, not kept
        return measure(plan)

    def keep(plan: Plan) -> None:
        state["incumbent"] = plan

    run.engine = measure.engine  # type: ignore[attr-defined]
    run.keep = keep  # type: ignore[attr-defined]  # the walk tells it the incumbent
    run.racer = racer  # type: ignore[attr-defined]
    return run


def raced_on_engine(s: Setup) -> Evaluate:
    return raced(s, on_engine=True)


def torch_ranked(s: Setup) -> Evaluate:
    """The planner's ``--rank-engine torch`` evaluator (:class:`TorchMeasure`, the fake-quant
    interpreter built on the first plan, inside the timing) on ``TORCH_DEVICE``; the walk's
    chosen plan is measured again in ORT after the timing (``confirmed_in_ort``)."""
    from quantscope.finetune.rank import TorchMeasure

    measure = TorchMeasure(s.model, s.data, scheme=QuantScheme(), device=TORCH_DEVICE[0],
                           reference_outputs=s.reference)

    def run(plan: Plan) -> float:
        _gram_scoring()
        return float(measure(s.model, s.stats, plan)[s.metric])

    run.ranked_by = f"torch ({TORCH_DEVICE[0]})"  # type: ignore[attr-defined]
    return run


TORCH_DEVICE = ["cuda"]  # --torch-device
SCREEN = [0.25]  # --screen-fraction


def screen_pairs(data: Dataset, fraction: float, seed: int = 0) -> Dataset:
    """``data`` on a random ``fraction`` of its retrieval pairs (both texts of each)."""
    import dataclasses

    task = data.task
    n = task.n_pairs  # type: ignore[union-attr]
    k = max(1, round(n * fraction))
    pairs = np.sort(np.random.default_rng(seed).permutation(n)[:k])
    cut = dataclasses.replace(task.only_texts(np.concatenate([pairs, n + pairs])),  # type: ignore[union-attr]
                              n_pairs=k)
    return dataclasses.replace(data, evaluation=cut.batches.batches, task=cut)


def screened(s: Setup) -> Evaluate:
    """An approximation measured and not adopted: the planner's evaluator on a random
    ``SCREEN`` fraction of the pairs (its texts only: each query ranked among the subset's
    documents); the walk's chosen plan is measured again on every pair after the timing
    (``confirmed_in_ort``), as a ranked choice is."""
    data = screen_pairs(s.data, SCREEN[0])
    measure = cheap(Setup(s.model, data, s.stats, s.metric, None,
                          reference_kept_outputs(s.model, data)))
    measure.ranked_by = (  # type: ignore[attr-defined]
        f"ort on {data.task.n_pairs} of {s.data.task.n_pairs} pairs")  # type: ignore[union-attr]
    return measure


VARIANTS: dict[str, Callable[[Setup], Evaluate]] = {
    "today": today,  # the baseline: first, every ratio is against it
    "naive": naive,
    "incremental": incremental,
    "incremental+cheap": cheap,
    "incremental+cheap-floats": cheap_floats,  # the cache without the codes (cut_codes)
    "incremental+cheap+race": raced,
    "incremental+cheap+race-on-engine": raced_on_engine,
    "torch": torch_ranked,  # not in the default list: ranks on --torch-device
    "screen": screened,  # not in the default list: ranks on --screen-fraction of the pairs
}
DEFAULT_VARIANTS = ("today", "naive", "incremental", "incremental+cheap",
                    "incremental+cheap+race", "incremental+cheap+race-on-engine")


def greedy_sequence(evaluate: Evaluate, names: tuple[str, ...], n: int, seed: int
                    ) -> tuple[list[float], list[bool], float, list[Plan]]:
    """The measured greedy walk (module docstring): values, kept or not, seconds, plans."""
    rng = np.random.default_rng(seed)
    order = [names[i] for i in rng.permutation(len(names))[:n]]
    t0 = time.perf_counter()
    kept: list[str] = []
    plans = [Plan.uniform(Precision.A8_W8)]
    tell = getattr(evaluate, "keep", lambda plan: None)  # the incumbent, for a race
    best = evaluate(plans[0])
    tell(plans[0])
    values, taken = [best], [True]
    for g in order:
        plans.append(Plan(default=Precision.A8_W8,
                          overrides=tuple((x, Precision.A16_W16) for x in [*kept, g])))
        v = evaluate(plans[-1])
        values.append(v)
        taken.append(v >= best)  # False for NaN: stopped by a race
        if v >= best:
            kept, best = [*kept, g], v
            tell(plans[-1])
    return values, taken, time.perf_counter() - t0, plans


def outputs_only(s: Setup, plans: list[Plan]) -> dict[str, float]:
    """The part the incremental evaluator changes, alone: the emulated outputs of the same
    plans, by one full QDQ graph each vs the runner (seconds each, largest difference)."""
    batches = list(s.data.evaluation)
    runner = IncrementalRunner(s.model, s.stats, batches, scheme=QuantScheme())
    full_s, fast_s, diff = 0.0, 0.0, 0.0
    for p in plans:  # one plan's outputs held at a time
        t0 = time.perf_counter()
        full = run_model(qdq_for_plan(s.model, s.stats, p)[0], batches)
        t1 = time.perf_counter()
        fast = runner.outputs(p)
        fast_s, full_s = fast_s + time.perf_counter() - t1, full_s + t1 - t0
        diff = max([diff, *(float(np.max(np.abs(a - b)))
                            for x, y in zip(full.batches, fast.batches, strict=True)
                            for a, b in zip(x, y, strict=True))])
    return {"plans": len(plans), "full_seconds": round(full_s, 2),
            "incremental_seconds": round(fast_s, 2), "speedup": round(full_s / fast_s, 2),
            "max_abs_difference": diff, "engine": runner.counts.engine}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="minilm-l3")
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--plans", type=int, default=16, help="promotions measured after the start")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help=f"comma list of {', '.join(VARIANTS)} (the first is the baseline)")
    ap.add_argument("--torch-device", default="cuda", help="where the torch variant ranks")
    ap.add_argument("--screen-fraction", type=float, default=0.25,
                    help="the share of the pairs the screen variant ranks on")
    ap.add_argument("--metric", help="the measured metric (default: the task's headline)")
    ap.add_argument("--no-outputs-only", action="store_true",
                    help="skip the emulated-outputs-only comparison at the end")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    TORCH_DEVICE[0] = args.torch_device
    SCREEN[0] = args.screen_fraction
    model = stages.open_model(args.model)
    data = at_length(stages.open_data("stdlib-docs", model, max_pairs=args.pairs),
                     args.seq_len)
    t = time.perf_counter()
    stats = stages.calibrate_model(model, data)
    calib = time.perf_counter() - t
    setup = Setup(model, data, stats, headline(data, args.metric).metric,
                  run_model(model.proto, list(data.evaluation)),
                  reference_kept_outputs(model, data))
    names = find_groups(model).names()
    print(f"{args.model}: {len(names)} groups, {args.pairs} pairs at seq-len {args.seq_len}, "
          f"metric {setup.metric}; calibration {calib:.1f} s; {os.cpu_count()} cores "
          f"({platform.processor() or platform.machine()})")
    naive(setup)(Plan.uniform(Precision.A8_W8))  # warm-up, untimed: no variant pays the
    _gram_scoring()  # one-off costs of the first ORT session and of lazy imports
    rows, base = [], None
    loads = [list(os.getloadavg())]
    for name in args.variants.split(","):
        evaluate = VARIANTS[name](setup)
        cpu = time.process_time()  # the process's CPU (ORT's threads too): on a shared
        values, taken, secs, plans = greedy_sequence(evaluate, names, args.plans, args.seed)
        cpu = time.process_time() - cpu  # machine a steadier figure than the wall time
        base = base or (values, taken, secs)
        last = max(i for i, k in enumerate(taken) if k)
        done = ~np.isnan(values)
        row = {"variant": name, "plans": len(values), "seconds": round(secs, 2),
               "cpu_seconds": round(cpu, 2),
               "plans_per_minute": round(60 * len(values) / secs, 2),
               "speedup": round(base[2] / secs, 2), "same_decisions": taken == base[1],
               "max_value_difference": float(np.max(np.abs(
                   np.subtract(values, base[0])[done]))),
               "stopped_by_race": int(np.sum(~done)),
               "chosen": values[last],
               "chosen_plan": sorted(g for g, _ in plans[last].overrides),
               "values": values}
        engine = getattr(evaluate, "engine", None)
        if engine is not None:
            row["engine"] = engine.counts.to_dict()
            if engine.cuts is not None:  # per cut: stored, dropped, evicted, hits
                row["cache"] = {**engine.cuts.to_dict(), "notes": engine.notes}
        if hasattr(evaluate, "ranked_by"):  # ranked elsewhere: the chosen plan in ORT
            row["ranked_by"] = evaluate.ranked_by
            row["confirmed_in_ort"] = naive(setup)(plans[last])
            row["ort_vs_baseline_chosen"] = row["confirmed_in_ort"] - base[0][
                max(i for i, k in enumerate(base[1]) if k)]
        racer = getattr(evaluate, "racer", None)
        if racer is not None:
            row["race_runs"] = racer.runs_text()
            row["races"] = [{"looks": list(r.looks), "stopped": [e.n for e in r.entries
                                                                 if e.stopped]}
                            for r, _ in racer.records]
        rows.append(row)
        loads.append(list(os.getloadavg()))
        print(json.dumps(row), f"(load average {loads[-1][0]:.1f})")
        del evaluate, engine  # its caches go before the next variant
    _gram_scoring()
    only = None if args.no_outputs_only else outputs_only(setup, plans)
    if only is not None:
        print("emulated outputs only:", json.dumps(only))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of the process (all variants): {peak:.0f} MB; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "pairs": args.pairs, "seq_len": args.seq_len,
                       "metric": setup.metric, "rows": rows, "outputs_only": only,
                       "peak_rss_mb": round(peak), "load_average": loads,
                       "cores": os.cpu_count()}, f,
                      indent=1)


if __name__ == "__main__":
    main()
