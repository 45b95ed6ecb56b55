"""Argument types of the command line, checked while parsing, before any work is done.

=================  ==================================================================
numbers            one ``type=`` per kind: positive int, count (0 = all), fraction in
                   (0, 1], finite (positive / non-negative) float
``precision``      a :class:`Precision` name
``InputPath``      something a command reads (model, data, stats, plan, ...): a file
                   that must exist is checked to be a file, not a folder; none is a
                   FIFO, a device, a symlink loop or a name too long
``OutputPath``     a file a command writes: not a folder (nor ``name/``), not a special
                   file, in an existing folder that can be written
names              ``model_spec`` (an ONNX file or a built-in model), ``tokenizer_spec``,
                   ``target_spec``
                   (a built-in target or a TOML profile, loaded here), ``repair_names``
                   (each in the repair registry): a mistyped one fails before any stage
values             ``--input-shape``, ``--batch-axis``, ``--seq-len`` lists, compiled
                   lengths, phases, ``--check-mapping``, a run folder, a Ray address
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
import errno
import io
import math
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from quantscope.cli.numbers import (  # noqa: F401 - re-exported
    _number,
    at_least_one,
    at_most_max_seq_len,
    confidence,
    count,
    finite_float,
    fraction,
    new_tokens,
    non_negative_float,
    pair_count,
    positive_float,
    positive_int,
    seq_len,
)
from quantscope.types import PRECISION_ORDER, Precision, QuantscopeError


class InputPath(str):
    """An argument naming something the command reads (a path or a built-in name)."""

    __slots__ = ()


class OutputPath(str):
    """An argument naming a file the command writes."""

    __slots__ = ()


def precision(text: str) -> Precision:
    try:
        return Precision.parse(text)
    except QuantscopeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ---------------------------------------------------------------- paths


def short_path(text: str) -> str:
    """``text`` with each over-long component cut (for one readable error line)."""
    return "/".join(c if len(c) <= 60 else f"{c[:40]}…({len(c.encode())} bytes)"
                    for c in str(text).split("/"))


def path_problem(text: str, what: str, *, output: bool = False) -> str | None:
    """Why ``text`` cannot be opened as a file or folder, or None (also when it is missing).

    Caught here, before any work, so that they are one line instead of a traceback or a
    hang: a name component longer than the file system allows, a symlink loop, a symlink
    to nothing, and a special file (a FIFO would block the reader forever; a device is
    no saved file).
    """
    try:
        st = os.stat(text)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            return (f"{what} path '{short_path(text)}' has a name longer than the file "
                    "system allows (255 bytes per folder or file name): shorten it")
        if exc.errno == errno.ELOOP:
            return (f"{what} '{text}' is a symlink loop (its links point back to each "
                    "other): point it at a real file")
        if not output and os.path.islink(text):
            return (f"{what} '{text}' is a symlink to '{os.readlink(text)}', which does not "
                    "exist: fix the link or give the file itself")
        return None
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        fix = ("write to a regular file path (a special file is never replaced)" if output
               else "give a saved file (a special file is never read: a FIFO would block)")
        return f"{what} '{text}' is a {_special_kind(st.st_mode)}, not a regular file: {fix}"
    return None


def _special_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def _checked(text: str, what: str, *, output: bool = False) -> None:
    problem = path_problem(text, what, output=output)
    if problem:
        raise argparse.ArgumentTypeError(problem)


def input_spec(what: str, *, folder: bool = True) -> Callable[[str], InputPath]:
    """A path or a built-in name (model, target, tokenizer); ``folder``: may be a folder."""

    def parse(text: str) -> InputPath:
        if not text:
            raise argparse.ArgumentTypeError(f"empty {what}: give a path or a built-in name")
        _checked(text, what)
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
    if text not in builtin and not Path(text).exists() and ":" in text:
        from quantscope.tasks.faces import face_spec

        try:  # face data with its pixels declared: faces:raw, FOLDER:scale=255
            if face_spec(text) is not None:
                return InputPath(text)
        except QuantscopeError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    if text not in builtin:
        _checked(text, "data")
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
        _checked(text, what)
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
    """A file to write: not a folder, in an existing folder this process can write; never
    a special file (a FIFO or a device such as /dev/null would be replaced by a regular
    file, since outputs are written to a temporary file and renamed into place)."""
    if not text:
        raise argparse.ArgumentTypeError("empty output path: give a file name")
    _checked(text, "output", output=True)
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"output '{text}' is a folder: give a file path "
                                         "inside it")
    if text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"output '{text}' ends in '/', which names a folder, "
                                         "and there is none: give a file path (e.g. "
                                         f"{text}NAME after creating the folder)")
    folder = path.parent
    _checked(str(folder), "output folder", output=True)
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


# ---------------------------------------------------------------- values


def input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=1x3x224x224`` (see :func:`quantscope.model.shapes.parse_input_shape`)."""
    from quantscope.model.shapes import parse_input_shape

    return parse_input_shape(text)



DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float | None:
    """``--budget``: seconds, from a number with a unit (``90s``, ``30m``, ``1h``), or
    ``none`` for no bound."""
    t = text.strip().lower()
    if t == "none":
        return None
    try:
        value = float(t[:-1]) * DURATION_UNITS[t[-1:]]
    except (KeyError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"'{text}' is not a time budget: give a number above "
                                         "0 with a unit s, m or h (90s, 30m, 1h) or 'none'")
    return value


def run_folder(text: str) -> str:
    """The run folder: created if missing (its parent must exist), never a file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"run folder '{text}' is a file: give a folder path")
    if not path.exists() and not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"the folder '{path.parent}' of run folder '{text}' "
                                         "does not exist: create it first")
    return text



def cache_folder(text: str) -> str:
    """``--cache``: the evaluation cache's folder, as :func:`run_folder` checks one."""
    try:
        return run_folder(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(str(e).replace("run folder", "cache folder")) from None


# one NAME=AXIS of a --batch-axis list: a quoted name is taken as written; a bare one runs
# to the last '=' before an integer axis that ends the item, so it may hold ',' and '='
_BATCH_AXIS = re.compile(r"""\s*(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<bare>.*?))"""
                         r"\s*=\s*(?P<axis>-?\d+)\s*(?:,|$)")
QUOTE_HINT = ("a name holding ',' or '=' may be quoted: --batch-axis '\"a,b=c\"=1'")


def batch_axes(text: str) -> tuple[tuple[str, int], ...]:
    """``NAME=AXIS`` or a comma list of them (names checked against the model later); a
    name may hold ',' or '=' (read up to the last '=' before the axis), or be quoted."""
    out, at = [], 0
    while at < len(text):
        m = _BATCH_AXIS.match(text, at)
        name = None if m is None else next(
            (m[k] for k in ("dq", "sq") if m[k] is not None), (m["bare"] or "").strip())
        if m is None or not name:
            part = text[at:].split(",", 1)[0].strip() or text.strip()
            raise argparse.ArgumentTypeError(
                f"'{part}' is no NAME=AXIS: give e.g. --batch-axis h=1 ({QUOTE_HINT})")
        out.append((name, int(m["axis"])))
        at = m.end()
    if not out:
        raise argparse.ArgumentTypeError(
            f"'{text}' is no NAME=AXIS: give e.g. --batch-axis h=1 ({QUOTE_HINT})")
    return tuple(out)


def merged_batch_axes(given: list[tuple[tuple[str, int], ...]] | None) -> dict[str, int]:
    """The ``--batch-axis`` values as one mapping; a name given twice with two axes is
    refused (one line)."""
    out: dict[str, int] = {}
    for name, axis in (pair for group in given or [] for pair in group):
        if out.setdefault(name, axis) != axis:
            raise QuantscopeError(f"--batch-axis gives '{name}' two axes ({out[name]} and "
                                  f"{axis}): give it once")
    return out



def output_name(text: str) -> str:
    """A model output's name (checked against the model when the data is opened)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty output name: give one of the model's outputs")
    return text


def file_stem(text: str) -> str:
    """The stem of files to write in a folder: a plain name (no folder, not hidden)."""
    if not text or "/" in text or os.sep in text or text.startswith("."):
        raise argparse.ArgumentTypeError(f"'{text}' is no plain file name: give a name with "
                                         "no '/' that does not begin with '.'")
    return text


def ray_address(text: str) -> str:
    """A Ray cluster address (``local``, ``auto``, ``HOST:PORT``, ``ray://HOST:PORT``)."""
    if not text.strip() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(
            f"'{text}' is no Ray address: give local, auto, HOST:PORT or ray://HOST:PORT")
    return text



MAPPING_QUOTE_HINT = ("a TENSOR holding ',' or '=' is read up to the last '=', or quote it: "
                      "--check-mapping '\"a,b=c\"=0:-1,255:1'")


def mapping(text: str) -> object:
    """``TENSOR=CODE:VALUE,…`` (see :func:`quantscope.export.device_io.parse_mapping`); the
    points hold no '=', so TENSOR runs to the last '=' and may hold ',' and '=', or is quoted."""
    import dataclasses

    from quantscope.export.device_io import parse_mapping

    name, sep, points = text.rpartition("=")
    quoted = re.fullmatch(r"""\s*(?:"([^"]*)"|'([^']*)')\s*""", name)
    name = next((g for g in quoted.groups() if g is not None), "") if quoted else name.strip()
    try:
        if not sep or not name:
            raise QuantscopeError(f"mapping '{text}' is not TENSOR=CODE:VALUE,CODE:VALUE,…")
        parsed = parse_mapping(f"*={points}")
    except QuantscopeError as exc:
        why = str(exc).replace(f"mapping '*={points}'", f"mapping '{text}'")
        hint = "" if "twice" in why else f" ({MAPPING_QUOTE_HINT})"
        raise argparse.ArgumentTypeError(why + hint) from None
    return dataclasses.replace(parsed, tensor=name)


def seq_lens(text: str) -> tuple[int, ...]:
    """``256`` or ``128,256``: positive sequence lengths."""
    try:
        out = tuple(int(t) for t in text.split(","))
    except ValueError:
        out = ()
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive length or a comma list "
                                         "of them (e.g. 256 or 128,256)")
    for n in out:
        seq_len(str(n))
    return out



def lengths(text: str) -> tuple[int, ...]:
    """``16,32,64,128,256``: compiled sequence lengths."""
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a comma-separated list of token counts (e.g. 32,64,128,256)"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': every length must be a positive token count")
    at_most_max_seq_len(max(values))
    return values


