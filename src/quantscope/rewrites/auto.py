"""``run --rewrites auto``: which rewrites a run keeps, chosen by measurement.

Forward selection in the registry's order (:data:`quantscope.rewrites.registry.REWRITES`):

==========  ==========================================================================
tried       a rewrite whose precondition (``applies``) holds on the current model and
            whose rule binds (``binds``: e.g. the target keeps attention at 8 bit; an
            entry without one: the precondition is the diagnosis, e.g. tokensplit's size
            rule at the run's length, the stats rewrites' outlier channels)
measured    the rewritten model calibrated and measured by ``measure(model, stats)`` (the
            caller's: e.g. the run's candidate plan on the FIT data, never held out)
kept        only when it measures better than the current model by more than
            ``min_gain``; on a tie (a coarse metric such as top-1 agreement on few
            pairs), when the measure gives a second figure (``(metric, tiebreak)``,
            higher is better, e.g. the embedding SQNR in dB) better by more than
            :data:`TIE_MARGIN`; else dropped (a rewrite adds layers). The next rewrite
            is tried on the model kept so far
==========  ==========================================================================

The function is pure but for the callables it is given (``calibrate``, ``measure``,
``reload``), so another evaluator (a cache, an incremental one) plugs in there. Every
decision is kept in :class:`AutoChoice` (figures, sample size, reasons) for the run's
files, verdict and report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import onnx

from quantscope.model.load import Model
from quantscope.progress import say
from quantscope.rewrites.base import InputShapes, Precondition, Rewrite, run_rewrite
from quantscope.rewrites.registry import REWRITES
from quantscope.types import QuantscopeError, Stats

if TYPE_CHECKING:
    from quantscope.targets.profile import Target

Measure = Callable[[Model, Stats], "float | tuple[float, float]"]
TIE_MARGIN = 0.1  # the tiebreak figure must gain more than this (dB for an SQNR)
Calibrate = Callable[[Model], Stats]
Reload = Callable[[onnx.ModelProto], Model]


@dataclass(frozen=True)
class Trial:
    """One rewrite's decision. ``tried``: its precondition held and its rule bound;
    ``before``/``after``: the measured figure without and with it (None: not measured);
    ``reason``: why it was not tried, not applied, dropped or kept, in words."""

    name: str
    tried: bool
    kept: bool
    reason: str
    before: float | None = None
    after: float | None = None
    config: Mapping[str, Any] | None = None
    tiebreak_before: float | None = None
    tiebreak_after: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["config"] = None if self.config is None else dict(self.config)
        return out


@dataclass(frozen=True)
class AutoChoice:
    """What ``auto`` tried and kept: ``metric`` (``higher_is_better``) measured on ``n``
    fit ``unit`` by ``measured_on`` (the caller's words: which plan, which data);
    ``baseline``: the given model's figure; ``final``: the kept model's; ``repairs``:
    the caller's record of the legality repairs it applied after the rewrites (``name``,
    ``rules``, ``applied``, ``reason``)."""

    metric: str
    higher_is_better: bool
    n: int | None
    unit: str
    measured_on: str
    baseline: float | None
    final: float | None
    trials: tuple[Trial, ...]
    repairs: tuple[Mapping[str, Any], ...] = ()
    tiebreak: str | None = None  # the second figure that decides a tie (higher is better)

    @property
    def kept(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.trials if t.kept)

    @property
    def applied_repairs(self) -> tuple[str, ...]:
        return tuple(str(r["name"]) for r in self.repairs if r.get("applied"))

    def configs(self) -> tuple[tuple[Rewrite, Any], ...]:
        """The kept rewrites with their configs, in the registry's order."""
        return tuple((REWRITES[t.name], REWRITES[t.name].config(**dict(t.config or {})))
                     for t in self.trials if t.kept)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": "auto", "metric": self.metric,
                "higher_is_better": self.higher_is_better, "n": self.n, "unit": self.unit,
                "measured_on": self.measured_on, "baseline": self.baseline,
                "final": self.final, "kept": list(self.kept),
                "tiebreak": self.tiebreak, "trials": [t.to_dict() for t in self.trials],
                "repairs": [dict(r) for r in self.repairs]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AutoChoice:
        trials = tuple(Trial(**{**t, "config": t.get("config")}) for t in d["trials"])
        return cls(metric=d["metric"], higher_is_better=bool(d["higher_is_better"]),
                   n=d.get("n"), unit=d.get("unit", "samples"),
                   measured_on=d.get("measured_on", ""), baseline=d.get("baseline"),
                   final=d.get("final"), trials=trials, tiebreak=d.get("tiebreak"),
                   repairs=tuple(dict(r) for r in d.get("repairs", [])))


def should_try(rw: Rewrite, model: Model, target: Target | None, seq_len: int | None,
               stats: Stats | None) -> Precondition:
    """The rewrite's precondition and, when it holds, whether the rule it answers binds
    (:attr:`Rewrite.binds`); the reason says both."""
    pre = rw.applies(model, target, seq_len, stats)
    if not pre.holds or rw.binds is None:
        return pre
    bound = rw.binds(model, target, seq_len)
    if not bound.holds:
        return Precondition(False, f"{pre.reason}, but {bound.reason}")
    return Precondition(True, f"{pre.reason}; {bound.reason}")


