"""Length buckets: one text encoder compiled at several sequence lengths, each text run
on the shortest compiled length that holds it (``quantscope route``).

A compiled NPU model has one input shape, so a deployment at sequence 256 pays for 256
tokens on every text, and a plan's legality is decided at 256 (``hailo.super_defuse``
binds there). Most texts are much shorter: compiled at 32, 64 or 128 tokens the same
encoder costs a fraction of the 256-token model (the Linears scale with the length, the
attention with its square) and 16 bit is legal on tensors that are too wide at 256. A
deployment of several compiled lengths ("buckets", each with its own model file, stats and
plan) therefore buys more precision per unit of cost, at the price of holding several
compiled models and routing each text by its token count on the host.

What is measured here, all in ONNX Runtime on the one QDQ graph per bucket:

- every evaluation text runs on the bucket its untruncated token count selects (texts
  longer than the longest bucket are truncated there, as that bucket runs them), and the
  task metrics of the routed outputs are computed against the FP32 reference model at the
  longest length;
- each bucket's plan is checked for legality at its own length, and its cost is its
  model's cost at its length relative to the reference model's uniform a8_w8 at the
  longest length; the deployment's cost is the mean over the evaluation texts (the share
  of each bucket is the share of the evaluation texts it receives: the user's own traffic
  decides the real mean);
- for comparison, the longest bucket alone on every text (one compiled model).

A text's emulated output does not depend on how much padding its batch has (masked
positions get no attention weight and are not pooled), so a bucket's rows are taken from
its model run on the length-ordered evaluation batches that hold them.

::

    read_deployment ─► Deployment ─► routed_outputs ─► Routed ─┐
                                     deployment_costs ─► BucketCost ×n ─┴─► evaluate_deployment ─► RouteResult
                                                                        deployment_verdict ─► RouteVerdict

The values and the files are :mod:`quantscope.plan.deployment` and
:mod:`quantscope.plan.deployment_results`; choosing a deployment is
:mod:`quantscope.stages.buckets`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantscope.analyze.measure import default_metric
from quantscope.emulate.evaluate import kept_runs, open_runs, run_kept
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.shapes import given_shapes
from quantscope.plan.buckets import route
from quantscope.plan.cost import plan_cost, uniform_a8_cost
from quantscope.plan.deployment import (
    Bucket,
    Deployment,
    check_bucket_entry,
    check_seq_lens,
    entry_list,
    one_target,
)
from quantscope.plan.deployment_results import (
    BucketCost,
    LongestAlone,
    RoutedBucket,
    RouteResult,
    RouteVerdict,
)
from quantscope.serde import plan_to_dict, read_json, read_plan, read_stats
from quantscope.stages.open import open_model, plan_problems
from quantscope.targets import load_target
from quantscope.tasks.registry import TextTask, at_length, text_task
from quantscope.types import Batch, Dataset, Outputs, Plan, QuantscopeError, Stats

BUCKET_EXAMPLE = '{"seq_len": 128, "model": ..., "stats": ..., "plan": ...}'


def read_deployment(path: str | Path) -> Deployment:
    """A deployment file (:mod:`quantscope.plan.deployment`), its files opened: relative
    paths are relative to the file's folder; a built-in model name may stand for a model
    file."""
    path = Path(path)
    where = f"deployment '{path}'"
    listed = entry_list(read_json(path, "deployment"), "buckets", where, BUCKET_EXAMPLE)
    entries = check_seq_lens([check_bucket_entry(e, f"{where}, bucket {i + 1}")
                              for i, e in enumerate(listed)], where)
    buckets = []
    for entry in entries:
        model, stats, plan, _ = open_entry(entry, path)
        buckets.append(Bucket(
            seq_len=entry["seq_len"], model=model, stats=stats, plan=plan,
            files=tuple((k, str(entry[k])) for k in ("model", "stats", "plan"))))
    target = one_target([(f"bucket {b.seq_len}", b.plan) for b in buckets], where)
    return Deployment(buckets=tuple(buckets), target=target, source=str(path))


def open_entry(entry: dict[str, Any], path: Path, cache: dict[tuple[str, str], Any] | None = None
               ) -> tuple[Model, Stats, Plan, dict[str, str]]:
    """The model, stats and plan an entry names (paths relative to ``path``'s folder; a
    built-in model name may stand for a model file), and the paths as opened. Entries
    naming the same model or stats file share one object through ``cache``."""
    def beside(name: str) -> Path:
        p = Path(name)
        return p if p.is_absolute() else path.parent / p

    model_spec = str(beside(entry["model"])) if beside(entry["model"]).exists() \
        else entry["model"]
    opened = {"model": model_spec, "stats": str(beside(entry["stats"])),
              "plan": str(beside(entry["plan"]))}
    memo = {} if cache is None else cache
    for key, spec, read in (("model", model_spec, open_model),
                            ("stats", opened["stats"], read_stats)):
        if (key, spec) not in memo:
            memo[(key, spec)] = read(spec)
    return (memo[("model", model_spec)], memo[("stats", opened["stats"])],
            read_plan(opened["plan"]), opened)


def cost_unit(model: Model, seq_len: int, target: Any) -> float:
    """Uniform a8_w8 of ``model`` at ``seq_len`` in the target's cost units."""
    return uniform_a8_cost(find_groups(model), target, given_shapes(model, seq_len), model=model)


