"""``run --rewrites auto``: which rewrites a run keeps, chosen by measurement.

Forward selection in the registry's order (:data:`quantscope.rewrites.registry.REWRITES`),
then a second round (below):

==========  ==========================================================================
tried       a rewrite whose precondition (``applies``) holds on the current model and
            whose rule binds (``binds``: e.g. the target keeps attention at 8 bit; an
            entry without one: the precondition is the diagnosis, e.g. tokensplit's size
            rule at the run's length, the stats rewrites' outlier channels)
measured    the rewritten model calibrated and measured by ``measure(model, stats)`` (the
            caller's: e.g. the run's candidate plan on the FIT data, never held out)
kept        with per-sample scores (:class:`Measured`, e.g. each fit query's top-1
            agreement): only when its gain is beyond noise, the one-sided
            :data:`CONFIDENCE` lower bound of the mean paired difference (Student t:
            ``mean(d) - t(CONFIDENCE, n - 1) * sd(d) / sqrt(n)``, ``d`` = with minus
            without, per sample) above ``min_gain``; worse beyond noise (the upper bound
            below zero): dropped; in between, a TIE within noise, decided by the second
            figure (``tiebreak``, higher is better, e.g. the embedding SQNR in dB):
            kept when it gains more than :data:`TIE_MARGIN` beyond its own noise (with
            ``Measured.tiebreak_parts``, :mod:`quantscope.rewrites.tie`; else the model
            without it, "a tie on both figures" where the two cannot be told apart),
            and the reason says it was a tie. Without per-sample scores (a figure or
            ``(figure, tiebreak)``):
            kept when better by more than ``min_gain``, an exact tie by the tiebreak
            (no noise estimate: the reason says so); with the caller's ``margin``
            (``run``: 0.1 dB for a headline in dB) a gain within it is a tie, decided
            so, and said; for a share over n items (``Measured.share_of``, the count
            the task gives: detection F1, top-1 or decision agreement) the margin is
            its one-sided :data:`CONFIDENCE` binomial noise, each figure over its own
            count (:func:`quantscope.rewrites.tie.share_noise`), a gain within it a
            tie, decided so, the figures in the reason. Else dropped
            (a rewrite adds layers). The next rewrite is tried on the model kept so far
interval    the paired interval of each measured trial (``Trial.interval``: n, mean
            difference, both one-sided bounds, the outcome) is kept in the record
==========  ==========================================================================

Round 2: a rewrite tried and dropped before one kept after it is tried again on top of
the kept set, the set rebuilt from the given model in the registry's order (a rewrite
that is worse alone can pay once a later one makes 16 bit legal: on minilm-l6 at 256
tokens headsplit and rowscale measure worse alone and better on top of tokensplit); kept
by the same rule, recorded with ``round=2``. A rewrite's config is its entry's
``auto_config`` given the rewrites before it (tokensplit splits the Linears per head on a
head-split model), recorded as built (``AutoChoice.final_configs``).

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

import numpy as np
import onnx

from quantscope.model.load import Model
from quantscope.progress import say
from quantscope.rewrites.base import InputShapes, Precondition, Rewrite, run_rewrite
from quantscope.rewrites.registry import REWRITES
from quantscope.rewrites.tie import (  # noqa: F401 - paired_interval, _interval_text: re-exported
    CONFIDENCE,
    TIE_MARGIN,
    LeftOut,
    Parts,
    _interval_text,
    decide_tie,
    paired_gain,
    paired_interval,
    share_noise,
)
from quantscope.types import QuantscopeError, Stats
from quantscope.units import gain as gain_text
from quantscope.units import value

if TYPE_CHECKING:
    from quantscope.targets.profile import Target

KEEP_RULE = (f"kept when the paired per-sample gain's one-sided {CONFIDENCE:.0%} lower bound "
             f"(Student t) is above 0; a tie within noise is decided by the tiebreak: its "
             f"gain's one-sided {CONFIDENCE:.0%} lower bound (jackknife over pairs) above "
             f"{TIE_MARGIN:g}, else the model without it; without per-sample scores a "
             f"gain within the headline's margin ({TIE_MARGIN:g} dB for a figure in dB; "
             f"for a share over the n items its task counts its one-sided "
             f"{CONFIDENCE:.0%} binomial noise, each figure over its own n) is a tie")


@dataclass(frozen=True, eq=False)
class Measured:
    """What ``measure`` gives: the figure, optionally the tiebreak figure (higher is
    better) and the per-sample scores whose mean is the figure (higher is better, the
    same samples in the same order for every model: differences are paired), and the
    per-sample signal and noise powers the tiebreak pools (its noise:
    :mod:`quantscope.rewrites.tie`)."""

    value: float
    tiebreak: float | None = None
    samples: np.ndarray | None = None
    tiebreak_parts: Parts | None = None
    # the figure is a share over this many items, and what they are (its binomial noise
    # decides when there are no per-sample scores: quantscope.rewrites.tie.share_noise)
    share_of: tuple[int, str] | None = None
    # the samples the figure was computed on, where fewer than all (a where= gate's: the
    # samples holding a point it keeps; quantscope.tasks.shares.judged_samples)
    judged: int | None = None
    # a share's value with each unit left out where its items are not its units (face
    # data's people: the paired jackknife decides, not the binomial; tie.paired_gain)
    left: LeftOut | None = None


Measure = Callable[[Model, Stats], "float | tuple[float, float] | Measured"]
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
    # the paired interval of the gain over per-sample scores (None: not measured per
    # sample): n, difference (mean, in the metric's direction), lower and upper (one-sided
    # CONFIDENCE bounds), confidence, outcome ("better", "worse" or "tie")
    interval: Mapping[str, Any] | None = None
    round: int = 1  # 2: retried on top of a rewrite kept after it (the module table)
    # the tiebreak's gain with its jackknife bounds where it decided a headline tie, or
    # beside a decided headline (said in the reason; "the figures disagree" where it moved
    # the other way beyond noise) (quantscope.rewrites.tie.gain_interval; outcome
    # "better", "not better" or "tie")
    tiebreak_interval: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["config"] = None if self.config is None else dict(self.config)
        out["interval"] = None if self.interval is None else dict(self.interval)
        out["tiebreak_interval"] = (None if self.tiebreak_interval is None
                                    else dict(self.tiebreak_interval))
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
    # the kept rewrites' configs as the kept model was built (a second round rebuilds the
    # set: a rewrite's auto config may follow the ones before it); empty: the trials'
    final_configs: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    # of the n, the samples the figure was computed on where fewer (the model without
    # rewrites' Measured.judged: a where= gate's); None: all n
    judged: int | None = None

    @property
    def kept(self) -> tuple[str, ...]:
        names = {t.name for t in self.trials if t.kept}
        return tuple(n for n in REWRITES if n in names)

    @property
    def applied_repairs(self) -> tuple[str, ...]:
        return tuple(str(r["name"]) for r in self.repairs if r.get("applied"))

    def configs(self) -> tuple[tuple[Rewrite, Any], ...]:
        """The kept rewrites with their configs, in the registry's order."""
        given = {t.name: t.config for t in self.trials if t.kept}
        given.update(self.final_configs)
        return tuple((REWRITES[n], REWRITES[n].config(**dict(given[n] or {})))
                     for n in REWRITES if n in given)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": "auto", "metric": self.metric,
                "higher_is_better": self.higher_is_better, "n": self.n, "unit": self.unit,
                **({"judged": self.judged} if self.judged is not None else {}),
                "measured_on": self.measured_on, "baseline": self.baseline,
                "final": self.final, "kept": list(self.kept),
                "tiebreak": self.tiebreak, "keep_rule": KEEP_RULE,
                "final_configs": {k: dict(v) for k, v in self.final_configs.items()},
                "trials": [t.to_dict() for t in self.trials],
                "repairs": [dict(r) for r in self.repairs]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AutoChoice:
        trials = tuple(Trial(**{**t, "config": t.get("config")}) for t in d["trials"])
        return cls(metric=d["metric"], higher_is_better=bool(d["higher_is_better"]),
                   n=d.get("n"), unit=d.get("unit", "samples"),
                   measured_on=d.get("measured_on", ""), baseline=d.get("baseline"),
                   final=d.get("final"), trials=trials, tiebreak=d.get("tiebreak"),
                   repairs=tuple(dict(r) for r in d.get("repairs", [])),
                   final_configs={k: dict(v) for k, v in d.get("final_configs", {}).items()},
                   judged=d.get("judged"))


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


