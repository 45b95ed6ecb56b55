"""Whole-profile checks of a target a user wrote (``--target ./my.toml``).

:mod:`quantscope.targets.profile` reads each value; this module checks what only the
profile as a whole shows, each failure one line naming the key, the file and the fix:

* a rule's ``params`` against what its ``check`` reads (:data:`CHECK_PARAMS`): a missing
  parameter, an op kind that does not exist (a misspelt ``kinds`` entry makes a rule that
  never fires), a number that is no whole number;
* rule ids unique (a problem, ``with_params`` and ``check.json`` name a rule by its id);
* ``[precisions]``: each op kind has a non-empty list (its own or ``other``'s);
* ``[cost.relative]``: a factor for every precision ``[precisions]`` allows (without one
  the planner costs that precision as infinite and never picks it, without saying so);
* ``default_precision`` (what the compiler gives a layer a plan does not name) allowed on
  every op kind by ``[precisions]``, and not refused by an error rule on a whole op kind
  whatever the model's sizes and weights (:func:`default_against_rules`);
* a rule parameter set by ``with_params`` (:func:`override`): the same two checks of the
  rule it changes, the error naming the parameter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from quantscope.types import QuantscopeError

# check name -> parameter name -> (what its value is, required); a check not listed here
# (a user's own, added to CHECK_NAMES) takes any parameters
CHECK_PARAMS: dict[str, dict[str, tuple[str, bool]]] = {
    "act16_on_kinds": {"kinds": ("kinds", True), "readers": ("kinds", False)},
    "a16_low_sublayer": {"split_bits": ("int", True), "low_bits": ("int", True)},
    "act16_wide_non_conv": {"max_values": ("int", True), "exempt_kinds": ("kinds", True)},
    "quant_bias_add_rank": {"rank": ("int", True), "min_values": ("int", True)},
    "float_boundary_cascade": {"min_boundaries": ("int", True)},
}


def rule_params(rule_id: str, check: str, params: Mapping[str, Any], kinds: tuple[str, ...],
                source: str) -> None:
    """The parameters a rule's check reads: present, and of the right kind."""
    spec = CHECK_PARAMS.get(check)
    if spec is None:
        return
    where = f"rule '{rule_id}' (check '{check}') in target profile '{source}'"
    for name in params:
        if name not in spec:
            raise QuantscopeError(f"{where} has parameter '{name}', which {check} does not "
                                  f"read: its parameters are {', '.join(spec)}")
    for name, (what, required) in spec.items():
        if name not in params:
            if required:
                raise QuantscopeError(f"{where} has no parameter '{name}': add it to the "
                                      f"rule's params (see a built-in profile)")
            continue
        value = params[name].value
        if what == "int":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise QuantscopeError(f"{where}: params.{name} is {value!r}: give a whole "
                                      "number >= 0")
            continue
        # an empty exemption list exempts nothing (a rule on every kind): meaningful
        if not isinstance(value, list) or (not value and not name.startswith("exempt")):
            raise QuantscopeError(f"{where}: params.{name} is {value!r}: give a list of op "
                                  f"kinds, e.g. [\"softmax\"], from {', '.join(kinds)}")
        for kind in value:
            if kind not in kinds:
                raise QuantscopeError(f"{where}: params.{name} names op kind {kind!r}, which "
                                      f"does not exist: use {', '.join(kinds)}")


def unique_ids(ids: Iterable[str], source: str) -> None:
    """Each rule id once."""
    seen: set[str] = set()
    for rule_id in ids:
        if rule_id in seen:
            raise QuantscopeError(f"rule id '{rule_id}' appears twice in target profile "
                                  f"'{source}': give each [[rules]] entry its own id")
        seen.add(rule_id)


def coverage(precisions: Mapping[str, tuple[Any, ...]], cost_kinds: Iterable[str],
             allowed: Any, factor: Any, kinds: tuple[str, ...], source: str) -> None:
    """Every op kind has precisions, and every allowed precision a cost factor.

    ``allowed(kind)`` and ``factor(kind, precision)`` are the target's own lookups (with
    their fall-back to ``other``), so this judges what the planner will read."""
    cost_kinds = set(cost_kinds)
    for kind in kinds:
        listed = allowed(kind)
        if not listed:
            if kind in precisions:
                what = f"lists no precision for '{kind}'"
            elif kind == "other":
                what = ("has no 'other' list (op kinds without a list of their own, e.g. "
                        "Concat or Reshape, take it)")
            else:
                what = f"has no '{kind}' list and no 'other' list to fall back to"
            raise QuantscopeError(f"[precisions] of target profile '{source}' {what}: give "
                                  f"{kind} = [\"a8_w8\", …]")
        for p in listed:
            if factor(kind, p) is None:
                raise QuantscopeError(
                    f"target profile '{source}' allows {p} on {kind} ([precisions]) but "
                    f"[cost.relative] has no factor for it (the planner would cost it as "
                    f"infinite and never pick it): add {p} = <factor> to cost.relative."
                    f"{kind if kind in cost_kinds or kind == 'weighted' else 'other'}, "
                    "or remove it from [precisions]")


