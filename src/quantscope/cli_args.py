"""Arguments of the command line: the shared parent parsers and one subparser per command.

Every input a command can read (model, data, stats, plan, target, tokenizer, pairs, ...) is
declared once here, with its help; the commands themselves live in :mod:`quantscope.cli`.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from quantscope import __version__
from quantscope.cli_types import (
    at_least_one,
    count,
    data_spec,
    finite_float,
    fraction,
    input_file,
    input_spec,
    layout,
    non_negative_float,
    output_file,
    positive_float,
    positive_int,
    precision,
    seq_len,
)
from quantscope.types import Precision, QuantscopeError

METHODS = ("minmax", "percentile", "mse")
DATA_HELP = (".npy/.npz file or folder, JSONL query/document pairs, a text file, a face "
             "folder, or a built-in data name (stdlib-docs, faces, photos, photos-small)")


# ---------------------------------------------------------------- shared options
# One parent parser per input a command can read; each is declared here once, with its help.
# Factories, not shared objects: argparse shares a parent's actions with every child, so a
# per-command default (e.g. --pairs) needs its own parent.


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are a :class:`QuantscopeError` (one line, exit 2)."""

    def error(self, message: str) -> NoReturn:
        line = " ".join(message.split())
        command = self.prog.removeprefix("quantscope").strip()
        raise QuantscopeError(f"{command}{': ' if command else ''}{line} "
                              f"(see '{self.prog} --help')")


def _parent() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False)


STATS_FIX = "run 'quantscope calibrate' to make one"
PLAN_FIX = "check the path (plans are written by 'quantscope plan')"


def _model_parent(*, option: bool = False) -> argparse.ArgumentParser:
    p, what = _parent(), "ONNX file or built-in model name (see 'quantscope models')"
    kind = input_spec("model", folder=False)
    if option:
        p.add_argument("--model", required=True, type=kind, help=what)
    else:
        p.add_argument("model", type=kind, help=what)
    return p


def _data_parent(*, required: bool = True, help: str = DATA_HELP) -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--data", required=required, type=data_spec, help=help)
    p.add_argument("--batch-axis", action="append", default=[], type=batch_axes,
                   metavar="NAME=AXIS[,…]",
                   help="the axis of input (or output) NAME that holds the samples, for "
                   "tensor data (default: found from the model: a symbolic dim the inputs "
                   "share, else the axis of static size 1 the data fills; e.g. an LSTM "
                   "state h=1); repeatable")
    return p


def _output_parent() -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--output", type=output_name, metavar="NAME",
                   help="score this model output alone (default: every output; the "
                   "metrics without an output name are the worst output's)")
    _add_layout(p)
    return p


LAYOUT_HELP = ("tensor data: what a model output is, scored as such (repeat per output): "
               "OUTPUT=detect[:boxes=0-3,scores=4-,axis=1,format=cxcywh|xyxy,threshold=0.25,"
               "iou=0.5] (detection F1 vs FP32), OUTPUT=map[:threshold=0.5] (mask IoU), "
               "OUTPUT=score[:threshold=0.5] (decision agreement, one value per sample), "
               "OUTPUT=tensor (fidelity only). Default: a detection head (a Concat of 4 box "
               "rows and score rows) is found in the graph; other outputs are tensors "
               "(docs/outside-the-zoo.md)")


def _add_layout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", type=layout, action="append", default=[],
                   metavar="OUTPUT=KIND[:KEY=VALUE,...]", help=LAYOUT_HELP)


def _stats_parent(*, required: bool = True, help: str | None = None) -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--stats", required=required, type=input_file("stats", STATS_FIX),
                   help=help or "stats file written by 'quantscope calibrate' (.npz)")
    return p


def _plan_parent() -> argparse.ArgumentParser:
    p = _parent()
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--precision", type=precision, help="uniform precision: " + ", ".join(x.value for x in Precision))
    g.add_argument("--plan", type=input_file("plan", PLAN_FIX), help="plan JSON (group name -> precision, with a default)")
    return p