Score = Measured


def _score(value: float | tuple[float, float] | Measured) -> Score:
    if isinstance(value, Measured):
        return value
    if isinstance(value, tuple):
        return Measured(float(value[0]), float(value[1]))
    return Measured(float(value))


def _better(after: Score, before: Score, higher: bool, min_gain: float, tiebreak: str | None,
            *, margin: float = 0.0, metric: str = "") -> tuple[str | None, dict[str, Any] | None]:
    """Why ``after`` is better (None: it is not) and the paired interval, when both have
    per-sample scores (the module table); without them a gain within ``margin`` (the
    headline's, in its unit: no noise estimate) is a tie. A tie of the headline is decided by
    :func:`quantscope.rewrites.tie.decide_tie`; its interval, when it has one, is the
    returned interval's ``tiebreak`` (popped by the callers)."""
    def tie(words: str, iv: dict[str, Any] | None, *, won: str = "decided by better"
            ) -> tuple[str | None, dict[str, Any] | None]:
        outcome, how, tie_iv = decide_tie(after, before, tiebreak or "the tiebreak")
        iv = {} if iv is None and tie_iv is not None else iv
        if iv is not None:
            iv["tiebreak"] = tie_iv
        if outcome == "better":
            return f"{words}, {won} {how}", iv
        if iv is None:
            return None, None
        lost = "a tie on both figures:" if outcome == "tie" else "not better on"
        iv["because"] = words + (f", {lost} {how}" if how else "")
        return None, iv

    iv = paired_gain(after.samples, before.samples, after.left, before.left, higher=higher)
    if iv is not None:
        text = _interval_text(iv, metric)
        if iv["lower"] > min_gain:
            other, against = _other(after, before, iv, tiebreak, True)
            if against:  # the evidence is not consistent: the model without it stands
                iv["because"] = f"measured better beyond noise ({text}){other}"
                return None, iv
            return f"measured better beyond noise ({text}){other}", iv
        if iv["outcome"] == "worse":
            iv["because"] = (f"measured worse beyond noise ({text})"
                             f"{_other(after, before, iv, tiebreak, False)[0]}")
            return None, iv
        return tie(f"a tie within noise ({text})", iv)
    gain = after.value - before.value if higher else before.value - after.value
    noise = (share_noise(before.value, after.value, before.share_of[0], before.share_of[1],
                         n_after=after.share_of[0])
             if after.share_of is not None and before.share_of is not None
             and after.share_of[1] == before.share_of[1] else None)
    if noise is not None:  # a share over n items: its binomial noise is the margin
        words = (f"gain {gain_text(metric, gain, fine=True) if metric else f'{gain:+.4g}'}, "
                 f"{noise[1]}; "
                 "no per-sample scores")
        if gain > max(min_gain, noise[0]):
            extra: dict[str, Any] = {}
            other, against = _other(after, before, extra, tiebreak, True)
            if against:  # the evidence is not consistent: the model without it stands
                extra["because"] = f"measured better beyond noise ({words}){other}"
                return None, extra
            return f"measured better beyond noise ({words}){other}", extra or None
        if gain < -noise[0]:
            return None, {"because": f"measured worse beyond noise ({words})"}
        return tie(f"a tie within noise ({words})", {}, won="decided by better")
    if gain > max(min_gain, margin):
        return ("measured better" + (f" by more than the {margin:g} margin" if margin else "")
                + " (no per-sample scores: no noise estimate)"), None
    if gain == 0:
        return tie("measured equal", None, won="better on")
    if abs(gain) <= margin:  # a hair either way decides nothing: the tiebreak does
        return tie(f"a tie within the {margin:g} margin (gain "
                   f"{gain_text(metric, gain, fine=True) if metric else f'{gain:+.4g}'}; "
                   "no per-sample "
                   "scores: no noise estimate)", {}, won="decided by better")
    return None, None


