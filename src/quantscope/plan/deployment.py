"""A deployment of several compiled lengths: its values and the two files that describe
one (``quantscope route`` reads a deployment file, ``quantscope buckets`` reads a
candidates file and writes a deployment file).

=====================  ==============================================================
deployment file        ``{"buckets": [{"seq_len": 128, "model": "m.onnx", "stats":
                       "m.npz", "plan": "p.json"}, ...]}``: :func:`check_bucket_entry`,
                       :func:`check_seq_lens`; written by :func:`deployment_file`
candidates file        ``{"candidates": [{"name": "all16", "model": "m.onnx", "stats":
                       "m.npz", "plan": "p.json"}, ...]}`` (``name`` optional):
                       :func:`check_candidate_entry`
=====================  ==============================================================

Paths in both are relative to the file's folder; opening them (a built-in model name may
stand for a model file) is :mod:`quantscope.stages.route`'s. The results of the two
commands are :mod:`quantscope.plan.deployment_results`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from quantscope.model.load import Model
from quantscope.serde import check_keys
from quantscope.types import Plan, QuantscopeError, Stats

if TYPE_CHECKING:
    from quantscope.plan.deployment_results import DeploymentChoice

T = TypeVar("T")
BUCKET_KEYS = {"seq_len", "model", "stats", "plan"}
CANDIDATE_KEYS = {"name", "model", "stats", "plan"}


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


@dataclass(frozen=True)
class Candidate:
    """One way to compile a bucket: a model file (the reference or a rewrite), its stats and
    a plan; ``paths`` as opened (for the deployment file written)."""

    name: str
    model: Model
    stats: Stats
    plan: Plan
    paths: tuple[tuple[str, str], ...] = ()


def entry_list(doc: Any, key: str, where: str, example: str) -> list[Any]:
    """The non-empty list ``doc[key]`` of a deployment or candidates file (no other key)."""
    if not isinstance(doc, dict) or not isinstance(doc.get(key), list) or not doc[key]:
        raise QuantscopeError(f"{where} has no '{key}' list: write {{\"{key}\": [{example}, "
                              "...]}")
    check_keys(doc, {key}, where)
    return list(doc[key])


def check_bucket_entry(entry: Any, at: str) -> dict[str, Any]:
    """One bucket of a deployment file, checked: a positive ``seq_len`` and three file
    names."""
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
    return entry


def check_seq_lens(entries: Sequence[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """The bucket entries in increasing length; an error when a length is given twice."""
    lens = [e["seq_len"] for e in entries]
    if len(set(lens)) != len(lens):
        raise QuantscopeError(f"{where} lists seq_len {first_repeat(lens)} twice: give each "
                              "compiled length once")
    return sorted(entries, key=lambda e: e["seq_len"])


def check_candidate_entry(entry: Any, at: str) -> dict[str, Any]:
    """One candidate of a candidates file, checked: three file names, an optional name."""
    if not isinstance(entry, dict):
        raise QuantscopeError(f"{at} is not an object: give model, stats and plan")
    check_keys(entry, CANDIDATE_KEYS, at)
    missing = sorted(CANDIDATE_KEYS - {"name"} - set(entry))
    if missing:
        raise QuantscopeError(f"{at} has no '{missing[0]}': give model, stats and plan")
    for key in CANDIDATE_KEYS & set(entry):
        if not isinstance(entry[key], str) or not entry[key]:
            raise QuantscopeError(f"{at}: '{key}' must be a non-empty string")
    return entry


def candidate_name(entry: dict[str, Any]) -> str:
    """A candidate's name: its own, or ``<model stem>:<plan stem>``."""
    return entry.get("name") or f"{Path(entry['model']).stem}:{Path(entry['plan']).stem}"


def check_candidate_names(candidates: Sequence[Candidate], where: str) -> None:
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise QuantscopeError(f"{where} names candidate '{first_repeat(names)}' twice: "
                              "give each candidate its own name")


def one_target(plans: list[tuple[str, Plan]], where: str) -> str:
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


def first_repeat(values: list[T]) -> T:
    seen: set[T] = set()
    for v in values:
        if v in seen:
            return v
        seen.add(v)
    raise AssertionError("no repeat")


def deployment_file(choice: DeploymentChoice, out: str | Path) -> dict[str, Any]:
    """The deployment file (``route --deployment``) of a choice, paths relative to
    ``out``'s folder."""
    folder = Path(out).resolve().parent
    entries = []
    for b in choice.buckets:
        entry: dict[str, Any] = {"seq_len": b.seq_len}
        paths = dict(b.paths)
        for key in ("model", "stats", "plan"):
            p = paths[key]
            entry[key] = os.path.relpath(Path(p).resolve(), folder) if Path(p).exists() else p
        entries.append(entry)
    return {"buckets": entries}
