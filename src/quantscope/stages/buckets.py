"""Choosing a deployment of several compiled lengths (``quantscope buckets``): one
pipeline of named steps, each passing a frozen value to the next.

::

    select_texts ─► Selection ─► measure_errors ─► Errors ─► length_costs ─► costs
                                                                            │
    DeploymentChoice ◄─ summarise ◄─ Allocation ◄─ allocate (lazy legality) ◄┘

==============  ===================================================================
select_texts    the inputs checked; the selection texts (the pairs after the first
                ``skip_pairs``: keep those for ``route`` to measure on), their token
                counts and the task cut to them, at the longest length
measure_errors  FP32 and every candidate's QDQ graph once on the selection texts:
                each text's error ``1 − cosine`` of its pooled embedding to FP32's
                (the same on every bucket that holds it: a text's emulated output
                does not depend on its padding, :mod:`quantscope.stages.route`)
length_costs    each (candidate, length)'s cost relative to the reference's uniform
                a8_w8 at the longest length
allocate        the least mean error within ``max_cost`` (mean over the selection
                texts) with at most ``max_buckets`` lengths
                (:func:`quantscope.plan.buckets.solve_legal`: exact up to its cost
                grid), legality (the ``check`` rules at that length) asked of the
                picks only; one-line errors when nothing is legal or within the cost
summarise       per bucket and per candidate figures, the mean cost's standard error,
                the retrieval figures on the selection pairs, the notes
==============  ===================================================================
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from quantscope.analyze.incremental import IncrementalConfig, IncrementalEngine
from quantscope.emulate.evaluate import Keep, Runs, kept_runs, open_runs, run_kept
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.emulate.release import release_memory
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.shapes import given_shapes
from quantscope.plan.buckets import (
    CHOICE_LENGTHS,
    COST_LEVELS,
    MAX_BUCKETS,
    cheapest,
    route,
    solve_legal,
)
from quantscope.plan.check import BUILTIN_RULES
from quantscope.plan.cost import plan_cost, uniform_a8_cost
from quantscope.plan.deployment import (
    Bucket,
    Candidate,
    candidate_name,
    check_candidate_entry,
    check_candidate_names,
    entry_list,
    one_target,
)
from quantscope.plan.deployment_results import CandidateFigures, ChosenBucket, DeploymentChoice
from quantscope.plan.race import RaceResult, RaceRule
from quantscope.plan.start import blocks, legal_start, legality, lets_through
from quantscope.progress import say, track
from quantscope.serde import read_json
from quantscope.stages.open import plan_problems
from quantscope.stages.race import race_errors
from quantscope.stages.route import check_compatible, cost_unit, open_entry, routable
from quantscope.targets import load_target
from quantscope.targets.profile import Target
from quantscope.tasks.registry import TextTask, at_length, text_embeddings
from quantscope.types import Batch, Dataset, Outputs, Precision, Problem, QuantscopeError

if TYPE_CHECKING:
    from quantscope.analyze.evalcache import EvalCache

Problems = tuple[dict[str, object], ...]  # a (candidate, length)'s ``check`` errors

CANDIDATE_EXAMPLE = '{"name": ..., "model": ..., "stats": ..., "plan": ...}'


def read_candidates(path: str | Path) -> tuple[tuple[Candidate, ...], str]:
    """A candidates file (:mod:`quantscope.plan.deployment`), its files opened (paths
    relative to its folder), and the one target their plans name."""
    path = Path(path)
    where = f"candidates '{path}'"
    listed = entry_list(read_json(path, "candidates"), "candidates", where, CANDIDATE_EXAMPLE)
    out = []
    cache: dict[tuple[str, str], object] = {}
    for i, entry in enumerate(listed):
        entry = check_candidate_entry(entry, f"{where}, candidate {i + 1}")
        model, stats, plan, opened = open_entry(entry, path, cache)
        out.append(Candidate(name=candidate_name(entry), model=model, stats=stats, plan=plan,
                             paths=tuple(opened.items())))
    check_candidate_names(out, where)
    target = one_target([(f"candidate '{c.name}'", c.plan) for c in out], where)
    return tuple(out), target


@dataclass(frozen=True, eq=False)
class Selection:
    """The texts a deployment is chosen on, at the longest length."""

    data: Dataset  # the data at the longest length
    task: TextTask  # cut to the selection texts (text ``i`` is selection text ``i``)
    seq_lens: tuple[int, ...]  # the lengths to choose from, increasing
    lengths: np.ndarray  # each selection text's untruncated token count
    n_pairs: int  # pairs loaded
    skip_pairs: int  # the first pairs, not selected


@dataclass(frozen=True, eq=False)
class Errors:
    """Every candidate once on the selection texts."""

    reference: np.ndarray  # FP32's embeddings [text, dim]
    errors: np.ndarray  # 1 − cosine to FP32 [candidate, text]
    embeddings: tuple[np.ndarray, ...]  # per candidate [text, dim]
    notes: tuple[tuple[str, ...], ...]  # the QDQ writer's notes, per candidate
    engines: tuple[str, ...] = ()  # which engine measured each candidate


@dataclass(frozen=True, eq=False)
class Allocation:
    """The chosen buckets and what legality was asked on the way."""

    picks: tuple[tuple[int, int], ...]  # (length index, candidate index), shortest first
    legal: dict[tuple[int, int], Problems]  # (candidate, length index) -> blocking, as asked
    # (candidate, length index) -> warnings of --allow-warning rules it carries, as asked
    accepted: dict[tuple[int, int], Problems] = dataclasses.field(default_factory=dict)


def choose_deployment(
    reference: Model, data: Dataset, candidates: tuple[Candidate, ...], target_name: str, *,
    max_cost: float, seq_lens: tuple[int, ...] = CHOICE_LENGTHS,
    max_buckets: int = MAX_BUCKETS, skip_pairs: int = 0, progress: bool = False,
    cache: EvalCache | None = None,
    race: float | None = None,
    allowed: frozenset[str] = frozenset(),
) -> DeploymentChoice:
    """Bucket lengths and a candidate per bucket for a deployment within ``max_cost``: the
    selection texts' mean error is the least subject to their mean cost ≤ ``max_cost``
    with at most ``max_buckets`` compiled lengths (the steps: module doc). ``race``: the
    candidates are raced first at that confidence (:func:`race_candidates`); the stopped
    ones are not measured in full and are out of the allocation. ``allowed``: warning
    rules that make no pick illegal (``--allow-warning``; the notes say what they let
    through)."""
    sel = select_texts(reference, data, candidates, seq_lens, max_buckets, skip_pairs)
    target = load_target(target_name)
    raced = None
    if race is None:
        err = measure_errors(reference, candidates, sel, progress=progress, cache=cache)
        costs = length_costs(reference, candidates, target, sel.seq_lens, progress=progress)
    else:
        costs = length_costs(reference, candidates, target, sel.seq_lens, progress=progress)
        # one engine per shared model for the race and the measurement after it: the
        # survivors' segment sessions are the race's (before, the measurement built them
        # all again in engines of its own)
        engines = _engines(candidates, tuple(sel.task.batches.batches))
        raced = race_candidates(reference, candidates, sel, costs, race, progress=progress,
                                engines=engines)
        keep = list(raced.survivors)
        candidates, costs = tuple(candidates[i] for i in keep), costs[keep]
        err = measure_errors(reference, candidates, sel, progress=progress, cache=cache,
                             engines=engines)
    alloc = allocate(candidates, sel, err, costs, max_cost=max_cost, max_buckets=max_buckets,
                     target_name=target_name, progress=progress, allowed=allowed)
    choice = summarise(reference, candidates, sel, err, costs, alloc, target_name=target_name,
                       max_cost=max_cost, max_buckets=max_buckets)
    if allowed:
        choice = dataclasses.replace(choice, notes=(*choice.notes, *accepted_notes(
            candidates, sel, alloc, allowed)))
    if raced is None:
        return choice
    return dataclasses.replace(choice, race=raced.to_dict(),
                               notes=(*choice.notes, *race_notes(raced)))


def race_candidates(reference: Model, candidates: tuple[Candidate, ...], sel: Selection,
                    costs: np.ndarray, confidence: float, *, progress: bool = False,
                    engines: dict[int, IncrementalEngine] | None = None) -> RaceResult:
    """``buckets --race``: every candidate raced on prefixes of the selection pairs by
    each pair's ``1 − cosine`` (:func:`quantscope.stages.race.race_errors`; candidates
    sharing a model and statistics on the incremental engine, from their first changed
    segment, as :func:`_engines` measures them in full); a candidate
    may be stopped only by a rival that costs no more at any length, so a stopped one is
    worse on the mean error and never cheaper. (It could still have been the better pick
    for one bucket's texts, or legal where its rival is not: the notes say so.)
    ``engines``: :func:`_engines` of these candidates, whose segment sessions the race
    shares (the measurement after it then builds none of them again)."""
    may_stop = np.all(costs[None, :, :] <= costs[:, None, :] + 1e-12, axis=2)
    np.fill_diagonal(may_stop, False)

    def proto(c: Candidate) -> Callable[[], Any]:
        return lambda: quantize_model(c.model, c.stats, c.plan,
                                      scheme=scheme_for(c.plan, None)).proto

    pairs = len(sel.lengths) // 2
    say(f"buckets: racing {len(candidates)} candidate(s) on prefixes of {pairs} pairs",
        show=progress)
    models: dict[tuple[int, int], int] = {}  # candidates per (model, statistics)
    for c in candidates:
        models[(id(c.model), id(c.stats))] = models.get((id(c.model), id(c.stats)), 0) + 1
    shared = [(c.model, c.stats, c.plan) if models[(id(c.model), id(c.stats))] > 1 else None
              for c in candidates]  # these run on the incremental engine, each model's own
    return race_errors(reference.proto, [proto(c) for c in candidates],
                       [c.name for c in candidates], sel.task, pairs, may_stop,
                       RaceRule(confidence=confidence), shared=shared, engines=engines)


def race_notes(raced: RaceResult) -> tuple[str, ...]:
    """What the race stopped, in words."""
    stopped = [e for e in raced.entries if e.stopped]
    return (f"race: {len(stopped)} of {len(raced.entries)} candidate(s) stopped early and "
            "left out of the allocation (the others measured on every selection text)"
            + "".join(f"; {e.name} at {e.n} pairs, error {-e.difference:+.4f} "
                      f"(+-{e.half_width:.4f}) over {e.rival}" for e in stopped),
            f"race rule: {raced.rule}; a stopped candidate costs no less than its rival at "
            "every length and errs more on the mean: it could still have been the better "
            "pick for one bucket's texts, or legal where its rival is not")


def select_texts(reference: Model, data: Dataset, candidates: tuple[Candidate, ...],
                 seq_lens: tuple[int, ...], max_buckets: int, skip_pairs: int) -> Selection:
    """The inputs checked, and the selection texts (every text of the pairs after the first
    ``skip_pairs``) with the task cut to them, at the longest length."""
    routable(data, "buckets")
    if max_buckets < 1:
        raise QuantscopeError(f"--max-buckets must be at least 1, got {max_buckets}")
    seq_lens = tuple(sorted(set(seq_lens)))
    longest = seq_lens[-1]
    data = at_length(data, longest)
    task = routable(data, "buckets")
    n_pairs = task.n_pairs
    if skip_pairs >= n_pairs:
        raise QuantscopeError(
            f"--skip-pairs {skip_pairs} leaves no pair to choose on ({n_pairs} loaded): give "
            f"--pairs above {skip_pairs} (e.g. --pairs {skip_pairs + 500})")
    sel = np.concatenate([np.arange(skip_pairs, n_pairs), n_pairs + np.arange(skip_pairs, n_pairs)])
    lengths = np.asarray(data.token_lengths)[sel]
    for c in candidates:
        check_compatible(reference, Bucket(seq_len=longest, model=c.model, stats=c.stats,
                                           plan=c.plan))
    # run the selection texts only (in their batches)
    return Selection(data=data, task=task.only_texts(sel), seq_lens=seq_lens, lengths=lengths,
                     n_pairs=n_pairs, skip_pairs=skip_pairs)


def measure_errors(reference: Model, candidates: tuple[Candidate, ...], sel: Selection, *,
                   progress: bool = False, cache: EvalCache | None = None,
                   engines: dict[int, IncrementalEngine] | None = None) -> Errors:
    """FP32 and every candidate's QDQ graph on the selection texts: each text's ``1 −
    cosine`` of its pooled embedding to FP32's (with ``cache``, a candidate measured
    before on the same content is read back: :func:`_cached_embed`); ``engines``: made
    already (:func:`_engines`, shared with a race), else made here."""
    task = sel.task
    batches = tuple(task.batches.batches)
    ref = text_embeddings(task, run_kept(reference.proto, batches, task.keep,
                                         label="fp32" if progress else ""))
    errors, notes, embs, measured_by = [], [], [], []
    engines = _engines(candidates, batches) if engines is None else engines
    for c in candidates:
        eng = engines.get(id(c.model))
        if cache is None:
            emb, note, how = _embed(c, task, batches, eng, progress)
        else:
            emb, note, how = _cached_embed(cache, reference, c, task, batches, eng,
                                           progress)
        notes.append(note)
        measured_by.append(how)
        errors.append(1.0 - np.sum(emb * ref, axis=1))
        embs.append(emb)
        release_memory()  # a full pass's session and arena, before the next candidate's
    return Errors(reference=ref, errors=np.asarray(errors, dtype=np.float64),
                  embeddings=tuple(embs), notes=tuple(notes),
                  engines=tuple(measured_by))


# The length candidates' activation cache, at most (bytes). Their plans differ from their
# first groups on (max_legal and its variants at each length), so a cut past the first few
# is never read again: on mpnet-base (19 candidates, 19 batches at up to 256 tokens) the
# sized budget (1.49 GB) let 59 of 954 segment runs be skipped, this one 37, and the deploy
# stage's peak went from 5,613 to 4,104 MiB with lengths.json unchanged (docs/benchmarks.md,
# "The deploy stage's cache, capped").
CANDIDATES_CACHE_CAP = 256 << 20


def _engines(candidates: tuple[Candidate, ...], batches: tuple[Batch, ...]
             ) -> dict[int, IncrementalEngine]:
    """One incremental evaluator per model that two or more candidates share (their
    plans then run from their first changed segment; its activation cache at most
    :data:`CANDIDATES_CACHE_CAP`); a model alone gets none."""
    seen: dict[int, list[Candidate]] = {}
    for c in candidates:
        seen.setdefault(id(c.model), []).append(c)
    config = IncrementalConfig(cache_cap=CANDIDATES_CACHE_CAP)
    return {k: IncrementalEngine(cs[0].model, batches, config=config)
            for k, cs in seen.items() if len(cs) > 1}


def _candidate_outputs(c: Candidate, batches: tuple[Batch, ...], keep: Keep | None,
                       engine: IncrementalEngine | None, progress: bool
                       ) -> tuple[Outputs, tuple[str, ...], str]:
    """A candidate's emulated outputs on ``batches``, each batch reduced by ``keep`` as it
    comes (no batch's per-token outputs outlive it), the notes of its build and which
    engine measured: the model's incremental evaluator when it has one, else one full
    pass of its QDQ graph (its proto dropped once the session holds the graph)."""
    scheme = scheme_for(c.plan, None)
    runner, why = (None, None) if engine is None else engine.runner(c.model, c.stats, scheme)
    if runner is not None:
        enc, cov = runner.encodings(c.plan)
        before = runner.counts
        out = kept_runs(Runs(c.model.output_names(), runner.iterate(c.plan, enc)), keep)
        how = runner.counts.minus(before).engine
        say(f"{c.name}: measured by {how}", show=progress)
        return out, (*enc.notes, *cov.lines()), how
    q = quantize_model(c.model, c.stats, c.plan, scheme=scheme)
    notes = (*q.notes, *q.coverage.lines(), *((why,) if why else ()))
    runs = open_runs(q.proto, batches, f"{c.name}" if progress else "", shared_arena=False)
    del q
    return kept_runs(runs, keep), notes, "ort (full pass)"


def _embed(c: Candidate, task: TextTask, batches: tuple[Batch, ...],
           engine: IncrementalEngine | None, progress: bool
           ) -> tuple[np.ndarray, tuple[str, ...], str]:
    """A candidate's pooled embeddings of the selection texts, its QDQ writer's notes and
    which engine measured (:func:`_candidate_outputs`)."""
    out, notes, how = _candidate_outputs(c, batches, task.keep, engine, progress)
    return text_embeddings(task, out), notes, how


def _cached_embed(cache: EvalCache, reference: Model, c: Candidate, task: TextTask,
                  batches: tuple[Batch, ...], engine: IncrementalEngine | None,
                  progress: bool) -> tuple[np.ndarray, tuple[str, ...], str]:
    """:func:`_embed` through ``cache``: keyed by the candidate's model content, stats,
    plan and scheme, the reference's content and the selection texts (batches in order,
    the task cut to them)."""
    import time

    from quantscope.analyze import evalcache as ec

    key = ec.evaluation_key(
        kind="buckets.embeddings", model=ec.model_digest(c.model.proto),
        stats=ec.stats_digest(c.stats), plan=ec.plan_digest(c.plan),
        scheme=scheme_for(c.plan, None), reference=ec.model_digest(reference.proto),
        texts=ec.content_digest({"batches": list(batches), "task": task}))
    hit = cache.get_entry(key)
    if hit is not None and "embeddings" in hit.arrays:
        return (hit.arrays["embeddings"], tuple(str(n) for n in hit.what.get("notes", [])),
                f"evaluation cache (measured by {hit.what.get('engine', 'ort')})")
    t0 = time.perf_counter()
    emb, notes, how = _embed(c, task, batches, engine, progress)
    cache.put(key, float(len(emb)), seconds=time.perf_counter() - t0,
              what={"candidate": c.name, "notes": list(notes), "engine": how},
              arrays={"embeddings": emb})
    return emb, notes, how


def length_costs(reference: Model, candidates: tuple[Candidate, ...], target: Target,
                 seq_lens: tuple[int, ...], *, progress: bool = False) -> np.ndarray:
    """``costs[candidate, length]``: the candidate's plan cost at that length relative to
    the reference's uniform a8_w8 at the longest length."""
    unit = cost_unit(reference, seq_lens[-1], target)
    costs = np.zeros((len(candidates), len(seq_lens)))
    per_model: dict[int, tuple[object, list[object], list[float]]] = {}  # groups, shapes, a8
    for ci, c in track(list(enumerate(candidates)), "costs per length", unit="candidate",
                       show=progress):
        if id(c.model) not in per_model:
            groups = find_groups(c.model)
            shapes = [given_shapes(c.model, s) for s in seq_lens]
            per_model[id(c.model)] = (groups, shapes, [
                uniform_a8_cost(groups, target, sh, model=c.model) for sh in shapes])
        groups, shapes, units = per_model[id(c.model)]
        for j in range(len(seq_lens)):
            costs[ci, j] = (plan_cost(c.plan, groups, target, shapes[j], model=c.model)
                            * units[j] / unit)
    return costs


