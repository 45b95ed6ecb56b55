"""File forms of the typed values: the only place that parses dicts and files.

Everything is written atomically (temporary file in the same folder, then
``os.replace``) so that a failed run never leaves a half-written output behind; a full
disk is one line naming the file, and a special file (FIFO, device) is never replaced.
Unknown keys, and a key given twice in one JSON object, are rejected with a one-line
error naming the key and the file. It is over 600 lines because it is that one parser of
every file form (the stats' damage checks and the analysis' ranked key came in together).
"""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import math
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantscope.lookup_range import LookupRange
from quantscope.results import RESULT_TYPES, TaggedResult
from quantscope.types import (
    Encoding,
    Encodings,
    Plan,
    Precision,
    QuantscopeError,
    Sensitivity,
    Stats,
    TensorStats,
)

STATS_FORMAT = "quantscope.stats/1"
PLAN_FORMAT = "quantscope.plan/1"
SENSITIVITY_FORMAT = "quantscope.sensitivity/1"
ANALYSIS_FORMAT = "quantscope.analysis/1"


Writer = Callable[[io.BufferedWriter], object]


def _write_temp(path: Path, write: Writer) -> Path:
    """``write(f)`` into a new temporary file next to ``path`` (removed on failure)."""
    if path.parent and not path.parent.exists():
        raise QuantscopeError(f"output folder '{path.parent}' does not exist: create it first")
    if path.is_dir():
        raise QuantscopeError(f"output '{path}' is a folder: give a file path inside it")
    if path.exists() and not path.is_file():  # the rename would replace a FIFO or a device
        raise QuantscopeError(f"output '{path}' is a special file (a FIFO or a device), not "
                              "a regular file: give a file path (special files are never "
                              "replaced)")
    # a short temporary name: the output's own name may be near the 255-byte limit
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:32]}.", suffix=".tmp",
                               dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; outputs are ordinary files
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


_FULL = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is used up"}


def write_atomic(path: str | Path, write: Writer) -> Path:
    """Call ``write(f)`` on a temporary file next to ``path``, then rename it into place."""
    return write_atomic_set([(path, write)])[0]


def write_atomic_set(items: list[tuple[str | Path, Writer]]) -> list[Path]:
    """Write several files as a set: all of them, or none (earlier contents kept).

    Every file is first written to a temporary file; only when all are written are they
    renamed into place, each existing file moved aside first, so that a failure while
    renaming puts every earlier file back.
    """
    paths = [Path(p) for p, _ in items]
    if len({p.resolve() for p in paths}) != len(paths):
        raise QuantscopeError(f"one path for two outputs ({', '.join(map(str, paths))}): "
                              "give each output its own path")
    temps: list[Path] = []
    try:
        for path, (_, write) in zip(paths, items, strict=True):
            try:
                temps.append(_write_temp(path, write))
            except OSError as exc:
                if exc.errno not in _FULL:
                    raise
                raise QuantscopeError(
                    f"{_FULL[exc.errno]} while writing '{path}': free some space or write "
                    f"elsewhere ({_not_written(paths)})") from None
        _rename_set(paths, temps)
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
    return paths


def _not_written(paths: list[Path]) -> str:
    if len(paths) == 1:
        return f"{paths[0].name} was not written"
    return f"none of {', '.join(p.name for p in paths)} was written"


def _rename_set(paths: list[Path], temps: list[Path]) -> None:
    if len(paths) == 1:  # one rename replaces it atomically: killed at any point, the file
        os.replace(temps[0], paths[0])  # is the old or the new one (moving the old aside
        return  # first left it missing, and a '.old' file behind, under SIGKILL)
    done: list[tuple[Path, Path | None]] = []  # (path, its earlier content moved aside)
    try:
        for path, tmp in zip(paths, temps, strict=True):
            old = None
            if path.exists():
                old = path.with_name(f"{tmp.name}.old")
                os.replace(path, old)
            done.append((path, old))
            os.replace(tmp, path)
    except BaseException:
        for path, old in reversed(done):
            path.unlink(missing_ok=True)
            if old is not None:
                os.replace(old, path)
        raise
    for _, old in done:
        if old is not None:
            old.unlink(missing_ok=True)


def text_writer(text: str) -> Writer:
    return lambda f: f.write(text.encode("utf-8"))


