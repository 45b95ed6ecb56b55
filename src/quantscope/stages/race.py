"""Racing plans on prefixes of retrieval pairs (``plan --race``): which candidates are
worth a full measurement.

==================  ==================================================================
samples             the retrieval pairs in a fixed shuffled order (seed
                    :data:`RACE_SEED`, so a prefix is a sample of the whole set, not
                    its first topic); sample ``i`` = the query of pair ``i``
prefix of n         the first ``n`` pairs of that order: their queries ranked against
                    their ``n`` documents only (a smaller pool). FP32 and every
                    candidate are run on the same texts, and every score is taken on
                    the same prefix (:mod:`quantscope.tasks.samples`)
chunks              the pairs between two looks (``0..16``, ``16..32``, ...): each model
                    runs only the chunks it has not run yet, each chunk's texts in the
                    task's own length-sorted batches (a text's pooled output does not
                    depend on its padding); the same chunks for every plan and race
runs                on the incremental engine (:class:`RaceRuns`): per chunk one
                    :class:`~quantscope.analyze.incremental.IncrementalRunner` on its
                    batches, so a plan runs from its first changed segment after the
                    incumbent's cached cut tensors of that chunk; the segment sessions
                    shared by every chunk and with the planner's own runner (a
                    survivor's full measurement builds none of the race's again); a
                    plan's embeddings of a chunk kept by its content (the incumbent of
                    many races runs each chunk once). Exact: the chain of segments is
                    the full QDQ graph (``tests/test_race.py``: within 1e-6 of
                    :class:`PairRunner`). The cut tensors are not shared with the
                    planner's full pass: its batches hold other texts (other padding)
full graph          a plan whose repairs rewrite the model, and FP32: one ORT session
                    each (:class:`PairRunner`, QDQ graphs by the one writer)
interval            over the queries of the prefix, given its pool: the paired
                    per-query difference of the candidate's score and its rival's
                    (:mod:`quantscope.plan.race`)
figures             a race only decides which plans are measured in full: the planner
                    measures the survivors on every pair with its own evaluator; no
                    prefix figure is reported as a plan's quality
==================  ==================================================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from quantscope.analyze.activation_cache import SessionCache
from quantscope.analyze.incremental import (
    IncrementalCounts,
    IncrementalEngine,
    IncrementalRunner,
    plan_digest,
)
from quantscope.emulate.qdq import plan_encodings, quantize_model, scheme_for
from quantscope.emulate.session import make_session
from quantscope.kept import Kept
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.plan.race import Margin, RaceResult, RaceRule, race
from quantscope.progress import say
from quantscope.tasks.registry import RetrievalTask, TextTask, text_embeddings
from quantscope.tasks.samples import SAMPLE_SCORES, prefix_samples
from quantscope.types import (
    Dataset,
    Encodings,
    Outputs,
    Plan,
    QuantScheme,
    Stats,
    sample_first,
)

RACE_SEED = 0  # the order of the pairs a race reads (fixed: same inputs, same race)

ENGINE_RUNS = ("incremental engine: per chunk of pairs between two looks, each plan from its "
               "first changed segment (sessions shared with the planner's engine); a plan "
               "whose repairs rewrite the model by a full QDQ session")
FULL_GRAPH_RUNS = "a full QDQ session per racing plan (not incremental)"
FULL_SET_NOTE = ("a race only decides which candidates get a full measurement: every "
                 "figure reported is measured in ORT on the whole set")


def race_unsupported(data: Dataset | None, metric: str) -> str | None:
    """Why a race cannot be run on this data and metric (None: it can)."""
    if data is None or not isinstance(data.task, RetrievalTask):
        return ("race: needs retrieval pairs (per-query scores on a prefix); this data has "
                "none, so every candidate is measured in full")
    if metric not in SAMPLE_SCORES:
        return (f"race: {metric} has no per-sample form (races: "
                f"{', '.join(SAMPLE_SCORES)}), so every candidate is measured in full")
    if not RaceRule().looks(data.task.n_pairs):
        return (f"race: {data.task.n_pairs} pairs are too few to look at a prefix, so every "
                "candidate is measured in full")
    return None


class PairRunner:
    """One model's pooled embeddings of the pairs in race order, run on demand: ``upto(n)``
    runs only the pairs it has not run yet."""

    def __init__(self, proto: onnx.ModelProto, task: TextTask, order: np.ndarray) -> None:
        self.session = make_session(proto)
        self.names = tuple(o.name for o in self.session.get_outputs())
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.task, self.order, self.done = task, order, 0
        self.queries: np.ndarray | None = None
        self.docs: np.ndarray | None = None

    def upto(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(queries, documents) of the first ``n`` pairs in race order."""
        if n > self.done:
            self._run(np.sort(self.order[self.done:n]))
            self.done = n
        assert self.queries is not None and self.docs is not None
        pick = self.order[:n]
        return self.queries[pick], self.docs[pick]

    def _run(self, pairs: np.ndarray) -> None:
        total = len(self.order)  # the pairs of the task (text i and text total + i)
        cut = self.task.only_texts(np.concatenate([pairs, total + pairs]))
        outs = []
        for b in cut.batches.batches:
            out = self.session.run(None, {k: v for k, v in b.items() if k in self.inputs})
            outs.append(cut.keep(tuple(sample_first(out, b)), b))
        emb = text_embeddings(cut, Outputs(names=self.names, batches=tuple(outs)))
        if self.queries is None:
            self.queries = np.zeros((total, emb.shape[1]), emb.dtype)
            self.docs = np.zeros((total, emb.shape[1]), emb.dtype)
        assert self.docs is not None
        self.queries[pairs], self.docs[pairs] = emb[: len(pairs)], emb[len(pairs):]