def allocate(candidates: tuple[Candidate, ...], sel: Selection, err: Errors, costs: np.ndarray,
             *, max_cost: float, max_buckets: int, target_name: str,
             progress: bool = False, allowed: frozenset[str] = frozenset()) -> Allocation:
    """The least mean error within ``max_cost`` (:func:`~quantscope.plan.buckets.solve_legal`),
    legality asked of the picks only; one-line errors when nothing fits. A pick is legal as
    the planner screens a plan (:func:`~quantscope.plan.start.blocks`): no error, and no
    warning of a target rule that applies unless its rule is ``allowed``; the model's
    operator notes (``ops.*`` warnings) do not depend on the plan and block nothing."""
    legal: dict[tuple[int, int], Problems] = {}  # (candidate, length) -> blocking problems
    accepted: dict[tuple[int, int], Problems] = {}
    target = load_target(target_name)
    rules = {r.id for r in target.rules} | BUILTIN_RULES
    screens: dict[tuple[int, int], Callable[[Problem], bool]] = {}  # (model, length)

    def is_legal(ci: int, j: int) -> bool:
        if (ci, j) not in legal:
            say(f"legality: {candidates[ci].name} at {sel.seq_lens[j]} tokens", show=progress)
            model = candidates[ci].model
            found = plan_problems(model, candidates[ci].plan, seq_len=sel.seq_lens[j])
            key = (id(model), j)
            if key not in screens:
                screens[key] = _screen(model, target, sel.seq_lens[j], allowed)
            legal[(ci, j)] = tuple(p for p in found if p["severity"] == "error" or (
                p["rule"] in rules and screens[key](Problem(**p))))
            accepted[(ci, j)] = tuple(p for p in found if lets_through(Problem(**p), allowed))
        return not legal[(ci, j)]

    n = len(sel.lengths)
    choice = solve_legal(sel.lengths, err.errors, costs, sel.seq_lens, max_buckets,
                         max_cost * n, is_legal)
    if not choice.picks:
        least = cheapest(sel.lengths, costs, choice.allowed, sel.seq_lens, max_buckets)
        if least is None:
            raise QuantscopeError(
                "no candidate is legal at any of the lengths "
                f"{', '.join(map(str, sel.seq_lens))} on {target_name}: give candidates "
                "whose plans pass 'quantscope check --seq-len N' (e.g. with "
                "'quantscope tokensplit' for the long lengths)")
        raise QuantscopeError(
            f"no deployment of these candidates is within --max-cost {max_cost:g}: the "
            f"cheapest costs {least:.3f}x; add a cheaper candidate (fewer 16-bit "
            "layers) or raise --max-cost")
    return Allocation(picks=choice.picks, legal=legal, accepted=accepted)


