"""Plan -> Hailo model script (``.alls``) text. Translation only: no legality decisions.

Hailo layer names (``conv4``, ``normalization1``, ``ew_add3`` ...) are not ONNX names.
The translation is explicit:

==================  ==============================================================
exact               the parsed model's HN JSON: each layer lists its ONNX
                    ``original_names``; :func:`hn_layer_names` turns it into
                    ONNX group name -> Hailo layer name
guessed             :data:`HAILO_PREFIXES`: ``<prefix><i>`` = the i-th group (1-based,
                    graph order) that the prefix's predicate selects; every guessed
                    name is marked ``# guessed name`` in the script
==================  ==============================================================

A decision with no Hailo layer name (an op kind no prefix covers: ``Exp``, ``ReduceMax``,
``Min`` of the ``rowscale`` Softmax, a decoder's ``RMSNormalization`` and RoPE ``Neg``) is
written as a ``# ... NOT SET`` comment naming its op kind: the compiler would not apply it,
and :func:`unset_decisions` is what every verdict counts. A table lookup the target leaves
to the host (``host``) is not a compiler decision: its comment says so, without NOT SET.

Script lines written (syntax as in the Hailo field reports, seeds/001 and 002)::

    quantization_param({*}, precision_mode=a16_w8)        # non-a8_w8 plan default
    quantization_param(conv18, precision_mode=a16_w16)    # one line per override
    quantization_param(conv18, force_range_out=[-1.1, 1.1])
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from quantscope.numerics import MSE_MAX_BITS
from quantscope.types import (
    Encodings,
    Group,
    GroupKind,
    Groups,
    Plan,
    Precision,
    QuantscopeError,
)


def _weighted(g: Group) -> bool:
    return g.kind is GroupKind.WEIGHTED


def _act(op_type: str) -> Callable[[Group], bool]:
    return lambda g: g.kind is GroupKind.ACTIVATION and g.op_type == op_type


def _conv(g: Group) -> bool:
    """Conv and linear MatMul parse to conv layers; a depthwise Conv (dw), a Gemm (fc) and
    a ConvTranspose (deconv) are counted apart (the Hailo Model Zoo's scripts name
    ``dw1``…``dw14`` beside ``conv`` layers, ``fc1`` for a classifier Gemm and
    ``deconv1``…``deconv3`` beside ``conv56``…``conv65``)."""
    return _weighted(g) and not g.depthwise and g.op_type not in ("Gemm", "ConvTranspose")


# prefix -> which groups it counts; the first prefix that selects a group names it on export
HAILO_PREFIXES: dict[str, Callable[[Group], bool]] = {
    "conv": _conv,
    "dw": lambda g: _weighted(g) and g.depthwise,
    "fc": lambda g: _weighted(g) and g.op_type == "Gemm",
    "deconv": lambda g: _weighted(g) and g.op_type == "ConvTranspose",
    "normalization": _act("LayerNormalization"),
    "layer_normalization": _act("LayerNormalization"),
    "mul_and_add": _act("LayerNormalization"),
    "batch_norm": _act("BatchNormalization"),
    "softmax": _act("Softmax"),
    "matmul": _act("MatMul"),
    "ew_add": _act("Add"),
    "ew_sub": _act("Sub"),
    "ew_mult": _act("Mul"),
    "ew_div": _act("Div"),
    "maxpool": _act("MaxPool"),
    "avgpool": lambda g: (
        g.kind is GroupKind.ACTIVATION and g.op_type in ("AveragePool", "GlobalAveragePool")
    ),
    "concat": _act("Concat"),
    "reduce_sum": _act("ReduceSum"),
    "reduce_mean": _act("ReduceMean"),
    "resize": _act("Resize"),  # the DFC's resize layers (nearest / bilinear upsampling)
}


def heuristic_names(groups: Groups) -> dict[str, str]:
    """Guessed Hailo layer name -> group name, for every prefix in :data:`HAILO_PREFIXES`."""
    out: dict[str, str] = {}
    for prefix, selects in HAILO_PREFIXES.items():
        chosen = [g.name for g in groups.groups if selects(g)]
        for i, name in enumerate(chosen, start=1):
            out[f"{prefix}{i}"] = name
    return out


def short_layer_name(name: str) -> str:
    """``net_name/conv4`` -> ``conv4`` (scripts may use either form)."""
    return name.rsplit("/", 1)[-1]


def hn_layers(hn: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """Hailo layer (short name) -> its ONNX original names, from a parsed HN JSON dict."""
    layers = hn.get("layers") if isinstance(hn, dict) else None
    if not isinstance(layers, dict):
        raise QuantscopeError(
            "HN JSON has no 'layers' table: pass the .hn file of the parsed model"
        )
    out: dict[str, tuple[str, ...]] = {}
    for name, layer in layers.items():
        originals = layer.get("original_names", []) if isinstance(layer, dict) else []
        out[short_layer_name(name)] = tuple(str(o) for o in originals)
    return out


def hn_groups(hn: dict[str, Any], groups: Groups) -> dict[str, str]:
    """Hailo layer name -> group name, for layers whose original names hit a group's nodes."""
    owner: dict[str, str] = {}
    for g in groups.groups:
        for key in (*g.nodes, *g.outputs):
            owner.setdefault(key, g.name)
    out: dict[str, str] = {}
    for layer, originals in hn_layers(hn).items():
        hit = next((owner[o] for o in originals if o in owner), None)
        if hit is not None:
            out[layer] = hit
    return out