def _other(after: Score, before: Score, iv: dict[str, Any], tiebreak: str | None,
           won: bool) -> tuple[str, bool]:
    """The tiebreak's figures beside a headline that decided (``won``: better beyond
    noise), its interval kept as ``iv['tiebreak']``, and whether it moved the other way
    beyond its own noise and margin: said as a disagreement, and the model without the
    rewrite stands either way (a rewrite adds layers: it is kept only on consistent
    evidence). The headline's per-sample picks (top-1 over a few hundred pairs) flip on
    near-ties, and the figure of a kept set is the best of those measured, so the two can
    disagree (field report: e5-small, headsplit dropped at -3.5 pts top-1 while the
    embedding SQNR rose 2.8 dB)."""
    outcome, how, tie_iv = decide_tie(after, before, tiebreak or "the tiebreak")
    if how is None:
        return "", False
    iv["tiebreak"] = tie_iv
    named = tiebreak or "the tiebreak"
    figures = (f"{named} {value(named, before.tiebreak, fine=True)} -> "
               f"{value(named, after.tiebreak, fine=True)}")
    if won:  # against it: the tiebreak worse beyond its noise and margin (a figure with
        # no noise estimate cannot say so)
        against = tie_iv is not None and tie_iv["upper"] < -TIE_MARGIN
    else:
        against = outcome == "better"
    if not against:
        return f"; {figures}", False
    which = ("the headline rose beyond its noise while the tiebreak fell beyond its own"
             if won else "the headline fell beyond its noise while the tiebreak rose beyond "
             "its own")
    return (f"; the figures disagree: {how}; {which}, so the model without it stands (a "
            f"rewrite adds layers: it is kept only when no figure says worse beyond noise; "
            f"the headline's per-sample picks flip on near-ties, and the figure it is "
            f"compared with is a kept set's, chosen as the best measured): compare with "
            f"--rewrites NAME,..., or on more pairs"), True


