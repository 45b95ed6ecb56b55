"""Target profiles: typed values loaded from one TOML file per target.

A profile states what a compiler accepts, as data (see ``docs/targets.md``):

==============  =================================================================
``scheme``      how values are stored (signedness, symmetry, per-channel weights)
``precisions``  precisions allowed per op kind (see :data:`OP_KINDS`)
``rules``       forbidden combinations: each has an id, a ``check`` (a function in
                :mod:`quantscope.plan.check`), a reason a user can read, the
                provenance (report, SDK version), a fix and parameters; a parameter
                that is not known exactly is written ``{ value = .., estimate = true }``
``cost``        relative cost per precision per op kind, and per precision boundary
``formats``     the export formats the compiler takes (names in
                :data:`quantscope.export.formats.FORMATS`; the QDQ model is always
                written); a profile without the key takes its vendor's formats
``host_embedding``  lookups the compiler expects on the host: ``rows`` (a Gather of a
                table of at least this many rows by an integer model input runs on
                the host: :mod:`quantscope.model.host_gather`), ``reason``,
                ``provenance``; absent: every lookup is judged as a device layer
``ops``         which ONNX operators the compiler takes, each verdict with its source
                (:mod:`quantscope.targets.ops`)
``promotion``   the precision ``run`` promotes a group to (its analysis' ``high``, the
                max-legal candidates'): ``precision``, ``reason``, ``provenance``;
                absent: a16_w16
==============  =================================================================

The loader rejects unknown keys with one line naming the key and the file.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from quantscope.export.formats import FORMATS, vendor_formats
from quantscope.targets import validate
from quantscope.targets.ops import OpSupport, parse_ops
from quantscope.types import Group, GroupKind, Precision, QuantScheme, QuantscopeError

# op_type of an activation group -> op kind (weighted groups are always "weighted")
OP_KINDS: dict[str, str] = {
    "MatMul": "matmul",
    "Gemm": "matmul",
    "Softmax": "softmax",
    "LogSoftmax": "softmax",
    "LayerNormalization": "normalization",
    "InstanceNormalization": "normalization",
    "GroupNormalization": "normalization",
    "RMSNormalization": "normalization",
    "BatchNormalization": "normalization",
    "MaxPool": "maxpool",
    "GlobalMaxPool": "maxpool",
    "AveragePool": "pool",
    "GlobalAveragePool": "pool",
    "Add": "elementwise",
    "Sub": "elementwise",
    "Mul": "elementwise",
    "Div": "elementwise",
    "Relu": "elementwise",
    "Sigmoid": "elementwise",
    "Tanh": "elementwise",
    "Gelu": "elementwise",
    "Clip": "elementwise",
}
KINDS: tuple[str, ...] = (
    "weighted",
    "matmul",
    "softmax",
    "normalization",
    "maxpool",
    "pool",
    "elementwise",
    "other",
)


def op_kind(group: Group) -> str:
    """The op kind a profile's precisions and costs are keyed by."""
    if group.kind is GroupKind.WEIGHTED:
        return "weighted"
    return OP_KINDS.get(group.op_type, "other")


@dataclass(frozen=True)
class Param:
    """A rule parameter; ``estimate`` marks a value that is not known exactly."""

    value: Any
    estimate: bool = False
    note: str = ""


@dataclass(frozen=True)
class Rule:
    id: str
    check: str  # name of the check function (registry in quantscope.plan.check)
    severity: str  # "error" | "warning"
    reason: str
    provenance: str
    fix: str
    params: tuple[tuple[str, Param], ...] = ()

    def param(self, name: str) -> Param:
        found = dict(self.params).get(name)
        if found is None:
            raise QuantscopeError(
                f"rule '{self.id}' has no parameter '{name}': add it to the profile"
            )
        return found


