"""How to feed and read the deployed model: stored type, scale and zero-point per I/O.

Hailo (and QNN) store every quantized value as an integer with its own scale and
zero-point: ``real = (q - zero_point) * scale`` and ``q = round(real / scale) +
zero_point``. A 16-bit unsigned output reads 0..65535; reading it as signed or with a
hand-written 0/127/255 mapping is the classic mistake of the field reports.
"""

from __future__ import annotations

from typing import Any

from quantscope.model.load import Model
from quantscope.types import Encodings, Groups


def device_io(model: Model, groups: Groups, encodings: Encodings) -> list[dict[str, Any]]:
    """One row per quantized model input / output (float ones are left out)."""
    root = {t: chain[0] for chain in groups.shared for t in chain[1:]}
    rows = []
    for role, names in (("input", groups.model_inputs), ("output", model.output_names())):
        for name in names:
            enc = encodings.activations.get(root.get(name, name))
            if enc is None:
                continue
            rows.append({
                "role": role, "tensor": name, "bits": enc.bits, "signed": enc.signed,
                "scale": float(enc.scale), "zero_point": int(enc.zero_point),
                "min": float(enc.range()[0]), "max": float(enc.range()[1]),
            })
    return rows


def format_device_io(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no quantized model inputs or outputs (they stay float under this plan)"
    lines = []
    for r in rows:
        kind = f"{'int' if r['signed'] else 'uint'}{r['bits']}"
        lines.append(
            f"{r['role']:<6} {r['tensor']}: stored as {kind}, scale {r['scale']:.8g}, "
            f"zero point {r['zero_point']} (range {r['min']:.6g} .. {r['max']:.6g})\n"
            f"       to device:   q = clip(round(x / {r['scale']:.8g}) + {r['zero_point']})\n"
            f"       from device: x = (q - {r['zero_point']}) * {r['scale']:.8g}"
        )
    return "\n".join(lines)
