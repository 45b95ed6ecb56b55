"""Exports of one plan in vendor formats (translation only): Hailo .alls, QNN encodings.

The formats are a registry (:mod:`.formats`, ``FORMATS``); :mod:`.plan_export` writes a
plan in one of them. Also the preflight of a user's own .alls script (:mod:`.alls_lint`).

The names below are imported on first use (PEP 562): the target profiles import
:mod:`.formats`, and importing this package face must not load the ``.alls`` lint (which
imports the planner above the profiles).
"""

from __future__ import annotations

from quantscope.lazy import lazy_face

_LAZY = {
    **dict.fromkeys(("lint", "parse_alls", "script_plan"), "quantscope.export.alls_lint"),
    **dict.fromkeys(("export_alls", "heuristic_names", "hn_layer_names"),
                    "quantscope.export.hailo_alls"),
    **dict.fromkeys(("export_qnn_encodings", "parse_qnn_encodings", "to_json"),
                    "quantscope.export.qnn_encodings"),
    **dict.fromkeys(("FORMATS", "ExportFormat", "ExportInput", "export_format"),
                    "quantscope.export.formats"),
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_face(__name__, _LAZY)
