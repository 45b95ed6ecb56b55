"""``run <decoder> --rewrites search``: which of the decoder recipe's steps a run keeps,
chosen by measurement (the default, ``auto``, is the fixed recipe measured by hand on
smollm2-135m, docs/benchmarks.md; ``search`` is opt-in: each trial costs a plan search).

Backward elimination from the full recipe (sequential leave-one-out):

==========  ==========================================================================
trial 1     the whole recipe (:data:`quantscope.stages_llm.RECIPE` but
            :data:`SKIPPED_BY_SEARCH`: rotate, smooth, gatedsplit), written by :func:`~quantscope.stages_llm.recipe_phase_files`
            and planned by :func:`~quantscope.stages_llm.plan_phases` at the plan
            stage's quick amounts (``DecoderOptions.rank_setup``), legal on both phases
            within ``--max-cost``: the incumbent
then        for each step in the recipe's order, the incumbent without it (no step left:
            the given graphs), planned the same way. The step is kept only when the
            incumbent (with it) measures better than the trial (without it) by more than
            :data:`KEEP_RULE`'s margin; else it is dropped and the trial becomes the
            incumbent (fewer steps on a tie). A trial that cannot be made or planned
            (its rewrite or its plan search refuses: one line) keeps the step
scored by   the chosen plan's figure for the run's ``--metric`` (``decoder_report.METRICS``:
            e.g. the prefill perplexity ratio, lower is better) with its standard error
            over windows (or prompts), measured by ONNX Runtime on the plan stage's
            quick amounts (never the evaluate stage's held-out amounts)
files       each trial's graphs in ``rewrite.trials/`` of the run folder; a trial's
            files are removed as soon as it is not the incumbent (a smollm2-135m trial's
            graphs are about 1 GB); the kept one's become ``model/`` (none: the given
            graphs)
==========  ==========================================================================

Why backward from the recipe and not forward from nothing (``rewrites/auto.py``, the
encoder's): the steps interact (SmoothQuant's scales are taken in the rotated basis, the
split chunks the smoothed MLPs), so each step is judged with the others present; forward
selection would judge ``rotate`` alone, where its gain on smollm2-135m (1.711 -> 1.660 at
20,000 tokens, docs/benchmarks.md) is within the quick amounts' noise, and drop it before
``smooth`` is tried. Both need at most five plan searches (one per step and one more); the plan search is most of a
trial's time, so neither is cheaper by much (backward rewrites more: each trial rewrites
from the given graphs).

The margin is one standard error of the difference, sqrt(se_with² + se_without²), the
two figures' errors taken as independent. The trials are measured on the same windows,
so the paired error is smaller: the rule is conservative (it drops a step whose gain is
real but small at the quick amounts). A figure without an error (0): better by anything.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quantscope.report import fmt
from quantscope.types import QuantscopeError

SEARCH = "search"  # rewrite.json mode of a search (DecoderOptions.search, run --rewrites search)
TRIALS = "rewrite.trials"  # the trials' graphs, inside the run folder, while the search runs
KEEP_RULE = ("a step is kept when the recipe with it measures better than without it by more "
             "than one standard error of the difference, sqrt(se_with^2 + se_without^2); "
             "else dropped (fewer steps on a tie)")
ENGINE = "onnxruntime"
# the steps a search starts from: the recipe but vrotate (QuaRot R2), which measured no gain
# on smollm2-135m (decode top-1 0.887 against 0.895, ppl ratio 1.0431 against 1.0337:
# docs/benchmarks.md, "R2 on the decode path") and would cost each search a plan search;
# it stays a step to give by name (--rewrites vrotate,gatedsplit)
SKIPPED_BY_SEARCH = ("vrotate",)
MARGIN_SE = 1.0  # the margin in standard errors of the difference (KEEP_RULE's one)


@dataclass(frozen=True)
class Figure:
    """One trial's measurement: the chosen plan's figure for the metric (``se``: its
    standard error, 0 when none), each phase's cost, the plan's label."""

    value: float
    se: float
    costs: dict[str, float]
    candidate: str
    seconds: float = 0.0


@dataclass(frozen=True)
class RecipeTrial:
    """One trial: ``steps`` measured (``figure``; None: it could not be made or planned,
    ``reason`` says why), ``question`` what it asked (the recipe, or a step's removal),
    ``kept`` whether its steps were the incumbent at the end."""

    steps: tuple[str, ...]
    question: str
    figure: Figure | None
    reason: str
    kept: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["steps"] = list(self.steps)
        return d


@dataclass
class Search:
    """The search's record (``rewrite.json``'s ``search``)."""

    metric: str
    higher: bool
    measured_on: str
    chosen: tuple[str, ...] = ()
    trials: list[RecipeTrial] = field(default_factory=list)
    decisions: dict[str, str] = field(default_factory=dict)  # step -> kept/dropped, why

    def to_dict(self) -> dict[str, Any]:
        return {"mode": SEARCH, "method": "backward elimination from the recipe",
                "metric": self.metric, "higher_is_better": self.higher,
                "measured_on": self.measured_on, "measured_by": ENGINE,
                "keep_rule": KEEP_RULE, "chosen": list(self.chosen),
                "decisions": dict(self.decisions),
                "trials": [t.to_dict() for t in self.trials]}


def _said(metric: str, fig: Figure) -> str:
    """A trial's figure ± its error in the metric's unit (``93.1 % (± 1.1 pts)``,
    ``1.0321 (± 0.0040)``: :mod:`quantscope.report.fmt`)."""
    return fmt.with_se(metric, fig.value, fig.se, bracket=True)


def eliminate(recipe: tuple[str, ...], measure: Callable[[tuple[str, ...]], Figure], *,
              metric: str, higher: bool, measured_on: str = "",
              free: Callable[[tuple[str, ...]], None] = lambda steps: None) -> Search:
    """Backward elimination (module docstring): ``measure(steps)`` plans the recipe's
    ``steps`` and returns the :class:`Figure` (a :class:`QuantscopeError`: that set cannot
    be made or planned); ``free(steps)`` removes a trial's files once it is not the
    incumbent. The whole recipe failing is the run's error (one line)."""
    out = Search(metric, higher, measured_on)
    incumbent = tuple(recipe)
    try:
        best = measure(incumbent)
    except QuantscopeError as e:
        raise QuantscopeError(f"--rewrites search: the recipe ({', '.join(recipe)}) could "
                              f"not be planned: {e}") from None
    out.trials.append(RecipeTrial(incumbent, "the whole recipe", best, "the start"))
    for step in recipe:
        without = tuple(s for s in incumbent if s != step)
        question = f"without {step}"
        try:
            fig = measure(without)
        except QuantscopeError as e:
            why = f"kept: the recipe without it could not be planned ({e})"
            out.trials.append(RecipeTrial(without, question, None, why))
            out.decisions[step] = why
            free(without)
            continue
        sign = 1.0 if higher else -1.0
        gain = sign * (best.value - fig.value)  # with minus without, in the better direction
        noise = MARGIN_SE * math.hypot(best.se, fig.se)
        words = f"{metric} {_said(metric, best)} with it, {_said(metric, fig)} without"
        by, within = fmt.spread(metric, abs(gain)), fmt.spread(metric, noise)
        if gain > noise:
            why = (f"kept: better with it by {by}, more than one standard error of the "
                   f"difference ({within}); {words}")
            free(without)
        else:
            why = ("dropped: " + (f"worse with it by {by}" if gain < 0 else
                                  "the same figure with and without it: a tie, fewer steps"
                                  if gain == 0 else
                                  f"better with it by {by}, within one standard error "
                                  f"of the difference ({within}): a tie, fewer steps")
                   + f"; {words}")
            free(incumbent)
            incumbent, best = without, fig
        out.decisions[step] = why
        out.trials.append(RecipeTrial(without, question, fig, why))
    out.chosen = incumbent
    out.trials = [RecipeTrial(t.steps, t.question, t.figure, t.reason,
                              kept=t.figure is not None and t.steps == incumbent)
                  for t in out.trials]
    return out


