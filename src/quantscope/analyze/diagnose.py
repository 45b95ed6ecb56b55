"""Per-layer diagnosis: noise, task-level sensitivity, outliers, degenerate weights, collapse.

``analyze(model, groups, stats, batches, scorer=...) -> Analysis`` is the one entry; the
CLI writes :func:`~quantscope.analyze.report.analysis_to_dict` as JSON and prints
:func:`~quantscope.analyze.report.summary_text`. (Moved here from the package face
``quantscope/analyze/__init__.py``, which re-exports every name lazily.)

Flow: both sweeps run with the exact segment method on every row (``proxy_fraction``
1.0; the task metric is then scored for every candidate) or, by default, on a row subset
per sweep (:func:`~quantscope.analyze.sweeps.sweep_fast`: enable-one on stratified
rows, disable-one on the rows that carry the quantization noise); the
uniform ``low``/``high`` baselines and the collapse check are evaluated on every row with
full QDQ models. The recovery plans (promote the top 1, 2, 4, 8 offenders to ``high``, one
full pass each) are computed only on request (``recover_top``): the planner does not read
them, and they were four of the analysis' seven full passes; without them a note in the
analysis says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from quantscope.analyze.inputfloor import find_input_floors
from quantscope.analyze.logfloor import find_log_floors
from quantscope.analyze.memory import peak_bytes, tensor_sizer
from quantscope.analyze.mixed import find_mixed_scales
from quantscope.analyze.noise import TensorNoise, tensor_noise
from quantscope.analyze.outliers import Outlier, find_outliers
from quantscope.analyze.report import (
    Analysis,
    GroupSensitivity,
    Offender,
    Recovery,
    Skipped,
)
from quantscope.analyze.rows import run_plan_rows, squared_error_rows
from quantscope.analyze.scoring import Scorer, fidelity
from quantscope.analyze.sweeps import SweepResult, sweep_fast, sweep_segments
from quantscope.analyze.weights import WeightIssue, find_weight_issues
from quantscope.calibrate.collect import nonfinite_note
from quantscope.emulate.coverage import Coverage
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.emulate.release import release_memory, resident_bytes
from quantscope.emulate.session import use_arena
from quantscope.model.load import Model
from quantscope.model.units import Unit, sweep_units
from quantscope.parallel import Executor
from quantscope.progress import say
from quantscope.types import Groups, Plan, Precision, QuantScheme, Stats, batch_rows

RECOVER_TOP = (1, 2, 4, 8)  # the recovery plans, when asked for (``recover_top``)
RECOVERY_NOTE = ("recovery plans (uniform {low} with the top 1, 2, 4, 8 offenders at {high}, "
                 "one full pass each) not computed: the planner does not read them "
                 "(analyze(..., recover_top=(1, 2, 4, 8)) computes them)")
UNITS_NOTE = ("{parts} groups of token- or head-split layers swept as {units} units (e.g. "
              "'{example}'): each unit's parts moved together, its gain split evenly among "
              "them; the planner still promotes parts one by one and measures its plans")
# the ranking's metric: the worst output channel's SQNR when the scorer reports it (a
# Concat of boxes and class scores leaves the whole-output SQNR unmoved), else the output's
CHANNEL_KEY = "sqnr_db_channel_min"


def rank_key(metrics: dict[str, float]) -> str:
    """The key offenders are ranked by: ``sqnr_db_channel_min`` when present, else
    ``sqnr_db``."""
    return CHANNEL_KEY if CHANNEL_KEY in metrics else "sqnr_db"


def _sensitivity(
    res: SweepResult, groups: Groups, scorer: Scorer | None
) -> tuple[GroupSensitivity, ...]:
    """One row per swept group; a unit's members share its metrics (computed once)."""
    by = {(g, c.sweep): i for i, c in enumerate(res.candidates) for g in c.names}
    done: dict[int, dict[str, float]] = {}

    def metrics(g: str, sweep: str) -> dict[str, float]:
        i = by[(g, sweep)]
        if i not in done and res.metrics:  # scored by the sweep, its rows dropped
            done[i] = res.metrics[i]
        elif i not in done:
            ref, rows = res.ref_of(i), res.rows[i]
            done[i] = scorer(ref, rows) if scorer else fidelity(ref, rows)
        return dict(done[i])

    def unit(g: str) -> tuple[str, int]:
        c = res.candidates[by[(g, "disable_one")]]
        return (c.group, len(c.members)) if c.members else ("", 1)

    return tuple(
        GroupSensitivity(
            g.name, g.op_type, metrics(g.name, "enable_one"), metrics(g.name, "disable_one"),
            *unit(g.name)
        )
        for g in groups.groups if (g.name, "disable_one") in by
    )


