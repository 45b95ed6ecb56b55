"""Command line: one subcommand per stage, reading and writing the stages' files.

Every user error is one line on stderr and exit code 2; outputs are written atomically,
so a failed command leaves no file behind. File-system errors the user can act on (a full
disk, a name too long, a symlink loop, no permission: :func:`os_error_line`) are such a
line too, naming the path; Ctrl-C is ``quantscope: interrupted`` and exit 130, also during
the imports (:mod:`quantscope.__main__`).

=====================  ===============================================================
``commands``           the table of commands (name -> module, group, summary) and the
                       parser; only the chosen command's module is imported
``options``            the parent parsers every command shares (model, data, stats, ...)
``types``              argument types, checked while parsing, before any work
``inputs``             opening what the options named (model, data, stats, target, plan)
``inspect``            models, groups
``measure``            calibrate, evaluate, whatif
``analyze``            analyze
``plan``               plan, check, lint
``repair``             repair
``rewrites``           tokensplit, headsplit, rowscale, outscale, peel
``export``             export, export-qdq, io
``run``                run, route, buckets
``report``             report, demo
=====================  ===============================================================
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from quantscope.cli.commands import COMMANDS, chosen, handler, parser
from quantscope.cli.types import QuietPipe, check_input_shapes, check_paths, short_path
from quantscope.progress import MEMORY_FIX as LOWER_MEMORY
from quantscope.threads import default_threads
from quantscope.types import QuantscopeError

EXIT_USER, EXIT_INTERNAL = 2, 3


def _run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    def call() -> int:
        check_paths(args)
        check_input_shapes(getattr(args, "input_shape", None))
        default_threads()  # a bad $QUANTSCOPE_THREADS is one line before any work
        return func(args)

    return _one_line(call)


def _one_line(call: Callable[[], int]) -> int:
    """``call()``, with every error it raises as one stderr line and an exit code (a user's
    error 2, Ctrl-C 130, anything else an internal error: never a traceback unless asked)."""
    try:
        return call()
    except QuantscopeError as exc:
        print(f"quantscope: error: {exc}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("quantscope: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        line = os_error_line(exc)
        if line is None:
            return _internal(exc)
        print(f"quantscope: error: {line}", file=sys.stderr)
        return EXIT_USER
    except MemoryError as exc:
        print(f"quantscope: error: {memory_line(exc)}", file=sys.stderr)
        return EXIT_USER
    except Exception as exc:  # last resort: one line, never a traceback unless asked
        line = memory_line(exc)
        if line is None:
            return _internal(exc)
        print(f"quantscope: error: {line}", file=sys.stderr)
        return EXIT_USER


MEMORY_FIX = ("the model's tensors at the size it runs at, for the samples held at once, "
              f"take more memory than this machine has: {LOWER_MEMORY}")


def memory_line(exc: BaseException) -> str | None:
    """One line for running out of memory, naming what asked for it: numpy's array (its
    size and shape) or ONNX Runtime's node (its ``std::bad_alloc`` or failed buffer); None
    for another error. It had said 'use fewer or smaller batches', which no option
    sets, and ONNX Runtime's failure was an internal error."""
    text = str(exc).strip()
    if isinstance(exc, MemoryError):
        return f"out of memory ({text.splitlines()[0] if text else 'an allocation failed'}): {MEMORY_FIX}"
    if not type(exc).__module__.startswith("onnxruntime") or not (
            "bad_alloc" in text or "Failed to allocate memory" in text):
        return None
    import re

    node = re.search(r"running (\w+) node\. Name:'([^']*)'", text)
    size = re.search(r"buffer of size (\d+)", text)
    where = f" in ONNX Runtime's {node[1]} node '{node[2]}'" if node else " in ONNX Runtime"
    what = f" (a buffer of {int(size[1]) / 2**30:.1f} GiB)" if size else ""
    return f"out of memory{where}{what}: {MEMORY_FIX}"


def _internal(exc: BaseException) -> int:
    if os.environ.get("QUANTSCOPE_DEBUG"):
        traceback.print_exception(exc)
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    print(f"quantscope: internal error: {type(exc).__name__}: {first} "
          "(set QUANTSCOPE_DEBUG=1 for the traceback and report it)", file=sys.stderr)
    return EXIT_INTERNAL


# errors of the file system the user can act on: one line naming the path, exit 2
_USER_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is used up",
    errno.ENAMETOOLONG: "a file or folder name is longer than the file system allows "
                        "(255 bytes)",
    errno.ELOOP: "a symlink loop (links that point back to each other)",
    errno.EROFS: "a read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}
_USER_FIXES = {
    errno.ENOSPC: "free some space or write to another file system",
    errno.EDQUOT: "free some space or write to another file system",
    errno.ENAMETOOLONG: "shorten it",
    errno.ELOOP: "point the link at a real file",
}


def os_error_line(exc: OSError) -> str | None:
    """One line for a file-system error the user can fix (None: an internal error)."""
    what = _USER_ERRNOS.get(exc.errno or 0)
    if what is None or (not exc.filename and exc.errno in (errno.EACCES, errno.EPERM,
                                                          errno.EROFS)):
        return None  # a permission error without a path says nothing the user can act on
    where = f" at '{short_path(str(exc.filename))}'" if exc.filename else ""
    return f"{what}{where}: {_USER_FIXES.get(exc.errno or 0, 'choose another path')}"

def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    name = chosen(words)
    parsed: list[argparse.Namespace] = []
    code = _one_line(lambda: parsed.append(
        parser(full=[name] if name else ()).parse_args(words)) or 0)
    if not parsed:
        return code
    args = parsed[0]
    from quantscope.emulate.release import tune_malloc

    tune_malloc()  # before the first large array (emulate/release.py: why)
    stdout = sys.stdout
    sys.stdout = QuietPipe(stdout)  # type: ignore[assignment]
    try:
        return _run(handler(args.command), args)
    finally:
        sys.stdout.flush()
        sys.stdout = stdout


__all__ = ["COMMANDS", "EXIT_INTERNAL", "EXIT_USER", "main", "memory_line", "os_error_line",
           "parser"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