def search_recipe(model: str, folder: Path, *, target: str, metric: str, max_cost: float,
                  seq_len: int | None, prefix: str, setup: Any,
                  say: Callable[[str], None], allowed: frozenset[str] = frozenset()
                  ) -> tuple[Search, Path | None, dict[str, dict[str, str]]]:
    """The search on decoder ``model`` (its trials in ``folder / TRIALS``); returns the
    record, the kept trial's prefill graph (None: the given graphs) and its rewrites'
    notes (step -> phase -> what it did). ``allowed``: the warning rules each trial's plan
    search and its gatedsplit step accept (``--allow-warning``)."""
    from quantscope.emulate.release import release_memory
    from quantscope.pipeline.decoder_report import METRICS, _amounts
    from quantscope.stages_llm import RECIPE, plan_phases, recipe_phase_files

    m = METRICS[metric]
    root = folder / TRIALS
    if root.exists():
        shutil.rmtree(root)  # a search cut short: its trials are remeasured
    root.mkdir()
    made: dict[tuple[str, ...], tuple[Path, dict[str, dict[str, str]]]] = {}
    count = iter(range(1, 100))

    def measure(steps: tuple[str, ...]) -> Figure:
        start = time.perf_counter()
        spec: str | Path = model
        if steps:
            sub = root / f"t{next(count)}-{'-'.join(steps)}"
            sub.mkdir()
            made[steps] = (sub, {})
            say(f"[rewrite] search: trial {', '.join(steps)} …")
            notes = recipe_phase_files(model, steps, sub / "model.prefill.onnx",
                                       seq_len=seq_len, prefix=prefix, target=target,
                                       allowed=allowed)
            made[steps] = (sub, notes)
            spec = sub / "model.prefill.onnx"
        else:
            say("[rewrite] search: trial without any step (the given graphs) …")
        out = plan_phases(spec, target, max_cost=max_cost, setup=setup, prefix=prefix,
                          allowed=allowed)
        row = out.quality["plans"][out.chosen.label][m.phase]
        fig = Figure(float(row[m.key]), float(row.get(f"{m.key}_se", 0.0)),
                     {c.phase: float(c.cost) for c in out.chosen.checks}, out.chosen.label,
                     round(time.perf_counter() - start, 1))
        del out
        release_memory()
        say(f"[rewrite] search: {', '.join(steps) or 'no step'}: {metric} "
            f"{_said(metric, fig)}, plan {fig.candidate}")
        return fig

    def free(steps: tuple[str, ...]) -> None:
        if steps in made:
            shutil.rmtree(made.pop(steps)[0], ignore_errors=True)

    record = eliminate(searched(RECIPE), measure, metric=metric, higher=m.higher, free=free,
                       measured_on=f"plan --phase at the plan stage's amounts "
                                   f"({_amounts(setup.__dict__)}), {m.words}")
    kept = made.get(record.chosen)
    return record, (kept[0] / "model.prefill.onnx" if kept else None), (kept[1] if kept else {})


def searched(recipe: tuple[str, ...]) -> tuple[str, ...]:
    """The recipe's steps a search starts from (:data:`SKIPPED_BY_SEARCH` left out)."""
    return tuple(s for s in recipe if s not in SKIPPED_BY_SEARCH)


__all__ = ["KEEP_RULE", "SEARCH", "SKIPPED_BY_SEARCH", "TRIALS", "Figure", "RecipeTrial",
           "Search", "eliminate", "search_recipe", "searched"]
