"""Every candidate evaluation on disk, under a hash of what its figure is a function of.

A rerun of ``plan``, ``buckets`` or ``run`` (with a larger ``--budget``, or after a kill)
reads back what an earlier one measured instead of measuring it again.

=============  ===================================================================
key            sha256 of: the model's content (its graph and weights, not its path),
               the statistics (every array), the plan (default, overrides, ranges,
               pinned tensors, target, and its meta except the descriptive keys of
               :data:`DESCRIPTIVE_META`; never its reasons), the scheme and the range
               method, the evaluation data (every evaluation batch's arrays in order,
               so the texts, their order and the length; the task's own values;
               the scored output), the metric, what else the caller names (the
               repairs' calibration feeds), and the tool's version
entry          one small JSON file per key, ``<folder>/<key[:2]>/<key>.json``, written
               atomically (a temporary file, then a rename): the value, the seconds
               the measurement took, what was measured; array payloads (``buckets``'
               per-text errors and embeddings) in a ``.npz`` beside it, named in the
               JSON with their digest
unreadable     a corrupt, partial or foreign entry is a miss: measured again and
               rewritten, with one note
counts         hits and misses, said by :meth:`EvalCache.summary`
=============  ===================================================================

No lock: two processes sharing a folder may both measure a plan; each entry is written
whole or not at all, and both write the same figure.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantscope.model.load import model_digest as model_digest  # its one place: model
from quantscope.serde import bytes_writer, plan_to_dict, read_json, write_atomic, write_json
from quantscope.types import Dataset, Plan, QuantscopeError, Stats
from quantscope.version import __version__

# /2: a share's entry carries its items (text retrieval's queries, a verification's pairs):
# a /1 entry of those lacks them, and its figure would be read back with no noise estimate;
# /3: a picture's PSNR, a face verification's, image views' and an embedding's SQNR carry
# their per-sample powers (h58): a /2 entry of those lacks them, the same way
FORMAT = "quantscope.eval-cache/3"
# plan meta keys that describe a plan and change no figure measured of it
DESCRIPTIVE_META = frozenset({"planner", "seed", "budget", "cost", "predicted", "measured",
                              "note", "metric"})


def _feed(h: Any, obj: Any, seen: set[int]) -> None:
    """Feed ``obj``'s content into hash ``h`` (arrays by bytes; dataclasses, mappings,
    sequences and plain objects by their values; anything else by its repr)."""
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        h.update(f"nd|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())
        return
    if obj is None or isinstance(obj, bool | int | float | str | bytes | np.generic):
        h.update(f"{type(obj).__name__}|{obj!r}|".encode())
        return
    if isinstance(obj, enum.Enum):
        h.update(f"enum|{type(obj).__qualname__}.{obj.name}|".encode())
        return
    if id(obj) in seen:
        h.update(b"cycle|")
        return
    seen = {*seen, id(obj)}
    h.update(f"{type(obj).__qualname__}{{".encode())
    if isinstance(obj, Mapping):
        for k in sorted(obj, key=str):
            _feed(h, k, seen)
            _feed(h, obj[k], seen)
    elif isinstance(obj, list | tuple):
        for v in obj:
            _feed(h, v, seen)
    elif isinstance(obj, set | frozenset):
        for v in sorted(obj, key=repr):
            _feed(h, v, seen)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _feed(h, f.name, seen)
            _feed(h, getattr(obj, f.name), seen)
    elif hasattr(obj, "__dict__") and not callable(obj):
        _feed(h, vars(obj), seen)
    elif not isinstance(obj, Mapping | list | tuple | set | frozenset):
        h.update(repr(obj).encode())
    h.update(b"}")


def content_digest(obj: Any) -> str:
    """sha256 of a value's content (see :func:`_feed`)."""
    h = hashlib.sha256()
    _feed(h, obj, set())
    return h.hexdigest()


def stats_digest(stats: Stats) -> str:
    return content_digest(stats)


def data_digest(data: Dataset) -> str:
    """The evaluation data's identity: every evaluation batch in order, the task's values
    and the scored output (the calibration batches are not scored: not in it)."""
    return content_digest({"evaluation": list(data.evaluation), "task": data.task,
                           "output": data.output})


def plan_digest(plan: Plan) -> str:
    """A plan's identity for its figure: everything but its reasons and descriptive meta."""
    doc = plan_to_dict(plan)
    doc.pop("reasons", None)
    meta = {k: v for k, v in doc.pop("meta", {}).items() if k not in DESCRIPTIVE_META}
    if meta:
        doc["meta"] = meta
    return content_digest(doc)


def evaluation_key(**parts: Any) -> str:
    """The cache key of one evaluation: ``parts`` (digests and plain values, e.g. model,
    stats, data, plan, scheme, method, metric) with the format and the tool's version."""
    return content_digest({**parts, "format": FORMAT, "version": __version__})


