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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantscope.emulate.evaluate import kept, run_model
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.shapes import given_shapes
from quantscope.serde import check_keys, plan_to_dict, read_json, read_plan, read_stats
from quantscope.stages import default_metric, open_model, plan_problems
from quantscope.tasks.registry import RetrievalTask, StsTask, at_length
from quantscope.types import Batch, Dataset, Outputs, Plan, QuantscopeError, Stats

BUCKET_KEYS = {"seq_len", "model", "stats", "plan"}


@dataclass(frozen=True)
class Bucket:
    """One compiled length: the model file (the original or a rewrite of it), its stats and
    its plan; ``files`` are the paths as the deployment file names them."""

    seq_len: int
    model: Model
    stats: Stats
    plan: Plan
    files: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Deployment:
    """Buckets in increasing length, all planned for one target."""

    buckets: tuple[Bucket, ...]
    target: str
    source: str = ""

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return tuple(b.seq_len for b in self.buckets)


def read_deployment(path: str | Path) -> Deployment:
    """A deployment file: ``{"buckets": [{"seq_len": 128, "model": "m.onnx", "stats":
    "m.npz", "plan": "p.json"}, ...]}``; relative paths are relative to the file's folder.
    A built-in model name may stand for a model file."""
    path = Path(path)
    doc = read_json(path, "deployment")
    where = f"deployment '{path}'"
    if not isinstance(doc, dict) or not isinstance(doc.get("buckets"), list) or not doc["buckets"]:
        raise QuantscopeError(f"{where} has no 'buckets' list: write {{\"buckets\": [{{\"seq_len\": "
                              "128, \"model\": ..., \"stats\": ..., \"plan\": ...}, ...]}")
    check_keys(doc, {"buckets"}, where)
    entries = []
    for i, entry in enumerate(doc["buckets"]):
        at = f"{where}, bucket {i + 1}"
        if not isinstance(entry, dict):
            raise QuantscopeError(f"{at} is not an object: give seq_len, model, stats and plan")
        check_keys(entry, BUCKET_KEYS, at)
        missing = sorted(BUCKET_KEYS - set(entry))
        if missing:
            raise QuantscopeError(f"{at} has no '{missing[0]}': give seq_len, model, stats and plan")
        n = entry["seq_len"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise QuantscopeError(f"{at}: seq_len must be a positive whole number of tokens, "
                                  f"not {n!r}")
        for key in ("model", "stats", "plan"):
            if not isinstance(entry[key], str) or not entry[key]:
                raise QuantscopeError(f"{at}: '{key}' must be a file name")
        entries.append(entry)
    lens = [e["seq_len"] for e in entries]
    if len(set(lens)) != len(lens):
        raise QuantscopeError(f"{where} lists seq_len {_first_repeat(lens)} twice: give each "
                              "compiled length once")

    def beside(name: str) -> Path:
        p = Path(name)
        return p if p.is_absolute() else path.parent / p

    buckets = []
    for entry in sorted(entries, key=lambda e: e["seq_len"]):
        model_spec = str(beside(entry["model"])) if beside(entry["model"]).exists() \
            else entry["model"]
        plan = read_plan(beside(entry["plan"]))
        buckets.append(Bucket(
            seq_len=entry["seq_len"], model=open_model(model_spec),
            stats=read_stats(beside(entry["stats"])), plan=plan,
            files=tuple((k, str(entry[k])) for k in ("model", "stats", "plan"))))
    targets = {b.plan.target for b in buckets}
    if None in targets:
        bad = next(b for b in buckets if not b.plan.target)
        raise QuantscopeError(f"{where}: the plan of bucket {bad.seq_len} names no target: "
                              "route checks legality and cost on one target; give each plan "
                              "one (\"target\": \"hailo10h\", as 'quantscope plan' writes)")
    if len(targets) > 1:
        raise QuantscopeError(f"{where}: the plans name different targets ("
                              f"{', '.join(sorted(str(t) for t in targets))}): a deployment "
                              "runs on one device; plan every bucket for the same target")
    return Deployment(buckets=tuple(buckets), target=str(targets.pop()), source=str(path))


def _first_repeat(values: list[int]) -> int:
    seen: set[int] = set()
    for v in values:
        if v in seen:
            return v
        seen.add(v)
    raise AssertionError("no repeat")


def route(lengths: np.ndarray, seq_lens: tuple[int, ...]) -> np.ndarray:
    """Index of the bucket each text runs on: the shortest that holds its token count, the
    longest for a text longer than every bucket (truncated there)."""
    idx = np.searchsorted(np.asarray(seq_lens), np.asarray(lengths), side="left")
    return np.minimum(idx, len(seq_lens) - 1)


def _cost_unit(model: Model, seq_len: int, target: Any) -> float:
    """Uniform a8_w8 of ``model`` at ``seq_len`` in the target's cost units."""
    from quantscope.plan.cost import uniform_a8_cost

    return uniform_a8_cost(find_groups(model), target, given_shapes(model, seq_len), model=model)


def _check_compatible(reference: Model, bucket: Bucket) -> None:
    ins, outs = set(reference.input_names()), reference.output_names()
    if not ins <= set(bucket.model.input_names()) or tuple(bucket.model.output_names()) != tuple(outs):
        raise QuantscopeError(
            f"the model of bucket {bucket.seq_len} ('{bucket.model.source}') has inputs "
            f"{', '.join(bucket.model.input_names())} and outputs "
            f"{', '.join(bucket.model.output_names())}; the reference has inputs "
            f"{', '.join(reference.input_names())} and outputs {', '.join(outs)}: every bucket "
            "must be the reference model or a rewrite of it (same inputs and outputs)")


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
    longest_alone: Outputs  # the longest bucket's emulated model on every row, kept
    which: np.ndarray  # bucket index per evaluation text (task order)
    data: Dataset  # the data as measured (truncated at the longest bucket)
    notes: tuple[tuple[str, ...], ...]  # the QDQ writer's notes, per bucket


def routed_outputs(reference: Model, data: Dataset, deployment: Deployment, *,
                   progress: bool = False) -> Routed:
    """Every evaluation text through its bucket's QDQ model (see the module doc)."""
    if not isinstance(data.task, RetrievalTask | StsTask) or data.token_lengths is None:
        raise QuantscopeError(f"route needs text data (retrieval pairs or STS), not "
                              f"'{data.name}': the buckets are chosen by each text's token count")
    for b in deployment.buckets:
        _check_compatible(reference, b)
    data = at_length(data, deployment.seq_lens[-1])
    task = data.task
    assert isinstance(task, RetrievalTask | StsTask)
    batches = tuple(task.batches.batches)
    rows = _rows_by_batch(task.batches.order, batches)
    which = route(np.asarray(data.token_lengths), deployment.seq_lens)
    ref = kept(run_model(reference.proto, batches, label="fp32" if progress else ""), batches,
               task.keep)
    routed: list[list[np.ndarray] | None] = [None] * len(batches)
    alone: Outputs | None = None
    notes = []
    last = len(deployment.buckets) - 1
    for i, b in enumerate(deployment.buckets):
        # the longest bucket runs every batch: its rows, and the one-model comparison
        need = list(range(len(batches))) if i == last else [
            k for k, r in enumerate(rows) if np.any(which[r] == i)]
        if not need:
            notes.append(())
            continue
        q = quantize_model(b.model, b.stats, b.plan, scheme=scheme_for(b.plan, None))
        notes.append((*q.notes, *q.coverage.lines()))
        proto = q.proto
        del q
        label = f"bucket {b.seq_len}" if progress else ""
        out = kept(run_model(proto, [batches[k] for k in need], label=label),
                   [batches[k] for k in need], task.keep)
        for k, o in zip(need, out.batches, strict=True):
            take = which[rows[k]] == i
            cur = routed[k] if routed[k] is not None else [np.array(a, copy=True) for a in o]
            for a, new in zip(cur, o, strict=True):
                a[take] = new[take]
            routed[k] = cur
        if i == last:
            alone = out
    assert alone is not None
    test = Outputs(names=ref.names, batches=tuple(tuple(r) for r in routed if r is not None))
    return Routed(reference=ref, routed=test, longest_alone=alone, which=which, data=data,
                  notes=tuple(notes))


def deployment_costs(reference: Model, deployment: Deployment) -> list[dict[str, Any]]:
    """Per bucket: legality at its length, its cost relative to its own uniform a8_w8
    (``cost_own``) and to the reference's uniform a8_w8 at the longest length (``cost``)."""
    from quantscope.plan.cost import plan_cost, uniform_a8_cost
    from quantscope.targets import load_target

    target = load_target(deployment.target)
    unit = _cost_unit(reference, deployment.seq_lens[-1], target)
    out = []
    for b in deployment.buckets:
        groups, shapes = find_groups(b.model), given_shapes(b.model, b.seq_len)
        own = plan_cost(b.plan, groups, target, shapes, model=b.model)
        own_unit = uniform_a8_cost(groups, target, shapes, model=b.model)
        found = plan_problems(b.model, b.plan, seq_len=b.seq_len)
        problems = [p for p in found if p["severity"] == "error"]
        out.append({"seq_len": b.seq_len, "cost_own": own, "cost": own * own_unit / unit,
                    "legal": not problems, "problems": problems,
                    "warnings": [p for p in found if p["severity"] != "error"]})
    return out


def evaluate_deployment(
    reference: Model, data: Dataset, deployment: Deployment, *, progress: bool = False,
) -> dict[str, Any]:
    """The routed deployment measured against the FP32 ``reference`` (see the module doc)."""
    r = routed_outputs(reference, data, deployment, progress=progress)
    task = r.data.task
    assert task is not None
    costs = deployment_costs(reference, deployment)
    per_bucket = []
    for i, (b, c) in enumerate(zip(deployment.buckets, costs, strict=True)):
        per_bucket.append({
            **c, "files": dict(b.files), "model": b.model.source,
            "share": float(np.mean(r.which == i)), "texts": int(np.sum(r.which == i)),
            "plan": plan_to_dict(b.plan), "notes": list(r.notes[i]),
        })
    metrics = task.metrics(r.reference, r.routed)
    alone_metrics = task.metrics(r.reference, r.longest_alone)
    longest = deployment.seq_lens[-1]
    lengths = np.asarray(r.data.token_lengths)
    notes = [*reference.notes, *r.data.notes]
    longer = float(np.mean(lengths > longest))
    if longer > 0:
        notes.append(f"{longer:.1%} of the evaluation texts are longer than the longest "
                     f"bucket ({longest}) and run there truncated (FP32 truncated alike)")
    notes.append(f"a deployment of {len(per_bucket)} compiled models: the host routes each "
                 "text by its token count; the mean cost weights each bucket by its share of "
                 "these evaluation texts (your traffic decides the real mean)")
    empty = [p["seq_len"] for p in per_bucket if p["texts"] == 0]
    if empty:
        notes.append(f"no evaluation text runs on bucket(s) {', '.join(map(str, empty))}: "
                     "their quality is not measured here")
    return {
        "reference": reference.source, "data": r.data.name, "target": deployment.target,
        "metric": default_metric(r.data),
        "deployment": deployment.source, "seq_lens": list(deployment.seq_lens),
        "buckets": per_bucket,
        "cost_mean": float(sum(p["share"] * p["cost"] for p in per_bucket)),
        "cost_max": max(p["cost"] for p in per_bucket),
        "legal": all(p["legal"] for p in per_bucket),
        "metrics": dict(metrics.values), "notes": [*notes, *metrics.notes],
        "longest_alone": {"seq_len": longest, "cost": per_bucket[-1]["cost"],
                          "metrics": dict(alone_metrics.values)},
    }


def deployment_verdict(result: dict[str, Any], *, max_cost: float | None = None,
                       goal: float | None = None) -> dict[str, Any] | None:
    """Whether the routed deployment is legal, within ``max_cost`` (mean) and at ``goal``
    (the task's metric); None when neither is asked."""
    if max_cost is None and goal is None:
        return None
    metric = result["metric"]
    value = result["metrics"].get(metric)
    out: dict[str, Any] = {"legal": result["legal"], "metric": metric, "value": value}
    ok = bool(result["legal"])
    if max_cost is not None:
        out["max_cost"] = max_cost
        out["within_cost"] = result["cost_mean"] <= max_cost
        ok = ok and out["within_cost"]
    if goal is not None:
        out["goal"] = goal
        out["goal_met"] = value is not None and value >= goal
        out["short_by"] = None if value is None else max(0.0, goal - value)
        ok = ok and out["goal_met"]
    out["met"] = ok
    return out


HEADLINE = ("top1_agreement", "recall@1", "recall@1_fp32", "embedding_cosine_mean",
            "score_agreement", "spearman", "spearman_fp32")


def format_deployment(result: dict[str, Any]) -> str:
    """The routed deployment in a few lines."""
    def metric_line(m: dict[str, Any]) -> str:
        return ", ".join(f"{k} {m[k]:.4g}" for k in HEADLINE if k in m)

    lines = [f"deployment on {result['target']}: {len(result['buckets'])} compiled lengths "
             f"({', '.join(str(n) for n in result['seq_lens'])}), each text on the shortest "
             "that holds it"]
    for p in result["buckets"]:
        legal = "legal" if p["legal"] else (
            f"NOT legal ({len(p['problems'])} problems, e.g. {p['problems'][0]['rule']} on "
            f"{p['problems'][0]['group']})")
        if p["warnings"]:
            legal += (f" ({len(p['warnings'])} warnings, e.g. {p['warnings'][0]['rule']}: "
                      f"{p['warnings'][0]['reason']})")
        lines.append(f"  seq {p['seq_len']:>5}: {p['share']:6.1%} of the texts, cost "
                     f"{p['cost_own']:.3f}x its own a8_w8 = {p['cost']:.3f}x the reference's "
                     f"a8_w8 at {result['seq_lens'][-1]}; {legal}; {p['model']}")
    lines.append(f"routed: mean cost {result['cost_mean']:.3f}x (the most costly bucket "
                 f"{result['cost_max']:.3f}x); {metric_line(result['metrics'])}")
    alone = result["longest_alone"]
    lines.append(f"for comparison, seq {alone['seq_len']} alone on every text: cost "
                 f"{alone['cost']:.3f}x; {metric_line(alone['metrics'])}")
    v = result.get("verdict")
    if v is not None:
        parts = [("legal" if v["legal"] else "NOT legal")]
        if "max_cost" in v:
            parts.append(f"mean cost {result['cost_mean']:.3f}x "
                         f"{'within' if v['within_cost'] else 'OVER'} {v['max_cost']}x")
        if "goal" in v and v["value"] is not None:
            parts.append(f"{v['metric']} {v['value']:.4g} "
                         + ("reaches" if v["goal_met"] else f"short of (by {v['short_by']:.4g})")
                         + f" the goal {v['goal']}")
        lines.append(f"verdict: {'MET' if v['met'] else 'NOT MET'}: {'; '.join(parts)}")
    if not result["legal"]:
        lines.append("NOT legal: at least one bucket's plan breaks a target rule (see above; "
                     "'quantscope check --seq-len N' on that plan lists them)")
    lines.extend(f"note: {n}" for n in result["notes"])
    by_note: dict[str, list[str]] = {}  # the QDQ writer's notes (coverage: ops left float …)
    for p in result["buckets"]:
        for n in p["notes"]:
            by_note.setdefault(n, []).append(str(p["seq_len"]))
    lines.extend(f"note (bucket {', '.join(where)}): {n}" for n, where in by_note.items())
    return "\n".join(lines)
