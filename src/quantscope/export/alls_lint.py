"""Preflight of a user's own Hailo model script (``.alls``) before an 8-minute compile.

Parsed lines (anything after ``#`` is a comment)::

    quantization_param(<layers>, precision_mode=a16_w16)
    quantization_param(<layers>, force_range_out=[-1.1, 1.1])
    normalization1 = normalization([127.5, 127.5, 127.5], [128.0, 128.0, 128.0])
    <other command>(...)            # known commands are skipped, unknown ones warned

``<layers>`` is a name (``conv4`` or ``net/conv4``), a wildcard (``*``, ``conv*``) or a
set ``{conv1, conv2}``; without it (``quantization_param(precision_mode=..)``) the line
applies to every layer. Names resolve to quantscope groups exactly through the HN JSON
(``original_names``), or else by the heuristics of
:data:`quantscope.export.hailo_alls.HAILO_PREFIXES` (reported as ``alls.guessed_name``);
an ONNX node name also resolves exactly. The script becomes a :class:`Plan` (later lines
win) that runs through :func:`quantscope.plan.check.check`; each problem names the line
that set the precision.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, replace
from typing import Any

from quantscope.export.hailo_alls import (
    heuristic_names,
    hn_groups,
    hn_layers,
    short_layer_name,
    unset_decisions,
    unset_group,
)
from quantscope.model.load import Model
from quantscope.plan.check import check
from quantscope.targets.profile import Target
from quantscope.types import Groups, Plan, Precision, Problem

KNOWN_COMMANDS = frozenset(
    {
        "quantization_param",
        "normalization",
        "model_optimization_config",
        "model_optimization_flavor",
        "pre_quantization_optimization",
        "post_quantization_optimization",
        "allocator_param",
        "compilation_param",
        "performance_param",
        "resources_param",
        "context_switch_param",
        "nms_postprocess",
        "change_output_activation",
        "input_conversion",
        "transpose",
        "reshape",
        "resize",
        "set_seed",
        "hef_param",
        "platform_param",
        "buffers",
        "output_layer",
        "logits_layer",
        "from_tf",
        "yuv_to_rgb",
    }
)
_LINE = re.compile(r"^\s*(?:(?P<lhs>[\w./-]+)\s*=\s*)?(?P<cmd>\w+)\s*\((?P<args>.*)\)\s*$")
PROVENANCE = "quantscope .alls parser (syntax from seeds/000-002)"


@dataclass(frozen=True)
class AllsCommand:
    line: int
    text: str
    command: str
    lhs: str | None
    positional: tuple[str, ...]
    keywords: tuple[tuple[str, str], ...]

    def keyword(self, name: str) -> str | None:
        return dict(self.keywords).get(name)


def split_args(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


def parse_alls(text: str) -> tuple[tuple[AllsCommand, ...], list[Problem]]:
    """Commands of a script, plus a syntax problem for each line that does not parse."""
    commands, problems = [], []
    for i, raw in enumerate(text.splitlines(), start=1):
        body = raw.split("#", 1)[0].strip()
        if not body:
            continue
        m = _LINE.match(body)
        if m is None:
            problems.append(
                _line_problem(
                    i,
                    body,
                    "*",
                    "alls.syntax",
                    "cannot parse this line",
                    "write `command(args)` or `name = command(args)`",
                )
            )
            continue
        pos, kw = [], []
        for arg in split_args(m["args"]):
            key, eq, value = arg.partition("=")
            if eq and re.fullmatch(r"\w+", key.strip()):
                kw.append((key.strip(), value.strip()))
            else:
                pos.append(arg)
        commands.append(AllsCommand(i, body, m["cmd"], m["lhs"], tuple(pos), tuple(kw)))
    return tuple(commands), problems


def _line_problem(
    line: int, text: str, group: str, rule: str, reason: str, fix: str, *, severity: str = "error"
) -> Problem:
    return Problem(
        group=group,
        rule=rule,
        reason=f"line {line} `{text}`: {reason}",
        provenance=PROVENANCE,
        fix=fix,
        severity=severity,
    )


def layer_patterns(cmd: AllsCommand) -> tuple[str, ...]:
    """Layer names/patterns of a command's first positional argument (``*`` if none)."""
    if not cmd.positional:
        return ("*",)
    first = cmd.positional[0].strip()
    if first[:1] in "{[" and first[-1:] in "}]":
        return tuple(short_layer_name(p.strip()) for p in split_args(first[1:-1]) if p.strip())
    return (short_layer_name(first),)


