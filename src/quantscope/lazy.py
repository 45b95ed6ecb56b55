"""Package faces whose names load on first use (PEP 562), written once.

``__getattr__, __dir__ = lazy_face(__name__, {"name": "quantscope.module", ...})`` in a
package's ``__init__.py``: ``package.name`` imports its home module the first time it is
read and is a plain attribute after that, so importing the package loads none of them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_face(package: str, homes: Mapping[str, str]
              ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose ``homes`` map each lazy
    name to the module that defines it."""
    space = sys.modules[package].__dict__

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module '{package}' has no attribute '{name}'")
        value = getattr(importlib.import_module(home), name)
        space[name] = value  # once loaded, a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted({*space, *homes})

    return __getattr__, __dir__


__all__ = ["lazy_face"]