def check_compatible(reference: Model, bucket: Bucket) -> None:
    """An error unless the bucket's model has the reference's inputs and outputs."""
    ins, outs = set(reference.input_names()), reference.output_names()
    if not ins <= set(bucket.model.input_names()) or tuple(bucket.model.output_names()) != tuple(outs):
        raise QuantscopeError(
            f"the model of bucket {bucket.seq_len} ('{bucket.model.source}') has inputs "
            f"{', '.join(bucket.model.input_names())} and outputs "
            f"{', '.join(bucket.model.output_names())}; the reference has inputs "
            f"{', '.join(reference.input_names())} and outputs {', '.join(outs)}: every bucket "
            "must be the reference model or a rewrite of it (same inputs and outputs)")


def routable(data: Dataset, command: str) -> TextTask:
    """The data's text task; an error naming ``command`` when the data has none (or no
    token counts to route by)."""
    task = text_task(data.task)
    if task is None or data.token_lengths is None:
        raise QuantscopeError(f"{command} needs text data (retrieval pairs or STS), not "
                              f"'{data.name}': the buckets are chosen by each text's token count")
    return task


def _rows_by_batch(order: np.ndarray, batches: tuple[Batch, ...]) -> list[np.ndarray]:
    """Text index of every row, batch by batch."""
    out, start = [], 0
    for b in batches:
        n = len(next(iter(b.values())))
        out.append(order[start:start + n])
        start += n
    return out


@dataclass(frozen=True, eq=False)
class Routed:
    """The routed outputs (what the task reads of them) and how they were made."""

    reference: Outputs  # FP32 reference, kept
    routed: Outputs  # each row from its bucket's emulated model, kept
    longest_alone: Outputs | None  # the longest bucket's model on every row (None: not run)
    which: np.ndarray  # bucket index per evaluation text (task order)
    data: Dataset  # the data as measured (truncated at the longest bucket)
    notes: tuple[tuple[str, ...], ...]  # the QDQ writer's notes, per bucket


