"""Built-in target profiles (one TOML file each, next to this module).

``load_target("hailo10h")`` loads a built-in profile; a path to a ``.toml`` file loads
a user's own. Names accept ``-`` or ``_`` (``qnn-htp-v73`` = ``qnn_htp_v73``).
"""

from __future__ import annotations

import dataclasses
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


# profile files loaded in this process, by their `name` (a plan names its target by name:
# the stages of one `run --target ./my.toml` look it up again by that name); a file named
# like a built-in profile is not recorded here (the built-in keeps its name: `_builtin_copy`
# refuses such a file unless it states what the built-in states)
_USER_TARGETS: dict[str, Target] = {}


def _key(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def _builtin_copy(target: Target) -> None:
    """A profile file named like a built-in must be that built-in (e.g. a copy of its file):
    every later stage, and a later command, reads the plan's target by that name, so an
    edited file would be replaced by the built-in without a word."""
    builtin = load_target_file(_HERE / BUILTIN_TARGETS[_key(target.name)])
    if dataclasses.replace(target, source=builtin.source) != builtin:
        raise QuantscopeError(
            f"target profile '{target.source}' is named '{target.name}', a built-in target, "
            f"but states other values (a plan names its target by name, so later stages "
            f"would read the built-in): rename it, e.g. name = \"my_{_key(target.name)}\"")


def load_target(name_or_path: str | Path) -> Target:
    """A built-in target by name, a profile TOML file by path, or by name a profile file
    this process loaded before."""
    text = str(name_or_path)
    if text.endswith(".toml") or "/" in text:
        target = load_target_file(text)
        if _key(target.name) in BUILTIN_TARGETS:
            _builtin_copy(target)
        else:
            _USER_TARGETS[_key(target.name)] = target
        return target
    key = _key(text)
    if key in BUILTIN_TARGETS:
        return load_target_file(_HERE / BUILTIN_TARGETS[key])
    if key in _USER_TARGETS:
        return _USER_TARGETS[key]
    names = ", ".join(n.replace("_", "-") for n in BUILTIN_TARGETS)
    raise QuantscopeError(f"unknown target '{text}': use one of {names} or a .toml path (a "
                          "plan made with a profile file names that file's 'name': give the "
                          "file again with --target)")


def loaded_profiles() -> dict[str, Target]:
    """The profile files this process loaded, by name (what a worker process needs to know
    for the plans it is sent: :func:`know_profiles`)."""
    return dict(_USER_TARGETS)


def know_profiles(profiles: dict[str, Target]) -> None:
    """Know ``profiles`` (:func:`loaded_profiles` of another process) by name here, as if
    this process had loaded their files (a Ray worker, for the plans it measures)."""
    _USER_TARGETS.update(profiles)


__all__ = [
    "BUILTIN_TARGETS",
    "CostModel",
    "Param",
    "Rule",
    "Target",
    "load_target",
    "know_profiles",
    "load_target_file",
    "loaded_profiles",
    "op_kind",
    "parse_target",
    "with_params",
]
