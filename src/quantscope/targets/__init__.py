"""Built-in target profiles (one TOML file each, next to this module).

``load_target("hailo10h")`` loads a built-in profile; a path to a ``.toml`` file loads
a user's own. Names accept ``-`` or ``_`` (``qnn-htp-v73`` = ``qnn_htp_v73``).
"""

from __future__ import annotations

from pathlib import Path

from quantscope.targets.profile import (
    CostModel,
    Param,
    Rule,
    Target,
    load_target_file,
    op_kind,
    parse_target,
    with_params,
)
from quantscope.types import QuantscopeError

_HERE = Path(__file__).parent
BUILTIN_TARGETS: dict[str, str] = {
    "hailo8": "hailo8.toml",
    "hailo8l": "hailo8l.toml",
    "hailo10h": "hailo10h.toml",
    "qnn_htp_v73": "qnn_htp_v73.toml",
    "ort_cpu": "ort_cpu.toml",
}


def load_target(name_or_path: str | Path) -> Target:
    """A built-in target by name, or a profile TOML file by path."""
    text = str(name_or_path)
    if text.endswith(".toml") or "/" in text:
        return load_target_file(text)
    key = text.strip().lower().replace("-", "_")
    if key not in BUILTIN_TARGETS:
        names = ", ".join(n.replace("_", "-") for n in BUILTIN_TARGETS)
        raise QuantscopeError(f"unknown target '{text}': use one of {names} or a .toml path")
    return load_target_file(_HERE / BUILTIN_TARGETS[key])


__all__ = [
    "BUILTIN_TARGETS",
    "CostModel",
    "Param",
    "Rule",
    "Target",
    "load_target",
    "load_target_file",
    "op_kind",
    "parse_target",
    "with_params",
]