def routed_outputs(reference: Model, data: Dataset, deployment: Deployment, *,
                   progress: bool = False, alone: bool = True, reuse: Routed | None = None,
                   unchanged: frozenset[int] = frozenset()) -> Routed:
    """Every evaluation text through its bucket's QDQ model (see the module doc).

    ``alone``: also the longest bucket on every text (the one-model comparison).
    ``reuse``: an earlier measurement of a deployment at the same lengths on the same
    data: its FP32 reference is taken, and so are the rows of the buckets whose lengths
    are in ``unchanged`` (the same model, statistics and plan there: the deployment as
    its scripts carry it, where only some lengths' scripts leave a decision unset), so
    only the changed buckets run, each on the batches holding its rows."""
    routable(data, "route")
    for b in deployment.buckets:
        check_compatible(reference, b)
    data = at_length(data, deployment.seq_lens[-1])
    task = routable(data, "route")
    batches = tuple(task.batches.batches)
    rows = _rows_by_batch(task.batches.order, batches)
    which = route(np.asarray(data.token_lengths), deployment.seq_lens)
    routed: list[list[np.ndarray] | None] = [None] * len(batches)
    if reuse is None:
        ref = run_kept(reference.proto, batches, task.keep, label="fp32" if progress else "")
    else:
        if len(reuse.routed.batches) != len(batches) or not np.array_equal(reuse.which, which):
            raise ValueError("reuse: another data or other lengths than this deployment's")
        ref = reuse.reference
        routed = [[np.array(a, copy=True) for a in o] for o in reuse.routed.batches]
    longest: Outputs | None = None
    notes = []
    last = len(deployment.buckets) - 1
    for i, b in enumerate(deployment.buckets):
        kept = reuse is not None and b.seq_len in unchanged
        if kept and i == last and alone and reuse is not None:
            longest = reuse.longest_alone
        whole = i == last and alone and longest is None
        if kept and not whole:
            assert reuse is not None
            notes.append(reuse.notes[i])
            continue
        # the longest bucket runs every batch with ``alone``: its rows and the comparison
        need = list(range(len(batches))) if whole else [
            k for k, r in enumerate(rows) if np.any(which[r] == i)]
        if not need:
            notes.append(())
            continue
        q = quantize_model(b.model, b.stats, b.plan, scheme=scheme_for(b.plan, None))
        notes.append((*q.notes, *q.coverage.lines()))
        label = f"bucket {b.seq_len}" if progress else ""
        runs = open_runs(q.proto, [batches[k] for k in need], label, shared_arena=False)
        del q  # the session holds the graph
        out = kept_runs(runs, task.keep)
        for k, o in zip(need, out.batches, strict=True):
            take = which[rows[k]] == i
            cur = routed[k] if routed[k] is not None else [np.array(a, copy=True) for a in o]
            for a, new in zip(cur, o, strict=True):
                a[take] = new[take]
            routed[k] = cur
        if whole:
            longest = out
    assert longest is not None or not alone
    test = Outputs(names=ref.names, batches=tuple(tuple(r) for r in routed if r is not None))
    return Routed(reference=ref, routed=test, longest_alone=longest, which=which, data=data,
                  notes=tuple(notes))


def deployment_costs(reference: Model, deployment: Deployment) -> tuple[BucketCost, ...]:
    """Per bucket: legality at its length, its cost relative to its own uniform a8_w8
    (``cost_own``) and to the reference's uniform a8_w8 at the longest length (``cost``)."""
    target = load_target(deployment.target)
    unit = cost_unit(reference, deployment.seq_lens[-1], target)
    out = []
    for b in deployment.buckets:
        groups, shapes = find_groups(b.model), given_shapes(b.model, b.seq_len)
        own = plan_cost(b.plan, groups, target, shapes, model=b.model)
        own_unit = uniform_a8_cost(groups, target, shapes, model=b.model)
        found = plan_problems(b.model, b.plan, seq_len=b.seq_len)
        problems = [p for p in found if p["severity"] == "error"]
        out.append(BucketCost(seq_len=b.seq_len, cost_own=own, cost=own * own_unit / unit,
                              legal=not problems, problems=tuple(problems),
                              warnings=tuple(p for p in found if p["severity"] != "error")))
    return tuple(out)


