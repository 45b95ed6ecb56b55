"""``[ops]`` of a target profile: which ONNX operators its compiler takes, each verdict
with the source it comes from.

One table per profile (not one rule per operator: a source is one list, and what the
product must say of an operator *no* list names is a property of the list, not of any
rule)::

    [ops]
    source = "…"          # the list that was read: title, version, address
    unlisted = "…"        # what an operator outside every entry means for this compiler
    unlisted_fix = "…"
    all = true            # optional: the runtime takes every operator ONNX Runtime runs

    [[ops.entries]]
    status = "supported"  # or "unsupported", or "conditional"
    ops = ["Conv", …]
    provenance = "…"      # required: where the source says so
    reason = "…"          # required for "unsupported" and "conditional"
    fix = "…"             # required for "unsupported" and "conditional"

An operator no entry names is *not guessed*: ``check`` says it is not in the source's
list (a warning naming the source); only an ``unsupported`` entry makes an error. A
``conditional`` entry is for an operator the sources saw taken in one form and refused in
another (an ``Erf`` inside torch's exported exact-GELU pattern, but not as a tf2onnx GELU):
a warning that says which form was seen to work (``reason``) and what to do (``fix``),
never silence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantscope.types import QuantscopeError

STATUSES = ("supported", "unsupported", "conditional")
_KEYS = frozenset({"source", "unlisted", "unlisted_fix", "all", "entries"})
_ENTRY_KEYS = frozenset({"status", "ops", "provenance", "reason", "fix"})


@dataclass(frozen=True)
class OpEntry:
    """One verdict of a source on some operators."""

    status: str  # "supported" | "unsupported" | "conditional"
    ops: tuple[str, ...]
    provenance: str
    reason: str = ""
    fix: str = ""


@dataclass(frozen=True)
class OpSupport:
    """``[ops]``: the operator list of the target's compiler, as far as a source says."""

    source: str
    unlisted: str
    unlisted_fix: str
    entries: tuple[OpEntry, ...] = ()
    takes_all: bool = False

    def entry(self, op_type: str) -> OpEntry | None:
        """The entry naming ``op_type`` (None: no source names it)."""
        for e in self.entries:
            if op_type in e.ops:
                return e
        return None


def _text(raw: dict[str, Any], key: str, where: str, source: str, *,
          required: bool = True) -> str:
    value = raw.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise QuantscopeError(f"{where} of target profile '{source}' has no {key!r}: give "
                              f"{key} = \"…\" (every operator verdict names its source)")
    return value


def _entry(raw: Any, i: int, source: str) -> OpEntry:
    where = f"[[ops.entries]] #{i + 1}"
    if not isinstance(raw, dict):
        raise QuantscopeError(f"{where} of target profile '{source}' is not a table: write "
                              "[[ops.entries]] with status, ops, provenance")
    for key in raw:
        if key not in _ENTRY_KEYS:
            raise QuantscopeError(f"unknown key '{key}' in {where} of target profile "
                                  f"'{source}': allowed keys are {', '.join(sorted(_ENTRY_KEYS))}")
    status = raw.get("status")
    if status not in STATUSES:
        raise QuantscopeError(f"{where} of target profile '{source}' has status {status!r}: "
                              f"use one of {', '.join(STATUSES)}")
    ops = raw.get("ops")
    if not isinstance(ops, list) or not ops or not all(isinstance(o, str) and o for o in ops):
        raise QuantscopeError(f"{where} of target profile '{source}' has ops {ops!r}: give a "
                              "non-empty list of ONNX op types, e.g. [\"LSTM\"]")
    bad = status != "supported"  # unsupported, conditional: say why and what to do
    return OpEntry(status=status, ops=tuple(ops),
                   provenance=_text(raw, "provenance", where, source),
                   reason=_text(raw, "reason", where, source, required=bad),
                   fix=_text(raw, "fix", where, source, required=bad))


def parse_ops(raw: Any, source: str) -> OpSupport | None:
    """``[ops]`` (None when the profile has none: nothing is said of its operators)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise QuantscopeError(f"[ops] of target profile '{source}' is not a table")
    for key in raw:
        if key not in _KEYS:
            raise QuantscopeError(f"unknown key '{key}' in [ops] of target profile "
                                  f"'{source}': allowed keys are {', '.join(sorted(_KEYS))}")
    takes_all = raw.get("all", False)
    if not isinstance(takes_all, bool):
        raise QuantscopeError(f"ops.all in target profile '{source}' is {takes_all!r}: give "
                              "true or false")
    entries = raw.get("entries", [])
    if not isinstance(entries, list):
        raise QuantscopeError(f"ops.entries in target profile '{source}' is not a list: "
                              "write [[ops.entries]] tables")
    parsed = tuple(_entry(e, i, source) for i, e in enumerate(entries))
    seen: dict[str, int] = {}
    for i, e in enumerate(parsed):
        for op in e.ops:
            if op in seen:
                raise QuantscopeError(f"operator '{op}' is in [[ops.entries]] #{seen[op] + 1} "
                                      f"and #{i + 1} of target profile '{source}': name each "
                                      "operator once")
            seen[op] = i
    return OpSupport(source=_text(raw, "source", "[ops]", source),
                     unlisted=_text(raw, "unlisted", "[ops]", source, required=not takes_all),
                     unlisted_fix=_text(raw, "unlisted_fix", "[ops]", source,
                                        required=not takes_all),
                     entries=parsed, takes_all=takes_all)


__all__ = ["OpEntry", "OpSupport", "STATUSES", "parse_ops"]