def _split(iv: dict[str, Any] | None) -> tuple[str | None, dict[str, Any] | None,
                                               dict[str, Any] | None]:
    """``_better``'s interval taken apart: the reason it was not kept, the headline's
    interval (None: none, or only the tiebreak's) and the tiebreak's."""
    if iv is None:
        return None, None, None
    because, tie_iv = iv.pop("because", None), iv.pop("tiebreak", None)
    return because, iv or None, tie_iv


def choose_rewrites(model: Model, target: Target | None, seq_len: int | None, *,
                    calibrate: Calibrate, measure: Measure, reload: Reload,
                    metric: str, higher_is_better: bool = True, n: int | None = None,
                    unit: str = "samples", measured_on: str = "",
                    input_shapes: InputShapes = (), min_gain: float = 0.0,
                    configs: Mapping[str, Any] | None = None, progress: bool = False,
                    tiebreak: str | None = None, margin: float = 0.0,
                    ) -> tuple[AutoChoice, onnx.ModelProto | None]:
    """Forward selection over the registry (see the module table). Returns the choice and
    the last kept rewrite's proto as ``reload`` gave it (None: nothing kept, the given
    model stands; the rewrite's own output is not held beside it). The given
    model is calibrated once (the stats rewrites' preconditions read it); the baseline is
    measured only when some rewrite is tried. ``measure`` gives the figure of ``metric``,
    or ``(figure, tiebreak figure)`` (``tiebreak`` names the second, higher is better)."""
    configs = configs or {}
    current, stats = model, calibrate(model)
    score: Score | None = None
    baseline: Score | None = None  # the given model's (its judged samples are the trials')
    proto: onnx.ModelProto | None = None
    trials: list[Trial] = []
    built: dict[str, Mapping[str, Any]] = {}  # the kept set, name -> config as built
    for name, rw in REWRITES.items():
        why = should_try(rw, current, target, seq_len, stats)
        if not why.holds:
            trials.append(Trial(name, tried=False, kept=False, reason=why.reason))
            continue
        if score is None:
            say("rewrites auto: measuring the model without rewrites", show=progress)
            try:
                score = baseline = _score(measure(current, stats))
            except QuantscopeError as e:  # nothing can be compared: none is kept
                trials += [Trial(n_, tried=False, kept=False,
                                 reason=f"the model without rewrites is not measurable: {e}")
                           for n_ in list(REWRITES)[len(trials):]]
                break
            if score.share_of is not None:  # the items its noise is over, once counted
                say(f"rewrites auto: without rewrites {metric} {value(metric, score.value)} is a share "
                    f"over {score.share_of[0]} {score.share_of[1]}", show=progress)
        config = configs.get(name) or auto_config(rw, frozenset(built), current, target,
                                                  seq_len)
        trial, kept = _try(rw, config, current, stats, score, seq_len=seq_len,
                           input_shapes=input_shapes, calibrate=calibrate, measure=measure,
                           reload=reload, higher=higher_is_better, min_gain=min_gain,
                           margin=margin, reason=why.reason, tiebreak=tiebreak, metric=metric)
        trials.append(trial)
        _say_trial(trial, metric, _judged(n, baseline), progress)
        if kept is not None:
            current, stats, proto = kept[0], kept[1], kept[2]
            score = kept[3]
            built[name] = dataclasses.asdict(config)
    if score is not None:
        again = _second_round(model, trials, built, score, target, seq_len,
                              calibrate=calibrate, measure=measure, reload=reload,
                              higher=higher_is_better, min_gain=min_gain,
                              margin=margin, input_shapes=input_shapes, configs=configs, tiebreak=tiebreak,
                              metric=metric, n=_judged(n, baseline), progress=progress)
        if again is not None:
            current, stats, proto, score, built = again
    first = next((t.before for t in trials if t.before is not None), None)
    return AutoChoice(metric=metric, higher_is_better=higher_is_better, n=n, unit=unit,
                      measured_on=measured_on, baseline=first,
                      final=None if score is None else score.value, trials=tuple(trials),
                      tiebreak=tiebreak, final_configs=dict(built),
                      judged=None if baseline is None else baseline.judged), proto