@dataclass(frozen=True)
class CostModel:
    """Relative costs; a8_w8 on each kind is the unit of that kind's work."""

    relative: tuple[tuple[str, tuple[tuple[Precision, float], ...]], ...]
    value_macs: tuple[tuple[str, float], ...]  # MAC-equivalents per output value, by kind
    boundary_macs: float  # MAC-equivalents per value crossing a precision boundary
    basis: str
    estimate: bool = True
    # MAC-equivalents per weight byte read, charged where a phase reads every weight for
    # one token (a decoder's decode step: bound by weight bandwidth); 0: not charged
    weight_byte_macs: float = 0.0

    def factor(self, kind: str, precision: Precision) -> float | None:
        """Relative cost; for non-weighted kinds only the activation bits matter."""
        table = dict(dict(self.relative).get(kind) or dict(self.relative).get("other", ()))
        if precision in table or kind == "weighted":
            return table.get(precision)
        same = [v for p, v in table.items() if p.act_bits == precision.act_bits]
        return same[0] if same else None

    def macs_per_value(self, kind: str) -> float:
        table = dict(self.value_macs)
        return table.get(kind, table.get("other", 1.0))


@dataclass(frozen=True)
class HostEmbedding:
    """``[host_embedding]``: a lookup of a table of at least ``rows`` rows by an integer
    model input runs on the host (not costed or judged as a device layer)."""

    rows: Param  # int value; an estimate where the real limit is not known
    reason: str
    provenance: str

    @property
    def min_rows(self) -> int:
        return int(self.rows.value)


@dataclass(frozen=True)
class Promotion:
    """``[promotion]``: the precision a group is promoted to by ``run`` (its analysis'
    ``high`` and the max-legal candidates'), where the target's usual 16-bit form is not
    a16_w16 (e.g. W8A16 on Qualcomm HTP)."""

    precision: Precision
    reason: str
    provenance: str


@dataclass(frozen=True)
class Target:
    name: str
    vendor: str
    device: str
    sdk: str
    description: str
    default_precision: Precision
    scheme: QuantScheme
    scheme_notes: str
    precisions: tuple[tuple[str, tuple[Precision, ...]], ...]
    rules: tuple[Rule, ...]
    cost: CostModel
    source: str = "<memory>"
    formats: tuple[str, ...] = ()  # export formats besides the QDQ model (always written)
    host_embedding: HostEmbedding | None = None  # lookups left to the host (None: none)
    promotion: Promotion | None = None  # [promotion] (None: a16_w16)
    ops: OpSupport | None = None  # [ops]: which operators the compiler takes (targets/ops.py)
    # the warning rules a run accepts (``--allow-warning``), as the rewrites' and repairs'
    # preconditions read them: set only by :func:`quantscope.targets.accept.for_run` (a
    # profile states none; the planner takes its own set, plan.start.Legality.allowed)
    accepted: frozenset[str] = frozenset()

    @property
    def promote(self) -> Precision:
        """The precision ``run`` promotes a group to: ``[promotion]``'s, else a16_w16, or
        a16_w8 where the profile allows that and not a16_w16 on weighted groups."""
        if self.promotion:
            return self.promotion.precision
        weighted = self.allowed("weighted")
        if Precision.A16_W8 in weighted and Precision.A16_W16 not in weighted:
            return Precision.A16_W8
        return Precision.A16_W16

    @property
    def host_rows(self) -> int:
        """The ``rows`` of ``[host_embedding]`` (0: no lookup stays on the host)."""
        return self.host_embedding.min_rows if self.host_embedding else 0

    def allowed(self, kind: str) -> tuple[Precision, ...]:
        table = dict(self.precisions)
        return table.get(kind, table.get("other", ()))

    def is_allowed(self, kind: str, precision: Precision) -> bool:
        """Allowed on ``kind``; for non-weighted kinds only the activation bits matter."""
        listed = self.allowed(kind)
        if kind == "weighted" or precision in listed:
            return precision in listed
        return any(p.act_bits == precision.act_bits for p in listed)


