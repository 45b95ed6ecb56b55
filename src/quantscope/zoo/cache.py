"""The user cache folder for built-in models, and atomic writes into it.

=====================  ==========================================================
cache folder           ``$QUANTSCOPE_CACHE`` if set, else ``~/.cache/quantscope``
atomic write           write to a temporary file in the same folder, then
                       ``os.replace`` it onto the final name: a reader sees either
                       no file or a complete one, never a half-written model
=====================  ==========================================================
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

CACHE_ENV = "QUANTSCOPE_CACHE"


def cache_dir() -> Path:
    """The cache folder (created if missing)."""
    root = os.environ.get(CACHE_ENV)
    path = Path(root).expanduser() if root else Path.home() / ".cache" / "quantscope"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_atomic(dest: Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_path)`` on a temporary path next to ``dest``, then move it onto ``dest``.

    The temporary file is removed if ``write`` raises.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; a cache file is shareable
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_bytes_atomic(dest: Path, data: bytes) -> Path:
    """Write ``data`` to ``dest`` atomically."""
    return write_atomic(dest, lambda tmp: tmp.write_bytes(data))