def _target_parent(*, required: bool = True, help: str = "") -> argparse.ArgumentParser:
    from quantscope.targets import BUILTIN_TARGETS

    names = ", ".join(n.replace("_", "-") for n in BUILTIN_TARGETS)
    p = _parent()
    p.add_argument("--target", required=required, type=input_spec("target", folder=False),
                   help=f"{help}{': ' if help else ''}{names} or a target TOML file")
    return p


def _tokenizer_parent() -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--tokenizer", type=input_spec("tokenizer"), help="tokenizer.json or Hugging Face model folder (text "
                   "models; default: the one the model names or sits with (tokenizer.json "
                   "beside it), else the packaged uncased BERT tokenizer of the MiniLMs)")
    return p


def _pairs_parent(default: int | None, what: str) -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--pairs", type=count, default=default,
                   help=f"retrieval pairs {what} (text retrieval data; "
                   f"default: {default or 'all'}; 0 = all)")
    return p


def input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=1x3x224x224`` (see :func:`quantscope.model.shapes.parse_input_shape`)."""
    from quantscope.model.shapes import parse_input_shape

    return parse_input_shape(text)


RUN_STAGES = ("calibrate", "analyze", "plan", "repair", "check", "evaluate", "export", "io",
              "report")


def run_folder(text: str) -> str:
    """The run folder: created if missing (its parent must exist), never a file."""
    from pathlib import Path

    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"run folder '{text}' is a file: give a folder path")
    if not path.exists() and not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"the folder '{path.parent}' of run folder '{text}' "
                                         "does not exist: create it first")
    return text


def batch_axes(text: str) -> tuple[tuple[str, int], ...]:
    """``NAME=AXIS`` or a comma list of them (names checked against the model later)."""
    out = []
    for part in text.split(","):
        name, eq, axis = part.strip().partition("=")
        name, axis = name.strip(), axis.strip()
        if not eq or not name or not axis.lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(
                f"'{part.strip()}' is no NAME=AXIS: give e.g. --batch-axis h=1")
        out.append((name, int(axis)))
    return tuple(out)


def merged_batch_axes(given: list[tuple[tuple[str, int], ...]] | None) -> dict[str, int]:
    """The ``--batch-axis`` values as one mapping; a name given twice with two axes is
    refused (one line)."""
    from quantscope.types import QuantscopeError

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


def ray_address(text: str) -> str:
    """A Ray cluster address (``local``, ``auto``, ``HOST:PORT``, ``ray://HOST:PORT``)."""
    if not text.strip() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(
            f"'{text}' is no Ray address: give local, auto, HOST:PORT or ray://HOST:PORT")
    return text


def _ray_parent(what: str = "the sweep's candidates") -> argparse.ArgumentParser:
    """--ray [ADDRESS]: run the independent evaluations on a Ray cluster (the ray extra)."""
    p = _parent()
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   type=ray_address,
                   help=f"run {what} on Ray: a local cluster on this "
                   "machine's CPUs, or the existing cluster at ADDRESS (e.g. ray://head:10001 "
                   "or auto); the same results as without (needs: pip install ray)")
    return p


def mapping(text: str) -> object:
    """``TENSOR=CODE:VALUE,…`` (see :func:`quantscope.export.device_io.parse_mapping`)."""
    from quantscope.export.device_io import parse_mapping

    return parse_mapping(text)


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


def _seq_len_parent(*, several: bool = False) -> argparse.ArgumentParser:
    p = _parent()
    if several:
        p.add_argument("--seq-len", type=seq_lens, metavar="N[,N…]",
                       help="sequence length(s) for symbolic token dims: legality depends on "
                       "it, so a comma list (128,256) plans each and keeps the best, "
                       "showing every length's front and the fraction of texts that fit")
    else:
        p.add_argument("--seq-len", type=seq_len,
                       help="sequence length for symbolic token dims (rules and costs that "
                       "depend on the tensor size)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=DxDx…",
                   type=input_shape,
                   help="concrete shape of an input with symbolic dims other than the "
                   "sequence, e.g. pixel_values=1x3x224x224 (repeatable)")
    return p


