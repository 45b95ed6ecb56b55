"""The export formats: one entry per format, the one place that says what a format is.

An entry names the format, the file ``quantscope run`` writes it to, the vendor whose
compiler reads it (``None``: any), what the file is for, and its translator. A target
profile says which formats its compiler takes (``formats = ["alls"]`` in its TOML; the
loader checks each name against :data:`FORMATS`); ``quantscope export --format`` and the
run's export step both write through :func:`quantscope.export.plan_export.export_plan`,
which looks the format up here. Adding a format is one translator module plus one entry.

A translator gets the quantized plan (:class:`ExportInput`) and returns the file's bytes;
the caller writes them atomically. This module sits low (the target profiles import it),
so it and its translators import only :mod:`quantscope.types` and their own modules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quantscope.export.hailo_alls import export_alls, forced_ranges, hn_layer_names
from quantscope.export.qnn_encodings import export_qnn_encodings, to_json
from quantscope.types import Encodings, Groups, Plan, QuantscopeError

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True, eq=False)
class ExportInput:
    """What a translator may read: the plan, its groups, the quantized model and options."""

    plan: Plan
    groups: Groups
    encodings: Encodings
    qdq: onnx.ModelProto  # the QDQ model quantscope emulated
    hn: dict[str, Any] | None = None  # Hailo: the parsed HN (exact layer names)
    qnn_version: str = "1.0.0"  # QNN: the encodings file version
    host: frozenset[str] = frozenset()  # groups the target leaves to the host (lookups)


@dataclass(frozen=True)
class ExportFormat:
    name: str
    file_name: str  # the file ``quantscope run`` writes
    vendor: str | None  # the vendor whose compiler reads it; None: any
    purpose: str  # what the file is for, as the run's verdict says
    translate: Callable[[ExportInput], bytes]


def _alls(inp: ExportInput) -> bytes:
    names = hn_layer_names(inp.hn, inp.groups) if inp.hn else None
    return export_alls(inp.plan, inp.groups, layer_names=names,
                       force_ranges=forced_ranges(inp.groups, inp.plan, inp.encodings),
                       host=inp.host).encode("utf-8")


def _qnn(inp: ExportInput) -> bytes:
    doc = export_qnn_encodings(inp.plan, inp.groups, inp.encodings, version=inp.qnn_version)
    return to_json(doc).encode("utf-8")


def _qdq(inp: ExportInput) -> bytes:
    return inp.qdq.SerializeToString()


FORMATS: dict[str, ExportFormat] = {
    "alls": ExportFormat("alls", "model.alls", "Hailo",
                         "Hailo model script: the per-layer precisions and pinned ranges "
                         "(pass it with the model to the Dataflow Compiler)", _alls),
    "qnn": ExportFormat("qnn", "qnn.encodings.json", "Qualcomm",
                        "QNN/AIMET encodings (--quantization_overrides for the QNN converter)",
                        _qnn),
    "qdq": ExportFormat("qdq", "quantized.qdq.onnx", None,
                        "ONNX QDQ model: what quantscope emulated (for ONNX Runtime, or to "
                        "check the compiler's result against)", _qdq),
}
ALWAYS = "qdq"  # every target takes the QDQ model; ``run`` always writes it


def export_format(name: str) -> ExportFormat:
    """The registry entry for ``name``, or one line listing the formats there are."""
    found = FORMATS.get(name)
    if found is None:
        raise QuantscopeError(f"unknown export format '{name}': use {_choices()}")
    return found


def _choices() -> str:
    names = list(FORMATS)
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]


def vendor_formats(vendor: str) -> tuple[str, ...]:
    """The formats a vendor's compiler reads (a profile that names none takes these)."""
    return tuple(f.name for f in FORMATS.values() if f.vendor == vendor)