def auto_config(rw: Rewrite, before: frozenset[str], model: Model, target: Target | None,
                seq_len: int | None) -> Any:
    """The config ``auto`` tries ``rw`` with on ``model``, given the rewrites applied
    before it (:attr:`Rewrite.auto_config`; else the entry's default)."""
    return (rw.auto_config(before, model, target, seq_len) if rw.auto_config is not None
            else rw.config())


def _judged(n: int | None, baseline: Score | None) -> int | str | None:
    """The count a trial's figure is over, said: ``n``, or ``3 of 16 judged`` where the
    figure judged fewer samples (:attr:`Measured.judged`, a where= gate's)."""
    return n if baseline is None or baseline.judged is None else f"{baseline.judged} of {n} judged"


def _say_trial(trial: Trial, metric: str, n: int | str | None, progress: bool) -> None:
    figures = (f" ({metric} {value(metric, trial.before)} -> {value(metric, trial.after)}, n={n})"
               if trial.after is not None and trial.before is not None else "")
    again = " (round 2)" if trial.round > 1 else ""
    say(f"rewrites auto: {trial.name}{again}: {'kept' if trial.kept else 'dropped'}{figures}: "
        f"{trial.reason}", show=progress)


def _second_round(model: Model, trials: list[Trial], built: dict[str, Mapping[str, Any]],
                  score: Score, target: Target | None, seq_len: int | None, *,
                  calibrate: Calibrate, measure: Measure, reload: Reload, higher: bool,
                  min_gain: float, margin: float, input_shapes: InputShapes,
                  configs: Mapping[str, Any], tiebreak: str | None, metric: str,
                  n: int | str | None, progress: bool,
                  ) -> tuple[Model, Stats, onnx.ModelProto, Score,
                             dict[str, Mapping[str, Any]]] | None:
    """Round 2: each rewrite that was tried and dropped before a rewrite kept after it
    (in the registry's order) is tried again on top of the kept set, the set rebuilt
    from the given model in the registry's order (a rewrite that measured worse alone
    can pay once a later one makes 16 bit legal: on minilm-l6 at 256 tokens headsplit
    and rowscale measure worse alone, and better on top of tokensplit). Kept by the
    same rule; appended to ``trials`` with ``round=2``. None: nothing kept."""
    order = list(REWRITES)
    last_kept = max((order.index(k) for k in built), default=-1)
    retry = [t.name for t in trials
             if t.tried and not t.kept and order.index(t.name) < last_kept]
    if not retry:
        return None
    say(f"rewrites auto: round 2: {', '.join(retry)} again on top of {', '.join(built)}",
        show=progress)
    result = None
    for name in retry:
        got = _build(model, {**built, name: {}}, name, target, seq_len, calibrate=calibrate,
                     reload=reload, input_shapes=input_shapes, configs=configs)
        if isinstance(got, str):
            trial = Trial(name, tried=False, kept=False, reason=got, round=2)
        else:
            new, new_stats, new_proto, cfgs = got
            trial, after = _judge(name, new, new_stats, score, cfgs[name], measure=measure,
                                  higher=higher, min_gain=min_gain, margin=margin,
                                  tiebreak=tiebreak, reason=f"on top of {', '.join(built)}",
                                  metric=metric)
            if after is not None:
                built, score = cfgs, after
                result = (new, new_stats, new_proto, score, dict(built))
        trials.append(trial)
        _say_trial(trial, metric, n, progress)
    return result


