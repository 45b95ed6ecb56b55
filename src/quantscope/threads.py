"""How many threads one quantscope process computes with: ``$QUANTSCOPE_THREADS``.

==================  ===============================================================
unset or ``0``      ONNX Runtime's and PyTorch's own defaults (one thread per core)
``N`` (N >= 1)      every ONNX Runtime session's intra-op pool and PyTorch's CPU pool
                    use N threads: for several quantscope processes on one machine
                    (the test suite runs two, ``make test``), so that they do not
                    oversubscribe the cores. The figures do not depend on it.
==================  ===============================================================
"""

from __future__ import annotations

import os

from quantscope.types import QuantscopeError

THREADS_ENV = "QUANTSCOPE_THREADS"


def default_threads() -> int:
    """``$QUANTSCOPE_THREADS`` as a count (0: the runtimes' own default)."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise QuantscopeError(
            f"{THREADS_ENV}={raw!r} is not a thread count: set it to a whole number "
            "(0 or unset: one thread per core)")
    return value


__all__ = ["THREADS_ENV", "default_threads"]