def _plan_metrics(
    model: Model,
    groups: Groups,
    stats: Stats,
    batches: Sequence[dict],
    plan: Plan,
    scorer: Scorer,
    ref: np.ndarray,
    scheme: QuantScheme | None,
    arena: bool = True,
) -> tuple[dict[str, float], np.ndarray, Coverage]:
    q = quantize_model(model, stats, plan, scheme=scheme_for(plan, scheme), groups=groups)
    rows = run_plan_rows(model, groups, batches, q.proto, scorer, arena=arena)
    return scorer(ref, rows), rows, q.coverage


def _arena(model: Model, batches: Sequence[dict]) -> bool:
    """Whether a full pass's session allocates from an arena (not for large tensors:
    :func:`quantscope.emulate.session.use_arena`)."""
    size = tensor_sizer(model, batches)
    return use_arena(max((size([t]) for n in model.graph.node for t in n.output if t),
                         default=0))


def _left_float_notes(cov: Coverage, plan: str) -> tuple[str, ...]:
    """One note per reason a weight or op stays float in the uniform ``plan`` (never
    silent: the figures above do not include their quantization error)."""
    whys: dict[str, list[str]] = {}
    for t, op, why in cov.weights_float:
        whys.setdefault(why, []).append(f"weight {t} ({op})")
    for n, op, why in cov.ops_float:
        whys.setdefault(why, []).append(f"op {n} ({op})")
    return tuple(f"left float at uniform {plan}: {', '.join(what[:6])}"
                 f"{f' and {len(what) - 6} more' if len(what) > 6 else ''}: {why}"
                 for why, what in whys.items())


def _recovery(model: Model, groups: Groups, stats: Stats, batches: Sequence[dict],
              top: Sequence[Offender], low_high: tuple[Precision, Precision], scorer: Scorer,
              ref: np.ndarray, scheme: QuantScheme | None) -> Recovery:
    """Uniform ``low`` with the ``top`` offenders at ``high``, on every row (one full pass)."""
    low, high = low_high
    promoted = tuple(o.group for o in top)
    plan = Plan(low, tuple((g, high) for g in promoted))
    m, _, _ = _plan_metrics(model, groups, stats, batches, plan, scorer, ref, scheme)
    return Recovery(promoted, high.value, m)


def _reasons(
    g: str,
    sens: GroupSensitivity,
    low_sqnr: float,
    noise: dict[str, TensorNoise],
    outliers: dict[str, list[Outlier]],
    weights: dict[str, list[WeightIssue]],
    outputs: tuple[str, ...],
    key: str = "sqnr_db",
) -> tuple[str, ...]:
    what = "worst output channel's SQNR" if key == CHANNEL_KEY else "output SQNR"
    alone = "alone" if sens.unit_size == 1 else (
        f"with its {sens.unit_size} parts ('{sens.unit}', swept as one; the gain split "
        "evenly)")
    out = [
        f"{alone} at low: {what} {sens.enable_one[key]:.1f} dB; promoting it "
        f"{alone.split(' (')[0]}: {low_sqnr:.1f} -> {sens.disable_one[key]:.1f} dB"
    ]
    for t in outputs:
        n = noise.get(t)
        if n and n.sqnr_isolated_db is not None:
            out.append(
                f"{t}: own rounding SQNR {n.sqnr_isolated_db:.1f} dB, "
                f"in the quantized model {n.sqnr_cumulative_db:.1f} dB"
            )
        out += [o.reason for o in outliers.get(t, ())]
    out += [f"weight: {w.reason}" for w in weights.get(g, [])]
    return tuple(out)