def _build(model: Model, names: Mapping[str, Mapping[str, Any]], new_name: str,
           target: Target | None, seq_len: int | None, *, calibrate: Calibrate,
           reload: Reload, input_shapes: InputShapes, configs: Mapping[str, Any],
           ) -> tuple[Model, Stats, onnx.ModelProto, dict[str, Mapping[str, Any]]] | str:
    """The given model with ``names`` applied in the registry's order (each kept one's
    config as built, ``new_name``'s and those after it by :func:`auto_config`), and its
    stats; or why ``new_name`` could not be applied (a string)."""
    current, proto, done = model, model.proto, {}
    stats: Stats | None = None  # the current model's, calibrated when something reads it
    for name, rw in REWRITES.items():
        if name not in names:
            continue
        redo = name == new_name or list(REWRITES).index(name) > list(REWRITES).index(new_name)
        config = (configs.get(name) or auto_config(rw, frozenset(done), current, target,
                                                   seq_len)) if redo or not \
            names[name] else rw.config(**dict(names[name]))
        if rw.needs_stats or name == new_name:
            stats = calibrate(current) if stats is None else stats
        if name == new_name:
            why = should_try(rw, current, target, seq_len, stats)
            if not why.holds:
                return f"on top of the kept set: {why.reason}"
        try:
            r = run_rewrite(rw, current, config, stats=stats if rw.needs_stats else None,
                            seq_len=seq_len, input_shapes=input_shapes)
        except QuantscopeError as e:  # e.g. no shape to check the function at
            return f"not applied on top of the kept set ({name}): {e}"
        if r.failed is not None or not r.changes:
            return f"not applied on top of the kept set ({name}): {r.failed or r.reason}"
        # the loaded form only: the rewrite's own proto is another copy of every weight
        current, stats = reload(r.proto), None
        proto = current.proto
        del r
        done[name] = dataclasses.asdict(config)
    stats = calibrate(current) if stats is None else stats
    return current, stats, proto, done


