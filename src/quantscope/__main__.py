"""python -m quantscope (and the ``quantscope`` script): the CLI, Ctrl-C included.

The package imports nothing heavy until it is used, so the KeyboardInterrupt of a Ctrl-C
during the imports below (onnx, numpy, ONNX Runtime: about a second) is caught here and
is the same one line and exit code 130 as one during a command.
"""

from __future__ import annotations

import sys


def entry() -> int:
    try:
        from quantscope.cli import main
        from quantscope.emulate.release import own_process

        own_process()  # the command's own process: its imports may be frozen (release.py)
    except KeyboardInterrupt:
        print("quantscope: interrupted", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(entry())