class RaceRuns:
    """The racing plans of one (model, statistics, scheme) on the incremental engine
    (module docstring, *runs*): :meth:`pairs` is a plan's :class:`PairRunner` there."""

    MEMO = 64  # (plan, chunk) embeddings kept, the least recently used dropped first

    def __init__(self, model: Model, stats: Stats, task: TextTask, order: np.ndarray, *,
                 scheme: QuantScheme, method: str | None = None,
                 sessions: SessionCache | None = None) -> None:
        self.model, self.stats, self.task, self.order = model, stats, task, order
        self.scheme, self.method, self._sessions = scheme, method, sessions
        self._chunks: dict[tuple[int, int], tuple[TextTask, IncrementalRunner]] = {}
        self._memo: Kept[tuple[str, int, int], np.ndarray] = Kept(self.MEMO)
        self.width = 1  # plans in the race running now (their sessions held between looks)
        self._base: int | None = None  # the shared session cache's own budget
        self.groups = find_groups(model)

    def pairs(self, plan: Plan) -> EnginePairs:
        return EnginePairs(self, plan)

    @property
    def memo_hits(self) -> int:
        """Chunks of a plan read back, not run."""
        return self._memo.hits

    @property
    def counts(self) -> IncrementalCounts:
        """What the chunks' runners did (plans = chunk passes)."""
        total = IncrementalCounts()
        for _, r in self._chunks.values():
            total = total.plus(r.counts)
        return total

    def encodings(self, plan: Plan) -> tuple[str, Encodings]:
        """The plan's content key (:func:`plan_digest`) and encodings, as the runners
        compute them."""
        enc = plan_encodings(self.model, self.stats, plan, scheme=self.scheme,
                             groups=self.groups, method=self.method)[0]
        return plan_digest(enc), enc

    def embeddings(self, plan: Plan, enc: tuple[str, Encodings], lo: int, hi: int
                   ) -> np.ndarray:
        """The plan's pooled embeddings of the texts of pairs ``order[lo:hi]`` (queries,
        then documents, pairs sorted); ``enc``: :meth:`encodings` of the plan."""
        key = (enc[0], lo, hi)
        got = self._memo.get(key)
        if got is not None:
            return got
        cut, runner = self._chunk(lo, hi)
        self._widen(runner)
        outs = tuple(cut.keep(out, b) for out, b in runner.iterate(plan, enc[1]))
        emb = text_embeddings(cut, Outputs(names=self.model.output_names(), batches=outs))
        self._memo.put(key, emb)
        return emb

    def _widen(self, runner: IncrementalRunner) -> None:
        """Hold the changed sessions of every racing plan between looks: the shared
        cache's budget grows by ``width - 1`` of the largest segment session while a race
        of ``width`` plans runs (:meth:`narrow` after it); else each look would build the
        challengers' sessions again (a race reads look by look, plan by plan)."""
        cache = runner.sessions
        if self._base is None:
            self._base = cache.budget
        cache.budget = max(cache.budget,
                           self._base + (self.width - 1) * runner.largest_session)

    def narrow(self) -> None:
        """The shared cache's budget back to what it was (the next put evicts down)."""
        self.width = 1
        if self._base is not None and self._chunks:
            next(iter(self._chunks.values()))[1].sessions.budget = self._base

    def _chunk(self, lo: int, hi: int) -> tuple[TextTask, IncrementalRunner]:
        if (lo, hi) not in self._chunks:
            pairs, total = np.sort(self.order[lo:hi]), len(self.order)
            cut = self.task.only_texts(np.concatenate([pairs, total + pairs]))
            first = next(iter(self._chunks.values()), None)
            sessions = self._sessions if self._sessions is not None else (
                first[1].sessions if first is not None else None)
            self._chunks[(lo, hi)] = cut, IncrementalRunner(
                self.model, self.stats, cut.batches.batches, scheme=self.scheme,
                method=self.method, groups=self.groups, sessions=sessions)
        return self._chunks[(lo, hi)]