_TOP_KEYS = frozenset(
    {
        "name",
        "vendor",
        "device",
        "sdk",
        "description",
        "default_precision",
        "scheme",
        "precisions",
        "rules",
        "cost",
        "formats",
        "host_embedding",
        "promotion",
        "ops",
    }
)
_SCHEME_KEYS = frozenset(
    {
        "act_signed",
        "act_symmetric",
        "weight_signed",
        "weight_symmetric",
        "weight_per_channel",
        "notes",
    }
)
_HOST_KEYS = frozenset({"rows", "reason", "provenance"})
_RULE_KEYS = frozenset({"id", "check", "severity", "reason", "provenance", "fix", "params"})
_PARAM_KEYS = frozenset({"value", "estimate", "note"})
_COST_KEYS = frozenset({"basis", "estimate", "relative", "value_macs", "boundary_macs",
                        "weight_byte_macs"})
SEVERITIES = ("error", "warning", "info")
# The check functions a rule can name: the keys of ``quantscope.plan.check.CHECKS`` (a test
# keeps the two equal; the profile layer cannot import the planner above it).
CHECK_NAMES: tuple[str, ...] = (
    "act16_on_kinds",
    "a16_low_sublayer",
    "act16_wide_non_conv",
    "quant_bias_add_rank",
    "float_boundary_cascade",
)


def _reject_unknown(
    table: dict[str, Any], allowed: frozenset[str] | tuple[str, ...], where: str, source: str
) -> None:
    for key in table:
        if key not in allowed:
            raise QuantscopeError(
                f"unknown key '{key}' in {where} of target profile '{source}': "
                f"allowed keys are {', '.join(sorted(allowed))}"
            )


def _require(table: dict[str, Any], key: str, where: str, source: str) -> Any:
    if key not in table:
        raise QuantscopeError(f"missing key '{key}' in {where} of target profile '{source}': "
                              "add it (compare with a built-in profile, docs/targets.md)")
    return table[key]


def _typed(value: Any, kind: type, what: str, source: str) -> Any:
    """``value`` if it is a ``kind`` (a bool is no number, a string no bool), else one line."""
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if not ok:
        names = {bool: "true or false", str: "a string", list: "a list", dict: "a table"}
        raise QuantscopeError(f"{what} in target profile '{source}' is {value!r}, which has "
                              f"the wrong type: give {names.get(kind, kind.__name__)}")
    return value


def _cost_number(value: Any, what: str, source: str, *, zero: bool) -> float:
    """A cost: a finite number, above 0 (``zero``: at least 0)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise QuantscopeError(f"{what} in target profile '{source}' is {value!r}, which has "
                              "the wrong type: give a number")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (number == 0 and not zero):
        bound = "at least 0" if zero else "above 0"
        raise QuantscopeError(f"{what} in target profile '{source}' is {value!r}: a cost "
                              f"is a finite number {bound}")
    return number


def _precision(text: Any, source: str, where: str = "") -> Precision:
    try:
        return Precision(text)
    except ValueError:
        at = f" in {where}" if where else ""
        names = ", ".join(p.value for p in Precision)
        raise QuantscopeError(f"unknown precision {text!r}{at} of target profile '{source}': "
                              f"use one of {names}") from None


def _precision_list(raw: Any, kind: str, source: str) -> tuple[Precision, ...]:
    """``[precisions]``' list for one op kind: a list of precision names, each once."""
    names = _typed(raw, list, f"precisions.{kind}", source)
    out = tuple(_precision(n, source, f"precisions.{kind}") for n in names)
    if len(set(out)) != len(out):
        raise QuantscopeError(f"precisions.{kind} of target profile '{source}' names a "
                              "precision twice: name each once")
    return out


def _text(raw: dict[str, Any], key: str, where: str, source: str) -> str:
    """A required, non-empty string (a rule's reason, provenance, fix, id)."""
    value = _typed(_require(raw, key, where, source), str, f"'{key}' of {where}", source)
    if not value.strip():
        raise QuantscopeError(f"'{key}' of {where} in target profile '{source}' is empty: "
                              f"state the {key} (see a built-in profile and docs/targets.md)")
    return value