@dataclass(frozen=True, eq=False)
class Entry:
    """One cached evaluation with its arrays (``buckets``' per-text figures)."""

    value: float
    arrays: dict[str, np.ndarray]
    what: dict[str, Any]


class EvalCache:
    """The evaluations under ``folder`` (created on first write), with hit/miss counts
    and the notes of entries that could not be read."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.hits = 0
        self.misses = 0
        self.notes: list[str] = []

    def _path(self, key: str, suffix: str = ".json") -> Path:
        return self.folder / key[:2] / f"{key}{suffix}"

    def _read(self, key: str) -> dict[str, Any] | None:
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            doc = read_json(path, "evaluation cache entry")  # restores inf and nan
            if not isinstance(doc, dict) or doc.get("format") != FORMAT \
                    or doc.get("key") != key or not isinstance(doc.get("value"), int | float):
                raise ValueError("not an entry of this key")
            return doc
        except (OSError, ValueError, QuantscopeError) as exc:
            self.notes.append(f"evaluation cache: entry {path} unreadable ({exc}): "
                              "ignored, measured again")
            return None

    def get(self, key: str) -> float | None:
        """The cached value of ``key`` (a hit), or None (a miss: measure and :meth:`put`)."""
        doc = self._read(key)
        if doc is None:
            self.misses += 1
            return None
        self.hits += 1
        return float(doc["value"])

    def get_timed(self, key: str) -> tuple[float, float] | None:
        """(the cached value, the seconds its measurement took) of ``key``, or None (a
        miss), counted as :meth:`get` counts."""
        hit = self.get_measured(key)
        return None if hit is None else hit[:2]

    def get_measured(self, key: str) -> tuple[float, float, dict[str, Any]] | None:
        """(the cached value, the seconds its measurement took, what was stored with it)
        of ``key``, or None (a miss), counted as :meth:`get` counts."""
        doc = self._read(key)
        if doc is None:
            self.misses += 1
            return None
        self.hits += 1
        what = doc.get("what")
        return (float(doc["value"]), float(doc.get("seconds") or 0.0),
                dict(what) if isinstance(what, dict) else {})

    def get_what(self, key: str) -> dict[str, Any] | None:
        """What was stored with a cached value (e.g. every metric of a measurement), or
        None (a miss)."""
        doc = self._read(key)
        if doc is None or not isinstance(doc.get("what"), dict):
            self.misses += 1
            return None
        self.hits += 1
        return dict(doc["what"])

    def get_entry(self, key: str) -> Entry | None:
        """A cached value with its arrays and what was stored with it (:meth:`put` with
        ``arrays``), or None (a miss)."""
        doc = self._read(key)
        arrays = None if doc is None else self._arrays(key, doc)
        if doc is None or arrays is None:
            self.misses += 1
            return None
        self.hits += 1
        return Entry(float(doc["value"]), arrays, dict(doc.get("what") or {}))

    def arrays(self, key: str) -> dict[str, np.ndarray] | None:
        """The arrays stored with ``key``'s entry (None: no entry, none stored, or
        unreadable, with a note); not counted as a hit or miss (the entry's value was)."""
        doc = self._read(key)
        return None if doc is None or "arrays" not in doc else self._arrays(key, doc)

    def _arrays(self, key: str, doc: dict[str, Any]) -> dict[str, np.ndarray] | None:
        path = self._path(key, ".npz")
        try:
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != doc.get("arrays"):
                raise ValueError("its arrays file does not match the entry")
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError) as exc:
            self.notes.append(f"evaluation cache: arrays {path} unreadable ({exc}): "
                              "ignored, measured again")
            return None

    def put(self, key: str, value: float, *, seconds: float, what: Mapping[str, Any],
            arrays: Mapping[str, np.ndarray] | None = None) -> None:
        """Store one evaluation (atomically; its arrays first, so an entry never names
        arrays that are not there)."""
        self._path(key).parent.mkdir(parents=True, exist_ok=True)
        doc: dict[str, Any] = {"format": FORMAT, "key": key, "value": float(value),
                               "seconds": round(float(seconds), 3), "what": dict(what)}
        if arrays is not None:
            buf = io.BytesIO()
            np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
            write_atomic(self._path(key, ".npz"), bytes_writer(buf.getvalue()))
            doc["arrays"] = hashlib.sha256(buf.getvalue()).hexdigest()
        write_json(self._path(key), doc)

    def counts(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "hits": self.hits, "misses": self.misses}

    def summary(self) -> str:
        """One line: where, hits and misses."""
        return (f"evaluation cache {self.folder}: {self.hits} hit(s), {self.misses} "
                "miss(es) measured now")