Score = tuple[float, "float | None"]


def _score(value: float | tuple[float, float]) -> Score:
    if isinstance(value, tuple):
        return float(value[0]), float(value[1])
    return float(value), None


def _better(after: Score, before: Score, higher: bool, min_gain: float, tiebreak: str | None
            ) -> str | None:
    """Why ``after`` is better (None: it is not)."""
    gain = after[0] - before[0] if higher else before[0] - after[0]
    if gain > min_gain:
        return "measured better"
    if gain == 0 and after[1] is not None and before[1] is not None \
            and after[1] - before[1] > TIE_MARGIN:
        return (f"measured equal, better on {tiebreak or 'the tiebreak'} "
                f"({before[1]:.4g} -> {after[1]:.4g})")
    return None


def choose_rewrites(model: Model, target: Target | None, seq_len: int | None, *,
                    calibrate: Calibrate, measure: Measure, reload: Reload,
                    metric: str, higher_is_better: bool = True, n: int | None = None,
                    unit: str = "samples", measured_on: str = "",
                    input_shapes: InputShapes = (), min_gain: float = 0.0,
                    configs: Mapping[str, Any] | None = None, progress: bool = False,
                    tiebreak: str | None = None,
                    ) -> tuple[AutoChoice, onnx.ModelProto | None]:
    """Forward selection over the registry (see the module table). Returns the choice and
    the last kept rewrite's proto (None: nothing kept, the given model stands). The given
    model is calibrated once (the stats rewrites' preconditions read it); the baseline is
    measured only when some rewrite is tried. ``measure`` gives the figure of ``metric``,
    or ``(figure, tiebreak figure)`` (``tiebreak`` names the second, higher is better)."""
    configs = configs or {}
    current, stats = model, calibrate(model)
    score: Score | None = None
    proto: onnx.ModelProto | None = None
    trials: list[Trial] = []
    for name, rw in REWRITES.items():
        why = should_try(rw, current, target, seq_len, stats)
        if not why.holds:
            trials.append(Trial(name, tried=False, kept=False, reason=why.reason))
            continue
        if score is None:
            say("rewrites auto: measuring the model without rewrites", show=progress)
            try:
                score = _score(measure(current, stats))
            except QuantscopeError as e:  # nothing can be compared: none is kept
                trials += [Trial(n_, tried=False, kept=False,
                                 reason=f"the model without rewrites is not measurable: {e}")
                           for n_ in list(REWRITES)[len(trials):]]
                break
        config = configs.get(name) or rw.config()
        trial, kept = _try(rw, config, current, stats, score, seq_len=seq_len,
                           input_shapes=input_shapes, calibrate=calibrate, measure=measure,
                           reload=reload, higher=higher_is_better, min_gain=min_gain,
                           reason=why.reason, tiebreak=tiebreak)
        trials.append(trial)
        figures = (f" ({metric} {trial.before:.4g} -> {trial.after:.4g}, n={n})"
                   if trial.after is not None and trial.before is not None else "")
        say(f"rewrites auto: {name}: {'kept' if trial.kept else 'dropped'}{figures}: "
            f"{trial.reason}", show=progress)
        if kept is not None:
            current, stats, proto = kept[0], kept[1], kept[2]
            score = kept[3]
    first = next((t.before for t in trials if t.before is not None), None)
    return AutoChoice(metric=metric, higher_is_better=higher_is_better, n=n, unit=unit,
                      measured_on=measured_on, baseline=first,
                      final=None if score is None else score[0], trials=tuple(trials),
                      tiebreak=tiebreak), proto


def _try(rw: Rewrite, config: Any, model: Model, stats: Stats, score: Score, *,
         seq_len: int | None, input_shapes: InputShapes, calibrate: Calibrate,
         measure: Measure, reload: Reload, higher: bool, min_gain: float, reason: str,
         tiebreak: str | None,
         ) -> tuple[Trial, tuple[Model, Stats, onnx.ModelProto, Score] | None]:
    """One rewrite applied, calibrated and measured against ``score``."""
    cfg = dataclasses.asdict(config)
    base = {"before": score[0], "tiebreak_before": score[1], "config": cfg}
    r = run_rewrite(rw, model, config, stats=stats if rw.needs_stats else None,
                    seq_len=seq_len, input_shapes=input_shapes)
    if r.failed is not None or not r.changes:
        return Trial(rw.name, tried=True, kept=False, **base,
                     reason=f"not applied: {r.failed or r.reason}"), None
    new = reload(r.proto)
    new_stats = calibrate(new)
    try:
        after = _score(measure(new, new_stats))
    except QuantscopeError as e:
        return Trial(rw.name, tried=True, kept=False, **base,
                     reason=f"applied but not measurable: {e}"), None
    got = {**base, "after": after[0], "tiebreak_after": after[1]}
    why = _better(after, score, higher, min_gain, tiebreak)
    if why is not None:
        return Trial(rw.name, tried=True, kept=True, reason=f"{reason}; {why}", **got), (
            new, new_stats, r.proto, after)
    return Trial(rw.name, tried=True, kept=False, reason=f"{reason}; measured not better",
                 **got), None
