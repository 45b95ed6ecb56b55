"""Giving memory back to the OS between large steps, when there is something to give.

A garbage collection (reference cycles holding sessions or arrays), the shared ONNX
Runtime arena's free chunks (:func:`~quantscope.emulate.session.shrink_shared_arena`) and
glibc's ``malloc_trim``: ``run`` calls :func:`release_memory` between stages, the auto
choice after each trial, the LLM phases after each graph. On minilm-l6 the resident set
when ``analyze`` started went from 1.37 GB to 0.29 GB with it.

A full collection walks every object the process holds: 65 ms in a test worker after a
few hundred tests, 215 ms after a Ray cluster came and went, and the tiny decoder's rewrite
search called it 342 times (23 s of its 50 s, 75 s of 100 s). So a release happens only
when the resident set has grown by :data:`RELEASE_GROWTH` since the last one (or since it
was last that low); a step that freed less than that has nothing worth the walk. The
peak may therefore sit up to that much above what a release after every step would give.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from collections.abc import Callable
from typing import Any

RELEASE_GROWTH = 256 * 2**20  # bytes of resident-set growth that make a release worth it
# where a step's own peak or the resident set before it is read (between two stages of `run`,
# between evaluate's passes, before a sweep's estimate): a smaller growth (what a step left
# behind counts in the next one's peak), but not none, which every such place used to force
# (a tiny model's run made 20-28 full collections, 1.3 s of its 3 s, h81/h82)
STAGE_RELEASE_GROWTH = 32 * 2**20
_LOW: list[int] = []  # the resident set after the last release (lowered when it falls)

# glibc's malloc serves a block from 128 KiB up (its starting threshold, raised only as such
# blocks are freed) by mmap and gives it back on free, so each batch's temporaries (the
# tapped tensors, a histogram's chunks, ONNX Runtime's outputs where a session has no arena)
# were page-faulted in afresh: 54 s of system time of the minilm-l3 acceptance run's 227 s
# (tests/test_run.py, one thread). Served from the heap up to MMAP_THRESHOLD, kept for the
# next batch and given back at each release's malloc_trim: 22 s, 3.8 min -> 3.3 min, the
# same files, the peak 1.22 -> 1.26 GB (bench/malloc.py measures both in one bench run).
MMAP_THRESHOLD = 256 * 2**20
TRIM_THRESHOLD = 512 * 2**20  # free heap kept at its top between releases
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
MALLOC_ENV = "QUANTSCOPE_MALLOC"  # "default": glibc's own thresholds (bench/malloc.py's base)
_TUNED: list[bool] = []


def tune_malloc() -> bool:
    """Set glibc's thresholds once per process (:data:`MMAP_THRESHOLD`,
    :data:`TRIM_THRESHOLD`); ``quantscope``'s commands call it first. Left as they are
    where glibc's own ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` are set, with
    ``QUANTSCOPE_MALLOC=default``, and off glibc. True when it set them."""
    if _TUNED:
        return _TUNED[0]
    _TUNED.append(False)
    if os.environ.get(MALLOC_ENV) == "default" or any(
            k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name is not None else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):  # not glibc
        return False
    if mallopt is None:
        return False
    _TUNED[0] = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _TUNED[0]


def resident_bytes() -> int | None:
    """This process's resident set now (``/proc/self/statm``; None where there is none)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


_OWN_PROCESS: list[bool] = []  # set by the `quantscope` entry point (own_process)


def own_process() -> None:
    """Mark this process as the command line's own (``quantscope``, ``python -m
    quantscope``): nothing but the command runs in it, so :func:`freeze_imports` may freeze
    what it holds before the command's work starts."""
    _OWN_PROCESS[:] = [True]


def freeze_imports(load: Callable[[], Any]) -> bool:
    """``load()`` (the libraries a long command imports anyway), then everything the process
    holds frozen out of every later collection (``gc.freeze``): :func:`release_memory`'s
    full collections then walk what the command made, not the libraries' objects (the
    minilm-l3 acceptance run: 161k tracked objects, 13k of them sympy's functions, ~85 ms a
    collection, 48 collections). Only in the command line's own process
    (:func:`own_process`), before its work (nothing it makes later is frozen, so a cycle it
    drops is still collected), and once: not where anything was frozen before (a test
    worker freezes its own imports), nor in a caller's process (a notebook's objects)."""
    if not _OWN_PROCESS or gc.get_freeze_count():
        return False
    load()
    gc.collect()
    gc.freeze()
    return True


def release_memory(*, force: bool = False, growth: int = RELEASE_GROWTH) -> bool:
    """Collect, shrink the shared arena and trim the heap when the resident set grew by
    ``growth`` bytes (:data:`RELEASE_GROWTH`) since the last release (always with
    ``force``, on the first call, and where the resident set cannot be read); True when it
    released."""
    from quantscope.emulate.session import shrink_shared_arena

    now = resident_bytes()
    if not force and now is not None and _LOW:
        if now - _LOW[0] < growth:
            _LOW[0] = min(_LOW[0], now)
            return False
    gc.collect()
    shrink_shared_arena()
    name = ctypes.util.find_library("c")
    if name is not None:
        try:
            ctypes.CDLL(name).malloc_trim(0)
        except (OSError, AttributeError):  # not glibc: nothing to trim
            pass
    after = resident_bytes()
    _LOW[:] = [] if after is None else [after]
    return True


__all__ = ["MMAP_THRESHOLD", "RELEASE_GROWTH", "STAGE_RELEASE_GROWTH", "TRIM_THRESHOLD",
           "freeze_imports", "own_process", "release_memory", "resident_bytes", "tune_malloc"]