def _screen(model: Model, target: Target, seq_len: int,
            allowed: frozenset[str]) -> Callable[[Problem], bool]:
    """The planner's screen of a problem of ``model`` at ``seq_len`` (its start plan's own
    problems block nothing: :meth:`~quantscope.plan.start.Legality.refuses`); where no
    start plan is legal (the planner would refuse the model), :func:`blocks` alone."""
    groups = find_groups(model)
    shapes = given_shapes(model, seq_len)
    try:
        start, _ = legal_start(groups, model, target, shapes, Precision.A8_W8)
    except QuantscopeError:
        return functools.partial(blocks, allowed=allowed)
    return legality(start, groups, model, target, shapes, allowed=allowed).refuses


def accepted_notes(candidates: tuple[Candidate, ...], sel: Selection, alloc: Allocation,
                   allowed: frozenset[str]) -> tuple[str, ...]:
    """Per allowed rule, the groups it lets through in each chosen bucket (none: said)."""
    out = []
    for rule in sorted(allowed):
        where = [f"{len({p['group'] for p in alloc.accepted.get((ci, j), ()) if p['rule'] == rule})}"
                 f" in {candidates[ci].name} at {sel.seq_lens[j]}" for j, ci in alloc.picks]
        out.append(f"accepted by --allow-warning: {rule} lets group(s) through: "
                   + ", ".join(where))
    return tuple(out)


