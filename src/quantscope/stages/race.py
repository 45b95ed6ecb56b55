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
runs                each model runs only the pairs it has not run yet, in the task's own
                    length-sorted batches of those texts (a text's pooled output does
                    not depend on its padding); one ORT session per racing plan, held
                    for the race (QDQ graphs by the one writer, ``quantize_model``)
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
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.emulate.session import make_session
from quantscope.model.load import Model
from quantscope.plan.race import RaceResult, RaceRule, race
from quantscope.progress import say
from quantscope.tasks.registry import RetrievalTask, TextTask, text_embeddings
from quantscope.tasks.samples import SAMPLE_SCORES, prefix_samples
from quantscope.types import Dataset, Outputs, Plan, QuantScheme, Stats, sample_first

RACE_SEED = 0  # the order of the pairs a race reads (fixed: same inputs, same race)

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


class PlanRacer:
    """``racer(plans) -> RaceResult`` on the data's retrieval pairs (module docstring);
    ``records`` keeps every race, :meth:`record` is the plan file's ``race`` entry."""

    def __init__(self, model: Model, data: Dataset, stats: Stats, metric: str,
                 rule: RaceRule, *, scheme: QuantScheme | None = None,
                 method: str | None = None, repair: Any = None, progress: bool = False) -> None:
        assert isinstance(data.task, RetrievalTask)
        self.model, self.stats, self.metric, self.rule = model, stats, metric, rule
        self.task, self.scheme, self.method = data.task, scheme, method
        self.repair, self.progress = repair, progress
        self.order = np.random.default_rng(RACE_SEED).permutation(self.task.n_pairs)
        self.reference = PairRunner(model.proto, self.task, self.order)
        self.records: list[tuple[RaceResult, tuple[dict[str, str], ...]]] = []

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

    def __call__(self, plans: Sequence[Plan]) -> RaceResult:
        names = [f"candidate {i + 1}" for i in range(len(plans))]
        runners: dict[int, PairRunner] = {}

        def score(i: int, n: int) -> np.ndarray:
            if i not in runners:
                runners[i] = PairRunner(self._proto(plans[i]), self.task, self.order)
            return prefix_samples(self.metric, self.reference.upto(n), runners[i].upto(n), n)

        say(f"plan: racing {len(plans)} plan(s) on prefixes of {self.task.n_pairs} pairs",
            show=self.progress)
        result = race(names, score, self.task.n_pairs, self.rule)
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
                "note": FULL_SET_NOTE, "races": races}


def race_errors(reference: onnx.ModelProto, protos: Sequence[Callable[[], onnx.ModelProto]],
                names: Sequence[str], task: TextTask, pairs: int, may_stop: np.ndarray,
                rule: RaceRule) -> RaceResult:
    """``buckets --race``: the candidates raced on prefixes of the selection pairs by each
    pair's error ``1 − cosine`` to FP32 (the mean of its two texts'; lower is better),
    ``may_stop[i, j]``: ``j`` may stop ``i`` (the caller: ``j`` costs no more at any
    length); ``pairs``: how many the task holds (text ``i`` and ``pairs + i``). Errors do
    not depend on a pool: a prefix is just fewer pairs."""
    order = np.random.default_rng(RACE_SEED).permutation(pairs)
    ref = PairRunner(reference, task, order)
    runners: dict[int, PairRunner] = {}

    def score(i: int, n: int) -> np.ndarray:
        if i not in runners:
            runners[i] = PairRunner(protos[i](), task, order)
        (rq, rd), (tq, td) = ref.upto(n), runners[i].upto(n)
        return (np.sum(rq * tq, axis=1) + np.sum(rd * td, axis=1)) / 2.0 - 1.0

    return race(names, score, pairs, rule, may_stop=may_stop)