@dataclass(frozen=True)
class NameIndex:
    """Hailo layer name -> group name; ``guessed`` holds names mapped by heuristics."""

    names: dict[str, str]
    guessed: frozenset[str]
    all_groups: tuple[str, ...]
    hn_unmatched: str | None = None  # why an HN that was given is not used, if it is not

    def resolve(self, pattern: str) -> tuple[list[str], list[str]]:
        """(groups, guessed names used) for one name or wildcard."""
        if pattern == "*":
            return list(self.all_groups), []
        hits = [n for n in self.names if fnmatch.fnmatchcase(n, pattern)]
        groups = list(dict.fromkeys(self.names[n] for n in hits))
        return groups, [n for n in hits if n in self.guessed]


def name_index(groups: Groups, model: Model, hn: dict[str, Any] | None = None) -> NameIndex:
    """Exact names from the HN (if given) and ONNX node names; else heuristic guesses."""
    owner = {n: g.name for g in groups.groups for n in g.nodes}
    exact = {n.name: owner[n.name] for n in model.graph.node if n.name in owner}
    unmatched = None
    if hn is not None:
        from_hn = hn_groups(hn, groups)
        if from_hn:
            exact.update(from_hn)
            return NameIndex(names=exact, guessed=frozenset(), all_groups=groups.names())
        unmatched = hn_unmatched_note(hn)
    guesses = heuristic_names(groups)
    return NameIndex(
        names={**guesses, **exact},
        guessed=frozenset(guesses) - set(exact),
        all_groups=groups.names(),
        hn_unmatched=unmatched,
    )


def hn_unmatched_note(hn: dict[str, Any]) -> str:
    """One line: the HN matched no node of this model, its layer count and a sample."""
    layers = hn_layers(hn)
    sample = next(((n, o) for n, o in layers.items() if o), None)
    if sample is None:
        what = (f"its {len(layers)} layer(s) list no original_names" if layers
                else "it has no layers")
    else:
        what = (f"none of the original_names of its {len(layers)} layer(s) is a node or "
                f"tensor of this model (e.g. {sample[0]} <- '{sample[1][0]}')")
    return (f"the HN matched no node of this model: {what}; names below resolve by ONNX "
            "node name and by op-order guesses (conv1, softmax1, ...) instead")


def _apply_precision(
    cmd: AllsCommand,
    index: NameIndex,
    setters: dict[str, AllsCommand],
    overrides: dict[str, Precision],
    problems: list[Problem],
) -> None:
    text = cmd.keyword("precision_mode")
    try:
        precision = Precision.parse(text or "")
    except Exception:
        problems.append(
            _line_problem(
                cmd.line,
                cmd.text,
                "*",
                "alls.bad_precision",
                f"unknown precision_mode '{text}'",
                "use a8_w8, a8_w4, a16_w8 or a16_w16",
            )
        )
        return
    for group in _resolve(cmd, index, problems):
        overrides[group] = precision
        setters[group] = cmd


def _resolve(cmd: AllsCommand, index: NameIndex, problems: list[Problem]) -> list[str]:
    groups, guessed = [], []
    for pattern in layer_patterns(cmd):
        found, used = index.resolve(pattern)
        if not found:
            problems.append(
                _line_problem(
                    cmd.line,
                    cmd.text,
                    pattern,
                    "alls.unknown_layer",
                    f"'{pattern}' matches no layer of this model",
                    "check the name against the parsed HN (pass --hn for exact names)",
                    severity="warning",
                )
            )
        groups += found
        guessed += used
    if guessed:
        shown = ", ".join(guessed[:6]) + (" …" if len(guessed) > 6 else "")
        problems.append(
            _line_problem(
                cmd.line,
                cmd.text,
                ",".join(dict.fromkeys(groups)) or "*",
                "alls.guessed_name",
                f"layer names guessed by op order: {shown}",
                "pass the parsed model's HN JSON for exact names",
                severity="info",
            )
        )
    return list(dict.fromkeys(groups))


