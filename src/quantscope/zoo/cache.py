"""The user cache folder for built-in models, and atomic writes into it.

=====================  ==========================================================
cache folder           ``$QUANTSCOPE_CACHE`` if set, else ``~/.cache/quantscope``
atomic write           write to a temporary file in the same folder, then
                       ``os.replace`` it onto the final name: a reader sees either
                       no file or a complete one, never a half-written model
build lock             ``.NAME.lock`` in the folder, held (``flock``) while one
                       process builds NAME: a second process that wants it waits,
                       then finds it built (two test workers, two shells)
=====================  ==========================================================
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

CACHE_ENV = "QUANTSCOPE_CACHE"


def cache_dir() -> Path:
    """The cache folder (created if missing)."""
    root = os.environ.get(CACHE_ENV)
    path = Path(root).expanduser() if root else Path.home() / ".cache" / "quantscope"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def build_lock(folder: Path, name: str) -> Iterator[None]:
    """Hold ``folder/.name.lock`` exclusively; say so once when another process holds it.

    Where ``fcntl`` is missing (Windows), nothing is locked: the atomic writes still keep
    every file whole, two builders only do the work twice."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on the platforms CI runs
        yield
        return
    with open(Path(folder) / f".{name}.lock", "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"quantscope: another process is building {name}; waiting for it",
                  file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
        shareable(tmp)  # mkstemp creates 0600; a cache file is shareable
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def shareable(path: Path) -> None:
    """Make a cache file readable as an ordinary file is (``0666`` less the umask): mkstemp
    and ONNX's external-data writer create theirs ``0600``."""
    os.chmod(path, 0o666 & ~_umask())


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_bytes_atomic(dest: Path, data: bytes) -> Path:
    """Write ``data`` to ``dest`` atomically."""
    return write_atomic(dest, lambda tmp: tmp.write_bytes(data))
