"""A wrapper that logs each call's name before making it (tests of what a stage runs, and
in which order)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def recorded(events: list[str], name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    """``real``, appending ``name`` to ``events`` on each call."""
    def call(*a: Any, **k: Any) -> Any:
        events.append(name)
        return real(*a, **k)
    return call
