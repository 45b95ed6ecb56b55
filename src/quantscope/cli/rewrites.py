"""The graph rewrites as commands, generated from the rewrite registry.

Each entry of :data:`quantscope.rewrites.registry.REWRITES` is the command ``quantscope
NAME``: its parser comes from the entry's data (:func:`add_command`: summary, example,
description, ``cli_options``, the help of ``--out``; ``--stats`` when it needs stats) and
ONE handler (:func:`run_command`) runs any entry through the registry's runner
(:meth:`quantscope.rewrites.base.Rewrite.apply`, FP32 checked) and writes the new model
to plan like any other. The lines it prints come from the entry too (``left``,
``site_kinds``, ``checked_on``, ``nothing_suffix``). Adding a rewrite to the registry
adds its command; nothing here names one.

``add_NAME`` and ``cmd_NAME`` (what :mod:`quantscope.cli.commands` looks up) are this
module's attributes for every registry name (:func:`__getattr__`).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from quantscope import serde, stages
from quantscope.cli.inputs import input_shapes, open_inputs
from quantscope.cli.options import (
    command,
    model_parent,
    option_kwargs,
    seq_len_parent,
    stats_parent,
)
from quantscope.cli.types import output_file
from quantscope.rewrites.base import legacy
from quantscope.rewrites.registry import REWRITES
from quantscope.tasks.positions import check_token_lengths
from quantscope.types import QuantscopeError

if TYPE_CHECKING:
    import onnx

    from quantscope.rewrites.base import Rewrite

def add_command(sub: argparse._SubParsersAction, name: str, summary: str) -> None:
    """The parser of rewrite ``name``, from its registry entry."""
    rw = REWRITES[name]
    parents = (model_parent(), *((stats_parent(),) if rw.needs_stats else ()),
               seq_len_parent())
    p = command(sub, name, summary, parents=parents, details=rw.description,
                example=rw.example or f"quantscope {name} MODEL --out {name}.onnx")
    for o in rw.cli_options:
        if o.flags and o.dest:
            p.add_argument(*o.flags, dest=o.dest, **option_kwargs(o))
    p.add_argument("--out", type=output_file, required=True, help=rw.out_help)


def _write_rewritten(args: argparse.Namespace, original: onnx.ModelProto,
                     proto: onnx.ModelProto) -> None:
    """Write a rewritten model to ``args.out``, with the tokenizer the original names or
    sits with beside it (never over a different file), all or nothing."""
    files = [(args.out, serde.onnx_writer(proto))]
    tokenizer = stages.tokenizer_beside(args.model, original, args.out)
    if tokenizer is not None:  # the rewritten model names the same tokenizer: it goes along
        files.append((tokenizer[1], serde.bytes_writer(tokenizer[0].read_bytes())))
    serde.write_atomic_set(files)
    if tokenizer is not None:
        print(f"copied its tokenizer {tokenizer[0].name} beside it")


def config_of(rw: Rewrite, args: argparse.Namespace) -> Any:
    """The entry's config from the command's options (an option not given: the default)."""
    return rw.configure(**{o.dest: getattr(args, o.dest, None) for o in rw.cli_options
                           if o.flags and o.dest})


def run_command(name: str, args: argparse.Namespace) -> int:
    """Rewrite ``args.model`` with registry entry ``name`` (FP32 checked), print what it
    left and changed, write ``args.out``."""
    rw = REWRITES[name]
    inp = open_inputs(args, stats=rw.needs_stats)
    # the rewrite is checked by running the model at the length given: one it can hold
    check_token_lengths(inp.model, args.seq_len, input_shapes(args))
    config = config_of(rw, args)
    r, diff = legacy(rw.apply(inp.model, config, stats=inp.stats, seq_len=args.seq_len,
                              input_shapes=input_shapes(args)))
    for site, why in r.skipped:
        print(f"{rw.left}: {site}: {why}")
    if not r.changes:
        raise QuantscopeError(f"model '{args.model}': {r.reason}{rw.nothing_suffix}: "
                              "nothing written")
    for c in r.changes:
        if c.kind in rw.site_kinds:  # one line per site: what moved, by how much
            print(f"{c.tensor}: {c.note}")
    _write_rewritten(args, inp.model.proto, r.proto)
    on = f"{rw.checked_on(config, args.seq_len, r)} " if rw.checked_on else ""
    print(f"{r.reason}\nFP32 outputs unchanged {on}(max relative diff {diff:.2g})")
    again = ("; calibrate it again before planning (its tensors changed)" if rw.needs_stats
             else "")
    print(f"wrote {args.out} ({len(r.proto.graph.node)} nodes){again}")
    return 0


def __getattr__(attr: str) -> Callable[..., Any]:
    """``add_NAME`` / ``cmd_NAME`` of every registry name (``-`` in a name is ``_``)."""
    for prefix, func in (("add_", add_command), ("cmd_", run_command)):
        if attr.startswith(prefix):
            name = next((n for n in REWRITES if n.replace("-", "_") == attr[len(prefix):]),
                        None)
            if name is not None:
                if func is add_command:
                    return lambda sub, summary: add_command(sub, name, summary)
                return functools.partial(run_command, name)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
