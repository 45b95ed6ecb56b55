"""The analysis result: one frozen value, its JSON form (``quantscope.analysis/1``), a summary.

The JSON schema is documented in ``docs/analysis.md``; :func:`analysis_from_dict`
rejects unknown keys and a wrong ``format`` so a file from another version fails loudly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

from quantscope.analyze.noise import TensorNoise
from quantscope.analyze.outliers import Outlier
from quantscope.analyze.weights import WeightIssue
from quantscope.tasks.metrics import resemblance_note
from quantscope.types import QuantscopeError

FORMAT = "quantscope.analysis/1"
Metrics = dict[str, float]


@dataclass(frozen=True)
class GroupSensitivity:
    group: str
    op_type: str
    enable_one: Metrics  # only this group at low; metrics vs FP32
    disable_one: Metrics  # everything low but this group at high
    # swept with the other groups of its unit (model.units), all moved together: the
    # metrics are the unit's; its gain is the unit's split evenly (``unit_size`` members)
    unit: str = ""
    unit_size: int = 1


@dataclass(frozen=True)
class Offender:
    group: str
    score_db: float  # output SQNR gained by promoting this group alone (disable-one)
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Recovery:
    promoted: tuple[str, ...]
    precision: str
    metrics: Metrics


@dataclass(frozen=True)
class Skipped:
    """A group the sweeps left out: the planner cannot use its gain (``reason``)."""

    group: str
    op_type: str
    reason: str


@dataclass(frozen=True)
class Analysis:
    model: str
    low: str
    high: str
    target: str | None
    primary: str
    higher_is_better: bool
    method: dict[str, Any]  # sweep method, proxy rows, timing
    baselines: dict[str, Metrics]  # uniform precision -> metrics on all rows
    noise: tuple[TensorNoise, ...]
    sensitivity: tuple[GroupSensitivity, ...]
    offenders: tuple[Offender, ...]
    outliers: tuple[Outlier, ...]
    weights: tuple[WeightIssue, ...]
    collapse: dict[str, dict[str, Any]]  # uniform precision -> collapse report
    recovery: tuple[Recovery, ...]
    notes: tuple[str, ...] = ()
    skipped: tuple[Skipped, ...] = ()  # groups not swept (no sensitivity, no offender row)


_ROWS = {
    "noise": TensorNoise,
    "sensitivity": GroupSensitivity,
    "offenders": Offender,
    "outliers": Outlier,
    "weights": WeightIssue,
    "recovery": Recovery,
    "skipped": Skipped,
}


def _clean(x: Any) -> Any:
    """JSON-safe: tuples -> lists, non-finite floats -> strings 'inf' / '-inf' / 'nan'."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def _unclean(x: Any) -> Any:
    if isinstance(x, str) and x in ("inf", "-inf", "nan"):
        return float(x)
    if isinstance(x, dict):
        return {k: _unclean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_unclean(v) for v in x]
    return x


def analysis_to_dict(a: Analysis) -> dict[str, Any]:
    return {"format": FORMAT, **_clean(asdict(a))}


