"""The planner's input from the analysis: predicted metric gain per group and precision.

The analysis stage (``quantscope.analyze``) measures a task metric with one group
promoted at a time (enable-one sweep) and/or one group lowered at a time from a high
precision (disable-one sweep). The planner needs only this small typed value:

=================  ============================================================
``metric``         name of the task metric (e.g. ``top1_agreement``)
``base``           the metric of the start plan (uniform ``low``)
``gains``          group -> precision -> gain of promoting that one group from
                   ``low`` to that precision, in metric units, positive = better
                   (for a lower-is-better metric a gain is a reduction)
``higher_is_better``  the metric's direction
``reference``      the metric at full precision (e.g. 1.0 for agreement); predicted
                   quality is clipped to it
=================  ============================================================

Accepted JSON (:func:`sensitivity_from_dict`), format ``quantscope.sensitivity/1``::

    {"metric": "top1_agreement", "higher_is_better": true, "low": "a8_w8",
     "base": 0.708, "reference": 1.0,
     "gains": {"<group>": {"a16_w16": 0.031}}}           # deltas, or
     "enable_one": {"<group>": {"a16_w16": 0.739}}}      # metric with that group promoted

``enable_one`` values are converted to gains by subtracting ``base`` (sign-adjusted).
Extra keys (the analysis' own tables) are ignored; missing required keys are errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quantscope.types import Precision, QuantscopeError

SENSITIVITY_FORMAT = "quantscope.sensitivity/1"
Gains = tuple[tuple[str, tuple[tuple[Precision, float], ...]], ...]


@dataclass(frozen=True, kw_only=True)
class Sensitivity:
    metric: str
    base: float
    gains: Gains
    higher_is_better: bool = True
    low: Precision = Precision.A8_W8
    reference: float | None = None
    source: str = ""

    @classmethod
    def from_gains(
        cls,
        metric: str,
        base: float,
        gains: Mapping[str, Mapping[Precision | str, float]],
        *,
        higher_is_better: bool = True,
        low: Precision = Precision.A8_W8,
        reference: float | None = None,
        source: str = "",
    ) -> Sensitivity:
        table = tuple(
            (str(g), tuple((Precision.parse(str(p)), float(v)) for p, v in per.items()))
            for g, per in gains.items()
        )
        return cls(
            metric=metric,
            base=float(base),
            gains=table,
            low=low,
            reference=reference,
            higher_is_better=higher_is_better,
            source=source,
        )

    def gain(self, group: str, precision: Precision) -> float | None:
        """Gain of ``group`` at ``precision`` over ``low``; 0 at ``low``; None if unknown."""
        if precision == self.low:
            return 0.0
        return dict(dict(self.gains).get(group, ())).get(precision)

    def delta(self, group: str, old: Precision, new: Precision) -> float | None:
        a, b = self.gain(group, old), self.gain(group, new)
        return None if a is None or b is None else b - a

    def quality(self, total_gain: float) -> float:
        """Predicted metric for a summed gain, clipped to ``reference`` when given."""
        q = self.base + total_gain if self.higher_is_better else self.base - total_gain
        if self.reference is None:
            return q
        return min(q, self.reference) if self.higher_is_better else max(q, self.reference)


def _number(obj: Mapping[str, Any], key: str, where: str) -> float:
    value = obj.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise QuantscopeError(f"'{key}' in {where} must be a number (got {value!r})")
    return float(value)


def _table(obj: Any, key: str, where: str) -> dict[str, dict[str, float]]:
    if not isinstance(obj, dict) or not all(isinstance(v, dict) for v in obj.values()):
        raise QuantscopeError(f"'{key}' in {where} must map group names to {{precision: value}}")
    return {str(g): {str(p): _number(per, p, f"{key}.{g}") for p in per} for g, per in obj.items()}


def sensitivity_from_dict(obj: Any, where: str = "analysis") -> Sensitivity:
    """Adapter: analysis JSON (see module docstring) -> :class:`Sensitivity`."""
    if not isinstance(obj, dict):
        raise QuantscopeError(f"{where} must be a JSON object with 'metric', 'base', 'gains'")
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
        gains = _table(obj["gains"], "gains", where)
    elif "enable_one" in obj:
        sign = 1.0 if hib else -1.0
        raw = _table(obj["enable_one"], "enable_one", where)
        gains = {g: {p: sign * (v - base) for p, v in per.items()} for g, per in raw.items()}
    else:
        raise QuantscopeError(f"{where} needs 'gains' or 'enable_one' per group and precision")
    ref = obj.get("reference")
    return Sensitivity.from_gains(
        obj["metric"],
        base,
        gains,
        higher_is_better=hib,
        low=Precision.parse(str(obj.get("low", "a8_w8"))),
        reference=None if ref is None else _number(obj, "reference", where),
        source=where,
    )


ANALYSIS_FORMAT = "quantscope.analysis/1"


def sensitivity_from_analysis(obj: dict[str, Any], where: str = "analysis") -> Sensitivity:
    """Adapter: ``quantscope analyze`` JSON -> :class:`Sensitivity` in output SQNR (dB).

    The per-group gain of promoting group g to the analysis' ``high`` precision is the
    output SQNR that the disable-one sweep recovered (``offenders[].score_db``). SQNR gains
    are summed as if independent: a prediction, which the planner's refinement checks
    with real emulation of the task metric.
    """
    high = Precision.parse(str(obj.get("high", "a16_w16")))
    gains: dict[str, dict[Precision, float]] = {}
    for off in obj.get("offenders", []):
        if not isinstance(off, dict) or "group" not in off:
            raise QuantscopeError(f"{where}: every offender needs 'group' and 'score_db'")
        gains[str(off["group"])] = {high: max(float(off.get("score_db", 0.0)), 0.0)}
    low = Precision.parse(str(obj.get("low", "a8_w8")))
    base = obj.get("baselines", {}).get(low.value, {}).get("sqnr_db", 0.0)
    return Sensitivity.from_gains(
        "output_sqnr_db", float(base), gains, higher_is_better=True, low=low, source=where
    )


def load_sensitivity(obj: Any, where: str = "analysis") -> Sensitivity:
    """Either JSON form: ``quantscope.analysis/1`` or ``quantscope.sensitivity/1``."""
    if isinstance(obj, dict) and obj.get("format") == ANALYSIS_FORMAT:
        return sensitivity_from_analysis(obj, where)
    return sensitivity_from_dict(obj, where)
