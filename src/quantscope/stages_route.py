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
from typing import Any, TypeVar

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

T = TypeVar("T")
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

    buckets = []
    for entry in sorted(entries, key=lambda e: e["seq_len"]):
        model, stats, plan, _ = _open_entry(entry, path)
        buckets.append(Bucket(
            seq_len=entry["seq_len"], model=model, stats=stats, plan=plan,
            files=tuple((k, str(entry[k])) for k in ("model", "stats", "plan"))))
    target = _one_target([(f"bucket {b.seq_len}", b.plan) for b in buckets], where)
    return Deployment(buckets=tuple(buckets), target=target, source=str(path))


def _open_entry(entry: dict[str, Any], path: Path, cache: dict[tuple[str, str], Any] | None = None
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


def _one_target(plans: list[tuple[str, Plan]], where: str) -> str:
    """The one target every plan names (legality and cost are computed on it)."""
    targets = {p.target for _, p in plans}
    if None in targets:
        bad = next(name for name, p in plans if not p.target)
        raise QuantscopeError(f"{where}: the plan of {bad} names no target: legality and "
                              "cost are checked on one target; give each plan one "
                              "(\"target\": \"hailo10h\", as 'quantscope plan' writes)")
    if len(targets) > 1:
        raise QuantscopeError(f"{where}: the plans name different targets ("
                              f"{', '.join(sorted(str(t) for t in targets))}): a deployment "
                              "runs on one device; plan every bucket for the same target")
    return str(targets.pop())


def _first_repeat(values: list[T]) -> T:
    seen: set[T] = set()
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


# ---------------------------------------------------------------- choosing a deployment

CHOICE_LENGTHS = (16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)
CANDIDATE_KEYS = {"name", "model", "stats", "plan"}
MAX_BUCKETS = 6


@dataclass(frozen=True)
class Candidate:
    """One way to compile a bucket: a model file (the reference or a rewrite), its stats and
    a plan; ``paths`` as opened (for the deployment file written)."""

    name: str
    model: Model
    stats: Stats
    plan: Plan
    paths: tuple[tuple[str, str], ...] = ()


def read_candidates(path: str | Path) -> tuple[tuple[Candidate, ...], str]:
    """A candidates file: ``{"candidates": [{"name": "all16", "model": "m.onnx", "stats":
    "m.npz", "plan": "p.json"}, ...]}`` (paths relative to its folder; ``name`` optional),
    and the one target their plans name."""
    path = Path(path)
    doc = read_json(path, "candidates")
    where = f"candidates '{path}'"
    if not isinstance(doc, dict) or not isinstance(doc.get("candidates"), list) \
            or not doc["candidates"]:
        raise QuantscopeError(f"{where} has no 'candidates' list: write {{\"candidates\": "
                              "[{\"name\": ..., \"model\": ..., \"stats\": ..., \"plan\": ...}, "
                              "...]}")
    check_keys(doc, {"candidates"}, where)
    out = []
    cache: dict[tuple[str, str], Any] = {}
    for i, entry in enumerate(doc["candidates"]):
        at = f"{where}, candidate {i + 1}"
        if not isinstance(entry, dict):
            raise QuantscopeError(f"{at} is not an object: give model, stats and plan")
        check_keys(entry, CANDIDATE_KEYS, at)
        missing = sorted(CANDIDATE_KEYS - {"name"} - set(entry))
        if missing:
            raise QuantscopeError(f"{at} has no '{missing[0]}': give model, stats and plan")
        for key in CANDIDATE_KEYS & set(entry):
            if not isinstance(entry[key], str) or not entry[key]:
                raise QuantscopeError(f"{at}: '{key}' must be a non-empty string")
        model, stats, plan, opened = _open_entry(entry, path, cache)
        name = entry.get("name") or f"{Path(entry['model']).stem}:{Path(entry['plan']).stem}"
        out.append(Candidate(name=name, model=model, stats=stats, plan=plan,
                             paths=tuple(opened.items())))
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise QuantscopeError(f"{where} names candidate '{_first_repeat(names)}' twice: "
                              "give each candidate its own name")
    target = _one_target([(f"candidate '{c.name}'", c.plan) for c in out], where)
    return tuple(out), target


def _solve(lengths: np.ndarray, errors: np.ndarray, costs: np.ndarray, allowed: np.ndarray,
           seq_lens: tuple[int, ...], max_buckets: int, lam: float
           ) -> tuple[float, list[tuple[int, int]]]:
    """Boundaries and a candidate per bucket minimising Σ error + lam · Σ cost over the
    texts (dynamic programme over the allowed lengths; the last bucket is always the
    longest length and takes every longer text, truncated): (objective, [(length index,
    candidate index), ...])."""
    n_len = len(seq_lens)
    order = np.argsort(lengths, kind="stable")
    sorted_len = lengths[order]
    # texts with length <= seq_lens[j]: the first ends[j] of the sorted texts (the last
    # bucket also takes the longer ones)
    ends = [int(np.searchsorted(sorted_len, s, side="right")) for s in seq_lens]
    ends[-1] = len(lengths)
    starts = [0, *ends]  # starts[j] = texts before the bucket ending at j, for i = j - 1
    pref = np.concatenate([np.zeros((errors.shape[0], 1)),
                           np.cumsum(errors[:, order], axis=1)], axis=1)
    inf = float("inf")
    best = np.full((n_len + 1, max_buckets + 1), inf)
    arg: dict[tuple[int, int], tuple[int, int]] = {}
    best[0][0] = 0.0  # nothing covered yet (position 0 = below the first length)
    for j in range(1, n_len + 1):  # a bucket ending at seq_lens[j - 1]
        for i in range(j):  # previous bucket ended at seq_lens[i - 1] (i = 0: none)
            lo, hi = starts[i], ends[j - 1]
            count = hi - lo
            opts = [(pref[c, hi] - pref[c, lo] + lam * count * costs[c, j - 1], c)
                    for c in range(errors.shape[0]) if allowed[c, j - 1]]
            if not opts:
                continue
            val, c = min(opts)
            for k in range(1, max_buckets + 1):
                if best[i][k - 1] + val < best[j][k]:
                    best[j][k] = best[i][k - 1] + val
                    arg[(j, k)] = (i, c)
    k = int(np.argmin(best[n_len]))
    total = float(best[n_len][k])
    if total == inf:
        return inf, []
    picks, j = [], n_len
    while k > 0:
        i, c = arg[(j, k)]
        picks.append((j - 1, c))
        j, k = i, k - 1
    return total, list(reversed(picks))


COST_LEVELS = 600  # the budget's grid for the exact search: each bucket's cost rounded up


def _solve_budget(lengths: np.ndarray, errors: np.ndarray, costs: np.ndarray,
                  allowed: np.ndarray, seq_lens: tuple[int, ...], max_buckets: int,
                  budget: float, levels: int = COST_LEVELS
                  ) -> tuple[float, list[tuple[int, int]]]:
    """Boundaries and a candidate per bucket with the least Σ error whose Σ cost over the
    texts is within ``budget`` (a dynamic programme over the lengths, the bucket count and
    the cost spent on a grid of ``levels`` steps; each bucket's cost is rounded up to the
    grid, so the allocation found is within the budget and its error at most that
    rounding away from the optimum): (Σ error, [(length index, candidate index), ...]);
    (inf, []) when nothing fits."""
    n_len, n_cand = len(seq_lens), errors.shape[0]
    order = np.argsort(lengths, kind="stable")
    sorted_len = lengths[order]
    ends = [int(np.searchsorted(sorted_len, s, side="right")) for s in seq_lens]
    ends[-1] = len(lengths)
    starts = [0, *ends]
    pref = np.concatenate([np.zeros((n_cand, 1)), np.cumsum(errors[:, order], axis=1)], axis=1)
    step = budget / levels if budget > 0 else 1.0
    inf = float("inf")
    # best[j][k][c]: least error covering the texts up to seq_lens[j - 1] with k buckets
    # and at most c grid steps of cost; arg: (previous end, candidate) of the last bucket
    best = np.full((n_len + 1, max_buckets + 1, levels + 1), inf)
    arg_i = np.full((n_len + 1, max_buckets + 1, levels + 1), -1)
    arg_c = np.full((n_len + 1, max_buckets + 1, levels + 1), -1)
    best[0, 0, :] = 0.0

    def units(i: int, j: int, c: int) -> int:
        count = ends[j - 1] - starts[i]
        return int(np.ceil(count * costs[c, j - 1] / step - 1e-9)) if count else 0

    for j in range(1, n_len + 1):
        for i in range(j):
            lo, hi = starts[i], ends[j - 1]
            for c in range(n_cand):
                if not allowed[c, j - 1]:
                    continue
                u = units(i, j, c)
                if u > levels:
                    continue
                e = pref[c, hi] - pref[c, lo]
                for k in range(1, max_buckets + 1):
                    prev = best[i, k - 1]
                    cand = np.full(levels + 1, inf)
                    cand[u:] = prev[: levels + 1 - u] + e
                    better = cand < best[j, k]
                    if better.any():
                        best[j, k][better] = cand[better]
                        arg_i[j, k][better] = i
                        arg_c[j, k][better] = c
    finals = best[n_len, :, levels]
    k = int(np.argmin(finals))
    if finals[k] == inf:
        return inf, []
    total, picks, j, lvl = float(finals[k]), [], n_len, levels
    while k > 0:
        i, c = int(arg_i[j, k, lvl]), int(arg_c[j, k, lvl])
        picks.append((j - 1, c))
        lvl -= units(i, j, c)
        j, k = i, k - 1
    return total, list(reversed(picks))


def choose_deployment(
    reference: Model, data: Dataset, candidates: tuple[Candidate, ...], target_name: str, *,
    max_cost: float, seq_lens: tuple[int, ...] = CHOICE_LENGTHS,
    max_buckets: int = MAX_BUCKETS, skip_pairs: int = 0, progress: bool = False,
) -> dict[str, Any]:
    """Bucket lengths and a candidate per bucket for a deployment within ``max_cost``.

    Every candidate runs once on the selection texts (the pairs after the first
    ``skip_pairs``: keep those for ``route`` to measure on) at the longest length; a text's
    emulated output does not depend on its padding (module doc), so its error
    (``1 − cosine`` of its pooled embedding to FP32's) is the same on every bucket that
    holds it. Each (candidate, length) has its cost (relative to the reference's uniform
    a8_w8 at the longest length) and its legality at that length (the ``check`` rules,
    evaluated for the allocations considered). The choice minimises the selection texts'
    mean error subject to the mean cost (weighted by the selection texts) ≤ ``max_cost``
    with at most ``max_buckets`` compiled lengths (:func:`_solve_budget`: exact up to its
    cost grid)."""
    from quantscope.plan.cost import plan_cost, uniform_a8_cost
    from quantscope.progress import say, track
    from quantscope.targets import load_target
    from quantscope.tasks.registry import text_embeddings

    if not isinstance(data.task, RetrievalTask | StsTask) or data.token_lengths is None:
        raise QuantscopeError(f"buckets needs text data (retrieval pairs or STS), not "
                              f"'{data.name}': the buckets are chosen by each text's token count")
    if max_buckets < 1:
        raise QuantscopeError(f"--max-buckets must be at least 1, got {max_buckets}")
    seq_lens = tuple(sorted(set(seq_lens)))
    longest = seq_lens[-1]
    data = at_length(data, longest)
    task = data.task
    assert isinstance(task, RetrievalTask | StsTask)
    n_pairs = task.n_pairs if isinstance(task, RetrievalTask) else len(task.pairs)
    if skip_pairs >= n_pairs:
        raise QuantscopeError(
            f"--skip-pairs {skip_pairs} leaves no pair to choose on ({n_pairs} loaded): give "
            f"--pairs above {skip_pairs} (e.g. --pairs {skip_pairs + 500})")
    sel = np.concatenate([np.arange(skip_pairs, n_pairs), n_pairs + np.arange(skip_pairs, n_pairs)])
    lengths = np.asarray(data.token_lengths)[sel]
    for c in candidates:
        _check_compatible(reference, Bucket(seq_len=longest, model=c.model, stats=c.stats,
                                            plan=c.plan))
    task = _only_rows(task, sel)  # run the selection texts only (in their batches)
    batches = tuple(task.batches.batches)
    ref = text_embeddings(task, kept(run_model(reference.proto, batches,
                                               label="fp32" if progress else ""),
                                     batches, task.keep))
    errors, notes, embs = [], [], []
    for c in candidates:
        q = quantize_model(c.model, c.stats, c.plan, scheme=scheme_for(c.plan, None))
        notes.append((*q.notes, *q.coverage.lines()))
        proto = q.proto
        del q
        out = kept(run_model(proto, batches, label=f"{c.name}" if progress else ""), batches,
                   task.keep)
        emb = text_embeddings(task, out)
        errors.append(1.0 - np.sum(emb * ref, axis=1))
        embs.append(emb)
    err = np.asarray(errors, dtype=np.float64)
    target = load_target(target_name)
    unit = _cost_unit(reference, longest, target)
    costs = np.zeros((len(candidates), len(seq_lens)))
    per_model: dict[int, tuple[Any, list[Any], list[float]]] = {}  # groups, shapes, a8 units
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
    legal: dict[tuple[int, int], list[dict[str, Any]]] = {}  # (candidate, length) -> errors

    def is_legal(ci: int, j: int) -> bool:
        if (ci, j) not in legal:
            say(f"legality: {candidates[ci].name} at {seq_lens[j]} tokens", show=progress)
            found = plan_problems(candidates[ci].model, candidates[ci].plan,
                                  seq_len=seq_lens[j])
            legal[(ci, j)] = [p for p in found if p["severity"] == "error"]
        return not legal[(ci, j)]

    allowed = np.ones_like(costs, dtype=bool)
    n = len(lengths)
    while True:
        _, picks = _solve_budget(lengths, err, costs, allowed, seq_lens, max_buckets,
                                 max_cost * n)
        if not picks:
            _, cheap = _solve(lengths, np.zeros_like(err), costs, allowed, seq_lens,
                              max_buckets, 1.0)
            if not cheap:
                raise QuantscopeError(
                    "no candidate is legal at any of the lengths "
                    f"{', '.join(map(str, seq_lens))} on {target_name}: give candidates "
                    "whose plans pass 'quantscope check --seq-len N' (e.g. with "
                    "'quantscope tokensplit' for the long lengths)")
            cheapest = _allocation_figures(cheap, lengths, err, costs, seq_lens)[1]
            raise QuantscopeError(
                f"no deployment of these candidates is within --max-cost {max_cost:g}: the "
                f"cheapest costs {cheapest:.3f}x; add a cheaper candidate (fewer 16-bit "
                "layers) or raise --max-cost")
        bad = [(ci, j) for j, ci in picks if not is_legal(ci, j)]
        if not bad:
            break
        for ci, j in bad:
            allowed[ci, j] = False
    which = route(lengths, tuple(seq_lens[j] for j, _ in picks))  # bucket of each text
    chosen = np.asarray([ci for _, ci in picks])[which]  # its candidate
    per_text_cost = costs[chosen, np.asarray([j for j, _ in picks])[which]]
    mean_err = float(np.mean(err[chosen, np.arange(n)]))
    mean_cost = float(np.mean(per_text_cost))
    cost_se = float(np.std(per_text_cost, ddof=1) / np.sqrt(n)) if n > 1 else 0.0
    routed = np.stack([embs[ci][t] for t, ci in enumerate(chosen)])
    selection_metrics = _retrieval_figures(ref, routed) if isinstance(
        data.task, RetrievalTask) else {}
    buckets = []
    for b, (j, ci) in enumerate(picks):
        c = candidates[ci]
        rows = which == b
        buckets.append({
            "seq_len": seq_lens[j], "candidate": c.name, "paths": dict(c.paths),
            "cost": float(costs[ci, j]), "share": float(np.mean(rows)),
            "texts": int(np.sum(rows)),
            "cosine_mean": float(1.0 - err[ci, rows].mean()) if rows.any() else None,
            "legal": not legal[(ci, j)],
        })
    each = {c.name: {"cosine_mean": float(1.0 - err[i].mean()),
                     "cost_at_longest": float(costs[i, -1]),
                     "legal_lengths_checked": {str(seq_lens[j]): not legal[(i, j)]
                                               for (ii, j) in sorted(legal) if ii == i}}
            for i, c in enumerate(candidates)}
    note = (f"chosen on {n} texts of pairs {skip_pairs + 1}-{n_pairs} (the first "
            f"{skip_pairs} pairs are not used: measure the deployment on them with "
            "'quantscope route')") if skip_pairs else (
            f"chosen on the {n} texts of all {n_pairs} pairs: measuring it on the same pairs "
            "is not held out (give --skip-pairs N and route --pairs N)")
    margin = [] if mean_cost + 2 * cost_se <= max_cost else [
        f"the mean cost {mean_cost:.3f}x is the mean over these {n} texts (standard error "
        f"{cost_se:.3f}x): traffic of the same kind may cost up to about "
        f"{mean_cost + 2 * cost_se:.3f}x, over --max-cost {max_cost:g}; choose with "
        f"--max-cost {max(max_cost - 2 * cost_se, 0.0):.3g} for that margin"]
    return {
        "reference": reference.source, "data": data.name, "target": target_name,
        "max_cost": max_cost, "max_buckets": max_buckets, "lengths": list(seq_lens),
        "skip_pairs": skip_pairs, "texts": n,
        "buckets": buckets, "cost_mean": mean_cost, "cost_mean_se": cost_se,
        "cosine_mean": float(1.0 - mean_err),
        "selection_metrics": selection_metrics,
        "candidates": each,
        "notes": [note, *margin,
                  "the error is 1 - cosine of each text's pooled embedding to FP32's; the "
                  "choice minimises its mean within the cost (each bucket's cost rounded up "
                  f"to 1/{COST_LEVELS} of the budget); the mean cost weights each bucket by "
                  "its share of these texts (your traffic decides the real mean)",
                  *dict.fromkeys(n for ns in notes for n in ns)],
    }


def _only_rows(task: RetrievalTask | StsTask, rows: np.ndarray) -> RetrievalTask | StsTask:
    """The task's batches cut to the texts ``rows`` (sorted text indices), each batch
    keeping its selected rows and trimmed to its longest selected text; text ``rows[i]``
    becomes text ``i``."""
    import dataclasses

    from quantscope.tasks.text import TextBatches

    mask_name = task.encoder.input_name("attention_mask")
    new_index = np.full(len(task.batches.order), -1)
    new_index[rows] = np.arange(len(rows))
    batches, order, start = [], [], 0
    for b in task.batches.batches:
        n = len(next(iter(b.values())))
        texts = task.batches.order[start:start + n]
        start += n
        take = new_index[texts] >= 0
        if not take.any():
            continue
        cut = {k: v[take] for k, v in b.items()}
        if mask_name is not None and mask_name in cut:
            width = int(cut[mask_name].sum(axis=1).max())
            cut = {k: (np.ascontiguousarray(v[:, :width])
                       if v.ndim == 2 and v.shape[1] == b[mask_name].shape[1] else v)
                   for k, v in cut.items()}
        batches.append(cut)
        order.extend(new_index[texts[take]])
    return dataclasses.replace(task, batches=TextBatches(batches=tuple(batches),
                                                         order=np.asarray(order)))


def _retrieval_figures(ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
    """Top-1 agreement and recall@1 of the routed embeddings on the selection pairs (queries
    the first half of the rows, their documents the second), FP32's recall@1 beside."""
    from quantscope.tasks import metrics as M

    n = len(ref) // 2
    return {"top1_agreement": M.top1_agreement(ref[:n], ref[n:], test[:n], test[n:]),
            "recall@1": float(M.recall_at_k(test[:n], test[n:], ks=(1,))[1]),
            "recall@1_fp32": float(M.recall_at_k(ref[:n], ref[n:], ks=(1,))[1])}


def _allocation_figures(picks: list[tuple[int, int]], lengths: np.ndarray, err: np.ndarray,
                        costs: np.ndarray, seq_lens: tuple[int, ...]) -> tuple[float, float]:
    """Mean error and mean cost of an allocation over the texts."""
    which = route(lengths, tuple(seq_lens[j] for j, _ in picks))
    cand = np.asarray([ci for _, ci in picks])[which]
    col = np.asarray([j for j, _ in picks])[which]
    return (float(np.mean(err[cand, np.arange(len(lengths))])),
            float(np.mean(costs[cand, col])))


def deployment_file(choice: dict[str, Any], out: str | Path) -> dict[str, Any]:
    """The deployment file (``route --deployment``) of a choice, paths relative to
    ``out``'s folder."""
    import os

    folder = Path(out).resolve().parent
    entries = []
    for b in choice["buckets"]:
        entry: dict[str, Any] = {"seq_len": b["seq_len"]}
        for key in ("model", "stats", "plan"):
            p = b["paths"][key]
            entry[key] = os.path.relpath(Path(p).resolve(), folder) if Path(p).exists() else p
        entries.append(entry)
    return {"buckets": entries}


def format_choice(choice: dict[str, Any]) -> str:
    """The chosen deployment in a few lines."""
    lines = [f"chosen on {choice['target']}: {len(choice['buckets'])} compiled lengths "
             f"(at most {choice['max_buckets']}, from {', '.join(map(str, choice['lengths']))}) "
             f"within {choice['max_cost']:g}x"]
    for b in choice["buckets"]:
        cos = "-" if b["cosine_mean"] is None else f"{b['cosine_mean']:.5f}"
        lines.append(f"  seq {b['seq_len']:>5}: {b['share']:6.1%} of the texts, "
                     f"{b['candidate']}, cost {b['cost']:.3f}x, cosine {cos}, "
                     f"{'legal' if b['legal'] else 'NOT legal'}")
    sel = choice.get("selection_metrics") or {}
    on_sel = "".join(f", {k} {v:.4g}" for k, v in sel.items())
    lines.append(f"chosen: mean cost {choice['cost_mean']:.3f}x (standard error "
                 f"{choice.get('cost_mean_se', 0.0):.3f}x), embedding cosine "
                 f"{choice['cosine_mean']:.5f}{on_sel} on the {choice['texts']} texts it was "
                 "chosen on (not held out)")
    for name, c in choice["candidates"].items():
        lines.append(f"  candidate {name}: alone at {choice['lengths'][-1]} cosine "
                     f"{c['cosine_mean']:.5f}, cost {c['cost_at_longest']:.3f}x")
    lines.extend(f"note: {n}" for n in choice["notes"])
    return "\n".join(lines)
