"""Exports of one plan in vendor formats (translation only): Hailo .alls, QNN encodings.

Also the preflight of a user's own .alls script (:mod:`.alls_lint`).
"""

from quantscope.export.alls_lint import lint, parse_alls, script_plan
from quantscope.export.hailo_alls import export_alls, heuristic_names, hn_layer_names
from quantscope.export.qnn_encodings import export_qnn_encodings, parse_qnn_encodings, to_json

__all__ = [
    "export_alls",
    "export_qnn_encodings",
    "heuristic_names",
    "hn_layer_names",
    "lint",
    "parse_alls",
    "parse_qnn_encodings",
    "script_plan",
    "to_json",
]
