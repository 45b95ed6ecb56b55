"""File forms of the typed values: the only place that parses dicts and files.

Everything is written atomically (temporary file in the same folder, then
``os.replace``) so that a failed run never leaves a half-written output behind.
Unknown keys are rejected with a one-line error naming the key and the file.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantscope.types import (
    Encoding,
    Encodings,
    Plan,
    Precision,
    QuantscopeError,
    Stats,
    TensorStats,
)

STATS_FORMAT = "quantscope.stats/1"
PLAN_FORMAT = "quantscope.plan/1"


def write_atomic(path: str | Path, write: Callable[[io.BufferedWriter], None]) -> Path:
    """Call ``write(f)`` on a temporary file next to ``path``, then rename it into place."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise QuantscopeError(f"output folder '{path.parent}' does not exist: create it first")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; outputs are ordinary files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    return write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def write_json(path: str | Path, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=True) + "\n")


def write_onnx(path: str | Path, proto: onnx.ModelProto) -> Path:
    return write_atomic(path, lambda f: f.write(proto.SerializeToString()))


def read_json(path: str | Path, what: str) -> Any:
    path = Path(path)
    if not path.is_file():
        raise QuantscopeError(f"{what} file '{path}' does not exist: check the path")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise QuantscopeError(f"{what} file '{path}' is not valid JSON ({exc}): fix it") from None


def check_keys(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise QuantscopeError(
            f"unknown key '{unknown[0]}' in {where}: allowed keys are {', '.join(sorted(allowed))}"
        )


# ---------------------------------------------------------------- plan


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {"format": PLAN_FORMAT, "default": plan.default.value}
    if plan.target:
        out["target"] = plan.target
    out["groups"] = {name: p.value for name, p in plan.overrides}
    if plan.reasons:
        out["reasons"] = dict(plan.reasons)
    if plan.ranges:
        out["ranges"] = dict(plan.ranges)
    if plan.pinned:
        out["pinned"] = {t: [lo, hi] for t, (lo, hi) in plan.pinned}
    if plan.meta:
        out["meta"] = dict(plan.meta)
    return out


PLAN_KEYS = frozenset({"format", "default", "target", "groups", "reasons", "meta", "ranges",
                       "pinned"})
# what the planner and the repair command record next to the plan (not part of Plan)
PLAN_EXTRA_KEYS = frozenset({"pareto", "repairs", "repair_offer"})


def plan_from_dict(obj: Any, where: str = "plan") -> Plan:
    if not isinstance(obj, dict):
        raise QuantscopeError(f"{where} must be a JSON object with 'default' and 'groups'")
    check_keys(obj, PLAN_KEYS | PLAN_EXTRA_KEYS, where)
    groups = obj.get("groups", {})
    if not isinstance(groups, dict):
        raise QuantscopeError(f"'groups' in {where} must map group names to precisions")
    return Plan(
        default=Precision.parse(str(obj.get("default", "a8_w8"))),
        overrides=tuple((str(k), Precision.parse(str(v))) for k, v in groups.items()),
        target=obj.get("target"),
        reasons=tuple((str(k), str(v)) for k, v in obj.get("reasons", {}).items()),
        meta=tuple((str(k), str(v)) for k, v in obj.get("meta", {}).items()),
        ranges=tuple((str(k), _range_method(v, where)) for k, v in obj.get("ranges", {}).items()),
        pinned=tuple((str(k), _pinned(v, where)) for k, v in obj.get("pinned", {}).items()),
    )


def _pinned(value: Any, where: str) -> tuple[float, float]:
    ok = isinstance(value, list) and len(value) == 2 and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    if not ok or not value[0] <= value[1]:
        raise QuantscopeError(f"'pinned' ranges in {where} must be [lo, hi] number pairs, lo <= hi")
    return float(value[0]), float(value[1])


def _range_method(value: Any, where: str) -> str:
    methods = ("minmax", "percentile", "mse")
    if value not in methods:
        raise QuantscopeError(
            f"unknown range method {value!r} in 'ranges' of {where}: use {', '.join(methods)}"
        )
    return str(value)


def read_plan(path: str | Path) -> Plan:
    return plan_from_dict(read_json(path, "plan"), where=f"plan '{path}'")


def write_plan(path: str | Path, plan: Plan, extra: dict[str, Any] | None = None) -> Path:
    """The plan plus the planner's records (``PLAN_EXTRA_KEYS``), readable by read_plan."""
    bad = sorted(set(extra or {}) - PLAN_EXTRA_KEYS)
    if bad:
        raise ValueError(f"plan file key {bad[0]!r} is not one read_plan accepts")
    return write_json(path, {**plan_to_dict(plan), **(extra or {})})


# ---------------------------------------------------------------- stats


def _stats_arrays(stats: Stats) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    header: dict[str, Any] = {
        "format": STATS_FORMAT,
        "method": stats.method,
        "num_batches": stats.num_batches,
        "num_samples": stats.num_samples,
        "tensors": [],
    }
    arrays: dict[str, np.ndarray] = {}
    for i, (name, ts) in enumerate(stats.tensors.items()):
        header["tensors"].append({
            "name": name, "min": ts.min, "max": ts.max, "count": ts.count,
            "hist_range": ts.hist_range, "channel_axis": ts.channel_axis,
        })
        arrays[f"hist_{i}"] = ts.hist
        arrays[f"chan_{i}"] = ts.channel_absmax
    return header, arrays


def write_stats(path: str | Path, stats: Stats) -> Path:
    header, arrays = _stats_arrays(stats)
    arrays["header"] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    return write_atomic(path, lambda f: np.savez_compressed(f, **arrays))


def read_stats(path: str | Path) -> Stats:
    path = Path(path)
    if not path.is_file():
        raise QuantscopeError(f"stats file '{path}' does not exist: run 'quantscope calibrate'")
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(bytes(z["header"]).decode("utf-8"))
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError):
        raise QuantscopeError(
            f"'{path}' is not a quantscope stats file: run 'quantscope calibrate' to make one"
        ) from None
    if header.get("format") != STATS_FORMAT:
        raise QuantscopeError(f"'{path}' has stats format {header.get('format')!r}, "
                              f"expected {STATS_FORMAT}: calibrate again")
    tensors = {}
    for i, t in enumerate(header["tensors"]):
        tensors[t["name"]] = TensorStats(
            name=t["name"], min=float(t["min"]), max=float(t["max"]), count=int(t["count"]),
            hist=arrays[f"hist_{i}"], hist_range=float(t["hist_range"]),
            channel_absmax=arrays[f"chan_{i}"], channel_axis=int(t["channel_axis"]),
        )
    return Stats(tensors=tensors, method=header["method"],
                 num_batches=int(header["num_batches"]), num_samples=int(header["num_samples"]))


# ---------------------------------------------------------------- encodings


def encoding_to_dict(enc: Encoding) -> dict[str, Any]:
    lo, hi = enc.range()
    return {
        "bits": enc.bits, "signed": enc.signed, "axis": enc.axis,
        "scale": enc.scale.tolist(), "zero_point": enc.zero_point.tolist(),
        "min": np.asarray(lo).tolist(), "max": np.asarray(hi).tolist(),
    }


def encodings_to_dict(enc: Encodings) -> dict[str, Any]:
    return {
        "activations": {k: encoding_to_dict(v) for k, v in enc.activations.items()},
        "weights": {k: encoding_to_dict(v) for k, v in enc.weights.items()},
        "notes": list(enc.notes),
    }