def bytes_writer(data: bytes) -> Writer:
    return lambda f: f.write(data)


def write_text(path: str | Path, text: str) -> Path:
    return write_atomic(path, text_writer(text))


NONFINITE_KEY = "nonfinite"  # JSON pointer -> "inf" | "-inf" | "nan", for values written as null


def _strict(obj: Any, pointer: str, found: dict[str, str]) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        found[pointer or "/"] = "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
        return None
    if isinstance(obj, dict):
        return {k: _strict(v, f"{pointer}/{k}", found) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v, f"{pointer}/{i}", found) for i, v in enumerate(obj)]
    return obj


def _restore(obj: Any, pointer: str, found: dict[str, str]) -> Any:
    if obj is None and pointer in found:
        return float(found[pointer])
    if isinstance(obj, dict):
        return {k: _restore(v, f"{pointer}/{k}", found) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_restore(v, f"{pointer}/{i}", found) for i, v in enumerate(obj)]
    return obj


def to_strict_json(obj: Any) -> str:
    """Strict JSON (jq, JavaScript): a non-finite number becomes null, and a top-level
    ``nonfinite`` map says which value it was (JSON pointer -> ``inf``/``-inf``/``nan``,
    e.g. an SQNR of a noiseless output). :func:`read_json` restores them."""
    found: dict[str, str] = {}
    clean = _strict(obj, "", found)
    if found and isinstance(clean, dict):
        clean[NONFINITE_KEY] = found
    return json.dumps(clean, indent=2, sort_keys=False, allow_nan=False) + "\n"


def write_json(path: str | Path, obj: Any) -> Path:
    return write_text(path, to_strict_json(obj))


def json_writer(obj: Any) -> Writer:
    return text_writer(to_strict_json(obj))


def onnx_writer(proto: onnx.ModelProto) -> Writer:
    return lambda f: f.write(proto.SerializeToString())


def write_onnx(path: str | Path, proto: onnx.ModelProto) -> Path:
    return write_atomic(path, onnx_writer(proto))


def require_file(path: Path, what: str, fix: str = "check the path") -> None:
    """One line for a path that is missing or a folder where a file is read."""
    if path.is_dir():
        raise QuantscopeError(f"{what} '{path}' is a folder, not a file: give the {what} file")
    if not path.is_file():
        raise QuantscopeError(f"{what} file '{path}' does not exist: {fix}")


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def read_json(path: str | Path, what: str) -> Any:
    path = Path(path)
    require_file(path, what)
    try:
        doc = json.loads(path.read_text(encoding="utf-8-sig"),  # a BOM read past
                         object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise QuantscopeError(f"{what} file '{path}' is not valid JSON ({exc}): fix it") from None
    except _DuplicateKey as exc:
        raise QuantscopeError(f"{what} file '{path}' gives key '{exc.args[0]}' twice in one "
                              "object (JSON readers keep either one): keep one of them") from None
    if isinstance(doc, dict) and isinstance(doc.get(NONFINITE_KEY), dict):
        found = doc.pop(NONFINITE_KEY)
        doc = _restore(doc, "", found)
    return doc


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
PLAN_EXTRA_KEYS = frozenset({"pareto", "repairs", "repair_offer", "rewrites", "scope"})


def plan_from_dict(obj: Any, where: str = "plan") -> Plan:
    if not isinstance(obj, dict):
        raise QuantscopeError(f"{where} must be a JSON object with 'default' and 'groups'")
    check_keys(obj, PLAN_KEYS | PLAN_EXTRA_KEYS, where)
    groups = obj.get("groups", {})
    if not isinstance(groups, dict):
        raise QuantscopeError(f"'groups' in {where} must map group names to precisions")
    for key in ("reasons", "meta", "ranges"):
        if not isinstance(obj.get(key, {}), dict):
            raise QuantscopeError(f"'{key}' in {where} must be a JSON object (name -> value): "
                                  "fix or remove it")
    if obj.get("target") is not None and not isinstance(obj["target"], str):
        raise QuantscopeError(f"'target' in {where} must be a target name: fix or remove it")
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


def plan_writer(plan: Plan, extra: dict[str, Any] | None = None) -> Writer:
    """The plan plus the planner's records (``PLAN_EXTRA_KEYS``), readable by read_plan."""
    bad = sorted(set(extra or {}) - PLAN_EXTRA_KEYS)
    if bad:
        raise ValueError(f"plan file key {bad[0]!r} is not one read_plan accepts")
    return text_writer(to_strict_json({**plan_to_dict(plan), **(extra or {})}))


def write_plan(path: str | Path, plan: Plan, extra: dict[str, Any] | None = None) -> Path:
    return write_atomic(path, plan_writer(plan, extra))


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
            "bulk_min": ts.bulk_min, "floor_count": ts.floor_count,
            "floor_max": ts.floor_max,
            **({"nonfinite": ts.nonfinite} if ts.nonfinite else {}),
            **({"lookup": dataclasses.asdict(ts.lookup)} if ts.lookup else {}),
        })
        arrays[f"hist_{i}"] = ts.hist
        arrays[f"chan_{i}"] = ts.channel_absmax
    return header, arrays


