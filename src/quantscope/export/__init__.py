"""Exports of one plan in vendor formats (translation only): Hailo .alls, QNN encodings.

The formats are a registry (:mod:`.formats`, ``FORMATS``); :mod:`.plan_export` writes a
plan in one of them. Also the preflight of a user's own .alls script (:mod:`.alls_lint`).

The names below are imported on first use (PEP 562): the target profiles import
:mod:`.formats`, and importing this package face must not load the ``.alls`` lint (which
imports the planner above the profiles).
"""

from __future__ import annotations

import importlib

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


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'quantscope.export' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
