"""Opening what a command's options named: model, data, stats, target, plan.

Cheap checks first (:func:`open_inputs`); the helpers every family of commands shares
(the shapes ``--seq-len``/``--input-shape`` give, the Ray executor ``--ray`` asks for, the
HN file, a list of problems printed as ``check`` and ``lint`` print them).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantscope import stages
from quantscope.cli.types import merged_batch_axes
from quantscope.model.shapes import given_shapes
from quantscope.report import fmt
from quantscope.targets import Target, load_target
from quantscope.targets.accept import allowed_warnings
from quantscope.tasks.layout import LAYOUT_NOTE
from quantscope.tasks.tensors import check_token_ids
from quantscope.tasks.text import TextPrefixes
from quantscope.types import Plan, Precision, QuantscopeError, Stats

if TYPE_CHECKING:
    from quantscope.parallel import RayExecutor

EXIT_PROBLEMS = 1  # check and lint found an error


@dataclass(frozen=True)
class Inputs:
    model: stages.Model
    data: stages.Dataset | None
    stats: Stats | None
    target: Target | None
    plan: Plan | None


def open_inputs(args: argparse.Namespace, *, data: bool = False, stats: bool = False,
                target: bool = False, plan: bool = False, show: bool = True) -> Inputs:
    """Open what the command's parent parsers named, in this order (cheap checks first);
    ``show``: say the data's notes as it opens (False: the command prints them with its
    result)."""
    model = stages.open_model(args.model)
    tgt = load_target(args.target) if target and args.target else None
    ds = open_dataset(args, model, show=show) if data else None
    st = stages.read_stats(args.stats) if stats else None
    return Inputs(model, ds, st, tgt, plan_of(args) if plan else None)


def allowed_of(args: argparse.Namespace, target: Target | None) -> frozenset[str]:
    """The warning rules ``--allow-warning`` accepts on ``target`` (refused in one line:
    an error rule, an id the target does not name), before any work."""
    asked = getattr(args, "allow_warning", None) or ()
    if not asked:
        return frozenset()
    if target is None:
        raise QuantscopeError("--allow-warning names rules of a target: give --target")
    return allowed_warnings(target, asked)


def open_dataset(args: argparse.Namespace, model: stages.Model, *, show: bool = True
                 ) -> stages.Dataset:
    """The data, its token ids checked against the model's tables (tokenizer mismatch);
    ``show``: say its notes on stderr as it opens."""
    try:
        ds = stages.open_data(args.data, model, tokenizer=args.tokenizer,
                              max_pairs=getattr(args, "pairs", None),
                              output=getattr(args, "output", None),
                              layout=tuple(getattr(args, "layout", None) or ()),
                              batch_axes=merged_batch_axes(getattr(args, "batch_axis", None)),
                              prefixes=text_prefixes(args), show=show,
                              calib_texts=getattr(args, "calib_texts", None))
    except UnicodeDecodeError:
        raise QuantscopeError(f"data '{args.data}' is not UTF-8 text: save it as UTF-8") from None
    for batch in (*ds.calibration, *ds.evaluation):
        check_token_ids(batch, model, args.data)
    if getattr(args, "layout", None) is not None and args.command != "evaluate":
        for note in layout_notes(ds):  # evaluate prints them with its result
            print(f"note: {note}")
    return ds


def text_prefixes(args: argparse.Namespace) -> TextPrefixes | None:
    """The ``--query-prefix``/``--doc-prefix`` of text data (None: neither given)."""
    prefixes = TextPrefixes(getattr(args, "query_prefix", None) or "",
                            getattr(args, "doc_prefix", None) or "")
    return prefixes or None


def layout_notes(ds: stages.Dataset) -> tuple[str, ...]:
    """What tensor data's outputs were read as (``--layout`` or detected), to say first."""
    return tuple(n for n in ds.notes if LAYOUT_NOTE in n)


def plan_of(args: argparse.Namespace) -> Plan:
    """The plan ``--plan`` names, or the uniform ``--precision``."""
    if getattr(args, "plan", None):
        return stages.read_plan(args.plan)
    return Plan.uniform(Precision.parse(args.precision))


def input_shapes(args: argparse.Namespace) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The ``--input-shape`` values (none when the command has no such option)."""
    return tuple(getattr(args, "input_shape", None) or ())


def shapes(args: argparse.Namespace, model: stages.Model) -> dict | None:
    """The concrete input shapes ``--seq-len`` and ``--input-shape`` give (None: neither)."""
    return given_shapes(model, args.seq_len, input_shapes(args))


def print_problems(problems: list, what: str, *, allowed: frozenset[str] = frozenset()) -> int:
    """check / lint: each problem, its fix and its source, then the count; the exit code.
    A warning of a rule in ``allowed`` (``--allow-warning``) is listed as accepted, not
    as passing, and counted apart."""
    errors = [p for p in problems if p.severity == "error"]
    labels = [fmt.ACCEPTED if p.severity == "warning" and p.rule in allowed else p.severity
              for p in problems]
    for p, label in zip(problems, labels, strict=True):
        print(f"{label}: [{p.rule}] {p.group}: {p.reason}")
        print(f"    fix: {p.fix}    (source: {p.provenance})")
    print(f"{what}: {fmt.problem_counts(labels)}")
    return EXIT_PROBLEMS if errors else 0


def executor(address: str | None) -> RayExecutor | None:
    """The Ray executor ``--ray [ADDRESS]`` asks for, else None (in process)."""
    if not address:
        return None
    from quantscope.parallel import ray_executor

    return ray_executor(address)


def read_hn(args: argparse.Namespace) -> dict | None:
    """The Hailo HN JSON ``--hn`` names (an object with 'layers'), or None; refused with
    an ``export --format`` other than alls (which it would not change)."""
    fmt = getattr(args, "format", "alls")
    if args.hn and fmt != "alls":
        raise QuantscopeError(f"--hn gives the Hailo layer names of an .alls, and --format "
                              f"{fmt} writes no .alls: leave --hn out")
    hn = stages.read_json_file(args.hn, "HN") if args.hn else None
    if hn is not None and not isinstance(hn, dict):
        raise QuantscopeError(f"HN file '{args.hn}' is no Hailo HN (a JSON object with "
                              "'layers'): pass the .hn file of the parsed model")
    return hn