def _judge(name: str, model: Model, stats: Stats, score: Score, config: Mapping[str, Any], *,
           measure: Measure, higher: bool, min_gain: float, margin: float,
           tiebreak: str | None, reason: str, metric: str = "") -> tuple[Trial, Score | None]:
    """``model`` (with ``name`` in its set) measured against ``score``: the round-2 trial
    and, when kept, its score."""
    base = {"before": score.value, "tiebreak_before": score.tiebreak, "config": dict(config),
            "round": 2}
    try:
        after = _score(measure(model, stats))
    except QuantscopeError as e:
        return Trial(name, tried=True, kept=False, **base,
                     reason=f"{reason}: applied but not measurable: {e}"), None
    why, iv = _better(after, score, higher, min_gain, tiebreak, margin=margin, metric=metric)
    because, iv, tie_iv = _split(iv)
    got = {**base, "after": after.value, "tiebreak_after": after.tiebreak, "interval": iv,
           "tiebreak_interval": tie_iv}
    if why is not None:
        return Trial(name, tried=True, kept=True, reason=f"{reason}; {why}", **got), after
    return Trial(name, tried=True, kept=False,
                 reason=f"{reason}; {because or 'measured not better'}", **got), None


def _try(rw: Rewrite, config: Any, model: Model, stats: Stats, score: Score, *,
         seq_len: int | None, input_shapes: InputShapes, calibrate: Calibrate,
         measure: Measure, reload: Reload, higher: bool, min_gain: float, margin: float,
         reason: str, tiebreak: str | None, metric: str = "",
         ) -> tuple[Trial, tuple[Model, Stats, onnx.ModelProto, Score] | None]:
    """One rewrite applied, calibrated and measured against ``score``."""
    cfg = dataclasses.asdict(config)
    base = {"before": score.value, "tiebreak_before": score.tiebreak, "config": cfg}
    try:
        r = run_rewrite(rw, model, config, stats=stats if rw.needs_stats else None,
                        seq_len=seq_len, input_shapes=input_shapes)
    except QuantscopeError as e:  # e.g. no shape to check the function at: not this one
        return Trial(rw.name, tried=True, kept=False, **base, reason=f"not applied: {e}"), None
    if r.failed is not None or not r.changes:
        return Trial(rw.name, tried=True, kept=False, **base,
                     reason=f"not applied: {r.failed or r.reason}"), None
    new = reload(r.proto)
    del r  # the loaded form is what is kept: the rewrite's own proto is another copy
    new_stats = calibrate(new)
    try:
        after = _score(measure(new, new_stats))
    except QuantscopeError as e:
        return Trial(rw.name, tried=True, kept=False, **base,
                     reason=f"applied but not measurable: {e}"), None
    why, iv = _better(after, score, higher, min_gain, tiebreak, margin=margin, metric=metric)
    because, iv, tie_iv = _split(iv)
    got = {**base, "after": after.value, "tiebreak_after": after.tiebreak, "interval": iv,
           "tiebreak_interval": tie_iv}
    if why is not None:
        return Trial(rw.name, tried=True, kept=True, reason=f"{reason}; {why}", **got), (
            new, new_stats, new.proto, after)
    return Trial(rw.name, tried=True, kept=False,
                 reason=f"{reason}; {because or 'measured not better'}", **got), None