def _parse_param(name: str, raw: Any, rule_id: str, source: str) -> Param:
    if not isinstance(raw, dict):
        return Param(value=raw)
    _reject_unknown(raw, _PARAM_KEYS, f"parameter '{name}' of rule '{rule_id}'", source)
    value = _require(raw, "value", f"parameter '{name}' of rule '{rule_id}'", source)
    where = f"'estimate' of parameter '{name}' of rule '{rule_id}'"
    return Param(value=value, estimate=_typed(raw.get("estimate", False), bool, where, source),
                 note=_typed(raw.get("note", ""), str, f"'note' of parameter '{name}'", source))


def _parse_rule(raw: dict[str, Any], source: str) -> Rule:
    _typed(raw, dict, "each [[rules]] entry", source)
    where = f"rule '{raw.get('id', '?')}'"
    _reject_unknown(raw, _RULE_KEYS, where, source)
    rule_id = _text(raw, "id", "a [[rules]] entry", source)
    severity = raw.get("severity", "error")
    if not isinstance(severity, str) or severity not in SEVERITIES:
        raise QuantscopeError(
            f"rule '{rule_id}' in target profile '{source}' has severity '{severity}': "
            f"use one of {', '.join(SEVERITIES)}"
        )
    params = tuple(
        (k, _parse_param(k, v, rule_id, source))
        for k, v in _typed(raw.get("params", {}), dict, f"params of {where}", source).items()
    )
    check = _require(raw, "check", where, source)
    if check not in CHECK_NAMES:
        raise QuantscopeError(
            f"rule '{rule_id}' in target profile '{source}' names unknown check '{check}': "
            f"use one of {', '.join(CHECK_NAMES)}"
        )
    validate.rule_params(rule_id, check, dict(params), KINDS, source)
    return Rule(
        id=rule_id,
        check=check,
        severity=severity,
        reason=_text(raw, "reason", where, source),
        provenance=_text(raw, "provenance", where, source),
        fix=_text(raw, "fix", where, source),
        params=params,
    )


def _parse_kind_table(raw: dict[str, Any], where: str, source: str) -> None:
    _reject_unknown(raw, KINDS, where, source)


def _parse_cost(raw: dict[str, Any], source: str) -> CostModel:
    _reject_unknown(raw, _COST_KEYS, "[cost]", source)
    relative_raw = _require(raw, "relative", "[cost]", source)
    _parse_kind_table(relative_raw, "[cost.relative]", source)
    relative = tuple(
        (kind, tuple((_precision(p, source, f"cost.relative.{kind}"),
                      _cost_number(v, f"cost.relative.{kind}.{p}", source, zero=False))
                     for p, v in _typed(table, dict, f"cost.relative.{kind}", source).items()))
        for kind, table in relative_raw.items()
    )
    value_macs_raw = _typed(raw.get("value_macs", {}), dict, "cost.value_macs", source)
    _parse_kind_table(value_macs_raw, "[cost.value_macs]", source)
    return CostModel(
        relative=relative,
        value_macs=tuple((k, _cost_number(v, f"cost.value_macs.{k}", source, zero=True))
                         for k, v in value_macs_raw.items()),
        boundary_macs=_cost_number(raw.get("boundary_macs", 0.0), "cost.boundary_macs",
                                   source, zero=True),
        basis=_typed(_require(raw, "basis", "[cost]", source), str, "cost.basis", source),
        estimate=_typed(raw.get("estimate", True), bool, "cost.estimate", source),
        weight_byte_macs=_cost_number(raw.get("weight_byte_macs", 0.0),
                                      "cost.weight_byte_macs", source, zero=True),
    )


def _parse_scheme(raw: dict[str, Any], source: str) -> tuple[QuantScheme, str]:
    _reject_unknown(raw, _SCHEME_KEYS, "[scheme]", source)
    fields = {k: _typed(v, bool, f"scheme.{k}", source) for k, v in raw.items() if k != "notes"}
    return QuantScheme(**fields), _typed(raw.get("notes", ""), str, "scheme.notes", source)