def evaluate_deployment(
    reference: Model, data: Dataset, deployment: Deployment, *, progress: bool = False,
    routed: Routed | None = None,
) -> RouteResult:
    """The routed deployment measured against the FP32 ``reference`` (see the module doc);
    ``routed``: its :func:`routed_outputs` already computed (with the longest alone)."""
    r = routed or routed_outputs(reference, data, deployment, progress=progress)
    task = r.data.task
    assert task is not None and r.longest_alone is not None
    costs = deployment_costs(reference, deployment)
    per_bucket = tuple(
        RoutedBucket(cost=c, files=dict(b.files), model=b.model.source,
                     share=float(np.mean(r.which == i)), texts=int(np.sum(r.which == i)),
                     plan=plan_to_dict(b.plan), notes=r.notes[i])
        for i, (b, c) in enumerate(zip(deployment.buckets, costs, strict=True)))
    metrics = task.metrics(r.reference, r.routed)
    alone_metrics = task.metrics(r.reference, r.longest_alone)
    longest = deployment.seq_lens[-1]
    return RouteResult(
        reference=reference.source, data=r.data.name, target=deployment.target,
        metric=default_metric(r.data), deployment=deployment.source,
        seq_lens=deployment.seq_lens, buckets=per_bucket,
        cost_mean=float(sum(p.share * p.cost.cost for p in per_bucket)),
        cost_max=max(p.cost.cost for p in per_bucket),
        legal=all(p.cost.legal for p in per_bucket),
        metrics=dict(metrics.values),
        notes=(*_route_notes(reference, r, per_bucket, longest), *metrics.notes),
        longest_alone=LongestAlone(seq_len=longest, cost=per_bucket[-1].cost.cost,
                                   metrics=dict(alone_metrics.values)))


def _route_notes(reference: Model, r: Routed, per_bucket: tuple[RoutedBucket, ...],
                 longest: int) -> list[str]:
    """What a route result says besides its figures: truncation, routing, empty buckets."""
    lengths = np.asarray(r.data.token_lengths)
    notes = [*reference.notes, *r.data.notes]
    longer = float(np.mean(lengths > longest))
    if longer > 0:
        notes.append(f"{longer:.1%} of the evaluation texts are longer than the longest "
                     f"bucket ({longest}) and run there truncated (FP32 truncated alike)")
    notes.append(f"a deployment of {len(per_bucket)} compiled models: the host routes each "
                 "text by its token count; the mean cost weights each bucket by its share of "
                 "these evaluation texts (your traffic decides the real mean)")
    empty = [p.seq_len for p in per_bucket if p.texts == 0]
    if empty:
        notes.append(f"no evaluation text runs on bucket(s) {', '.join(map(str, empty))}: "
                     "their quality is not measured here")
    return notes


def deployment_verdict(result: RouteResult, *, max_cost: float | None = None,
                       goal: float | None = None) -> RouteVerdict | None:
    """Whether the routed deployment is legal, within ``max_cost`` (mean) and at ``goal``
    (the task's metric); None when neither is asked."""
    if max_cost is None and goal is None:
        return None
    from quantscope.tasks.headline import describe_metric

    value = result.metrics.get(result.metric)
    within = None if max_cost is None else result.cost_mean <= max_cost
    # the metric's own direction: a lower-is-better one (an error) is met at or below
    head = describe_metric(result.metric)
    goal_met = None if goal is None else head.reached(value, goal)
    sign = 1.0 if head.higher_is_better else -1.0
    short_by = None if goal is None or value is None else max(0.0, sign * (goal - value))
    met = bool(result.legal)  # the same and-chain (and value types) the JSON always had
    if within is not None:
        met = met and within
    if goal_met is not None:
        met = met and goal_met
    return RouteVerdict(legal=result.legal, metric=result.metric, value=value, met=met,
                        max_cost=max_cost, within_cost=within, goal=goal, goal_met=goal_met,
                        short_by=short_by)