def _method_parent(default: str | None) -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--method", default=default, choices=METHODS,
                   help=f"activation range setting (default: {default})" if default else
                   "activation range setting (default: the one the stats were made with)")
    return p


def _hn_parent() -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--hn", type=input_file("HN", "check the path"), help="parsed model HN JSON (exact Hailo layer names)")
    return p


# ---------------------------------------------------------------- the commands


def parser() -> argparse.ArgumentParser:
    """The `quantscope` argument parser: one subcommand per stage (`cli.COMMANDS`)."""
    p = Parser(
        prog="quantscope",
        description="Emulate INT8/INT16 quantization of an ONNX model for edge NPUs, "
        "measure task quality, diagnose layers, plan and export mixed precision.",
    )
    p.add_argument("--version", action="version", version=f"quantscope {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    _add_stage_commands(sub)
    _add_planning_commands(sub)
    _add_output_commands(sub)
    _add_run_command(sub)
    return p


def _add_stage_commands(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("calibrate", help="stream data through the model, write a stats file",
                       parents=[_model_parent(), _data_parent(), _method_parent("minmax"),
                                _tokenizer_parent()])
    c.add_argument("--out", type=output_file, required=True,
                   help="stats file to write (.npz)")

    e = sub.add_parser("evaluate", help="emulate a precision/plan and measure fidelity to FP32",
                       parents=[_model_parent(), _data_parent(), _output_parent(),
                                _stats_parent(), _plan_parent(),
                                _method_parent(None), _tokenizer_parent(),
                                _pairs_parent(None, "evaluated")])
    e.add_argument("--seq-len", type=seq_len, metavar="N",
                   help="text data: measure on the texts truncated at N tokens, as a "
                   "deployment at sequence length N runs them (against FP32 at the same "
                   "length)")
    e.add_argument("--json", type=output_file, help="also write the result as JSON")

    w = sub.add_parser("whatif", help="where a plan's error is: the plan measured with each "
                       "op kind it keeps below 16 bit lifted to a16_w16, one kind at a time, "
                       "then all (legality and cost aside)",
                       parents=[_model_parent(), _data_parent(), _output_parent(),
                                _stats_parent(), _plan_parent(),
                                _method_parent(None), _tokenizer_parent(),
                                _pairs_parent(None, "evaluated")],
                       description="One evaluation per op kind (FP32 runs once). A kind "
                       "whose lift gains little is not what binds; when every kind gains "
                       "little and all together gain much, the error is spread over the graph. "
                       "Task data also gets the headroom: the metric with the plan's own error "
                       "scaled down (0.7x ... 0.05x), and with --goal the scale that reaches it.")
    w.add_argument("--seq-len", type=seq_len, metavar="N",
                   help="text data: measure on the texts truncated at N tokens")
    w.add_argument("--metric", help="the metric the gains are in (default: the task's: "
                   "top1_agreement for retrieval, decision_agreement for faces, else sqnr_db)")
    w.add_argument("--goal", type=finite_float, help="task data: the metric to reach; says "
                   "how much smaller the plan's error must be for it")
    w.add_argument("--json", type=output_file, help="also write the result as JSON")

    x = sub.add_parser("export-qdq", help="write the ONNX QDQ model that emulation runs",
                       parents=[_model_parent(), _stats_parent(), _plan_parent(),
                                _method_parent(None)])
    x.add_argument("--out", type=output_file, required=True,
                   help="QDQ model to write (.onnx)")

    t = sub.add_parser("tokensplit", help="split token-wise layers (residual Adds, "
                       "LayerNorms) into chunks along the sequence so that 16 bit on them "
                       "fits a per-layer size limit (hailo.super_defuse); FP32 unchanged",
                       parents=[_model_parent(), _seq_len_parent()],
                       description="Text encoders need --seq-len (the deployment's length); "
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

    h = sub.add_parser("headsplit", help="split each multi-head attention into one layer "
                       "per head, so that every head's scores, Softmax and context get their "
                       "own 8-bit grid (hailo.attention_16bit keeps attention at 8 bit); "
                       "FP32 unchanged",
                       parents=[_model_parent(), _seq_len_parent()],
                       description="The head count comes from shape inference at "
                       "--seq-len (or 16 tokens), or the static/--input-shape shape.")
    h.add_argument("--out", type=output_file, required=True,
                   help="split FP32 model to write (.onnx); analyze, plan, repair, tokensplit "
                   "and export it like any model (its head groups are '<group>/head<h>')")

    rs = sub.add_parser("rowscale", help="feed each attention's context MatMul its 8-bit "
                        "weights scaled per row by min(Z, growth) (Z: the row's sum of "
                        "exp(s - max)) and divide the context by their sum afterwards, so "
                        "a flat row's weights use more of the 8-bit grid "
                        "(hailo.attention_16bit keeps them at 8 bit); FP32 unchanged",
                        parents=[_model_parent(), _seq_len_parent()],
                        description="Run it after headsplit (which matches Softmax chains) "
                        "and before tokensplit; plan '<Softmax>/w' at 8 bit and the row "
                        "statistics at 16 bit where the size rules allow.")
    rs.add_argument("--growth", type=at_least_one, default=None,
                    help="most the context MatMul's output grows, >= 1 (default 2: the "
                    "best measured on minilm-l6; 1 is the Softmax's own grid)")
    rs.add_argument("--out", type=output_file, required=True,
                    help="rewritten FP32 model to write (.onnx); its attention-weight groups "
                    "are '<Softmax>/w'")

    o = sub.add_parser("outscale", help="equalize the output channels of each residual-branch "
                       "Linear with outlier channels (an FFN down-projection): its 8-bit output "
                       "then fits every channel, the residual Add runs in the scaled basis "
                       "(two 16-bit per-channel Muls); FP32 unchanged",
                       parents=[_model_parent(), _stats_parent(), _seq_len_parent()],
                       description="Needs the model's stats ('quantscope calibrate'). Run it "
                       "before tokensplit; then calibrate the new model and plan its "
                       "'<Add>/outscale/in' groups and residual Adds at 16 bit.")
    o.add_argument("--min-ratio", type=positive_float, metavar="R",
                   help="only Linears whose output channel max / median is at least R "
                   "(default 8)")
    o.add_argument("--out", type=output_file, required=True,
                   help="rewritten FP32 model to write (.onnx)")

    pe = sub.add_parser("peel", help="move each FFN's few outlier hidden channels (after its "
                        "activation) into a small FFN of their own that joins the residual "
                        "stream through an Add: the big FFN's 8-bit hidden grid then fits "
                        "the other channels; FP32 unchanged",
                        parents=[_model_parent(), _stats_parent(), _seq_len_parent()],
                        description="Needs the model's stats ('quantscope calibrate'). Run "
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

    g = sub.add_parser("groups", help="list the decision groups of a model",
                       parents=[_model_parent()])
    g.add_argument("--json", type=output_file, help="also write the groups as JSON")

    m = sub.add_parser("models", help="list the built-in models: package, version, licence, "
                       "and whether each is built (cached) yet")
    m.add_argument("--json", type=output_file, help="also write the list as JSON")

    d = sub.add_parser("demo", help="the main job: FP32 vs a8_w8/a16_w8/a16_w16 on the "
                       "built-in sentence encoder and retrieval task",
                       parents=[_method_parent("minmax"), _pairs_parent(1000, "evaluated")])
    d.add_argument("--model", default="minilm-l6", type=input_spec("model", folder=False),
                   help="built-in model name or ONNX file (default: minilm-l6)")
    d.add_argument("--data", default="stdlib-docs", type=data_spec,
                   help="built-in retrieval data or a JSONL pairs file (default: stdlib-docs)")
    d.add_argument("--json", type=output_file,
                   help="also write the table and all metrics as JSON")
    d.add_argument("--report", type=output_file,
                   help="also write a self-contained HTML report")


def _add_planning_commands(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser("repair", help="repairs without 16 bit: equalisation, outlier "
                        "smoothing, bias correction, per-tensor ranges",
                        parents=[_model_parent(), _data_parent(), _output_parent(),
                                 _stats_parent(), _plan_parent(), _tokenizer_parent(),
                                 _pairs_parent(1000, "evaluated")])
    rp.add_argument("--repairs", default=None,
                    help="comma list of equalize, smooth, split, bias, adaround, ranges; "
                    "default: the repairs the plan lists (from `plan --repairs`), else "
                    "equalize,smooth,bias,ranges (split is never a default: it widens layers)")
    rp.add_argument("--proxy", default="local", choices=["local", "output"],
                    help="range choice by local histogram error (fast) or output error")
    rp.add_argument("--batches", type=positive_int, default=8, help="calibration batches used")
    rp.add_argument("--no-evaluate", action="store_true",
                    help="skip measuring the metrics before and after the repairs")
    rp.add_argument("--out-model", type=output_file, required=True,
                    help="repaired FP32 model to write (.onnx, for the vendor compiler)")
    rp.add_argument("--out-stats", type=output_file, required=True,
                    help="stats of the repaired model to write")
    rp.add_argument("--out-plan", type=output_file, required=True,
                    help="plan to write, with the chosen ranges and the repairs applied")

    an = sub.add_parser("analyze", help="which layers break the low precision, and why",
                        parents=[_model_parent(), _data_parent(required=False),
                                 _output_parent(), _stats_parent(required=False),
                                 _target_parent(required=False, help="target profile (its "
                                                "quantization scheme is used)"),
                                 _tokenizer_parent(), _pairs_parent(128, "analysed"),
                                 _ray_parent()])
    an.add_argument("--low", default="a8_w8", type=precision, help="the precision to diagnose (default a8_w8)")
    an.add_argument("--high", default="a16_w16", type=precision,
                    help="the precision a promoted group gets (default a16_w16)")
    an.add_argument("--proxy", type=fraction, default=0.125,
                    help="row-cost budget of the sweeps: enable-one on every "
                    "round(2/PROXY)-th row, disable-one on the noisiest rows worth PROXY of "
                    "the row cost (1.0 = exact, every row, task metric per candidate)")
    an.add_argument("--phase", type=_phases, metavar="prefill,decode",
                    help="a decoder LLM (e.g. smollm2-135m): per phase, from its own "
                    "calibration on stdlib-docs text (no --data/--stats): the widest "
                    "ranges and outlier channels, the first token, the KV cache, the "
                    "RMSNorm inputs, and which groups are predicted to break 8 bit")
    an.add_argument("--out", type=output_file, required=True,
                    help="analysis JSON to write")
    _add_plan_command(sub)


def _add_plan_command(sub: argparse._SubParsersAction) -> None:
    pl = sub.add_parser("plan", help="search a legal mixed-precision plan (Pareto front)",
                        parents=[_model_parent(), _target_parent(help="target profile"),
                                 _seq_len_parent(several=True), _output_parent(),
                                 _data_parent(required=False, help="with --stats: refine the "
                                              "front by real emulation (" + DATA_HELP + ")"),
                                 _stats_parent(required=False, help="with --data: the stats "
                                               "file of the model"),
                                 _tokenizer_parent(), _pairs_parent(300, "measured"),
                                 _ray_parent("the measurements of the best-predicted plans "
                                             "(with --data and --stats)")])
    pl.add_argument("--analysis",
                    type=input_file("analysis", "run 'quantscope analyze' to make one"), help="analysis JSON of 'quantscope analyze' (required, except with --phase)")
    pl.add_argument("--phase", type=_phases, metavar="prefill,decode",
                    help="a decoder LLM (e.g. smollm2-135m): search candidates legal on "
                    "every phase graph within --max-cost (default 1.5) at --seq-len, "
                    "measure them per phase on stdlib-docs text and keep the best (minutes)")
    budget = pl.add_mutually_exclusive_group()
    budget.add_argument("--min-quality", type=non_negative_float,
                        help="the least predicted quality (the analysis' metric, output SQNR "
                        "in dB); not with --data")
    budget.add_argument("--max-cost", type=positive_float, help="relative to uniform a8_w8 = 1.0")
    pl.add_argument("--metric", default=None,
                    help="with --data: the measured metric (default: top1_agreement for text "
                    "retrieval, score_agreement for sentence similarity, decision_agreement "
                    "for faces, sqnr_db of the worst output for tensor data)")
    pl.add_argument("--goal", type=finite_float, help="with --data: the measured metric to reach; "
                    "the output says whether it was reached and which rule binds if not")
    pl.add_argument("--repairs", help="with --data/--stats: comma list of repairs to search "
                    "together with the precisions (each measured; see docs/planner.md)")
    pl.add_argument("--repair-batches", type=positive_int, default=8,
                    help="calibration batches the repairs use")
    pl.add_argument("--seed", type=int, default=0,
                    help="recorded in the plan (the search draws no random numbers yet)")
    pl.add_argument("--out", type=output_file, required=True,
                    help="plan JSON to write (with the Pareto front)")

    k = sub.add_parser("check", help="legality preflight of a plan on a target",
                       parents=[_model_parent(option=True), _target_parent(),
                                _seq_len_parent()])
    k.add_argument("plan", type=input_file("plan", PLAN_FIX), help="plan JSON to check")
    k.add_argument("--phase", type=_phases, metavar="prefill,decode",
                   help="a decoder LLM (e.g. smollm2-135m): check the plan on each phase's "
                   "graph (same layer names) and print each phase's cost")
    k.add_argument("--quality", action="store_true",
                   help="with --phase: also measure next-token quality per phase on "
                   "stdlib-docs text (top-1 agreement, KL, perplexity ratio; minutes)")

    ro = sub.add_parser("route", help="a deployment of several compiled sequence lengths "
                        "(length buckets), each text on the shortest that holds it: legality "
                        "and cost per bucket, mean cost, task metrics of the routed outputs",
                        parents=[_model_parent(), _data_parent(), _tokenizer_parent(),
                                 _pairs_parent(None, "evaluated")],
                        description="MODEL is the FP32 reference (the metrics compare with "
                        "it; its uniform a8_w8 at the longest bucket is the cost unit). Each "
                        "bucket is a model file (the reference or a rewrite of it: tokensplit, "
                        "headsplit, ...), its stats and its plan, checked at its own length. "
                        "The deployment file: {\"buckets\": [{\"seq_len\": 128, \"model\": "
                        "\"m.onnx\", \"stats\": \"m.npz\", \"plan\": \"p128.json\"}, ...]} "
                        "(paths relative to its folder).")
    ro.add_argument("--deployment", type=input_file("deployment", "write the buckets file "
                    "(see 'quantscope route --help')"), required=True,
                    help="deployment JSON: the buckets")
    ro.add_argument("--max-cost", type=positive_float,
                    help="say whether the mean cost is within this (x uniform a8_w8)")
    ro.add_argument("--goal", type=finite_float,
                    help="say whether the routed top-1 agreement (retrieval) reaches this")
    ro.add_argument("--json", type=output_file, help="also write the result as JSON")

    bu = sub.add_parser("buckets", help="choose the compiled lengths of a deployment and a "
                        "candidate plan for each, within a mean cost (writes the file 'route' "
                        "measures)",
                        parents=[_model_parent(), _data_parent(), _tokenizer_parent(),
                                 _pairs_parent(None, "loaded")],
                        description="MODEL is the FP32 reference. Every candidate (a model "
                        "file: the reference or a rewrite of it, its stats and a plan) runs "
                        "once on the texts of the pairs after the first --skip-pairs; the "
                        "choice minimises their mean 1 - cosine to FP32 with the mean cost "
                        "(x the reference's uniform a8_w8 at the longest length, weighted by "
                        "those texts) within --max-cost, each bucket legal at its length. The "
                        "candidates file: {\"candidates\": [{\"name\": \"all16\", \"model\": "
                        "\"m.onnx\", \"stats\": \"m.npz\", \"plan\": \"p.json\"}, ...]} (paths "
                        "relative to its folder). Measure the result on the held-out pairs: "
                        "'quantscope route MODEL --data D --pairs N --deployment OUT'.")
    bu.add_argument("--candidates", type=input_file("candidates", "write the candidates file "
                    "(see 'quantscope buckets --help')"), required=True,
                    help="candidates JSON: model, stats and plan per candidate")
    bu.add_argument("--max-cost", type=positive_float, required=True,
                    help="the mean cost allowed (x uniform a8_w8 of the reference at the "
                    "longest length)")
    bu.add_argument("--max-buckets", type=positive_int, default=6,
                    help="at most this many compiled lengths (default 6)")
    bu.add_argument("--lengths", type=_lengths, default=None,
                    help="compiled lengths to choose from, comma-separated; the longest is "
                    "always a bucket (default 16,24,32,40,48,56,64,80,96,112,128,160,192,224,256)")
    bu.add_argument("--skip-pairs", type=count, default=0,
                    help="choose on the pairs after the first N (keep those for route)")
    bu.add_argument("--out", type=output_file, required=True,
                    help="deployment JSON to write (route --deployment)")
    bu.add_argument("--json", type=output_file, help="also write the choice as JSON")

    li = sub.add_parser("lint", help="preflight of a Hailo model script (.alls)",
                        parents=[_model_parent(option=True), _target_parent(), _hn_parent(),
                                 _seq_len_parent()])
    li.add_argument("script", type=input_file("model script", "check the path"), help="Hailo model script (.alls) to lint")


def _lengths(text: str) -> tuple[int, ...]:
    """``16,32,64,128,256``: compiled sequence lengths."""
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a comma-separated list of token counts (e.g. 32,64,128,256)"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': every length must be a positive token count")
    return values


def _phases(text: str) -> tuple[str, ...]:
    from quantscope.model.phases import parse_phases

    try:
        return parse_phases(text)
    except QuantscopeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_output_commands(sub: argparse._SubParsersAction) -> None:
    io = sub.add_parser("io", help="how to feed and read the deployed model (scale, zero "
                        "point, stored type of every quantized input/output)",
                        parents=[_model_parent(), _stats_parent(), _plan_parent()])
    io.add_argument("--json", type=output_file,
                    help="write the I/O table (and mapping checks) as JSON")
    io.add_argument("--check-mapping", action="append", metavar="TENSOR=CODE:VALUE,…",
                    type=mapping, help="a hand-written code<->value mapping to check "
                    "against the correct transform, e.g. 'out=0:-1,127:0,255:1' (TENSOR may "
                    "be *); repeatable")
    io.add_argument("--snippet", dest="out_snippet", metavar="FILE.py", type=output_file,
                    help="write host-side to_device/from_device functions to paste")

    r = sub.add_parser("report", help="one self-contained HTML report from result files",
                       parents=[_stats_parent(required=False, help="with --model and "
                                              "--plan: the stats file of the model"),
                                _seq_len_parent()])
    r.add_argument("--out", type=output_file, required=True, help="HTML file to write")
    r.add_argument("--results", nargs="*", type=input_file("results", "check the path"),
                   help="demo/evaluate JSON files")
    r.add_argument("--plan", type=input_file("plan", PLAN_FIX), help="plan JSON (Pareto front, decisions)")
    r.add_argument("--analysis", type=input_file("analysis", "check the path"), help="analysis JSON")
    r.add_argument("--model", type=input_spec("model", folder=False), help="with --stats and --plan: device I/O and legality")
    r.add_argument("--title", default="quantscope report", help="title of the page")

    ex = sub.add_parser("export", help="export a plan: Hailo .alls, QNN encodings, ONNX QDQ",
                        parents=[_model_parent(option=True), _stats_parent(), _hn_parent()])
    ex.add_argument("plan", type=input_file("plan", PLAN_FIX), help="plan JSON to export")
    ex.add_argument("--format", required=True, choices=["alls", "qnn", "qdq"],
                    help="alls: Hailo model script; qnn: QNN/AIMET encodings JSON; qdq: ONNX")
    ex.add_argument("--qnn-version", default="1.0.0", choices=["1.0.0", "0.6.1"],
                    help="QNN encodings file version (default 1.0.0)")
    ex.add_argument("--out", type=output_file, required=True, help="file to write")


def _add_run_command(sub: argparse._SubParsersAction) -> None:
    ru = sub.add_parser("run", help="model to device in one command: calibrate, analyze, "
                        "plan, repair, check, evaluate, export, io, report (resumable)",
                        parents=[_model_parent(), _data_parent(),
                                 _target_parent(help="target profile"), _seq_len_parent(),
                                 _method_parent("minmax"), _tokenizer_parent(),
                                 _pairs_parent(300, "fitting the plan (and as many held out)")])
    _add_layout(ru)
    ru.add_argument("--eval-data", type=data_spec, help="held-out evaluation data (default: split DATA, "
                    "or the pairs after --pairs for retrieval data)")
    ru.add_argument("--goal", type=finite_float, help="the measured metric to reach on the "
                    "held-out data (the verdict says if it is and what binds if not)")
    ru.add_argument("--max-cost", type=positive_float, help="relative to uniform a8_w8 = 1.0")
    ru.add_argument("--metric", help="the measured metric (default: the task's: "
                    "top1_agreement for retrieval, decision_agreement for faces, else "
                    "sqnr_db, the output SQNR in dB)")
    ru.add_argument("--repairs", help="repairs the plan search may choose, comma list, or "
                    "'none' (default: the default repairs of 'quantscope repair')")
    ru.add_argument("--hn", type=input_file("HN", "pass the parsed model's .hn JSON"), help="parsed model HN JSON (exact Hailo layer names in the .alls)")
    ru.add_argument("--repair-batches", type=positive_int, default=8,
                    help="calibration batches the repairs use (default 8)")
    ru.add_argument("--tokensplit", dest="token_chunk", type=positive_int, metavar="N",
                    help="work on the model with its LayerNorms and residual Adds split into "
                    "layers of N tokens (below --seq-len; 'quantscope tokensplit'): 16 bit on "
                    "them then fits hailo.super_defuse (unverified on a device)")
    ru.add_argument("--tokensplit-linears", dest="token_linears", action="store_true",
                    help="with --tokensplit: the token-wise Linears in chunks too "
                    "('quantscope tokensplit --linears')")
    ru.add_argument("--headsplit", dest="heads", action="store_true",
                    help="work on the model with each attention head a layer of its own "
                    "('quantscope headsplit'): every head's 8-bit scores, Softmax and "
                    "context get their own grid (unverified on a device)")
    ru.add_argument("--rowscale", action="store_true",
                    help="work on the model with each attention's 8-bit weights scaled per "
                    "row before the context MatMul and the context divided by their sum "
                    "('quantscope rowscale', after --headsplit): plan '<Softmax>/w' at 8 "
                    "bit (unverified on a device)")
    ru.add_argument("--outscale", action="store_true",
                    help="work on the model with its residual-branch Linears writing "
                    "equalized output channels ('quantscope outscale'; calibrates the given "
                    "model first): plan the new skip-branch Muls at 16 bit (unverified on a "
                    "device)")
    ru.add_argument("--whatif", action="store_true",
                    help="also measure where the final plan's error is ('quantscope whatif': "
                    "the plan with each op kind it keeps below 16 bit lifted to a16_w16, on "
                    "the held-out data; one evaluation per kind): in the verdict and report")
    ru.add_argument("--peel", action="store_true",
                    help="work on the model with each FFN's outlier hidden channels in a "
                    "small FFN of their own ('quantscope peel'; calibrates the given model "
                    "first, once with --outscale): plan the new '<Add>/peel' groups at 16 "
                    "bit (unverified on a device)")
    ru.add_argument("--proxy", type=fraction, default=0.125, help="analysis row budget (see "
                    "'quantscope analyze --help')")
    ru.add_argument("--force", metavar="STAGE", choices=RUN_STAGES, help="rerun from STAGE (calibrate, analyze, "
                    "plan, repair, check, evaluate, export, io, report)")
    ru.add_argument("--out", dest="folder", type=run_folder, required=True, help="run folder (created; every stage's file, "
                    "run.json, report.html)")
