"""Stage composition for decoder LLMs: both phase graphs, one plan, per-phase results.

Kept apart from ``stages.py`` (same layer): open a prefill/decode pair, check a plan on both,
measure its next-token quality per phase on frozen text."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from quantscope.analyze.phases import PhaseDiagnosis, diagnose_phase, residual_groups
from quantscope.analyze.prefix import (
    HEAD,
    THRESHOLD,
    PrefixChoice,
    choose_prefix,
    compute_prefix,
    format_prefix,
    head_choice,
    prefixed_model,
    prefixed_opener,
    recorded_prefix,
    scan_after,
    scan_sinks,
)
from quantscope.calibrate.collect import tapped_model
from quantscope.emulate.release import release_memory
from quantscope.model.groups import find_groups
from quantscope.model.load import Model, load
from quantscope.model.phases import PHASES, check_phase_interface, phase_path
from quantscope.plan.accepted import with_accepted
from quantscope.plan.phase_search import (
    SELECTION,
    PhaseCandidate,
    candidate_plans,
    choose,
    kept_plans,
    output_range_tensors,
    ranged_candidate,
    rank_by_range,
    screen,
)
from quantscope.plan.phases import PhaseCheck, check_phases, phase_accepted, phase_screen
from quantscope.report.phase_plan import (  # noqa: F401 - re-exported (plan --phase, run)
    format_lm_quality,
    format_phase_checks,
    format_phase_plan,
)
from quantscope.targets import load_target
from quantscope.targets.accept import for_run
from quantscope.tasks.lm import (
    DEFAULT_SEQ_LEN,
    TokenWindows,
    document_token,
    load_lm_tokenizer,
    token_texts,
    token_windows,
)
from quantscope.tasks.lm_phases import (
    OpenPhase,
    calibrate_phases,
    evaluate_lm_plans,
    position_absmax,
)
from quantscope.types import Plan, QuantscopeError, Stats
from quantscope.zoo.decoder import PRODUCER as DECODER_PRODUCER
from quantscope.zoo.prefix import KVPrefix

if TYPE_CHECKING:
    from quantscope.rewrites.base import PhaseJob
    from quantscope.targets.profile import Target

PROMPT = "The capital of France is"


def phase_file(spec: str | Path, phase: str) -> Path:
    """The ``phase`` graph file of a built-in decoder name or a prefill/decode file."""
    from quantscope.zoo import resolve_model

    return check_phase_interface(phase_path(resolve_model(str(spec)), phase), phase)


def open_phase(spec: str | Path, phase: str) -> Model:
    """One phase graph; a built-in decoder's cache file was checked when it was built."""
    path = phase_file(spec, phase)
    proto = onnx.load(str(path))
    if proto.producer_name == DECODER_PRODUCER and len(proto.graph.value_info):
        return Model(proto=proto, source=str(path))
    return load(path)


def open_phase_models(spec: str | Path, phases: tuple[str, ...] = PHASES) -> dict[str, Model]:
    return {p: open_phase(spec, p) for p in phases}


def check_plan_phases(spec: str | Path, plan: Plan, phases: tuple[str, ...],
                      seq_len: int | None, allowed: frozenset[str] = frozenset()
                      ) -> tuple[PhaseCheck, ...]:
    """``plan`` on each phase graph, the warning rules ``allowed`` accepted."""
    if not plan.target:
        raise QuantscopeError("the plan names no target: check --phase needs one "
                              "(give --target or a plan made for a target)")
    models, target = open_phase_models(spec, phases), load_target(plan.target)
    seq = seq_len or DEFAULT_SEQ_LEN
    return check_phases(plan, models, target, seq, phase_screen(models, target, seq, allowed))


EVAL_TOKENS, PROMPTS, NEW_TOKENS, DECODE_STEPS = 20_000, 32, 64, 256  # the CLI's amounts