def _row(cls: type, raw: dict[str, Any], where: str) -> Any:
    names = {f.name for f in fields(cls)}
    unknown = set(raw) - names
    if unknown:
        raise QuantscopeError(f"analysis file: unknown key '{sorted(unknown)[0]}' in {where}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


def analysis_from_dict(raw: dict[str, Any]) -> Analysis:
    """Parse the JSON form (strict: unknown keys and other formats are errors)."""
    if raw.get("format") != FORMAT:
        raise QuantscopeError(f"not a {FORMAT} file (format={raw.get('format')!r})")
    body = {k: v for k, v in raw.items() if k != "format"}
    names = {f.name for f in fields(Analysis)}
    unknown = set(body) - names
    if unknown:
        raise QuantscopeError(f"analysis file: unknown key '{sorted(unknown)[0]}'")
    body = _unclean(body)
    for key, cls in _ROWS.items():
        body[key] = tuple(_row(cls, r, key) for r in body.get(key, []))
    body["notes"] = tuple(body.get("notes", ()))
    return Analysis(**body)


Figure = Callable[[str, float], str]
"""How a metric's value is written: ``(key, value) -> text``."""


def _four_digits(key: str, v: float) -> str:
    return f"{v:.4g}"


def _fmt(metrics: Metrics, primary: str, figure: Figure) -> str:
    keys = [primary, "cosine_mean", "sqnr_db"]
    return "  ".join(f"{k} {figure(k, metrics[k])}" for k in dict.fromkeys(keys) if k in metrics)


def summary_text(a: Analysis, *, top: int = 8, figure: Figure = _four_digits) -> str:
    """Console summary: baselines, top offenders with reasons, findings, recovery.

    ``figure`` writes each metric (default: 4 significant digits); the CLI passes
    ``report.fmt.value``, the one unit rule (shares in percent, dB), which sits above this
    layer."""
    lines = [
        f"analysis of {a.model}: low {a.low}, high {a.high}"
        f"{', target ' + a.target if a.target else ''}"
    ]
    lines += [f"  uniform {p:<8} {_fmt(m, a.primary, figure)}" for p, m in a.baselines.items()]
    lines.append(f"top offenders (promote to {a.high}):")
    # a group whose promotion alone gains nothing (or loses) is no offender: not listed
    # as one (analysis.json keeps every group's row, in rank order)
    gaining = [o for o in a.offenders if o.score_db > 0]
    for o in gaining[:top]:
        lines.append(f"  {o.group}  ({o.score_db:+.1f} dB)")
        lines += [f"      - {r}" for r in o.reasons]
    if len(gaining) < min(top, len(a.offenders)):
        lines.append(f"  ({len(a.offenders) - len(gaining)} group(s) gain nothing promoted "
                     "alone: not listed)" if gaining else
                     "  none: promoting any one group alone gains nothing")
    for r in a.recovery:
        lines.append(f"  promote {len(r.promoted)} -> {_fmt(r.metrics, a.primary, figure)}")
    mixed = sum(o.kind == "mixed_scale" for o in a.outliers)
    floors = sum(o.kind == "log_floor" for o in a.outliers)
    inputs = sum(o.kind == "input_floor" for o in a.outliers)
    lines.append(f"outliers: {len(a.outliers) - mixed - floors - inputs}  mixed scales: "
                 f"{mixed}  " + (f"logs of a linear grid: {floors}  " if floors else "")
                 + (f"inputs read 0 below one step: {inputs}  " if inputs else "")
                 + f"degenerate weights: {len(a.weights)}")
    for o in a.outliers[:top]:
        lines.append(f"  {o.tensor}: {o.reason}")
        if o.kind in ("mixed_scale", "log_floor", "input_floor"):  # the fix is the finding's
            lines.append(f"      fix: {'; or '.join(o.remedies)}")
    lines += [f"  {w.weight} ({w.kind}): {w.reason}" for w in a.weights[:top]]
    for p, c in a.collapse.items():
        if c.get("collapsed"):
            lines.append(f"  COLLAPSE at {p}: {'; '.join(c.get('reasons', []))}")
    for p, m in a.baselines.items():
        verdict = resemblance_note(m.get("cosine_mean", 1.0))
        lines += [f"  at {p}: {verdict}"] if verdict else []
    lines += [f"note: {n}" for n in a.notes]
    return "\n".join(lines)


def mixed_scale_lines(doc: dict[str, Any], kind: str = "mixed_scale") -> list[str]:
    """Console lines for the mixed-scale findings (or those of another ``kind``:
    ``log_floor``) of an analysis JSON dict (for ``run``'s verdict, which reads the file):
    the finding and its first fix, one pair per tensor."""
    out = []
    for o in doc.get("outliers") or []:
        if o.get("kind") == kind:
            out.append(f"{o['tensor']}: {o['reason']}")
            out += [f"    fix: {o['remedies'][0]}"] if o.get("remedies") else []
    return out