def _check_range(cmd: AllsCommand, index: NameIndex, problems: list[Problem]) -> None:
    text = cmd.keyword("force_range_out") or ""
    values = [v for v in split_args(text.strip()[1:-1])] if text.strip()[:1] == "[" else []
    try:
        lo, hi = (float(v) for v in values)
        ok = lo < hi
    except ValueError:
        ok = False
    if not ok:
        problems.append(
            _line_problem(
                cmd.line,
                cmd.text,
                "*",
                "alls.bad_range",
                f"force_range_out={text} is not [low, high] with low < high",
                "write force_range_out=[low, high]",
            )
        )
    _resolve(cmd, index, problems)


def _check_normalization(cmd: AllsCommand, problems: list[Problem]) -> None:
    lists = [split_args(p.strip()[1:-1]) for p in cmd.positional if p.strip()[:1] == "["]
    try:
        numbers = [[float(v) for v in lst] for lst in lists]
    except ValueError:
        numbers = []
    if len(numbers) != 2 or len(numbers[0]) != len(numbers[1]) or 0.0 in numbers[1]:
        problems.append(
            _line_problem(
                cmd.line,
                cmd.text,
                "*",
                "alls.bad_normalization",
                "normalization needs two lists of equal length (mean, std) with non-zero std",
                "write normalization([m, ..], [s, ..])",
            )
        )


def _attribute(problem: Problem, setters: dict[str, AllsCommand]) -> Problem:
    cmd = setters.get(problem.group)
    if cmd is None:
        return replace(problem, reason=f"default precision: {problem.reason}")
    return replace(problem, reason=f"line {cmd.line} `{cmd.text}`: {problem.reason}")


def lint(
    script_text: str,
    model: Model,
    groups: Groups,
    target: Target,
    *,
    hn: dict[str, Any] | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> list[Problem]:
    """Every line of a Hailo model script that will hit a wall on ``target``."""
    commands, problems = parse_alls(script_text)
    index = name_index(groups, model, hn)
    if index.hn_unmatched:
        problems.append(Problem(group="*", rule="alls.hn_unmatched", reason=index.hn_unmatched,
                                provenance=PROVENANCE, fix="pass the .hn of the model "
                                "parsed from this ONNX file (hailo parser), or no --hn",
                                severity="warning"))
    setters: dict[str, AllsCommand] = {}
    overrides: dict[str, Precision] = {}
    for cmd in commands:
        if cmd.command == "quantization_param" and cmd.keyword("precision_mode") is not None:
            _apply_precision(cmd, index, setters, overrides, problems)
        if cmd.command == "quantization_param" and cmd.keyword("force_range_out") is not None:
            _check_range(cmd, index, problems)
        elif cmd.command == "normalization":
            _check_normalization(cmd, problems)
        elif cmd.command not in KNOWN_COMMANDS:
            problems.append(
                _line_problem(
                    cmd.line,
                    cmd.text,
                    "*",
                    "alls.unknown_command",
                    f"'{cmd.command}' is not a command quantscope knows; not checked",
                    "check the spelling",
                    severity="warning",
                )
            )
    for number, text in enumerate(script_text.splitlines(), start=1):
        for unset in unset_decisions(text):  # a decision quantscope could not write
            problems.append(_line_problem(
                number, text, unset_group(unset), "alls.not_set",
                "a plan decision this script does not carry: the compiler applies the "
                "default to that layer", "write its quantization_param line with the layer's "
                "name from the parsed HN (or export again with --hn)", severity="warning"))
    plan = Plan(
        default=target.default_precision, overrides=tuple(overrides.items()), target=target.name
    )
    found = check(plan, groups, model, target, shapes=shapes)
    return problems + [_attribute(p, setters) for p in found]


def script_plan(
    script_text: str,
    groups: Groups,
    model: Model,
    target: Target,
    *,
    hn: dict[str, Any] | None = None,
) -> Plan:
    """The plan a script expresses (for parse-back tests and reports)."""
    commands, _ = parse_alls(script_text)
    index = name_index(groups, model, hn)
    overrides: dict[str, Precision] = {}
    for cmd in commands:
        if cmd.command == "quantization_param" and cmd.keyword("precision_mode") is not None:
            _apply_precision(cmd, index, {}, overrides, [])
    return Plan(
        default=target.default_precision, overrides=tuple(overrides.items()), target=target.name
    )