@dataclass(frozen=True)
class LmSetup:
    """How much text a phase evaluation uses. The field defaults are a quick look (minutes
    on a 2-core laptop); :meth:`at` gives the amounts the commands measure by."""

    seq_len: int = DEFAULT_SEQ_LEN
    calibration: int = 16
    evaluation: int = 8
    steps: int = 8
    prompts: int = 4
    new_tokens: int = 32
    decode_windows: int | None = None  # windows whose last ``steps`` tokens decode (None: all)

    @classmethod
    def at(cls, seq_len: int | None, *, tokens: int = EVAL_TOKENS, prompts: int = PROMPTS,
           new_tokens: int = NEW_TOKENS, decode_steps: int = DECODE_STEPS) -> LmSetup:
        """At ``seq_len`` tokens (None: the default length): enough evaluation windows
        for ``tokens`` predicted tokens, ``prompts`` greedy prompts of ``new_tokens``, and
        ``decode_steps`` decode steps (``steps`` per window, on the emulated cache)."""
        n = seq_len or DEFAULT_SEQ_LEN
        windows = -(-decode_steps // cls.steps)
        _check_amounts(n, cls.steps, tokens=tokens, prompts=prompts, decode_steps=decode_steps)
        return cls(seq_len=n, evaluation=max(-(-tokens // (n - 1)), windows, prompts - 1),
                   prompts=prompts, new_tokens=new_tokens, decode_windows=windows)


@functools.lru_cache(maxsize=1)
def lm_documents() -> int:
    """How many documents the built-in evaluation text has (one evaluation window each)."""
    from quantscope.tasks.text import STDLIB_DOCS, load_pairs

    return len(load_pairs(STDLIB_DOCS))


def _check_amounts(seq_len: int, steps: int, *, tokens: int, prompts: int,
                   decode_steps: int) -> None:
    """Amounts of text needing more evaluation windows than the built-in text has documents
    (each window is one document's first ``seq_len`` tokens) refused in one line naming the
    option and its most, before any work (``--lm-tokens 1000000000`` was taken: the text
    ran out only after the run's conversion and calibration)."""
    docs = lm_documents()
    for flag, value, per, what in (
            ("--lm-tokens", tokens, seq_len - 1, "predicted tokens"),
            ("--decode-steps", decode_steps, steps, "decode steps")):
        if -(-value // per) > docs:
            raise QuantscopeError(
                f"{flag} {value} needs {-(-value // per):,} evaluation windows of {seq_len} "
                f"tokens ({per} {what} each), and the built-in text has {docs:,} documents, "
                f"one window each: give {flag} {docs * per} or less")
    if prompts - 1 > docs:
        raise QuantscopeError(
            f"--prompts {prompts}: the greedy prompts after the first are the evaluation "
            f"windows' first tokens, and the built-in text has {docs:,} documents: give "
            f"--prompts {docs + 1} or less")


def lm_text(spec: str | Path, setup: LmSetup) -> tuple[TokenWindows, list[np.ndarray]]:
    """The token windows and greedy prompts of ``setup`` (tokenized with the model's own)."""
    tok = load_lm_tokenizer(phase_file(spec, "prefill"))
    windows = token_windows(tok, seq_len=setup.seq_len, calibration=setup.calibration,
                            evaluation=setup.evaluation)
    prompts = [np.array(tok.encode(PROMPT).ids, np.int64), *(w[:12] for w in windows.evaluation)]
    return windows, prompts[:setup.prompts]


@dataclass(frozen=True)
class LmPrefix:
    """The constant KV prefix a phase evaluation runs with: which tokens, why, their K/V."""

    choice: PrefixChoice
    kv: KVPrefix
    text: tuple[str, ...]  # each token as the tokenizer spells it
    after: dict[str, Any] | None = None  # :class:`AfterPrefix` as recorded, token texts added
    decoded: tuple[str, ...] = ()  # each token as text ('\n', not 'Ċ')

    def to_dict(self) -> dict[str, Any]:
        """What the plan records (``meta['kv_prefix']``)."""
        return {"tokens": list(self.kv.tokens), "text": list(self.text),
                **({"decoded": list(self.decoded)} if self.decoded else {}),
                "why": list(self.choice.why), "threshold": THRESHOLD,
                "first_position_ratio": self.choice.first_ratio,
                "largest_later_ratio": self.choice.later_ratio,
                **({"profile_before": [round(x, 4) for x in self.choice.profile]}
                   if self.choice.profile else {}),
                **({"after": self.after} if self.after else {})}


def lm_prefix(spec: str | Path, mode: str | tuple[int, ...], windows: TokenWindows
              ) -> LmPrefix | None:
    """``none`` (None), ``auto`` (the sink tokens of the calibration windows,
    :mod:`quantscope.analyze.prefix`), ``head:TEXT`` (:func:`quantscope.analyze.prefix.with_head`) or given token
    ids; their FP32 K/V computed, and for ``auto`` and a head what is left after them."""
    if mode == "none" or mode == ():
        return None
    tok = load_lm_tokenizer(phase_file(spec, "prefill"))
    pre = open_phase(spec, "prefill")
    scanned = isinstance(mode, str) and (mode == "auto" or mode.startswith(HEAD))
    if mode == "auto":
        choice = choose_prefix(scan_sinks(pre, windows.calibration), document_token(tok))
    elif isinstance(mode, str) and mode.startswith(HEAD):
        choice = head_choice(document_token(tok),
                             tok.encode(mode[len(HEAD):], add_special_tokens=False).ids,
                             scan_sinks(pre, windows.calibration))
    elif isinstance(mode, tuple):
        choice = PrefixChoice(mode, ("recorded in the plan",) * len(mode), math.nan, math.nan)
    else:
        raise QuantscopeError(f"--prefix must be auto or none, not '{mode}'")
    kv = compute_prefix(pre, choice.tokens)
    after = None

    def name(t: int) -> str:  # the text, not the BPE spelling ('\n', not 'Ċ')
        return tok.decode([t], skip_special_tokens=False) or "?"

    if scanned:  # what is left after it (the graph is edited in place)
        a = scan_after(prefixed_model(pre, kv, in_place=True), windows.calibration)
        after = {**dataclasses.asdict(a), "worst_text": name(a.worst_token),
                 "profile": [round(x, 4) for x in a.profile],
                 "first_sinks": [[t, name(t), r] for t, r in a.first_sinks]}
    del pre
    release_memory()
    return LmPrefix(choice, kv, tuple(tok.id_to_token(t) or "?" for t in choice.tokens), after,
                    token_texts(tok, choice.tokens))


def _opener(spec: str | Path, prefix: LmPrefix | None = None) -> OpenPhase:
    def phase_model(phase: str) -> Model:
        return open_phase(spec, phase)

    return prefixed_opener(phase_model, prefix.kv if prefix else None)


def lm_quality(spec: str | Path, plans: dict[str, Plan], setup: LmSetup = LmSetup(),
               prefix: str | tuple[int, ...] = "none",
               stats: dict[str, Stats] | None = None) -> dict[str, Any]:
    """Per plan and phase: top-1 agreement, KL, perplexity ratio, greedy agreement, time;
    with ``prefix`` (:func:`lm_prefix`) every graph reads that constant KV prefix.
    ``stats``: the phases' calibration on ``setup``'s calibration windows with that
    prefix, when already made (``run``'s plan stage wrote it), else made here."""
    windows, prompts = lm_text(spec, setup)
    kv = lm_prefix(spec, prefix, windows)
    if stats is None:
        stats = calibrate_phases(_opener(spec, kv), windows, steps=setup.steps)
    results = evaluate_lm_plans(_opener(spec, kv), stats, plans, windows, prompts=prompts,
                                steps=setup.steps, new_tokens=setup.new_tokens,
                                decode_windows=setup.decode_windows)
    return {"data": windows.source, "setup": setup.__dict__, "plans": results,
            **({"prefix": kv.to_dict()} if kv else {})}


def diagnose_phases(spec: str | Path, stats: dict[str, Stats], windows: TokenWindows,
                    phases: tuple[str, ...] = PHASES, prefix: LmPrefix | None = None
                    ) -> tuple[PhaseDiagnosis, ...]:
    """Per phase, from its calibration statistics (and, in prefill, the residual stream's
    per-position max over the calibration windows); one graph open at a time."""
    out = []
    for phase in phases:
        model = _opener(spec, prefix)(phase)
        groups, names = find_groups(model), model.output_names()
        positions = None
        if phase == "prefill":
            residual = [g.outputs[0] for g in residual_groups(groups)]
            tapped = tapped_model(model, residual)
            del model  # one copy of the weights less while the session loads
            release_memory()
            positions = position_absmax(tapped, residual, windows.calibration)
            del tapped
        out.append(diagnose_phase(phase, groups, stats[phase], names, positions))
        release_memory()
    return tuple(out)


def diagnose_model(spec: str | Path, phases: tuple[str, ...] = PHASES,
                   setup: LmSetup = LmSetup()) -> tuple[PhaseDiagnosis, ...]:
    """``analyze --phase``: calibrate both phase graphs on ``setup``'s text, diagnose each."""
    windows, _ = lm_text(spec, setup)
    stats = calibrate_phases(_opener(spec), windows, steps=setup.steps)
    return diagnose_phases(spec, stats, windows, phases)


@dataclass(frozen=True)
class PhasePlan:
    """``plan --phase``: every candidate (checked per phase), the kept ones measured."""

    chosen: PhaseCandidate
    candidates: tuple[PhaseCandidate, ...]
    quality: dict[str, Any]  # lm_quality's form, for the kept candidates
    diagnosis: tuple[PhaseDiagnosis, ...]
    max_cost: float
    prefix: LmPrefix | None = None
    # the calibration of the phase graphs the figures ran on (with the prefix): what an
    # export of the plan per phase takes (``run`` on a decoder)
    stats: dict[str, Stats] | None = None
    accepted: tuple[dict[str, Any], ...] = ()  # --allow-warning's (plan/accepted.py)

    def plan(self) -> Plan:
        """The chosen plan with its per-phase results in ``meta`` (JSON strings)."""
        q = self.quality["plans"][self.chosen.label]
        results = {"checks": {c.phase: {"seq_len": c.seq_len, "cost": c.cost,
                                        "errors": c.errors} for c in self.chosen.checks},
                   "quality": {k: v for k, v in q.items() if k != "time"}}
        meta = {"planner": "quantscope plan --phase", "candidate": self.chosen.label,
                "selection": SELECTION, "max_cost": repr(self.max_cost),
                "lm_data": self.quality["data"], "lm_setup": json.dumps(self.quality["setup"]),
                "phase_results": json.dumps(results)}
        if self.prefix is not None:
            meta["kv_prefix"] = json.dumps(self.prefix.to_dict())
        return with_accepted(dataclasses.replace(
            self.chosen.plan, meta=tuple({**dict(self.chosen.plan.meta), **meta}.items())),
            self.accepted)


def plan_phases(spec: str | Path, target: str, *, max_cost: float = 1.5,
                setup: LmSetup = LmSetup(), phases: tuple[str, ...] = PHASES,
                prefix: str = "none", allowed: frozenset[str] = frozenset()) -> PhasePlan:
    """Candidates ranked by the calibrated ranges, screened on the ``phases`` graphs (legal,
    within ``max_cost`` in each), the kept ones measured (on both graphs: decode's metrics
    need the prefill cache), the best chosen (:mod:`quantscope.plan.phase_search`); with
    ``prefix`` (:func:`lm_prefix`) every step on the graphs that read that KV prefix;
    ``allowed``: the warning rules ``--allow-warning`` accepts (recorded in the plan)."""
    tgt = load_target(target)
    windows, prompts = lm_text(spec, setup)
    kv = lm_prefix(spec, prefix, windows)
    opener = _opener(spec, kv)
    stats = calibrate_phases(opener, windows, steps=setup.steps)
    diagnosis = diagnose_phases(spec, stats, windows, phases, kv)
    models = {p: opener(p) for p in phases}
    ranked = rank_by_range(find_groups(next(iter(models.values()))), list(stats.values()))
    legal = phase_screen(models, tgt, setup.seq_len, allowed)
    plans = candidate_plans(models, tgt, ranked, setup.seq_len, max_cost, legal)
    if str(target).endswith(".toml") or "/" in str(target):  # a profile file: the plans
        # name the file, which loads again (a built-in by its name)
        plans = {k: dataclasses.replace(p, target=str(target)) for k, p in plans.items()}
    candidates = screen(plans, models, tgt, setup.seq_len, legal)
    ranged = {p: output_range_tensors(m) for p, m in models.items()}
    del models
    release_memory()
    kept = kept_plans(candidates, max_cost)  # none: one line, before any evaluation
    measure = functools.partial(evaluate_lm_plans, opener, stats, windows=windows,
                                prompts=prompts, steps=setup.steps,
                                new_tokens=setup.new_tokens,
                                decode_windows=setup.decode_windows)
    results = dict(measure(kept))
    again = ranged_candidate(choose(candidates, results, max_cost), ranged)  # then MSE grids
    candidates = (*candidates, again)
    results.update(measure({again.label: again.plan}))
    quality = {"data": windows.source, "setup": setup.__dict__, "plans": results,
               **({"prefix": kv.to_dict()} if kv else {})}
    best = choose(candidates, results, max_cost)
    return PhasePlan(best, candidates, quality, diagnosis, max_cost, kv, stats,
                     tuple(phase_accepted(tgt, best.checks, legal.allowed)))


def phase_job(spec: str | Path, name: str, out: str | Path, setup: LmSetup, *,
              prefix: str | tuple[int, ...] = "none", target: Target | None = None
              ) -> PhaseJob:
    """What registered rewrite ``name`` is given to rewrite both phase graphs of ``spec``
    (:class:`quantscope.rewrites.base.PhaseJob`): the graphs opened here, its graphs
    written as a decoder's files ``out`` (:func:`write_phase_files`), and the prefill
    graph's calibration on ``setup``'s windows with the KV prefix ``prefix``
    (:func:`lm_prefix`) when it asks."""
    from quantscope.rewrites.base import PhaseJob

    def calibrate() -> Stats:
        windows, _ = lm_text(spec, setup)
        kv = lm_prefix(spec, prefix, windows)
        return calibrate_phases(_opener(spec, kv), windows, steps=setup.steps)["prefill"]

    return PhaseJob(spec=str(spec), seq_len=setup.seq_len,
                    open=functools.partial(open_phase, spec),
                    write=lambda make: write_phase_files(spec, name, make, out),
                    calibrate=calibrate, target=target)


def rewrite_phase_files(spec: str | Path, name: str, out: str | Path, config: Any = None, *,
                        seq_len: int = DEFAULT_SEQ_LEN) -> dict[str, str]:
    """Registered rewrite ``name`` applied to both phase graphs of ``spec``, one graph in
    memory at a time (:func:`quantscope.rewrites.phases.on_phases`: its own phase step,
    else its transform per phase, FP32 checked per phase; the same weights in both, by
    digest), written as a decoder's files (:func:`write_phase_files`). Returns phase ->
    the rewrite's reason."""
    from quantscope.rewrites.phases import on_phases
    from quantscope.rewrites.registry import REWRITES

    if name not in REWRITES:
        raise QuantscopeError(f"unknown rewrite '{name}': use one of {', '.join(REWRITES)}")
    return on_phases(REWRITES[name], phase_job(spec, name, out, LmSetup(seq_len=seq_len)),
                     config)


def smooth_phase_files(spec: str | Path, out: str | Path, *, alpha: float = 0.5,
                       setup: LmSetup = LmSetup(), rtol: float = 1e-4,
                       sites: str = "norms", prefix: str | tuple[int, ...] = "none"
                       ) -> dict[str, str]:
    """SmoothQuant (registry entry ``smooth``, :mod:`quantscope.rewrites.smooth`) on both
    phase graphs with the scales of the prefill graph's calibration at ``setup`` (so both
    get the same weights, checked), FP32 checked per phase within ``rtol`` (30 layers in
    float32: 1e-4, as ``rotate``), written as a decoder's files. ``sites``: ``norms``,
    ``gated`` or ``all`` (:data:`quantscope.rewrites.smooth.SITES`). ``prefix``: calibrate with that constant
    KV prefix (:func:`lm_prefix`), so the sink token's activation does not set the scales.
    Returns phase -> what it did."""
    from quantscope.rewrites.phases import on_phases
    from quantscope.rewrites.registry import REWRITES

    rw = REWRITES["smooth"]
    config = rw.config(alpha=alpha, sites=sites, rtol=rtol)  # sites checked: one line
    return on_phases(rw, phase_job(spec, rw.name, out, setup, prefix=prefix), config)


RECIPE = ("rotate", "vrotate", "smooth", "gatedsplit")  # the decoder's steps, run order
# run's default steps: measured best on smollm2-135m at the amounts (docs/benchmarks.md,
# "--rewrites search"): once the gated products are 16 bit in prefill, rotate and smooth
# no longer pay (ppl ratio 1.0603 +- 0.0030 alone, 1.069 +- 0.0035 with both)
DEFAULT_STEPS = ("gatedsplit",)
RECIPE_CALIBRATION = 16  # windows the recipe's steps calibrate on (smooth's scales)


def recipe_accepts(names: tuple[str, ...], allowed: frozenset[str]) -> list[str]:
    """The warning rules of ``allowed`` that a step of ``names`` answers (gatedsplit: the
    size rule, ``hailo.super_defuse``): those whose acceptance changes what the recipe
    does (``run``'s rewrite stage key holds them)."""
    from quantscope.rewrites.registry import REWRITES

    return sorted(a for a in allowed if any(REWRITES[n].answers_rule(a) for n in names
                                            if n in REWRITES))


def recipe_phase_files(spec: str | Path, names: tuple[str, ...], out: str | Path, *,
                       seq_len: int | None = None, prefix: str = "auto",
                       say: Callable[[str], None] | None = None,
                       target: str | None = None, allowed: frozenset[str] = frozenset()
                       ) -> dict[str, dict[str, str]]:
    """The decoder recipe's steps ``names`` (of :data:`RECIPE`; each a registry entry,
    :data:`quantscope.rewrites.registry.REWRITES`, at its default config, run by
    :func:`quantscope.rewrites.phases.on_phases`: ``rotate`` the residual stream,
    ``vrotate`` each attention head's values (R2), ``smooth`` each MLP's gated product at
    alpha 0.5, calibrated with ``prefix``, ``gatedsplit`` the prefill MLPs in chunks of
    tokens, the largest ``target``'s size rule allows at 16 bit, none if it allows all or
    ``allowed`` (the warning rules ``--allow-warning`` accepts) holds it: the target as the
    run reads it, :func:`quantscope.targets.accept.for_run`) on both phase graphs of
    ``spec``, one after another, the last written as ``out`` (``X.prefill.onnx``, its
    decode sibling, the tokenizer); intermediate graphs are removed once the next is
    written. Returns step -> phase -> what it did."""
    from quantscope.rewrites.phases import on_phases
    from quantscope.rewrites.registry import REWRITES

    bad = [n for n in names if n not in RECIPE]
    if bad or not names:
        raise QuantscopeError(f"decoder rewrites are {', '.join(RECIPE)}, not "
                              f"'{','.join(bad) or 'nothing'}'")
    out = Path(out)
    seq = seq_len or DEFAULT_SEQ_LEN
    setup = LmSetup(seq_len=seq, calibration=RECIPE_CALIBRATION, evaluation=1, steps=4)
    tgt = for_run(load_target(target), allowed) if target else None
    notes: dict[str, dict[str, str]] = {}
    current, made = str(spec), []
    for i, name in enumerate(names):
        last = i == len(names) - 1
        step = out if last else out.with_name(f"step{i}-{name}.prefill.onnx")
        if say is not None:
            say(f"[rewrite] {name} on both phase graphs …")
        notes[name] = on_phases(REWRITES[name], phase_job(current, name, step, setup,
                                                          prefix=prefix, target=tgt))
        for old in made:  # the previous step's files: read, no longer needed
            old.unlink(missing_ok=True)
        made = [p for p in out.parent.iterdir() if p.name.startswith(f"step{i}-")]
        current = str(step)
    return notes


def write_phase_files(spec: str | Path, what: str,
                      make: Callable[[str], tuple[onnx.ModelProto, str]],
                      out: str | Path) -> dict[str, str]:
    """Each phase graph ``make(phase)`` gives (one in memory at a time) written as a
    decoder's files: ``out`` (``X.prefill.onnx``), its ``.decode.`` sibling (weights as
    external ``.data`` files) and ``spec``'s tokenizer beside them; the graphs' shared
    weights must be equal (by digest), else the files are removed and one line says
    which differs. The decode graph reads each weight equal to the prefill graph's from
    the prefill graph's ``.data`` file (:func:`_share_weights`); its own file holds only
    the rest: smollm2-135m's two graphs take 651 MB, not 1.3 GB. Returns phase ->
    ``make``'s note."""
    import shutil

    from quantscope.rewrites.phases import same_weights, weight_digests
    from quantscope.tasks.lm import tokenizer_path
    from quantscope.zoo.cache import write_atomic

    out = Path(out)
    if ".prefill." not in out.name:
        raise QuantscopeError(f"name the output like X.prefill.onnx, not '{out.name}': the "
                              "decode graph and the tokenizer are written beside it")
    digests, notes, written = {}, {}, []
    try:
        for phase in PHASES:
            proto, notes[phase] = make(phase)
            digests[phase] = weight_digests(proto)
            path = out.with_name(out.name.replace(".prefill.", f".{phase}."))
            if written:  # the first graph's file holds the weights both have
                _share_weights(proto, written[0], digests[PHASES[0]], digests[phase])
            written += [path, path.with_name(f"{path.name}.data")]
            write_atomic(path, lambda tmp, p=proto, n=path.name: onnx.save(
                p, str(tmp), save_as_external_data=True, location=f"{n}.data"))
            del proto
            release_memory()
        same_weights(what, digests)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    tok = out.with_name(out.name.replace(".prefill.", ".tokenizer.")).with_suffix(".json")
    shutil.copyfile(tokenizer_path(phase_file(spec, "prefill")), tok)
    return notes


def _share_weights(proto: onnx.ModelProto, first: Path, first_digests: dict[str, str],
                   digests: dict[str, str]) -> None:
    """``proto``'s weights equal (by digest) to those the graph file ``first`` keeps in its
    external data file, made references to the same bytes there (location, offset,
    length); saving ``proto`` with external data then writes only the others."""
    from onnx.external_data_helper import uses_external_data

    stored = {t.name: list(t.external_data)
              for t in onnx.load(str(first), load_external_data=False).graph.initializer
              if uses_external_data(t)}
    for t in proto.graph.initializer:
        entries = stored.get(t.name)
        if entries and t.HasField("raw_data") and digests[t.name] == first_digests[t.name]:
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL
            del t.external_data[:]
            for e in entries:
                t.external_data.add(key=e.key, value=e.value)


__all__ = ["DECODE_STEPS", "EVAL_TOKENS", "NEW_TOKENS", "PROMPTS", "LmPrefix", "LmSetup",
           "PhasePlan", "check_plan_phases", "diagnose_model", "diagnose_phases",
           "document_token", "format_lm_quality", "format_prefix", "lm_prefix", "recorded_prefix",
           "format_phase_checks", "format_phase_plan", "lm_quality", "lm_text",
           "open_phase_models", "phase_file", "plan_phases", "rewrite_phase_files",
           "DEFAULT_STEPS", "RECIPE", "phase_job", "recipe_accepts", "recipe_phase_files",
           "smooth_phase_files", "write_phase_files"]