def _offenders(
    sens: tuple[GroupSensitivity, ...],
    low_sqnr: float,
    groups: Groups,
    noise: tuple[TensorNoise, ...],
    outliers: tuple[Outlier, ...],
    weights: tuple[WeightIssue, ...],
    key: str = "sqnr_db",
) -> tuple[Offender, ...]:
    """Groups ranked by what promoting each alone gains on ``key`` (:func:`rank_key`);
    ``low_sqnr``: that key at uniform low."""
    by_t = {n.tensor: n for n in noise}
    by_o: dict[str, list[Outlier]] = {}
    for o in outliers:
        by_o.setdefault(o.tensor, []).append(o)
    by_w: dict[str, list[WeightIssue]] = {}
    for w in weights:
        by_w.setdefault(w.group, []).append(w)
    ranked = sorted(sens, key=lambda s: -(s.disable_one[key] - low_sqnr) / s.unit_size)
    outs = groups.by_name()
    return tuple(
        Offender(
            s.group,
            (s.disable_one[key] - low_sqnr) / s.unit_size,
            _reasons(s.group, s, low_sqnr, by_t, by_o, by_w, outs[s.group].outputs, key),
        )
        for s in ranked
    )


def _sweep(
    model: Model,
    groups: Groups,
    stats: Stats,
    batches: list[dict],
    proxy_fraction: float,
    err: np.ndarray,
    kw: dict,
) -> SweepResult:
    """Exact sweep on every row (``proxy_fraction`` >= 1), else the fast one; ``err``:
    per row, the uniform-low run's summed squared error (what the fast sweep selects by)."""
    if proxy_fraction >= 1:
        return sweep_segments(model, groups, stats, batches, **kw)
    cuts = np.cumsum([batch_rows(b) for b in batches])[:-1]
    return sweep_fast(model, groups, stats, batches, fraction=proxy_fraction,
                      noise=np.split(err, cuts), **kw)


def _method(
    res: SweepResult, proxy_fraction: float, rows: int
) -> tuple[dict[str, object], tuple[str, ...]]:
    """The analysis' ``method`` record and its notes."""
    method = {
        "sweep": res.method,
        "proxy_fraction": proxy_fraction,
        "proxy_rows": int(len(res.ref_rows)),
        "rows_per_sweep": dict(res.row_counts),
        "rows": int(rows),
        "sweep_seconds": res.seconds,
        "groups_swept": len({g for c in res.candidates for g in c.names}),
        "candidates_per_sweep": len({c.group for c in res.candidates}),
    }
    if proxy_fraction >= 1:
        return method, ()
    counts = dict(res.row_counts)
    return method, (
        "sensitivity ranked on row subsets (enable-one "
        f"{counts.get('enable_one')}, disable-one "
        f"{counts.get('disable_one')} of {rows} rows) with "
        "task-independent metrics (output SQNR, cosine); baselines (and recovery plans, "
        "when asked for) use every row",
    )


def _zero_notes(stats: Stats) -> tuple[str, ...]:
    """Tensors the calibration data never exercises (every value exactly 0), then those
    it gave NaN/inf (:func:`quantscope.calibrate.collect.nonfinite_note`)."""
    zeros = [t for t, ts in stats.tensors.items() if ts.count and ts.min == 0.0 == ts.max]
    nonfinite = tuple(filter(None, [nonfinite_note(stats)]))  # NaN/inf left out of ranges
    if not zeros:
        return nonfinite
    shown = ", ".join(zeros[:6]) + (", …" if len(zeros) > 6 else "")
    return (f"every calibration value is 0 in {len(zeros)} tensor(s) ({shown}): the data "
            "never exercises them, so their findings and grids mean nothing; calibrate on "
            "data that does",) + nonfinite