def summarise(reference: Model, candidates: tuple[Candidate, ...], sel: Selection,
              err: Errors, costs: np.ndarray, alloc: Allocation, *, target_name: str,
              max_cost: float, max_buckets: int) -> DeploymentChoice:
    """The choice's figures over the selection texts (see :class:`DeploymentChoice`)."""
    seq_lens, picks, legal, e = sel.seq_lens, alloc.picks, alloc.legal, err.errors
    n = len(sel.lengths)
    which = route(sel.lengths, tuple(seq_lens[j] for j, _ in picks))  # bucket of each text
    chosen = np.asarray([ci for _, ci in picks])[which]  # its candidate
    per_text_cost = costs[chosen, np.asarray([j for j, _ in picks])[which]]
    mean_err = float(np.mean(e[chosen, np.arange(n)]))
    mean_cost = float(np.mean(per_text_cost))
    cost_se = float(np.std(per_text_cost, ddof=1) / np.sqrt(n)) if n > 1 else 0.0
    routed = np.stack([err.embeddings[ci][t] for t, ci in enumerate(chosen)])
    buckets = []
    for b, (j, ci) in enumerate(picks):
        rows = which == b
        buckets.append(ChosenBucket(
            seq_len=seq_lens[j], candidate=candidates[ci].name, paths=dict(candidates[ci].paths),
            cost=float(costs[ci, j]), share=float(np.mean(rows)), texts=int(np.sum(rows)),
            cosine_mean=float(1.0 - e[ci, rows].mean()) if rows.any() else None,
            legal=not legal[(ci, j)]))
    each = {c.name: CandidateFigures(
        cosine_mean=float(1.0 - e[i].mean()), cost_at_longest=float(costs[i, -1]),
        legal_lengths_checked={str(seq_lens[j]): not legal[(i, j)]
                               for (ii, j) in sorted(legal) if ii == i})
        for i, c in enumerate(candidates)}
    return DeploymentChoice(
        reference=reference.source, data=sel.data.name, target=target_name,
        max_cost=max_cost, max_buckets=max_buckets, lengths=seq_lens,
        skip_pairs=sel.skip_pairs, texts=n, buckets=tuple(buckets), cost_mean=mean_cost,
        cost_mean_se=cost_se, cosine_mean=float(1.0 - mean_err),
        selection_metrics=sel.task.selection_figures(err.reference, routed),
        candidates=each, notes=_choice_notes(sel, err, mean_cost, cost_se, max_cost))