def stats_writer(stats: Stats) -> Writer:
    header, arrays = _stats_arrays(stats)
    arrays["header"] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    return lambda f: np.savez_compressed(f, **arrays)


def write_stats(path: str | Path, stats: Stats) -> Path:
    return write_atomic(path, stats_writer(stats))


_NOT_STATS = (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError,
              zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError)


def read_stats(path: str | Path) -> Stats:
    path = Path(path)
    require_file(path, "stats", "run 'quantscope calibrate' to make one")
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(bytes(z["header"]).decode("utf-8"))
            arrays = {k: z[k] for k in z.files}
    except _NOT_STATS:
        raise QuantscopeError(
            f"'{path}' is not a quantscope stats file: run 'quantscope calibrate' to make one"
        ) from None
    if not isinstance(header, dict) or header.get("format") != STATS_FORMAT:
        found = header.get("format") if isinstance(header, dict) else None
        raise QuantscopeError(f"'{path}' has stats format {found!r}, "
                              f"expected {STATS_FORMAT}: calibrate again")
    try:
        stats = _stats_from(header, arrays)
    except _NOT_STATS as exc:
        missing = f"array {exc}" if isinstance(exc, KeyError) else type(exc).__name__
        raise QuantscopeError(f"stats file '{path}' is damaged ({missing} missing or "
                              "malformed): run 'quantscope calibrate' again") from None
    bad = next((why for ts in stats.tensors.values() if (why := ts.damage())), None)
    if bad:  # an edited or damaged file: its ranges would quantize silently wrong
        raise QuantscopeError(f"stats file '{path}' is damaged ({bad}): run 'quantscope "
                              "calibrate' again")
    return stats


def _lookup_from(d: dict[str, Any] | None) -> LookupRange | None:
    if d is None:
        return None
    return LookupRange(table=str(d["table"]), rows=int(d["rows"]), picked=int(d["picked"]),
                       data_min=float(d["data_min"]), data_max=float(d["data_max"]),
                       left_out=int(d.get("left_out", 0)))