class EnginePairs:
    """One plan's pooled embeddings of the pairs in race order on :class:`RaceRuns`:
    ``upto(n)`` as :meth:`PairRunner.upto`, run chunk by chunk."""

    def __init__(self, runs: RaceRuns, plan: Plan) -> None:
        self.runs, self.plan, self.done = runs, plan, 0
        self.order = runs.order
        self.enc: tuple[str, Encodings] | None = None
        self.queries: np.ndarray | None = None
        self.docs: np.ndarray | None = None

    def upto(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if n > self.done:
            self.enc = self.enc or self.runs.encodings(self.plan)
            emb = self.runs.embeddings(self.plan, self.enc, self.done, n)
            pairs, total = np.sort(self.order[self.done:n]), len(self.order)
            if self.queries is None:
                self.queries = np.zeros((total, emb.shape[1]), emb.dtype)
                self.docs = np.zeros((total, emb.shape[1]), emb.dtype)
            assert self.docs is not None
            self.queries[pairs], self.docs[pairs] = emb[: len(pairs)], emb[len(pairs):]
            self.done = n
        assert self.queries is not None and self.docs is not None
        pick = self.order[:n]
        return self.queries[pick], self.docs[pick]


class PlanRacer:
    """``racer(plans) -> RaceResult`` on the data's retrieval pairs (module docstring);
    ``records`` keeps every race, :meth:`record` is the plan file's ``race`` entry."""

    def __init__(self, model: Model, data: Dataset, stats: Stats, metric: str,
                 rule: RaceRule, *, scheme: QuantScheme | None = None,
                 method: str | None = None, repair: Any = None, progress: bool = False,
                 engine: IncrementalEngine | None = None, incremental: bool = True) -> None:
        """``engine``: the planner's evaluator, whose segment sessions the race shares;
        ``incremental=False``: every racing plan by a full QDQ session (as before the
        engine; for the bench and the tests' comparison)."""
        assert isinstance(data.task, RetrievalTask)
        self.model, self.stats, self.metric, self.rule = model, stats, metric, rule
        self.task, self.scheme, self.method = data.task, scheme, method
        self.repair, self.progress = repair, progress
        self.engine, self.incremental = engine, incremental
        self.order = np.random.default_rng(RACE_SEED).permutation(self.task.n_pairs)
        self.reference = PairRunner(model.proto, self.task, self.order)
        self.records: list[tuple[RaceResult, tuple[dict[str, str], ...]]] = []
        self.runs: dict[QuantScheme, RaceRuns] = {}
        self.full_graph = 0  # racing plans run by a full QDQ session
        self.width = 1  # plans in the race running now

    def _pairs(self, plan: Plan) -> PairRunner | EnginePairs:
        """The plan's pair runner: on the engine's :class:`RaceRuns` of its scheme, or a
        full QDQ session for a plan whose repairs rewrite the model."""
        repaired = any(dict(plan.meta).get("repairs", "").split(",")) and self.repair is not None
        if repaired or not self.incremental:
            self.full_graph += 1
            return PairRunner(self._proto(plan), self.task, self.order)
        scheme = scheme_for(plan, self.scheme)
        if scheme not in self.runs:
            shared = None if self.engine is None else self.engine.current(
                self.model, self.stats, scheme, make=True)
            self.runs[scheme] = RaceRuns(self.model, self.stats, self.task, self.order,
                                         scheme=scheme, method=self.method,
                                         sessions=None if shared is None else shared.sessions)
            self.runs[scheme].width = self.width
        return self.runs[scheme].pairs(plan)

    @property
    def counts(self) -> IncrementalCounts:
        """What the race's engine runs did (plans = a plan's pass over one chunk)."""
        total = IncrementalCounts()
        for r in self.runs.values():
            total = total.plus(r.counts)
        return total

    def _proto(self, plan: Plan) -> onnx.ModelProto:
        """The plan's QDQ graph, after the repairs its meta lists (as the planner's
        evaluator measures it)."""
        names = [n for n in dict(plan.meta).get("repairs", "").split(",") if n]
        m, s, p = self.model, self.stats, plan
        if names and self.repair is not None:
            out = self.repair(m, s, plan, names)
            m, s, p = out.model, out.stats, dataclasses.replace(out.plan, meta=plan.meta)
        return quantize_model(m, s, p, scheme=scheme_for(p, self.scheme),
                              method=self.method).proto

    def __call__(self, plans: Sequence[Plan], margin: Margin | None = None) -> RaceResult:
        names = [f"candidate {i + 1}" for i in range(len(plans))]
        self.width = len(plans)
        runners: dict[int, PairRunner | EnginePairs] = {}

        def score(i: int, n: int) -> np.ndarray:
            if i not in runners:
                runners[i] = self._pairs(plans[i])
            return prefix_samples(self.metric, self.reference.upto(n), runners[i].upto(n), n)

        say(f"plan: racing {len(plans)} plan(s) on prefixes of {self.task.n_pairs} pairs",
            show=self.progress)
        for r in self.runs.values():
            r.width = len(plans)
        try:
            result = race(names, score, self.task.n_pairs, self.rule, margin=margin)
        finally:
            for r in self.runs.values():
                r.narrow()
        groups = tuple({g: p.value for g, p in plan.overrides} for plan in plans)
        self.records.append((result, groups))
        stopped = [e for e in result.entries if e.stopped]
        say(f"plan: race stopped {len(stopped)} of {len(plans)} plan(s)"
            + "".join(f"; {e.name} at {e.n} pairs" for e in stopped), show=self.progress)
        return result

    def record(self) -> dict[str, Any]:
        """The plan file's ``race`` entry: the rule, what the interval is over, and every
        race with each candidate's n when it stopped and its estimate +- interval."""
        races = []
        for result, groups in self.records:
            doc = result.to_dict()
            for entry, g in zip(doc["candidates"], groups, strict=True):
                entry["groups"] = g
            races.append(doc)
        return {"metric": self.metric, "confidence": self.rule.confidence,
                "looks": {"min_samples": self.rule.min_samples,
                          "max_fraction": self.rule.max_fraction},
                "samples": f"queries of retrieval pairs in a shuffled order (seed {RACE_SEED})",
                "interval": ("one-sided, on the mean per-query difference of a candidate's "
                             f"{self.metric} and its rival's, over the queries of the "
                             "prefix, each ranked against the prefix's own documents"),
                "note": FULL_SET_NOTE, "races": races,
                "runs": ENGINE_RUNS if self.incremental else FULL_GRAPH_RUNS}

    def runs_text(self) -> str:
        """What the racing plans' runs did, in words (counts: not in the plan file, whose
        rerun from the evaluation cache writes the same file; the bench prints them)."""
        c = self.counts
        text = (f"incremental engine, per chunk of pairs between two looks: {c.plans} "
                f"plan-chunk pass(es), {c.segments_run} of {c.segments} segments run, "
                f"{c.sessions_built} segment session(s) built, "
                f"{sum(r.memo_hits for r in self.runs.values())} pass(es) read back")
        if not self.incremental:
            return f"{self.full_graph} plan(s) by a full QDQ session each (not incremental)"
        return text + (f"; {self.full_graph} plan(s) by a full QDQ session (repairs)"
                       if self.full_graph else "")


def race_errors(reference: onnx.ModelProto, protos: Sequence[Callable[[], onnx.ModelProto]],
                names: Sequence[str], task: TextTask, pairs: int, may_stop: np.ndarray,
                rule: RaceRule, *, shared: Sequence[tuple[Model, Stats, Plan] | None] = (),
                ran: list[RaceRuns] | None = None,
                engines: Mapping[int, IncrementalEngine] | None = None) -> RaceResult:
    """``buckets --race``: the candidates raced on prefixes of the selection pairs by each
    pair's error ``1 − cosine`` to FP32 (the mean of its two texts'; lower is better),
    ``may_stop[i, j]``: ``j`` may stop ``i`` (the caller: ``j`` costs no more at any
    length); ``pairs``: how many the task holds (text ``i`` and ``pairs + i``). Errors do
    not depend on a pool: a prefix is just fewer pairs. ``shared[i]``: candidate ``i``'s
    (model, statistics, plan) when other candidates share its model and statistics: those
    run on one :class:`RaceRuns` (from their first changed segment), the rest by their
    full QDQ session (``protos[i]``); ``ran``: gets those :class:`RaceRuns` (their
    counts); ``engines``: by ``id(model)``, the evaluators that measure the survivors
    afterwards, whose segment sessions the race's runs share (their runner made here)."""
    order = np.random.default_rng(RACE_SEED).permutation(pairs)
    ref = PairRunner(reference, task, order)
    runners: dict[int, PairRunner | EnginePairs] = {}
    runs: dict[tuple[int, int, QuantScheme], RaceRuns] = {}

    def runner(i: int) -> PairRunner | EnginePairs:
        got = shared[i] if i < len(shared) else None
        if got is None:
            return PairRunner(protos[i](), task, order)
        model, stats, plan = got
        key = (id(model), id(stats), scheme_for(plan, None))
        if key not in runs:
            engine = None if engines is None else engines.get(id(model))
            current = None if engine is None else engine.current(model, stats, key[2],
                                                                  make=True)
            runs[key] = RaceRuns(model, stats, task, order, scheme=key[2],
                                 sessions=None if current is None else current.sessions)
            runs[key].width = sum(  # its plans racing: their sessions held between looks
                1 for s in shared if s is not None and (id(s[0]), id(s[1])) == key[:2])
        return runs[key].pairs(plan)

    def score(i: int, n: int) -> np.ndarray:
        if i not in runners:
            runners[i] = runner(i)
        (rq, rd), (tq, td) = ref.upto(n), runners[i].upto(n)
        return (np.sum(rq * tq, axis=1) + np.sum(rd * td, axis=1)) / 2.0 - 1.0

    try:
        result = race(names, score, pairs, rule, may_stop=may_stop)
    finally:
        for r in runs.values():
            r.narrow()
    if ran is not None:
        ran.extend(runs.values())
    return result