def _parse_host(raw: Any, source: str) -> HostEmbedding | None:
    """``[host_embedding]``: rows (an integer >= 1, or a parameter table), reason and
    provenance (both required: a rule without its source is no rule)."""
    if raw is None:
        return None
    _typed(raw, dict, "[host_embedding]", source)
    _reject_unknown(raw, _HOST_KEYS, "[host_embedding]", source)
    rows = _parse_param("rows", _require(raw, "rows", "[host_embedding]", source),
                        "host_embedding", source)
    if not isinstance(rows.value, int) or isinstance(rows.value, bool) or rows.value < 1:
        raise QuantscopeError(f"host_embedding.rows in target profile '{source}' is "
                              f"{rows.value!r}: give a whole number of table rows >= 1")
    return HostEmbedding(
        rows=rows,
        reason=_typed(_require(raw, "reason", "[host_embedding]", source), str,
                      "host_embedding.reason", source),
        provenance=_typed(_require(raw, "provenance", "[host_embedding]", source), str,
                          "host_embedding.provenance", source))


def _parse_promotion(raw: Any, source: str) -> Promotion | None:
    """``[promotion]``: a precision with 16-bit activations, its reason and provenance."""
    if raw is None:
        return None
    where = "[promotion]"
    _typed(raw, dict, where, source)
    _reject_unknown(raw, frozenset({"precision", "reason", "provenance"}), where, source)
    precision = _precision(_require(raw, "precision", where, source), source,
                           "promotion.precision")
    if precision.act_bits != 16:
        raise QuantscopeError(f"promotion.precision in target profile '{source}' is "
                              f"{precision.value}: give a precision with 16-bit activations "
                              "(a16_w8 or a16_w16)")
    return Promotion(precision=precision,
                     reason=_typed(_require(raw, "reason", where, source), str,
                                   "promotion.reason", source),
                     provenance=_typed(_require(raw, "provenance", where, source), str,
                                       "promotion.provenance", source))


def _parse_formats(raw: dict[str, Any], vendor: str, source: str) -> tuple[str, ...]:
    """The ``formats`` list, each name in the export registry (default: the vendor's)."""
    if "formats" not in raw:
        return vendor_formats(vendor)
    names = _typed(raw["formats"], list, "'formats'", source)
    for name in names:
        if not isinstance(name, str) or name not in FORMATS:
            raise QuantscopeError(f"unknown export format {name!r} in 'formats' of target "
                                  f"profile '{source}': use one of {', '.join(FORMATS)}")
    if len(set(names)) != len(names):
        raise QuantscopeError(f"'formats' of target profile '{source}' names a format twice: "
                              "name each once")
    for name in names:  # export refuses one vendor's file for another vendor's target
        owner = FORMATS[name].vendor
        if owner and owner != vendor:
            raise QuantscopeError(f"'formats' of target profile '{source}' lists {name!r}, "
                                  f"a {owner} file, but its vendor is {vendor!r}: remove it "
                                  f"from 'formats' or set vendor = \"{owner}\"")
    return tuple(names)


