"""The commands: one table, name -> (module, group, summary), imported lazily (as pip does).

Each command ``NAME`` lives in ``quantscope.cli.<module>`` as two functions side by side:
``add_NAME(sub, summary)`` declares its subparser (through :func:`options.command`) and
``cmd_NAME(args) -> int`` runs it (``-`` in a name is ``_`` in Python). Only the chosen
command's module is imported to run it; ``quantscope --help`` lists this table by group
without importing any command module. Adding a command: one entry here and the two
functions in its family's module. The rewrite commands are generated: one row per entry
of the rewrite registry, run by :mod:`quantscope.cli.rewrites` (adding a rewrite adds
its command, no edit here).
"""

from __future__ import annotations

import argparse
import importlib
import textwrap
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from types import ModuleType

from quantscope import __version__
from quantscope.cli.options import HelpFormatter, Parser


@dataclass(frozen=True)
class Command:
    module: str  # quantscope.cli.<module> holds add_<name> and cmd_<name>
    group: str  # the heading ``quantscope --help`` lists it under (:data:`GROUPS`)
    summary: str  # one line: what it is for (``--help`` of the command opens with it)


GROUPS = ("start here", "steps", "rewrites", "deployment")

_TABLE: dict[str, Command] = {
    # start here
    "run": Command("run", "start here", "model to device in one command: calibrate, "
                   "analyze, plan, repair, check, evaluate, export, io, report (resumable)"),
    "demo": Command("report", "start here", "the main job: FP32 vs a8_w8/a16_w8/a16_w16 on "
                    "the built-in sentence encoder and retrieval task"),
    "models": Command("inspect", "start here", "list the built-in models: package, version, "
                      "licence, and whether each is built (cached) yet"),
    # steps
    "calibrate": Command("measure", "steps", "stream data through the model, write a stats "
                         "file"),
    "analyze": Command("analyze", "steps", "which layers break the low precision, and why"),
    "plan": Command("plan", "steps", "search a legal mixed-precision plan (Pareto front)"),
    "check": Command("plan", "steps", "legality preflight of a plan on a target, and which "
                     "of the model's operators its compiler takes"),
    "evaluate": Command("measure", "steps", "emulate a precision/plan and measure fidelity "
                        "to FP32"),
    "whatif": Command("measure", "steps", "where a plan's error is: the plan measured with "
                      "each op kind it keeps below 16 bit lifted to a16_w16, one kind at a "
                      "time, then all (legality and cost aside)"),
    "repair": Command("repair", "steps", "repairs without 16 bit: equalisation, outlier "
                      "smoothing, bias correction, per-tensor ranges"),
    "phases": Command("convert", "steps", "a Hugging Face causal-LM export (one graph with "
                      "attention_mask and past_key_values.*) -> the prefill and decode graphs "
                      "quantscope measures, with its tokenizer"),
    "images": Command("convert", "steps", "a folder of images -> the tensor data (.npz) a "
                      "vision model's input takes, by the preprocessing you declare "
                      "(--pixels: scale, mean/std, BGR, resize)"),
    "groups": Command("inspect", "steps", "list the decision groups of a model"),
    "report": Command("report", "steps", "one self-contained HTML report from result files"),
    # rewrites: one row per rewrite registry entry (:class:`_Commands`)
    # deployment
    "route": Command("run", "deployment", "a deployment of several compiled sequence lengths "
                     "(length buckets), each text on the shortest that holds it: legality "
                     "and cost per bucket, mean cost, task metrics of the routed outputs"),
    "buckets": Command("run", "deployment", "choose the compiled lengths of a deployment and "
                       "a candidate plan for each, within a mean cost (writes the file "
                       "'route' measures)"),
    "export": Command("export", "deployment", "export a plan: Hailo .alls, QNN encodings, "
                      "ONNX QDQ"),
    "export-qdq": Command("export", "deployment", "write the ONNX QDQ model that emulation "
                          "runs"),
    "io": Command("export", "deployment", "how to feed and read the deployed model (scale, "
                  "zero point, stored type of every quantized input/output)"),
    "lint": Command("plan", "deployment", "preflight of a Hailo model script (.alls)"),
}