def hn_layer_names(hn: dict[str, Any], groups: Groups) -> dict[str, str]:
    """ONNX group name -> Hailo layer name (the first HN layer that holds the group's nodes).

    A group that the HN splits into several layers maps to the one holding its anchor
    node when there is one.
    """
    by_group: dict[str, str] = {}
    layers = hn_layers(hn)
    for layer, group in hn_groups(hn, groups).items():
        if group in layers[layer] or group not in by_group:
            by_group[group] = layer
    return by_group


_WRITABLE = re.compile(r"[\w./-]+", re.ASCII)  # what a script's layer argument can hold


def one_line(text: str) -> str:
    """``text`` on one script line: each character that is not printable (a newline, a
    carriage return, a line separator in an ONNX name) written as its Python escape
    (``\\n``), so a name in a ``#`` comment can never start a script line of its own."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def unwritable_layers(layer_names: dict[str, str] | None) -> dict[str, str]:
    """Group -> its exact Hailo layer name, for names a script line cannot hold (a comma,
    a parenthesis, a brace, ``=``, ``#`` or a space would change the line's meaning)."""
    return {g: n for g, n in (layer_names or {}).items() if not _WRITABLE.fullmatch(n)}


def _names(groups: Groups, layer_names: dict[str, str] | None) -> dict[str, tuple[str, bool]]:
    """Group -> (Hailo layer name, guessed?); a group whose exact name cannot be written
    (:func:`unwritable_layers`) has none: its decisions are written NOT SET."""
    bad = unwritable_layers(layer_names)
    guessed = {g: n for n, g in reversed(heuristic_names(groups).items()) if g not in bad}
    exact = {g: n for g, n in (layer_names or {}).items() if g not in bad}
    return {
        g.name: (exact[g.name], False) if g.name in exact else (guessed[g.name], True)
        for g in groups.groups
        if g.name in exact or g.name in guessed
    }


def unnamed_groups(groups: Groups, layer_names: dict[str, str] | None = None) -> frozenset[str]:
    """The groups a script cannot name (no HN name, no guess): a decision on one is written
    NOT SET, so the compiler applies the script's default to it."""
    return frozenset(g.name for g in groups.groups) - set(_names(groups, layer_names))


def _layer(group: str, names: dict[str, tuple[str, bool]], lines: list[str]) -> str:
    if group not in names:
        raise QuantscopeError(f"no Hailo layer name for group '{group}': pass an HN mapping")
    name, guessed = names[group]
    if guessed:
        lines.append(f"# guessed name: {name} for ONNX '{group}' (check against the parsed HN)")
    return name


UNSET = "NOT SET"  # marks a plan decision the script does not carry
GUESSED = "guessed by op order"  # in the header: the layer names are guessed


def _unnamed(op_type: str, layer: str | None = None) -> str:
    if layer is not None:
        return (f"its Hailo layer name {one_line(repr(layer))} cannot be written in a script "
                "line (only letters, digits and _ . / - can): set it by hand")
    return (f"no Hailo layer name known for its {op_type} layer: give the HN parsed from "
            "this model or set it by hand")


# An unset decision as the Hailo script writes it (``<group>: <precision> NOT SET: <why>``
# or ``<group>: pinned range [lo, hi] NOT SET: <why>``, why: no layer name, or one a
# script line cannot hold), read by its structure: a name that merely holds the words
# (a node called "x NOT SET", a guessed-name or reason comment about it) is no decision.
UNSET_DECISION = re.compile(
    r": (?:" + "|".join(p.value for p in Precision) + r"|pinned range \[[^\]]*\]) "
    + re.escape(UNSET) + r": (?:no Hailo layer name known for (?:its (?P<op>\S+) layer|it\b)"
    r"|its Hailo layer name .* cannot be written)")


def unset_decisions(text: str) -> list[str]:
    """The decisions a script written by :func:`export_alls` does not carry (its
    ``# ... NOT SET`` comments, without the ``#``, read by :data:`UNSET_DECISION`'s
    structure: a comment that merely holds the words is none)."""
    return [ln.lstrip("# ") for ln in text.splitlines()
            if ln.startswith("#") and UNSET_DECISION.search(ln)]


def unset_group(decision: str) -> str:
    """The group an :func:`unset_decisions` line is about (its name may hold ``:``)."""
    *_, last = UNSET_DECISION.finditer(decision)
    return decision[:last.start()]


def names_guessed(text: str) -> bool:
    """Whether the script's Hailo layer names were guessed by op order (no HN, or an HN
    that matched nothing)."""
    return any(ln.startswith("# layer names:") and GUESSED in ln for ln in text.splitlines())


def script_warnings(scripts: dict[str, str], *, hn_option: str = "--hn") -> list[str]:
    """What scripts (name -> text) do not carry, each line led by its script's name:
    their NOT SET decisions, then which scripts have guessed layer names."""
    out, guessed = [], []
    for name, text in scripts.items():
        out += [f"{name}: {ln}" for ln in unset_decisions(text)]
        if names_guessed(text):
            guessed.append(name)
    if guessed:
        out.append(f"{', '.join(guessed)}: Hailo layer names guessed by op order; check "
                   f"them against the parsed HN or rerun with {hn_option}")
    return out


def export_alls(
    plan: Plan,
    groups: Groups,
    *,
    layer_names: dict[str, str] | None = None,
    force_ranges: dict[str, tuple[float, float]] | None = None,
    target_label: str | None = None,
    host: frozenset[str] = frozenset(),
) -> str:
    """Hailo model script for ``plan``; ``layer_names`` maps group -> Hailo layer (exact);
    ``host``: the groups the target leaves to the host (table lookups)."""
    names = _names(groups, layer_names)
    bad = unwritable_layers(layer_names)
    ops = {g.name: g.op_type for g in groups.groups}
    label = target_label or plan.target or "hailo"
    lines = [
        f"# quantscope plan for {label}: default {plan.default}",
        "# layer names: "
        + (
            f"from the HN; any others {GUESSED}"
            if layer_names
            else f"{GUESSED} (no HN given)"
            if layer_names is None
            else f"{GUESSED}: the HN given matched no node of this model (pass "
            "the .hn parsed from this ONNX file)"
        ),
    ]
    if plan.default is Precision.FLOAT:
        raise QuantscopeError("a Hailo script cannot express a float default: use a8_w8")
    if plan.default is not Precision.A8_W8:
        # every layer: the glob in braces, as the Hailo Model Zoo's scripts write it
        lines.append(f"quantization_param({{*}}, precision_mode={plan.default})")
    reasons = dict(plan.reasons)
    for group, precision in plan.overrides:
        if precision is Precision.FLOAT:
            raise QuantscopeError(
                f"group '{group}' is float, which Hailo cannot run: "
                "choose an integer precision for it"
            )
        if group in host:  # a lookup outside the compiled graph: not the compiler's
            lines.append(f"# {group}: {precision}: runs on the host (a table lookup the "
                         "target leaves outside the compiled graph): nothing to set")
            continue
        if group not in names:
            lines.append(f"# {group}: {precision} {UNSET}: "
                         + _unnamed(ops.get(group, "?"), bad.get(group)))
            continue
        if group in reasons:
            lines.append(f"# {group}: {reasons[group]}")
        layer = _layer(group, names, lines)
        lines.append(f"quantization_param({layer}, precision_mode={precision})")
    for group, (lo, hi) in (force_ranges or {}).items():
        if group in host:
            lines.append(f"# {group}: runs on the host: range [{lo!r}, {hi!r}] not pinned")
            continue
        if group not in names:
            lines.append(f"# {group}: pinned range [{lo!r}, {hi!r}] {UNSET}: "
                         + _unnamed(ops.get(group, "?"), bad.get(group)))
            continue
        lines.append(f"# {group}: pinned output range")
        layer = _layer(group, names, lines)
        lines.append(f"quantization_param({layer}, force_range_out=[{lo!r}, {hi!r}])")
    # an ONNX name is free text: each line stays one line whatever the names hold
    return "\n".join(one_line(ln) for ln in lines) + "\n"


def calibrated_alike(method: str, precision: Precision) -> bool:
    """Whether ``method`` at ``precision`` gives the calibrated min/max anyway (``minmax``;
    ``mse`` above :data:`~quantscope.numerics.MSE_MAX_BITS`, e.g. a 16-bit output)."""
    bits = precision.act_bits
    return method == "minmax" or (method == "mse" and bits is not None and bits > MSE_MAX_BITS)


def forced_ranges(
    groups: Groups, plan: Plan, enc: Encodings
) -> dict[str, tuple[float, float]]:
    """Group -> pinned output range, for tensors whose range method the plan overrides (and
    that method moves the range off min/max at the group's precision) or that it pins.

    On Hailo this becomes ``quantization_param(<layer>, force_range_out=[lo, hi])``: the
    compiler then uses the range quantscope measured instead of its own calibration.
    """
    owner = {t: g.name for g in groups.groups for t in g.outputs}
    out: dict[str, tuple[float, float]] = {}
    methods, pinned = dict(plan.ranges), dict(plan.pinned)
    for tensor in methods | pinned:
        if tensor not in pinned and tensor in owner and calibrated_alike(
                methods[tensor], plan.precision_of(owner[tensor])):
            continue  # the compiler's own min/max is this range: nothing to pin
        if tensor in owner and tensor in enc.activations:
            lo, hi = enc.activations[tensor].range()
            out[owner[tensor]] = (round(float(lo), 6), round(float(hi), 6))
    return out