def _stats_from(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> Stats:
    tensors = {}
    for i, t in enumerate(header["tensors"]):
        tensors[t["name"]] = TensorStats(
            name=t["name"], min=float(t["min"]), max=float(t["max"]), count=int(t["count"]),
            hist=arrays[f"hist_{i}"], hist_range=float(t["hist_range"]),
            channel_absmax=arrays[f"chan_{i}"], channel_axis=int(t["channel_axis"]),
            bulk_min=None if t.get("bulk_min") is None else float(t["bulk_min"]),
            floor_count=int(t.get("floor_count", 0)),
            floor_max=None if t.get("floor_max") is None else float(t["floor_max"]),
            nonfinite=int(t.get("nonfinite", 0)),
            lookup=_lookup_from(t.get("lookup")),
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


# ---------------------------------------------------------------- sensitivity (planner input)


def _number(obj: dict[str, Any], key: str, where: str) -> float:
    value = obj.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise QuantscopeError(f"'{key}' in {where} must be a number (got {value!r})")
    return float(value)


def _gain_table(obj: Any, key: str, where: str) -> dict[str, dict[str, float]]:
    if not isinstance(obj, dict) or not all(isinstance(v, dict) for v in obj.values()):
        raise QuantscopeError(f"'{key}' in {where} must map group names to {{precision: value}}")
    return {str(g): {str(p): _number(per, p, f"{key}.{g}") for p in per} for g, per in obj.items()}


def _sensitivity_json(obj: dict[str, Any], where: str) -> Sensitivity:
    obj = obj.get("sensitivity", obj) if isinstance(obj.get("sensitivity"), dict) else obj
    fmt = obj.get("format", SENSITIVITY_FORMAT)
    if fmt != SENSITIVITY_FORMAT:
        raise QuantscopeError(f"{where} has format {fmt!r}, expected {SENSITIVITY_FORMAT!r}")
    if not isinstance(obj.get("metric"), str):
        raise QuantscopeError(f"{where} needs 'metric': the name of the task metric")
    hib = obj.get("higher_is_better", True)
    if not isinstance(hib, bool):
        raise QuantscopeError(f"'higher_is_better' in {where} must be true or false")
    base = _number(obj, "base", where)
    if "gains" in obj:
        gains = _gain_table(obj["gains"], "gains", where)
    elif "enable_one" in obj:
        sign = 1.0 if hib else -1.0
        raw = _gain_table(obj["enable_one"], "enable_one", where)
        gains = {g: {p: sign * (v - base) for p, v in per.items()} for g, per in raw.items()}
    else:
        raise QuantscopeError(f"{where} needs 'gains' or 'enable_one' per group and precision")
    ref = obj.get("reference")
    return Sensitivity.from_gains(
        obj["metric"], base, gains, higher_is_better=hib,
        low=Precision.parse(str(obj.get("low", "a8_w8"))),
        reference=None if ref is None else _number(obj, "reference", where), source=where,
    )


# task-independent: ranked by the SQNR each offender recovered. Every fidelity primary
# (analyze.measure.FIDELITY_PRIMARIES) is one: a worst channel's SQNR measured by a proxy
# sweep on a subset of rows is not comparable with the all-row base (dinov2-s14: every
# disable-one figure below it, every gain 0, nothing promoted)
FIDELITY_METRICS = ("cosine_mean", "sqnr_db", "sqnr_db_channel_min")


def _task_ranked(obj: dict[str, Any], where: str) -> Sensitivity | None:
    """Gains in the analysis' task metric, when every candidate was scored with it
    (``analyze --proxy 1.0``: the task metric per candidate on every row)."""
    primary = str(obj.get("primary", ""))
    low = Precision.parse(str(obj.get("low", "a8_w8")))
    high = Precision.parse(str(obj.get("high", "a16_w16")))
    base_row = obj.get("baselines", {}).get(low.value, {})
    rows = obj.get("sensitivity", [])
    if (not primary or primary in FIDELITY_METRICS or primary not in base_row or not rows
            or not all(isinstance(r, dict) and primary in r.get("disable_one", {})
                       for r in rows)):
        return None
    higher = bool(obj.get("higher_is_better", True))
    sign = 1.0 if higher else -1.0
    base = float(base_row[primary])
    # a unit's parts (swept as one, analyze.report.GroupSensitivity) share its gain evenly
    gains = {str(r["group"]): {high: max(sign * (float(r["disable_one"][primary]) - base), 0.0)
                               / max(int(r.get("unit_size", 1)), 1)}
             for r in rows}
    ref = obj.get("baselines", {}).get(high.value, {}).get(primary)
    n = obj.get("method", {}).get("rows")
    return Sensitivity.from_gains(
        primary, base, gains, higher_is_better=higher, low=low,
        reference=None if ref is None else float(ref),
        source=f"{where} (ranked by {primary}, measured per candidate on {n} rows)")


def _analysis_json(obj: dict[str, Any], where: str) -> Sensitivity:
    task = _task_ranked(obj, where)
    if task is not None:
        return task
    high = Precision.parse(str(obj.get("high", "a16_w16")))
    gains: dict[str, dict[Precision, float]] = {}
    for off in obj.get("offenders", []):
        if not isinstance(off, dict) or "group" not in off:
            raise QuantscopeError(f"{where}: every offender needs 'group' and 'score_db'")
        where_off = f"offender '{off['group']}' of {where}"
        # the analysis file writes a non-finite number as its string (analyze.report._clean):
        # 'inf' is a promotion that made the output noiseless
        off = {**off, "score_db": float(off["score_db"])} if off.get("score_db") in (
            "inf", "-inf", "nan") else off
        score = _number(off, "score_db", where_off) if "score_db" in off else 0.0
        gains[str(off["group"])] = {high: max(score, 0.0) if score == score else 0.0}
    low = Precision.parse(str(obj.get("low", "a8_w8")))
    # the gains are in the key the offenders were ranked by (a worst channel's SQNR was
    # named output_sqnr_db); an analysis without that record: the whole output's SQNR
    base_row = obj.get("baselines", {}).get(low.value, {})
    key = str((obj.get("method") or {}).get("ranked_by", "sqnr_db"))
    key = key if key in base_row else "sqnr_db"
    return Sensitivity.from_gains({"sqnr_db": "output_sqnr_db"}.get(key, key),
                                  float(base_row.get(key, 0.0)), gains, higher_is_better=True,
                                  low=low, source=where)


def sensitivity_from_dict(obj: Any, where: str = "analysis") -> Sensitivity:
    """The planner's input from either JSON form; the only parser of them.

    ``quantscope.analysis/1`` (``quantscope analyze``): when every candidate was scored
    with the analysis' task metric (``analyze --proxy 1.0``; retrieval agreement, STS score
    agreement …), the gain of promoting group g to ``high`` is the task metric its
    disable-one run recovered (at least 0), so promotions are ranked by the task and the
    front is predicted in the unit it is measured in. Otherwise it is the output SQNR its
    disable-one sweep recovered (``offenders[].score_db``, dB, at least 0); ``base`` the
    SQNR of uniform ``low``.

    ``quantscope.sensitivity/1`` (also without ``format``, or under a top-level
    ``sensitivity`` key): ``metric``, ``base``, optional ``higher_is_better``, ``low``,
    ``reference``, and ``gains`` (deltas) or ``enable_one`` (the metric with that group
    promoted; ``base`` is subtracted, sign-adjusted). Other keys are ignored.
    """
    if not isinstance(obj, dict):
        raise QuantscopeError(f"{where} must be a JSON object with 'metric', 'base', 'gains'")
    if obj.get("format") == ANALYSIS_FORMAT:
        return _analysis_json(obj, where)
    return _sensitivity_json(obj, where)


def read_sensitivity(path: str | Path) -> Sensitivity:
    """:func:`sensitivity_from_dict` of an analysis (or sensitivity) JSON file."""
    return sensitivity_from_dict(read_json(path, "analysis"), where=f"analysis '{path}'")


# ---------------------------------------------------------------- results (tagged files)

ResultReader = Callable[[dict[str, Any], str], Any]


def tagged_reader(kind: type[TaggedResult]) -> ResultReader:
    """The reader of one :mod:`quantscope.results` type: its keys checked, then the value."""

    def read(obj: dict[str, Any], where: str) -> TaggedResult:
        keys = kind.keys()
        check_keys(obj, {"format", *(k for k, _ in keys)}, where)
        missing = [k for k, required in keys if required and k not in obj]
        if missing:
            raise QuantscopeError(f"missing key '{missing[0]}' in {where} ({kind.FORMAT})")
        return kind.of(obj)

    return read


# format tag -> reader(obj, where): one entry per tagged file; another result type adds
# ``RESULT_READERS[ITS_FORMAT] = its_reader`` (or ``tagged_reader(ItsResult)``)
RESULT_READERS: dict[str, ResultReader] = {
    PLAN_FORMAT: plan_from_dict,
    **{kind.FORMAT: tagged_reader(kind) for kind in RESULT_TYPES},
}


def read_result(path: str | Path) -> Any:
    """Any tagged result file, read by its ``format`` tag (a plan gives a :class:`Plan`, a
    measured result its :mod:`quantscope.results` type); one line for an untagged file or
    a tag no reader knows."""
    obj = read_json(path, "result")
    where = f"result '{path}'"
    tag = obj.get("format") if isinstance(obj, dict) else None
    if tag is None:
        raise QuantscopeError(f"{where} carries no 'format' tag: give a file quantscope wrote "
                              "(results carry their format since quantscope.*/1)")
    reader = RESULT_READERS.get(tag) if isinstance(tag, str) else None
    if reader is None:
        raise QuantscopeError(f"{where} has format {tag!r}, which no reader knows: use a file "
                              f"of one of {', '.join(RESULT_READERS)}")
    return reader(obj, where)