def _baselines(model: Model, groups: Groups, stats: Stats, batches: list[dict],
               scorer: Scorer, ref: np.ndarray, low_high: tuple[Precision, Precision],
               scheme: QuantScheme | None, arena: bool, progress: bool
               ) -> tuple[dict, dict, np.ndarray, tuple[str, ...]]:
    """The uniform ``low`` and ``high`` passes: their metrics, collapse reports, the
    left-float notes, and the uniform-low run's squared error per row, which is all the
    sweep reads of them: their rows are not kept (IS-Net at 1024 x 1024: 474 MB each)."""
    from quantscope.tasks.metrics import collapse_report

    baselines, collapse, float_notes = {}, {}, ()
    err = np.zeros(0)
    for p in low_high:
        say(f"analyze: uniform {p.value} baseline (Q/DQ model of {len(groups.groups)} groups, "
            f"{len(batches)} batches)", show=progress)
        baselines[p.value], rows, cov = _plan_metrics(
            model, groups, stats, batches, Plan.uniform(p), scorer, ref, scheme, arena
        )
        float_notes = float_notes or _left_float_notes(cov, p.value)
        collapse[p.value] = collapse_report(rows, ref).to_dict()
        if p is low_high[0]:
            err = squared_error_rows(ref, rows)
        del rows
        release_memory()  # the pass's session and scoring temporaries, before the next
    return baselines, collapse, err, float_notes


def analyze(
    model: Model,
    groups: Groups,
    stats: Stats,
    batches: Iterable[dict[str, np.ndarray]],
    *,
    scorer: Scorer,
    low: Precision = Precision.A8_W8,
    high: Precision = Precision.A16_W16,
    target: object | None = None,
    proxy_fraction: float = 0.125,
    recover_top: tuple[int, ...] = (),
    progress: bool = False,
    executor: Executor | None = None,
    skip: Mapping[str, str] | None = None,
) -> Analysis:
    """Diagnose which groups break ``low`` and why (see the module docstring).

    ``executor``: where the sweep's candidates run (:mod:`quantscope.parallel`; default
    this process); the result does not depend on it. ``skip``: group -> why the planner
    cannot use its gain (``stages.usable``): not swept, listed under ``skipped``.
    ``recover_top``: the recovery plans to measure (e.g. :data:`RECOVER_TOP`); none by
    default (the planner does not read them; a note says they were not computed)."""
    scheme = getattr(target, "scheme", None)
    batches = list(batches)
    skipped = _skipped(groups, skip or {}, progress)
    say(f"analyze: FP32 reference on {len(batches)} batches", show=progress)
    arena = _arena(model, batches)
    ref, run_taken = _reference(model, groups, batches, scorer, arena)
    baselines, collapse, err, float_notes = _baselines(model, groups, stats, batches, scorer,
                                                       ref, (low, high), scheme, arena, progress)
    n_rows, row_bytes = len(ref), ref.nbytes // max(len(ref), 1)
    if not recover_top:  # FP32's rows go too unless a recovery plan is scored against
        del ref  # them (the sweep keeps its own rows' reference)
    release_memory()
    units, units_notes = _units(model, groups, only := _swept(groups, skipped), progress)
    # each candidate scored as its sweep goes (its rows dropped): the metrics of a row
    # subset are task-independent unless the scorer's are per row
    by_task = proxy_fraction >= 1 or scorer.row_local
    kw = {"scorer": scorer, "low": low, "high": high, "scheme": scheme, "progress": progress,
          "executor": executor, "only": only, "units": units,
          "score": scorer if by_task else fidelity, "row_bytes": row_bytes,
          "held_bytes": row_bytes * n_rows if recover_top else 0,
          "run_bytes": run_taken, "arena": arena}
    res = _sweep(model, groups, stats, batches, proxy_fraction, err, kw)
    sens = _sensitivity(res, groups, scorer if by_task else None)
    tensors = [(t, g.name) for g in groups.groups for t in g.outputs]
    noise = tensor_noise(tensors, res.noise_cumulative, res.noise_isolated)
    outliers = tuple(sorted(find_outliers(stats, groups)
                            + find_mixed_scales(model, groups, stats, scheme)
                            + find_log_floors(model, groups, stats, scheme)
                            + find_input_floors(model, groups, stats, scheme),
                            key=lambda o: -o.ratio))
    weights = find_weight_issues(model, groups, scheme)
    low_fid = (scorer if scorer.row_local else fidelity)(res.ref_rows, res.low_rows)
    key = rank_key(low_fid)
    if any(key not in s.disable_one for s in sens):
        key = "sqnr_db"
    offenders = _offenders(sens, low_fid[key], groups, noise, outliers, weights, key)
    say(f"analyze: recovery of the top {', '.join(map(str, recover_top))} offenders",
        show=progress and bool(recover_top))
    recovery = [_recovery(model, groups, stats, batches, offenders[:k], (low, high), scorer,
                          ref, scheme) for k in recover_top]
    method, notes = _method(res, proxy_fraction, n_rows)
    method["ranked_by"] = key  # the offenders' score_db is this key's gain (the planner's)
    # what the loader changed (a float16 model's float32 form …) leads: the figures are of it
    notes = model.notes + notes + float_notes + units_notes + _zero_notes(stats) + _skip_notes(groups, skipped) + tuple(
        RECOVERY_NOTE.format(low=low.value, high=high.value) for _ in range(not recover_top))
    return Analysis(model.source, low.value, high.value, getattr(target, "name", None),
                    scorer.primary, scorer.higher_is_better, method, baselines, noise, sens,
                    offenders, outliers, weights, collapse, tuple(recovery), notes, skipped)


