"""The JSON result files quantscope writes, as typed values with a ``format`` tag.

A plan, stats and an analysis carry their own tags (``quantscope.plan/1`` …, in
:mod:`quantscope.serde`); the measured results below did not. Each type lists its file's
keys in the order they are written; ``to_dict()`` is the file's JSON form, the tag first,
and :func:`quantscope.serde.read_result` reads any of them back (by the tag, through the
registry ``serde.RESULT_READERS``). A key written only in some cases is an optional field:
``None`` leaves it out of the file.

=====================  ==========================================  =====================
type                   file                                        tag
=====================  ==========================================  =====================
``RunEvaluation``      ``run``'s ``evaluate.json``                 quantscope.run-evaluation/1
``CheckResult``        ``run``'s ``check.json``                    quantscope.check/1
``DeviceIOResult``     ``run``'s ``io.json``; ``io --json``        quantscope.io/1
``EvaluateResult``     ``evaluate --json`` (one plan measured)     quantscope.evaluate/1
``WhatifResult``       ``whatif --json``                           quantscope.whatif/1
=====================  ==========================================  =====================

The values inside (metrics, rules, rows) stay the plain JSON their producers build.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

R = TypeVar("R", bound="TaggedResult")
_OPTIONAL = {"optional": True}


def optional() -> Any:
    """A key written only when it has a value (``None``: not in the file)."""
    return field(default=None, metadata=_OPTIONAL)


class TaggedResult:
    """What every result type shares: its tag, its JSON form and its construction from
    the producer's dict (a dataclass subclass lists the keys as fields)."""

    FORMAT: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON form: the tag, then every key in field order."""
        out: dict[str, Any] = {"format": self.FORMAT}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.metadata.get("optional"):
                continue
            out[f.name] = value
        return out

    @classmethod
    def of(cls: type[R], doc: Mapping[str, Any]) -> R:
        """The result from the dict its producer built (keys as written; no ``format``)."""
        return cls(**{k: v for k, v in doc.items() if k != "format"})

    @classmethod
    def keys(cls) -> tuple[tuple[str, bool], ...]:
        """(key, required) for every key of the file besides ``format``."""
        return tuple((f.name, not f.metadata.get("optional"))
                     for f in dataclasses.fields(cls))  # type: ignore[arg-type]


@dataclass(frozen=True)
class RunEvaluation(TaggedResult):
    """``run``'s ``evaluate.json``: FP32, uniform a8_w8 and the final plan on the held-out
    data, by label (a headline in dB: a8_w8's and the plan's ``sample_powers``, the noise
    of their difference, :mod:`quantscope.pipeline.held_out`; absent in older files);
    ``whatif`` with ``--whatif``; ``as_scripted`` where the plan's Hailo script cannot
    carry a decision."""

    FORMAT: ClassVar[str] = "quantscope.run-evaluation/1"
    metric: str
    unit: str
    higher_is_better: bool
    results: dict[str, Any]
    data: dict[str, Any]
    whatif: dict[str, Any] | None = optional()
    # the plan as its Hailo script carries it, measured where the script leaves a decision
    # NOT SET: {decisions, groups, script, result}
    as_scripted: dict[str, Any] | None = optional()


@dataclass(frozen=True)
class CheckResult(TaggedResult):
    """``run``'s ``check.json``: every rule of the target, passed or not, and the problems."""

    FORMAT: ClassVar[str] = "quantscope.check/1"
    target: str
    sdk: str
    seq_len: int | None
    input_shapes: dict[str, list[int]]
    shape_note: Any
    rules: list[dict[str, Any]]
    problems: list[dict[str, Any]]


@dataclass(frozen=True)
class DeviceIOResult(TaggedResult):
    """How to feed and read the device: ``run``'s ``io.json`` and ``io --json`` (with the
    checks of the hand-written mappings)."""

    FORMAT: ClassVar[str] = "quantscope.io/1"
    io: list[dict[str, Any]]
    mapping_checks: list[dict[str, Any]] | None = optional()
    note: str = ""
    # model inputs/outputs the plan leaves float ({role, tensor}): no conversion on the host
    float_io: list[dict[str, str]] | None = optional()
    # model inputs/outputs that are not float ({role, tensor, dtype}): as they are, not quantized
    as_is_io: list[dict[str, str]] | None = optional()


@dataclass(frozen=True)
class EvaluateResult(TaggedResult):
    """One plan measured against FP32 (``evaluate --json``)."""

    FORMAT: ClassVar[str] = "quantscope.evaluate/1"
    model: str
    data: str
    plan: dict[str, Any]
    method: str
    metrics: dict[str, Any]
    outputs: dict[str, Any]
    coverage: dict[str, Any]
    saturation: dict[str, Any] | None = optional()
    saturation_note: str | None = optional()
    error_scales: list[dict[str, Any]] | None = optional()
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class WhatifResult(TaggedResult):
    """Each op kind the plan keeps below 16 bit lifted to a16_w16 (``whatif --json``)."""

    FORMAT: ClassVar[str] = "quantscope.whatif/1"
    metric: str
    plan: dict[str, Any]
    kinds: list[dict[str, Any]]
    all: dict[str, Any]
    note: str
    headroom: dict[str, Any] | None = optional()
    headroom_note: str | None = optional()


RESULT_TYPES: tuple[type[TaggedResult], ...] = (
    RunEvaluation, CheckResult, DeviceIOResult, EvaluateResult, WhatifResult)
