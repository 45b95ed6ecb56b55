"""Argument types of the command line, checked while parsing, before any work is done.

=================  ==================================================================
numbers            one ``type=`` per kind: positive int, count (0 = all), fraction in
                   (0, 1], finite (positive / non-negative) float
``precision``      a :class:`Precision` name
``InputPath``      something a command reads (model, data, stats, plan, ...): a file
                   that must exist is checked to be a file, not a folder
``OutputPath``     a file a command writes: not a folder, in an existing folder that
                   can be written
=================  ==================================================================

:func:`check_paths` then refuses, for every command alike, an output that is one of the
command's inputs (also through another path, a symlink or a hard link) and one path given
for two outputs: the inputs and outputs are found by their types, so a new argument is
covered by declaring it with ``type=`` here. The ``check_*`` functions check values
that only make sense together (``--low``/``--high``, ``--goal`` and ``--metric``, the
demo's data); :class:`QuietPipe` is the stdout of a command whose reader may go away
early (``quantscope io ... | head``).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from quantscope.types import PRECISION_ORDER, Precision, QuantscopeError


class InputPath(str):
    """An argument naming something the command reads (a path or a built-in name)."""

    __slots__ = ()


class OutputPath(str):
    """An argument naming a file the command writes."""

    __slots__ = ()


# ---------------------------------------------------------------- numbers


def _number(text: str, kind: type, what: str) -> float | int:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number: give {what}") from None


def positive_int(text: str) -> int:
    value = _number(text, int, "a whole number of 1 or more")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed: give a whole number of 1 "
                                         "or more")
    return int(value)


def count(text: str) -> int:
    """A whole number >= 0 where 0 means 'all' (``--pairs``)."""
    value = _number(text, int, "a whole number (0 = all)")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative: give a whole number >= 0 "
                                         "(0 = all)")
    return int(value)


def finite_float(text: str) -> float:
    value = float(_number(text, float, "a finite number"))
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"'{text}' is not a finite number: give one")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value:g} is not allowed: give a number above 0")
    return value


def at_least_one(text: str) -> float:
    value = finite_float(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value:g} is below 1: give a number >= 1")
    return value


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value:g} is negative: give a number >= 0")
    return value


def fraction(text: str) -> float:
    """A fraction in (0, 1]."""
    value = finite_float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value:g} is outside (0, 1]: give a fraction "
                                         "above 0 and at most 1")
    return value


def precision(text: str) -> Precision:
    try:
        return Precision.parse(text)
    except QuantscopeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ---------------------------------------------------------------- paths


def input_spec(what: str, *, folder: bool = True) -> Callable[[str], InputPath]:
    """A path or a built-in name (model, target, tokenizer); ``folder``: may be a folder."""

    def parse(text: str) -> InputPath:
        if not text:
            raise argparse.ArgumentTypeError(f"empty {what}: give a path or a built-in name")
        if not folder and Path(text).is_dir():
            raise argparse.ArgumentTypeError(f"{what} '{text}' is a folder, not a file: "
                                             f"give the {what} file")
        return InputPath(text)

    parse.__name__ = what.replace(" ", "_")
    return parse


def data_spec(text: str) -> InputPath:
    """Data: an existing file or folder, or a built-in data name."""
    from quantscope.tasks.text import STDLIB_DOCS

    builtin = (STDLIB_DOCS, "faces", "photos", "photos-small")
    if text not in builtin and not Path(text).exists():
        raise argparse.ArgumentTypeError(
            f"data '{text}' does not exist: check the path, or use a built-in data name "
            f"({', '.join(builtin)})")
    return InputPath(text)


def layout(text: str) -> object:
    """``--layout OUTPUT=KIND[:KEY=VALUE,...]`` (:mod:`quantscope.tasks.layout`): syntax,
    kind, keys and numbers checked here; the output name when the data is opened."""
    from quantscope.tasks.layout import LayoutError, parse_layout

    try:
        return parse_layout(text)
    except LayoutError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--layout ")) from None


def input_file(what: str, fix: str) -> Callable[[str], InputPath]:
    """A file that must exist (stats, plan, analysis, results, script, HN JSON)."""

    def parse(text: str) -> InputPath:
        path = Path(text)
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{what} '{text}' is a folder, not a file: "
                                             f"give the {what} file")
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"{what} file '{text}' does not exist: {fix}")
        return InputPath(text)

    parse.__name__ = what.replace(" ", "_")
    return parse


def output_file(text: str) -> OutputPath:
    """A file to write: not a folder, in an existing folder this process can write."""
    if not text:
        raise argparse.ArgumentTypeError("empty output path: give a file name")
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"output '{text}' is a folder: give a file path "
                                         "inside it")
    folder = path.parent
    if not folder.exists():
        raise argparse.ArgumentTypeError(f"output folder '{folder}' of '{text}' does not "
                                         "exist: create it first")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"'{folder}' in output '{text}' is not a folder: "
                                         "give a path in a folder")
    try:  # a real probe: permissions, read-only file systems, ... (removed at once)
        with tempfile.TemporaryFile(dir=folder, prefix=".quantscope-probe-"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write into folder '{folder}' of '{text}' "
                                         f"({exc.strerror}): choose a writable folder") from None
    return OutputPath(text)


def _identity(text: str) -> tuple[object, ...]:
    """What makes two paths one file: the inode when it exists, else the resolved path."""
    path = Path(text)
    try:
        st = path.stat()
        return ("inode", st.st_dev, st.st_ino)
    except OSError:
        return ("path", str(path.resolve()))


def _paths(args: argparse.Namespace, kind: type) -> Iterator[tuple[str, str]]:
    for dest, value in sorted(vars(args).items()):
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, kind):
                yield "--" + dest.replace("_", "-"), str(v)


def check_paths(args: argparse.Namespace) -> None:
    """Refuse an output that is an input, and one path for two outputs (before any work)."""
    inputs = {_identity(p): (flag, p) for flag, p in _paths(args, InputPath) if Path(p).exists()}
    # a data folder is read whole: a file written into it would be read as data next time
    folders = [(f, p) for f, p in _paths(args, InputPath) if f == "--data" and Path(p).is_dir()]
    seen: dict[tuple[object, ...], tuple[str, str]] = {}
    for flag, path in _paths(args, OutputPath):
        key = _identity(path)
        if key in inputs:
            in_flag, in_path = inputs[key]
            raise QuantscopeError(
                f"output {flag} '{path}' is the input {in_flag.lstrip('-')} '{in_path}': "
                "write the output to another path (inputs are never overwritten)")
        for in_flag, folder in folders:
            if Path(path).resolve().is_relative_to(Path(folder).resolve()):
                raise QuantscopeError(
                    f"output {flag} '{path}' is inside the input {in_flag.lstrip('-')} "
                    f"folder '{folder}': write it elsewhere (it would be read as input)")
        if key in seen:
            raise QuantscopeError(
                f"{seen[key][0]} and {flag} are both '{path}': give each output its own path")
        seen[key] = (flag, path)


# ---------------------------------------------------------------- checks across arguments


def check_low_high(low: Precision, high: Precision) -> None:
    """``analyze``: the promoted precision is above the diagnosed one."""
    if PRECISION_ORDER.index(high) <= PRECISION_ORDER.index(low):
        raise QuantscopeError(
            f"--high {high} is not above --low {low}: --low is the precision diagnosed, "
            "--high the one a promoted group gets (e.g. --low a8_w8 --high a16_w16)")


def check_goal(metric: str, goal: float | None) -> None:
    """``plan --goal``: within the range of a bounded metric (:data:`METRIC_RANGES`)."""
    lo, hi = METRIC_RANGES.get(metric, (-math.inf, math.inf))
    if goal is not None and not lo <= goal <= hi:
        raise QuantscopeError(f"--goal {goal:g} is outside the range of {metric} "
                              f"({lo:g} to {hi:g}): give a goal in that range")


def check_demo_data(spec: str) -> None:
    """``demo`` measures text retrieval: its data are retrieval pairs."""
    from quantscope.tasks.text import STDLIB_DOCS

    if spec != STDLIB_DOCS and not spec.endswith(".jsonl"):
        raise QuantscopeError(
            f"demo measures text retrieval, and data '{spec}' is no retrieval pairs: give "
            f"{STDLIB_DOCS} or a JSONL pairs file, or use 'quantscope evaluate' for other data")


# ---------------------------------------------------------------- metric values

# The range of each bounded metric a goal can be set in (``plan --goal``); a metric not
# listed (e.g. an SQNR in dB) takes any finite goal.
METRIC_RANGES: dict[str, tuple[float, float]] = {
    "top1_agreement": (0.0, 1.0),
    "recall@1": (0.0, 1.0),
    "recall@5": (0.0, 1.0),
    "recall@10": (0.0, 1.0),
    "mrr": (0.0, 1.0),
    "tar_at_far": (0.0, 1.0),
    "decision_agreement": (0.0, 1.0),
    "embedding_cosine_mean": (-1.0, 1.0),
    "embedding_cosine_min": (-1.0, 1.0),
    "embedding_cosine_p01": (-1.0, 1.0),
    "cosine_mean": (-1.0, 1.0),
    "cosine_min": (-1.0, 1.0),
}


# ---------------------------------------------------------------- stdout


class QuietPipe:
    """stdout that goes quiet once its reader has gone (``quantscope io ... | head``): the
    command still finishes (and writes its files), with no BrokenPipeError message."""

    def __init__(self, stream: io.TextIOBase) -> None:
        self._stream, self._gone = stream, False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._silence()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._silence()

    def _silence(self) -> None:
        self._gone = True
        try:  # the interpreter flushes stdout at exit: point its descriptor at devnull
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, io.UnsupportedOperation):
            pass

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)