def phases(text: str) -> tuple[str, ...]:
    from quantscope.model.phases import parse_phases

    try:
        return parse_phases(text)
    except QuantscopeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def model_spec(text: str) -> InputPath:
    """A model: an existing ONNX file or a built-in model name (built later, on first use)."""
    from quantscope.zoo import BUILTIN_MODELS

    path = Path(input_spec("model", folder=False)(text))
    if text in BUILTIN_MODELS or path.exists():
        return InputPath(text)
    if path.suffix != ".onnx" and len(path.parts) == 1:
        raise argparse.ArgumentTypeError(
            f"unknown model '{text}': give an .onnx path or a built-in name "
            f"({', '.join(BUILTIN_MODELS)})")
    raise argparse.ArgumentTypeError(f"model file '{text}' does not exist: check the path")


def tokenizer_spec(text: str) -> InputPath:
    """A tokenizer: a ``tokenizer.json`` file, or a Hugging Face model folder holding one
    (read later, with the data; here only found)."""
    spec = input_spec("tokenizer")(text)
    file = Path(text) / "tokenizer.json" if Path(text).is_dir() else Path(text)
    if not file.is_file():
        raise argparse.ArgumentTypeError(
            f"tokenizer not found: {file} (pass --tokenizer a tokenizer.json or a model folder)")
    return spec


def target_spec(text: str) -> InputPath:
    """A target: a built-in name or a profile TOML file, loaded (and so checked) here, so
    that a mistyped one fails before any stage runs and before any file is written."""
    from quantscope.targets import load_target

    spec = input_spec("target", folder=False)(text)
    try:
        load_target(spec)
    except QuantscopeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return spec


def repair_names(text: str, *, none: bool = False) -> str:
    """A comma list of repair names (``--repairs``), each in the repair registry; ``none``:
    the word ``none`` (no repairs) is allowed too."""
    from quantscope.repair.registry import REGISTRY

    if none and text == "none":
        return text
    unknown = [n for n in text.split(",") if n not in REGISTRY]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown repair '{unknown[0]}': use {', '.join(REGISTRY)}"
            + (" or none" if none else ""))
    return text


def run_repair_names(text: str) -> str:
    """``run --repairs``: a comma list of repair names, or ``none``."""
    return repair_names(text, none=True)


# ---------------------------------------------------------------- checks across arguments


def check_input_shapes(shapes: list[tuple[str, tuple[int, ...]]] | None) -> None:
    """``--input-shape``: one shape per input (a repeated input is refused, since the
    second would silently win or contradict the first)."""
    seen: dict[str, tuple[int, ...]] = {}
    for name, dims in shapes or ():
        if name in seen:
            first, again = ("x".join(map(str, d)) for d in (seen[name], dims))
            how = (f"twice ({first})" if seen[name] == dims
                   else f"twice, as {first} and as {again}")
            raise QuantscopeError(f"--input-shape gives input '{name}' {how}: give each "
                                  "input's shape once")
        seen[name] = dims


def check_low_high(low: Precision, high: Precision) -> None:
    """``analyze``: the promoted precision is above the diagnosed one."""
    if PRECISION_ORDER.index(high) <= PRECISION_ORDER.index(low):
        raise QuantscopeError(
            f"--high {high} is not above --low {low}: --low is the precision diagnosed, "
            "--high the one a promoted group gets (e.g. --low a8_w8 --high a16_w16)")


def check_goal(metric: str, goal: float | None) -> None:
    """``plan --goal``: a goal the metric can take (range, and a dB goal that is no
    fraction: :meth:`quantscope.tasks.headline.Headline.check_goal`)."""
    from quantscope.tasks.headline import describe_metric

    describe_metric(metric).check_goal(goal)


def check_demo_data(spec: str) -> None:
    """``demo`` measures text retrieval: its data are retrieval pairs."""
    from quantscope.tasks.text import STDLIB_DOCS

    if spec != STDLIB_DOCS and not spec.endswith(".jsonl"):
        raise QuantscopeError(
            f"demo measures text retrieval, and data '{spec}' is no retrieval pairs: give "
            f"{STDLIB_DOCS} or a JSONL pairs file, or use 'quantscope evaluate' for other data")


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