def default_allowed(default: Any, is_allowed: Any, kinds: tuple[str, ...],
                    source: str) -> None:
    """``default_precision`` is allowed on every op kind (``is_allowed(kind, p)``, the
    target's own judgement): it is the precision of every layer a plan does not name."""
    refused = [kind for kind in kinds if not is_allowed(kind, default)]
    if not refused:
        return
    everywhere = [p.value for p in type(default)
                  if all(is_allowed(kind, p) for kind in kinds)]
    fix = (f"set default_precision to one every op kind allows ({', '.join(everywhere)})"
           if everywhere else "set default_precision to a precision every op kind allows")
    raise QuantscopeError(
        f"'default_precision' of target profile '{source}' is {default.value}, which "
        f"[precisions] does not allow on {', '.join(refused)}: {fix}, or add "
        f"{default.value} to those lists")


def _refuses(rule: Any, p: Any) -> str | None:
    """Where the error ``rule`` refuses precision ``p`` on every layer of some op kind,
    whatever the model's sizes and weights (the layers, in words), else None. The
    size-dependent checks (``act16_wide_non_conv``, ``quant_bias_add_rank``) and the
    plan-shape one (``float_boundary_cascade``) are conditional: never refused here."""
    if rule.severity != "error" or p.act_bits != 16:
        return None
    params = dict(rule.params)
    if rule.check == "act16_on_kinds":
        return f"every {', '.join(params['kinds'].value)} layer (by its kind alone)"
    if rule.check == "a16_low_sublayer":
        # plan/check.low_byte_empty shifts a b-bit weight code up by split_bits - b: with
        # that shift at least low_bits, every code's low part is empty, whatever the weight
        split, low = int(params["split_bits"].value), int(params["low_bits"].value)
        if p.weight_bits is not None and split - p.weight_bits >= low:
            return (f"every weighted layer ({p.weight_bits}-bit weight codes leave the low "
                    f"{low} bits of the {split}-bit split empty, whatever the weights)")
    return None


def default_against_rules(default: Any, rules: Iterable[Any], is_allowed: Any,
                          kinds: tuple[str, ...], source: str) -> None:
    """``default_precision`` is refused by no error rule on a whole op kind by
    construction (:func:`_refuses`): every plan that does not name each such layer would be
    illegal. Conditional rules (on sizes, weights, the plan's shape) are left to ``check``."""
    rules = tuple(rules)
    for rule in rules:
        where = _refuses(rule, default)
        if where is None:
            continue
        ok = [p.value for p in type(default) if p.act_bits is not None
              and all(is_allowed(k, p) for k in kinds)
              and not any(_refuses(r, p) for r in rules)]
        fix = (f"set default_precision to {' or '.join(ok)}" if ok
               else "set default_precision to a precision no error rule refuses")
        raise QuantscopeError(
            f"'default_precision' of target profile '{source}' is {default.value}, which "
            f"error rule '{rule.id}' refuses on {where}, so every plan that does not name "
            f"each such layer is illegal: {fix}, or make the rule severity = \"warning\"")


def override(key: str, value: Any, was: Any, rule: Any, default: Any, rules: Iterable[Any],
             is_allowed: Any, kinds: tuple[str, ...], target: str) -> None:
    """A rule parameter set by ``with_params`` (``key`` = ``<rule id>.<param>``, ``rule``
    with the new value, ``was`` the profile's): its value of the right kind
    (:func:`rule_params`), and the profile's ``default_precision`` still not refused by
    the rule on a whole op kind (:func:`default_against_rules`, as a loaded profile)."""
    try:
        rule_params(rule.id, rule.check, dict(rule.params), kinds, target)
    except QuantscopeError as exc:
        raise QuantscopeError(f"rule parameter '{key}' set to {value!r}: {exc}") from None
    where = _refuses(rule, default)
    if where is None:
        return
    rules = tuple(rules)
    ok = [p.value for p in type(default) if p.act_bits is not None
          and all(is_allowed(k, p) for k in kinds) and not any(_refuses(r, p) for r in rules)]
    other = f", or use a profile whose default_precision is {' or '.join(ok)}" if ok else ""
    raise QuantscopeError(
        f"rule parameter '{key}' set to {value!r} makes error rule '{rule.id}' refuse the "
        f"default precision {default.value} of target '{target}' on {where}, so every plan "
        f"that does not name each such layer is illegal: keep '{key}' at {was!r} (the "
        f"profile's) or give a value under which {default.value} is legal{other}")


__all__ = ["CHECK_PARAMS", "coverage", "default_against_rules", "default_allowed",
           "override", "rule_params", "unique_ids"]