class _Commands(MutableMapping[str, Command]):
    """:data:`_TABLE` and, in the group "rewrites", one row per entry of the rewrite
    registry (:data:`quantscope.rewrites.registry.REWRITES`, in its order; its summary),
    read at each use: a rewrite added to the registry is a command with no edit here.
    The registry is imported on first use (it loads onnx: ``quantscope --help`` lists
    its summaries, so it imports it; a command module is still imported only to run)."""

    def _rows(self) -> dict[str, Command]:
        registry = importlib.import_module("quantscope.rewrites.registry")
        return {**_TABLE, **{name: Command("rewrites", "rewrites", rw.summary)
                             for name, rw in registry.REWRITES.items()}}

    def __getitem__(self, name: str) -> Command:
        return self._rows()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows())

    def __len__(self) -> int:
        return len(self._rows())

    def __setitem__(self, name: str, command: Command) -> None:  # a row of :data:`_TABLE`
        _TABLE[name] = command

    def __delitem__(self, name: str) -> None:
        del _TABLE[name]


COMMANDS: MutableMapping[str, Command] = _Commands()

EXAMPLE = ("quantscope run minilm-l6 --data stdlib-docs --target hailo10h --goal 0.97 "
           "--max-cost 1.5 --out W")


def module_of(name: str) -> ModuleType:
    """The module of command ``name`` (imported now, and only it)."""
    return importlib.import_module(f"quantscope.cli.{COMMANDS[name].module}")


def handler(name: str) -> Callable[[argparse.Namespace], int]:
    """``cmd_NAME`` of command ``name``."""
    return getattr(module_of(name), "cmd_" + name.replace("-", "_"))


def grouped_list(width: int = 100) -> str:
    """Every command under its group, with its summary (``quantscope --help``)."""
    out = []
    for group in GROUPS:
        out.append(f"{group}:")
        for name, c in COMMANDS.items():
            if c.group == group:
                out.append(textwrap.fill(c.summary, width, initial_indent=f"  {name:<12}",
                                         subsequent_indent=" " * 14))
        out.append("")
    return "\n".join(out).rstrip()


def markdown_table() -> str:
    """The README's command table: every command under its group, with its summary."""
    rows = ["| group | command | what it is for |", "|---|---|---|"]
    for group in GROUPS:
        rows += [f"| {group} | `{name}` | {c.summary} |"
                 for name, c in COMMANDS.items() if c.group == group]
    return "\n".join(rows)


def parser(full: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The ``quantscope`` argument parser, one subcommand per :data:`COMMANDS` entry.

    ``full``: the commands whose options are declared (their modules imported); the others
    are named only, enough for ``--help`` and for an unknown command's error. None: all.
    """
    wanted = set(COMMANDS if full is None else full)
    p = Parser(prog="quantscope", formatter_class=HelpFormatter, allow_abbrev=False,
               description="Emulate INT8/INT16 quantization of an ONNX model for edge NPUs, "
               "measure task quality, diagnose layers, plan and export mixed precision.",
               epilog=f"{_indented(grouped_list())}\n\nexample (model to device in one "
               f"command; then 'quantscope COMMAND --help'):\n\n  {EXAMPLE}")
    p.add_argument("--version", action="version", version=f"quantscope {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           help="one of the commands below, by group")
    for name, c in COMMANDS.items():
        if name in wanted:
            getattr(module_of(name), "add_" + name.replace("-", "_"))(sub, c.summary)
        else:
            sub.add_parser(name, add_help=False, allow_abbrev=False)
    return p


def _indented(text: str) -> str:
    """The grouped list as paragraphs :class:`HelpFormatter` keeps as written."""
    return "\n\n".join("  " + block.replace("\n", "\n  ")
                       for block in text.split("\n\n"))


def chosen(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first word that is no option), if it is one."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else None
