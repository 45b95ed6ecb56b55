"""A plan written in one export format (:data:`quantscope.export.formats.FORMATS`: Hailo
``.alls``, QNN encodings, the QDQ model), the checks that a plan meets its target and
format, and the device I/O rows.

Moved here from ``quantscope.stages`` (which re-exports every name).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.export.device_io import device_io, float_io
from quantscope.export.formats import FORMATS, ExportInput, export_format
from quantscope.export.hailo_alls import (
    calibrated_alike,
    forced_ranges,
    hn_layer_names,
    one_line,
    unnamed_groups,
)
from quantscope.export.kv_prefix import plan_alls_note
from quantscope.export.qnn_encodings import unencoded_tensors
from quantscope.model.groups import find_groups
from quantscope.model.host_gather import host_gathers, host_groups
from quantscope.model.load import Model
from quantscope.plan.accepted import accepted_lines, accepted_of
from quantscope.plan.deployment import Deployment
from quantscope.serde import bytes_writer, write_atomic
from quantscope.targets import load_target
from quantscope.types import Plan, QuantscopeError, Stats

__all__ = ["FORMAT_VENDORS", "alls_target", "check_plan_format", "check_plan_target",
           "device_io_rows", "export_plan", "float_io_rows", "forced_ranges", "qnn_unencoded",
           "scripted_deployment", "scripted_plan"]

# export format -> the vendor whose compiler reads it (QDQ ONNX: any), from the registry
FORMAT_VENDORS = {f.name: f.vendor for f in FORMATS.values() if f.vendor}


def check_plan_target(plan: Plan, target: str | None, *, plan_name: str = "the plan") -> None:
    """Refuse a plan made for another target than the one it meets (``check``, ``lint``,
    ``run``): one line naming both. A plan that names no target meets any."""
    if plan.target and target and plan.target != target:
        raise QuantscopeError(
            f"{plan_name} was made for target '{plan.target}', not '{target}': use --target "
            f"{plan.target}, or plan again with --target {target} (a plan's legality and "
            "grid belong to its target)")


def check_plan_format(plan: Plan, fmt: str, *, plan_name: str = "the plan",
                      given: bool = False) -> None:
    """Refuse to write one vendor's file from a plan made for another vendor's target (a
    QNN plan as a Hailo ``.alls``): one line naming both. ``given``: the plan's target is
    the ``--target`` given for a plan that named none."""
    vendor = FORMATS[fmt].vendor if fmt in FORMATS else None
    if vendor is None or not plan.target:
        return
    try:
        target = load_target(plan.target)
    except QuantscopeError:
        return  # a target from a TOML file, not at hand by name: its vendor is unknown here
    if target.vendor != vendor:
        whose = (f"--target {plan.target} is a {target.vendor} target" if given else
                 f"{plan_name} was made for target '{plan.target}' ({target.vendor})")
        raise QuantscopeError(
            f"{whose}, and --format {fmt} writes a {vendor} file: export it with --format "
            + next((f.name for f in FORMATS.values() if f.vendor == target.vendor), "qdq")
            + f", or {'give' if given else 'plan again with'} a {vendor} --target")


def alls_target(text: str) -> str | None:
    """The target a quantscope ``.alls`` names in its first line, if any."""
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    prefix = "# quantscope plan for "
    if not first.startswith(prefix):
        return None
    name = first[len(prefix):].split(":")[0].strip()
    return None if name in ("", "hailo") else name


def export_plan(
    model: Model,
    stats: Stats,
    plan: Plan,
    *,
    fmt: str,
    out: str | Path,
    hn: dict[str, Any] | None = None,
    qnn_version: str = "1.0.0",
) -> Path:
    """Translate one plan into an export format (the registry's translator) and write it
    atomically."""
    entry = export_format(fmt)
    check_plan_format(plan, fmt)
    groups = find_groups(model)
    q = quantize_model(model, stats, plan, scheme=scheme_for(plan), groups=groups)
    host = host_groups(groups, host_gathers(model, _host_rows(plan)))
    data = entry.translate(ExportInput(plan, groups, q.encodings, q.proto, hn=hn,
                                       qnn_version=qnn_version, host=host))
    accepted = accepted_lines(accepted_of(plan)) if fmt == "alls" else []
    if accepted:  # the warnings the plan accepted (--allow-warning), after the first line
        head, _, rest = data.partition(b"\n")
        said = "".join(f"# {one_line(line)}\n" for line in accepted)
        data = head + b"\n" + said.encode() + rest
    note = plan_alls_note(plan) if fmt == "alls" else None
    if note:  # a decoder plan with a constant KV prefix: how it reaches the device
        data = note.encode() + b"\n" + data
    return write_atomic(out, bytes_writer(data))


def qnn_unencoded(model: Model) -> list[tuple[str, str]]:
    """(tensor, group) for each tensor inside a group of ``model`` that its QNN encodings
    file has no encoding for (:func:`quantscope.export.qnn_encodings.unencoded_tensors`)."""
    outputs = {n.name: tuple(n.output) for n in model.graph.node}
    return unencoded_tensors(find_groups(model), outputs)


def scripted_plan(model: Model, plan: Plan, *, hn: dict[str, Any] | None = None
                  ) -> tuple[Plan, tuple[str, ...]]:
    """The plan as its Hailo script carries it, and the groups that differ. A group the
    script cannot name (``unnamed_groups``: no HN name, no guess; a host lookup aside) is
    in the compiler's hands: a precision off the plan's default falls to the default, and
    a pinned range or a range method that moves the range off min/max (what
    ``force_range_out`` would carry) falls to the compiler's own calibrated min/max."""
    groups = find_groups(model)
    unset = (unnamed_groups(groups, hn_layer_names(hn, groups) if hn else None)
             - host_groups(groups, host_gathers(model, _host_rows(plan))))
    lost = {g for g in unset if plan.precision_of(g) is not plan.default}
    overrides = tuple((g, p) for g, p in plan.overrides if g not in lost)
    owner = {t: g.name for g in groups.groups for t in g.outputs if g.name in unset}
    methods, pinned = dict(plan.ranges), dict(plan.pinned)
    for tensor in sorted(set(methods) | set(pinned)):
        group = owner.get(tensor)
        if group is None:
            continue
        precision = plan.default if group in lost else plan.precision_of(group)
        if tensor in pinned or not calibrated_alike(methods[tensor], precision):
            methods[tensor] = "minmax"
            pinned.pop(tensor, None)
            lost.add(group)
    if not lost:
        return plan, ()
    return dataclasses.replace(plan, overrides=overrides, ranges=tuple(methods.items()),
                               pinned=tuple(pinned.items())), tuple(sorted(lost))


def scripted_deployment(deployment: Deployment, *, hn: dict[str, Any] | None = None
                        ) -> tuple[Deployment, dict[int, tuple[str, ...]]]:
    """The deployment as its compiled lengths' Hailo scripts carry it (:func:`scripted_plan`
    per length), and per length the groups that differ (lengths with none left out)."""
    buckets, lost = [], {}
    for b in deployment.buckets:
        plan, groups = scripted_plan(b.model, b.plan, hn=hn)
        buckets.append(dataclasses.replace(b, plan=plan))
        if groups:
            lost[b.seq_len] = groups
    return dataclasses.replace(deployment, buckets=tuple(buckets)), lost


def _host_rows(plan: Plan) -> int:
    try:
        return load_target(plan.target).host_rows if plan.target else 0
    except QuantscopeError:
        return 0  # a target from a TOML file, not at hand by name


def device_io_rows(model: Model, stats: Stats, plan: Plan) -> list[dict[str, Any]]:
    """Stored type, scale and zero-point of every quantized model input and output (and
    of the rows each lookup the plan's target leaves to the host feeds the device)."""
    groups = find_groups(model)
    q = quantize_model(model, stats, plan, scheme=scheme_for(plan), groups=groups)
    rows = load_target(plan.target).host_rows if plan.target else 0
    return device_io(model, groups, q.encodings, host_gathers(model, rows))


def float_io_rows(model: Model, plan: Plan) -> list[dict[str, str]]:
    """The float model inputs and outputs the plan leaves float (``device_io.float_io``)."""
    return float_io(model, find_groups(model), plan)