def _choice_notes(sel: Selection, err: Errors, mean_cost: float, cost_se: float,
                  max_cost: float) -> tuple[str, ...]:
    """What the texts were, the mean cost's margin when it is near the cap, how the choice
    is made, and the QDQ writer's notes (each once)."""
    n, skip, n_pairs = len(sel.lengths), sel.skip_pairs, sel.n_pairs
    note = (f"chosen on {n} texts of pairs {skip + 1}-{n_pairs} (the first "
            f"{skip} pairs are not used: measure the deployment on them with "
            "'quantscope route')") if skip else (
            f"chosen on the {n} texts of all {n_pairs} pairs: measuring it on the same pairs "
            "is not held out (give --skip-pairs N and route --pairs N)")
    margin = [] if mean_cost + 2 * cost_se <= max_cost else [
        f"the mean cost {mean_cost:.3f}x is the mean over these {n} texts (standard error "
        f"{cost_se:.3f}x): traffic of the same kind may cost up to about "
        f"{mean_cost + 2 * cost_se:.3f}x, over --max-cost {max_cost:g}; choose with "
        f"--max-cost {max(max_cost - 2 * cost_se, 0.0):.3g} for that margin"]
    return (note, *margin,
            "the error is 1 - cosine of each text's pooled embedding to FP32's; the "
            "choice minimises its mean within the cost (each bucket's cost rounded up "
            f"to 1/{COST_LEVELS} of the budget); the mean cost weights each bucket by "
            "its share of these texts (your traffic decides the real mean)",
            *dict.fromkeys(x for ns in err.notes for x in ns))