def _reference(model: Model, groups: Groups, batches: list[dict], scorer: Scorer,
               arena: bool = True) -> tuple[np.ndarray, int]:
    """FP32's rows, and what its run took beside them (the peak's rise over the resident
    set, for the sweep's memory estimate; 0 where an earlier peak hides it: the peak is
    not reset, `run` reads it per stage)."""
    base, before = resident_bytes(), peak_bytes()
    ref = run_plan_rows(model, groups, batches, model.proto, scorer, arena=arena)
    top = peak_bytes()
    taken = (max(top - base - ref.nbytes, 0)
             if top and base and before is not None and top > before else 0)
    return ref, taken


def _units(model: Model, groups: Groups, only: set[str] | None, progress: bool
           ) -> tuple[tuple[Unit, ...] | None, tuple[str, ...]]:
    """The sweeps' units (None: one per group, no split layer) and the note saying so."""
    units = sweep_units(model, groups, only)
    joint = [u for u in units if len(u[1]) > 1]
    if not joint:
        return None, ()
    parts = sum(len(m) for _, m in joint)
    say(f"analyze: {len(units)} candidates per sweep for {sum(len(m) for _, m in units)} "
        f"groups: a token- or head-split layer's {parts} parts swept as {len(joint)} units",
        show=progress)
    return units, (UNITS_NOTE.format(parts=parts, units=len(joint), example=joint[0][0]),)


def _skipped(groups: Groups, skip: Mapping[str, str], progress: bool) -> tuple[Skipped, ...]:
    """The groups ``skip`` names, with their reasons, in group order (said when any)."""
    out = tuple(Skipped(g.name, g.op_type, skip[g.name]) for g in groups.groups
                if g.name in skip)
    if out:
        say(f"analyze: sweeping {len(groups.groups) - len(out)} of {len(groups.groups)} "
            f"groups; {len(out)} not swept: the planner cannot promote them "
            f"({_reason_counts(out)})", show=progress)
    return out


def _swept(groups: Groups, skipped: Sequence[Skipped]) -> set[str] | None:
    """The groups the sweeps run (None: every group)."""
    gone = {k.group for k in skipped}
    return {g for g in groups.names() if g not in gone} if gone else None


def _skip_notes(groups: Groups, skipped: Sequence[Skipped]) -> tuple[str, ...]:
    return tuple(f"{len(skipped)} of {len(groups.groups)} groups not swept: the planner "
                 f"cannot promote them ({_reason_counts(skipped)}); listed under 'skipped'"
                 for _ in skipped[:1])


def _reason_counts(skipped: Sequence[Skipped]) -> str:
    counts: dict[str, int] = {}
    for k in skipped:
        counts[k.reason] = counts.get(k.reason, 0) + 1
    return "; ".join(f"{n} x {reason}" for reason, n in counts.items())
