"""A plan written in a vendor format (Hailo ``.alls``, QNN encodings) or as the QDQ
model, the checks that a plan meets its target and format, and the device I/O rows.

Moved here from ``quantscope.stages`` (which re-exports every name).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.serde import write_onnx, write_text
from quantscope.types import Encodings, Groups, Plan, QuantscopeError, Stats


def forced_ranges(
    groups: Groups, plan: Plan, enc: Encodings
) -> dict[str, tuple[float, float]]:
    """Group -> pinned output range, for tensors whose range method the plan overrides.

    On Hailo this becomes ``quantization_param(<layer>, force_range_out=[lo, hi])``: the
    compiler then uses the range quantscope measured instead of its own calibration.
    """
    owner = {t: g.name for g in groups.groups for t in g.outputs}
    out: dict[str, tuple[float, float]] = {}
    for tensor in dict(plan.ranges) | dict(plan.pinned):
        if tensor in owner and tensor in enc.activations:
            lo, hi = enc.activations[tensor].range()
            out[owner[tensor]] = (round(float(lo), 6), round(float(hi), 6))
    return out


# export format -> the vendor whose compiler reads it (QDQ ONNX: any)
FORMAT_VENDORS = {"alls": "Hailo", "qnn": "Qualcomm"}


def check_plan_target(plan: Plan, target: str | None, *, plan_name: str = "the plan") -> None:
    """Refuse a plan made for another target than the one it meets (``check``, ``lint``,
    ``run``): one line naming both. A plan that names no target meets any."""
    if plan.target and target and plan.target != target:
        raise QuantscopeError(
            f"{plan_name} was made for target '{plan.target}', not '{target}': use --target "
            f"{plan.target}, or plan again with --target {target} (a plan's legality and "
            "grid belong to its target)")


def check_plan_format(plan: Plan, fmt: str, *, plan_name: str = "the plan") -> None:
    """Refuse to write one vendor's file from a plan made for another vendor's target (a
    QNN plan as a Hailo ``.alls``): one line naming both."""
    from quantscope.targets import load_target

    vendor = FORMAT_VENDORS.get(fmt)
    if vendor is None or not plan.target:
        return
    try:
        target = load_target(plan.target)
    except QuantscopeError:
        return  # a target from a TOML file, not at hand by name: its vendor is unknown here
    if target.vendor != vendor:
        raise QuantscopeError(
            f"{plan_name} was made for target '{plan.target}' ({target.vendor}), and --format "
            f"{fmt} writes a {vendor} file: export it with --format "
            + next((f for f, v in FORMAT_VENDORS.items() if v == target.vendor), "qdq")
            + f", or plan again with a {vendor} --target")


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
    """Translate one plan into a vendor format (or the QDQ model) and write it atomically."""
    from quantscope.export.hailo_alls import export_alls, hn_layer_names
    from quantscope.export.qnn_encodings import export_qnn_encodings, to_json

    check_plan_format(plan, fmt)
    groups = find_groups(model)
    q = quantize_model(model, stats, plan, scheme=scheme_for(plan), groups=groups)
    enc = q.encodings
    if fmt == "alls":
        names = hn_layer_names(hn, groups) if hn else None
        return write_text(out, export_alls(plan, groups, layer_names=names,
                                           force_ranges=forced_ranges(groups, plan, enc)))
    if fmt == "qnn":
        return write_text(out, to_json(export_qnn_encodings(plan, groups, enc, version=qnn_version)))
    if fmt == "qdq":
        return write_onnx(out, q.proto)
    raise QuantscopeError(f"unknown export format '{fmt}': use alls, qnn or qdq")


def device_io_rows(model: Model, stats: Stats, plan: Plan) -> list[dict[str, Any]]:
    """Stored type, scale and zero-point of every quantized model input and output."""
    from quantscope.export.device_io import device_io

    groups = find_groups(model)
    q = quantize_model(model, stats, plan, scheme=scheme_for(plan), groups=groups)
    return device_io(model, groups, q.encodings)