def parse_target(raw: dict[str, Any], source: str = "<memory>") -> Target:
    """Build a :class:`Target` from a parsed TOML document (unknown keys rejected)."""
    _reject_unknown(raw, _TOP_KEYS, "the top level", source)
    precisions_raw = _typed(_require(raw, "precisions", "the top level", source), dict,
                            "[precisions]", source)
    _parse_kind_table(precisions_raw, "[precisions]", source)
    scheme, notes = _parse_scheme(_typed(raw.get("scheme", {}), dict, "[scheme]", source),
                                  source)

    def text(key: str, default: str | None = None) -> str:
        value = _require(raw, key, "the top level", source) if default is None else raw.get(
            key, default)
        return _typed(value, str, f"'{key}'", source)

    rules = tuple(_parse_rule(r, source)
                  for r in _typed(raw.get("rules", []), list, "[[rules]]", source))
    validate.unique_ids((r.id for r in rules), source)
    target = Target(
        name=text("name"),
        vendor=text("vendor"),
        device=text("device", ""),
        sdk=text("sdk"),
        description=text("description", ""),
        default_precision=_precision(raw.get("default_precision", "a8_w8"), source,
                                     "'default_precision'"),
        scheme=scheme,
        scheme_notes=notes,
        precisions=tuple(
            (k, _precision_list(v, k, source)) for k, v in precisions_raw.items()
        ),
        rules=rules,
        cost=_parse_cost(_require(raw, "cost", "the top level", source), source),
        source=source,
        formats=_parse_formats(raw, text("vendor"), source),
        host_embedding=_parse_host(raw.get("host_embedding"), source),
        promotion=_parse_promotion(raw.get("promotion"), source),
        ops=parse_ops(raw.get("ops"), source),
    )
    validate.coverage(dict(target.precisions), dict(target.cost.relative), target.allowed,
                      target.cost.factor, KINDS, source)
    validate.default_allowed(target.default_precision, target.is_allowed, KINDS, source)
    validate.default_against_rules(target.default_precision, target.rules, target.is_allowed,
                                   KINDS, source)
    return target


# the profiles parsed by (path, text): a run read its target 50-100 times (each check of a
# plan's scheme), parsing and validating the TOML each time (24 s of the test suite's)
_PARSED: dict[tuple[str, str], Target] = {}


def load_target_file(path: str | Path) -> Target:
    """Load a target profile from a TOML file (a text this process parsed before from
    the same path: the same frozen :class:`Target`)."""
    path = Path(path)
    if path.is_dir():
        raise QuantscopeError(f"target profile '{path}' is a folder, not a file: give the "
                              "profile's .toml file")
    if not path.is_file():
        raise QuantscopeError(f"target profile '{path}' does not exist: check the path")
    try:
        text = path.read_text(encoding="utf-8")
        if (str(path), text) in _PARSED:
            return _PARSED[(str(path), text)]
        raw = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise QuantscopeError(f"target profile '{path}' is not valid TOML ({exc})") from None
    try:
        target = parse_target(raw, source=str(path))
        while len(_PARSED) >= 32:
            del _PARSED[next(iter(_PARSED))]
        _PARSED[(str(path), text)] = target
        return target
    except (TypeError, ValueError, AttributeError) as exc:
        raise QuantscopeError(
            f"target profile '{path}' has a value of the wrong type ({exc}): compare it with "
            "a built-in profile (docs/targets.md)"
        ) from None


def with_params(target: Target, overrides: dict[str, Any]) -> Target:
    """Override rule parameters: keys are ``"<rule id>.<param>"``, values plain values.

    An overridden parameter is no longer an estimate (the user stated it). Each is checked
    as a loaded profile's are (:func:`quantscope.targets.validate.override`): its value, and
    that the profile's ``default_precision`` stays legal under the changed rule.
    """
    rules = {r.id: r for r in target.rules}
    changed: dict[str, tuple[str, Any, Any]] = {}  # key -> (rule id, value, the profile's)
    for key, value in overrides.items():
        rule_id, _, name = key.rpartition(".")
        rule = rules.get(rule_id)
        if rule is None or name not in dict(rule.params):
            raise QuantscopeError(
                f"no rule parameter '{key}' in target '{target.name}': "
                "use '<rule id>.<param>' as listed by the profile"
            )
        params = dict(rule.params)
        changed[key] = (rule_id, value, params[name].value)
        params[name] = Param(value=value, estimate=False, note="set by the user")
        rules[rule_id] = replace(rule, params=tuple(params.items()))
    out = replace(target, rules=tuple(rules[r.id] for r in target.rules))
    for key, (rule_id, value, was) in changed.items():
        validate.override(key, value, was, rules[rule_id], out.default_precision, out.rules,
                          out.is_allowed, KINDS, out.name)
    return out
