"""The graph rewrites as commands: tokensplit, headsplit, rowscale, outscale, peel.

Each keeps the FP32 function (checked) and writes a new model to plan like any other.
Parser and handler of all five sit in this one module, so that they can later be
generated from the rewrite registry.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from quantscope import serde, stages
from quantscope.cli.inputs import input_shapes, open_inputs
from quantscope.cli.options import command, model_parent, seq_len_parent, stats_parent
from quantscope.cli.types import at_least_one, output_file, positive_float, positive_int
from quantscope.types import QuantscopeError

if TYPE_CHECKING:
    import onnx



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



def add_tokensplit(sub: argparse._SubParsersAction, summary: str) -> None:
    t = command(sub, "tokensplit", summary,
                example="quantscope tokensplit minilm-l6 --seq-len 256 --out split.onnx",
                parents=(model_parent(), seq_len_parent()),
                details="Text encoders need --seq-len (the deployment's length); "
                "image models (a ViT's [B, patches + 1, C]) use their static input "
                "shape or --input-shape.")
    t.add_argument("--chunk", type=positive_int, metavar="N",
                   help="tokens per chunk (default: half the token count, rounded up)")
    t.add_argument("--linears", action="store_true",
                   help="split the token-wise Linears (MatMul + bias + activation) too, so "
                   "they read the 16-bit chunks directly instead of a full-width Concat; "
                   "only attention reads a Concat")
    t.add_argument("--out", type=output_file, required=True,
                   help="split FP32 model to write (.onnx); analyze, plan, repair and "
                   "export it like any model (its chunk groups are '<group>/tok<i>')")


def cmd_tokensplit(args: argparse.Namespace) -> int:
    model = stages.open_model(args.model)
    r, diff = stages.split_tokens(model, seq_len=args.seq_len, chunk=args.chunk,
                                  input_shapes=input_shapes(args), linears=args.linears)
    for name, why in r.skipped:
        print(f"left whole: {name}: {why}")
    if not r.changes:
        raise QuantscopeError(f"model '{args.model}': {r.reason} to split: nothing written")
    _write_rewritten(args, model.proto, r.proto)
    effect = dict(r.effect)
    on = (f"token feeds of {args.seq_len} and {max(1, int(effect['chunk']) // 2)} tokens"
          if args.seq_len else "random inputs")
    print(f"{r.reason}\nFP32 outputs unchanged on {on} (max relative diff {diff:.2g})")
    print(f"wrote {args.out} ({len(r.proto.graph.node)} nodes)")
    return 0



def add_headsplit(sub: argparse._SubParsersAction, summary: str) -> None:
    h = command(sub, "headsplit", summary,
                example="quantscope headsplit minilm-l6 --seq-len 128 --out heads.onnx",
                parents=(model_parent(), seq_len_parent()),
                details="The head count comes from shape inference at "
                "--seq-len (or 16 tokens), or the static/--input-shape shape.")
    h.add_argument("--out", type=output_file, required=True,
                   help="split FP32 model to write (.onnx); analyze, plan, repair, tokensplit "
                   "and export it like any model (its head groups are '<group>/head<h>')")


def add_rowscale(sub: argparse._SubParsersAction, summary: str) -> None:
    rs = command(sub, "rowscale", summary,
                 example="quantscope rowscale heads.onnx --seq-len 128 --out rows.onnx",
                 parents=(model_parent(), seq_len_parent()),
                 details="Run it after headsplit (which matches Softmax chains) "
                 "and before tokensplit; plan '<Softmax>/w' at 8 bit and the row "
                 "statistics at 16 bit where the size rules allow.")
    rs.add_argument("--growth", type=at_least_one, default=None,
                    help="most the context MatMul's output grows, >= 1 (default 2: the "
                    "best measured on minilm-l6; 1 is the Softmax's own grid)")
    rs.add_argument("--out", type=output_file, required=True,
                    help="rewritten FP32 model to write (.onnx); its attention-weight groups "
                    "are '<Softmax>/w'")


def _attention_rewrite(args: argparse.Namespace, stage: Callable[..., Any], left: str,
                       **opts: Any) -> int:
    """headsplit / rowscale: rewrite (no stats), print what was left, write."""
    model = stages.open_model(args.model)
    r, diff = stage(model, seq_len=args.seq_len, input_shapes=input_shapes(args), **opts)
    for name, why in r.skipped:
        print(f"{left}: {name}: {why}")
    if not r.changes:
        raise QuantscopeError(f"model '{args.model}': {r.reason}: nothing written")
    _write_rewritten(args, model.proto, r.proto)
    print(f"{r.reason}\nFP32 outputs unchanged (max relative diff {diff:.2g})")
    print(f"wrote {args.out} ({len(r.proto.graph.node)} nodes)")
    return 0


def cmd_headsplit(args: argparse.Namespace) -> int:
    return _attention_rewrite(args, stages.split_heads, "left whole")


def cmd_rowscale(args: argparse.Namespace) -> int:
    return _attention_rewrite(args, stages.scale_rows, "left as is", growth=args.growth)



def add_outscale(sub: argparse._SubParsersAction, summary: str) -> None:
    o = command(sub, "outscale", summary,
                example="quantscope outscale minilm-l6 --stats stats.npz --out outscaled.onnx",
                parents=(model_parent(), stats_parent(), seq_len_parent()),
                details="Needs the model's stats ('quantscope calibrate'). Run it "
                "before tokensplit; then calibrate the new model and plan its "
                "'<Add>/outscale/in' groups and residual Adds at 16 bit.")
    o.add_argument("--min-ratio", type=positive_float, metavar="R",
                   help="only Linears whose output channel max / median is at least R "
                   "(default 8)")
    o.add_argument("--out", type=output_file, required=True,
                   help="rewritten FP32 model to write (.onnx)")


def add_peel(sub: argparse._SubParsersAction, summary: str) -> None:
    pe = command(sub, "peel", summary,
                 example="quantscope peel minilm-l6 --stats stats.npz --out peeled.onnx",
                 parents=(model_parent(), stats_parent(), seq_len_parent()),
                 details="Needs the model's stats ('quantscope calibrate'). Run "
                 "it before tokensplit (after outscale, with the same stats); then "
                 "calibrate the new model and plan its '<Add>/peel' groups at 16 bit "
                 "like the residual stream.")
    pe.add_argument("--factor", type=positive_float, metavar="F",
                    help="peel hidden channels whose max |h| is at least F x the median "
                    "channel's (default 4)")
    pe.add_argument("--max-channels", type=positive_int, metavar="N",
                    help="peel at most N channels per FFN, the largest (default 8)")
    pe.add_argument("--out", type=output_file, required=True,
                    help="rewritten FP32 model to write (.onnx)")


def _stats_rewrite_command(args: argparse.Namespace, stage: Callable[..., Any],
                           **opts: Any) -> int:
    """outscale / peel: rewrite with the model's stats, print what was left, write."""
    inp = open_inputs(args, stats=True)
    assert inp.stats is not None
    r, diff = stage(inp.model, inp.stats, seq_len=args.seq_len,
                    input_shapes=input_shapes(args), **opts)
    for name, why in r.skipped:
        print(f"left as is: {name}: {why}")
    if not r.changes:
        raise QuantscopeError(f"model '{args.model}': {r.reason}: nothing written")
    for c in r.changes:
        if c.kind in ("divide", "split"):  # one line per site: what moved, by how much
            print(f"{c.tensor}: {c.note}")
    _write_rewritten(args, inp.model.proto, r.proto)
    print(f"{r.reason}\nFP32 outputs unchanged (max relative diff {diff:.2g})")
    print(f"wrote {args.out} ({len(r.proto.graph.node)} nodes); calibrate it again before "
          "planning (its tensors changed)")
    return 0


def cmd_outscale(args: argparse.Namespace) -> int:
    return _stats_rewrite_command(args, stages.out_scale, min_ratio=args.min_ratio)


def cmd_peel(args: argparse.Namespace) -> int:
    return _stats_rewrite_command(args, stages.peel_channels, factor=args.factor,
                                  max_channels=args.max_channels)
