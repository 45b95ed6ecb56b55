"""Options shared by the commands: one parent parser per input a command can read.

Every input a command can read (model, data, stats, plan, target, tokenizer, pairs, ...) is
declared once here, with its help; each command's own options sit with its handler in its
family's module (:mod:`quantscope.cli.commands` lists them). :class:`Parser` turns a
usage error into one line; :func:`command` opens each command's ``--help`` with what it is
for and the recommended invocation.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from quantscope.cli.types import (
    at_least_one,
    batch_axes,
    cache_folder,
    confidence,
    data_spec,
    duration,
    input_file,
    input_shape,
    layout,
    model_spec,
    output_name,
    pair_count,
    positive_float,
    positive_int,
    precision,
    ray_address,
    seq_len,
    seq_lens,
    target_spec,
    tokenizer_spec,
)
from quantscope.targets import BUILTIN_TARGETS
from quantscope.tasks.headline import TENSOR_HEADLINE
from quantscope.types import Precision, QuantscopeError

if TYPE_CHECKING:
    from quantscope.rewrites.base import CliOption

METHODS = ("minmax", "percentile", "mse")
DATA_HELP = (".npy/.npz file or folder, JSONL query/document pairs, a text file, a face "
             "folder, or a built-in data name (stdlib-docs, faces, photos, photos-small); "
             "face data takes its pixels' values after a colon (faces:raw, "
             "faces:scale=255: as --pixels of 'quantscope images')")


# ---------------------------------------------------------------- shared options
# One parent parser per input a command can read; each is declared here once, with its help.
# Factories, not shared objects: argparse shares a parent's actions with every child, so a
# per-command default (e.g. --pairs) needs its own parent.


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are a :class:`QuantscopeError` (one line, exit 2)."""

    def error(self, message: str) -> NoReturn:
        line = " ".join(message.split())
        command = self.prog.removeprefix("quantscope").strip()
        see = f"(see '{self.prog} --help')"  # once: a type's own fix may point there
        raise QuantscopeError(f"{command}{': ' if command else ''}{line}"
                              + ("" if line.endswith(see) else f" {see}"))


def _parent() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False)


STATS_FIX = "run 'quantscope calibrate' to make one"
PLAN_FIX = "check the path (plans are written by 'quantscope plan')"


def model_parent(*, option: bool = False) -> argparse.ArgumentParser:
    p, what = _parent(), "ONNX file or built-in model name (see 'quantscope models')"
    kind = model_spec
    if option:
        p.add_argument("--model", required=True, type=kind, help=what)
    else:
        p.add_argument("model", type=kind, help=what)
    return p


def data_parent(*, required: bool = True, help: str = DATA_HELP) -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--data", required=required, type=data_spec, help=help)
    p.add_argument("--batch-axis", action="append", default=[], type=batch_axes,
                   metavar="NAME=AXIS[,…]",
                   help="the axis of input (or output) NAME that holds the samples, for "
                   "tensor data (default: found from the model: a symbolic dim the inputs "
                   "share, else the axis of static size 1 the data fills; e.g. an LSTM "
                   "state h=1); repeatable; a NAME holding ',' or '=' is read up to the "
                   "last '=' before the axis, or quote it: '\"a,b\"=1'")
    return p


def output_parent() -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--output", type=output_name, metavar="NAME",
                   help="score this model output alone (default: every output; the "
                   "metrics without an output name are the worst output's)")
    add_layout(p)
    return p


METRIC_DEFAULT = ("the task's: top1_agreement for retrieval, score_agreement for sentence "
                  "similarity, decision_agreement for faces, the headline of the task "
                  f"--layout declares (detection_f1, mask_iou …), else {TENSOR_HEADLINE}, "
                  "the worst channel's SQNR in dB over every output")
"""The default of every ``--metric`` (``tasks.headline.headline_of``), said once."""


PROMOTION = "the target's [promotion] precision (else a16_w16; a16_w8 on qnn-htp-v73)"
"""What a promoted group gets (``Target.promote``): analyze --high, plan --max-legal."""


LAYOUT_HELP = ("tensor data: what a model output is, scored as such (repeat per output): "
               "OUTPUT=detect[:boxes=0-3,scores=4-,obj=R,axis=1,format=cxcywh|xyxy,"
               "threshold=0.25,iou=0.5,scores_from=OUT,anchors=FILE.npy,grid=8/16/32,dfl=8,"
               "centre=0.5,levels=OUT2+OUT3] (detection "
               "F1 vs FP32; obj=R: a YOLOv5 objectness row multiplying the class scores; "
               "scores_from: the scores in another output of the same anchors, an SSD's two "
               "heads; anchors: [A, 2] centres added to undecoded box centres; grid: the "
               "strides of a YOLOX head's undecoded grid offsets and log sizes; dfl: bins per "
               "side of distribution boxes (PicoDet, NanoDet-Plus, YOLOv8) with grid, their "
               "points at (cell + centre) x stride; levels: the other levels' box outputs, "
               "pooled into one detector with one NMS, scores_from=S1+S2+... one per level), "
               "OUTPUT=map[:threshold=0.5,channel=K] (mask IoU, of index K of axis 1 alone "
               "with channel=K; mean absolute error vs FP32), "
               "OUTPUT=score[:threshold=0.5] (decision agreement, one value per sample), "
               "OUTPUT=class[:axis=K] (top-1 agreement of class scores or logits on axis K, -1 the "
               "last; default: the axis the graph gives their features, e.g. the last of a "
               "token classifier's [N, T, C], else 1, said; an axis= counts the output's axes "
               "as the model declares it, its --batch-axis included), "
               "OUTPUT=points[:dims=2,tol=T,flags=A-B,threshold=0,scale=S,order=interleaved,"
               "photo=PX,where=OUT:K>T] "
               "(landmarks: share of points within tol of FP32's, distances in the output's "
               "units; tol default 1 %% of FP32's x, y span; flags: values A to B of each "
               "point, from 0, decided at threshold, e.g. MediaPipe pose's visibility, "
               "presence: dims=5,flags=3-4; scale=S or scale=input: the values x S are "
               "pixels, tol then defaults to 1 px, e.g. MTCNN's O-Net landmarks in units of "
               "its 48-px crop: scale=48,order=planar, planar: x1..xP then y1..yP; "
               "order=channels: a map's values on axis 1 at each position; photo=PX: the "
               "crop's box side in photo pixels, distances on the photo too; where=OUT:K>T: "
               "only the points where FP32's output OUT, channel K, passes T, e.g. MTCNN "
               "P-Net's where=prob:1>0.6; quote it in a shell), "
               "OUTPUT=ctc[:blank=0,axis=-1,lengths=OUT] (a text recognizer's or an ASR "
               "encoder's [N, T, C] decoded by CTC greedy decoding: string agreement and "
               "character error rate vs FP32; lengths: an int output of each sample's valid "
               "steps, FP32's read, e.g. log_probs_len), "
               "OUTPUT=image[:range=LO-HI] (an image: PSNR and SSIM vs FP32 over the range, "
               "both clipped to it, e.g. 0-255; default FP32's min..max, said), "
               "OUTPUT=depth[:align=affine|scale|none] (a relative depth map: AbsRel and "
               "delta < 1.25 vs FP32 after each map's least-squares scale and shift), "
               "OUTPUT=verify[:labels=NAME,threshold=T] (an embedding: every pair of samples "
               "decided same or not at cosine T, default FP32's equal-error threshold, vs "
               "FP32: decision agreement, TAR/FAR; labels=NAME, required: the data file's "
               "array of one label per sample, e.g. a speaker id), "
               "OUTPUT=pitch[:cents=20,threshold=0.21,tol=50] (a pitch tracker's bins on the "
               "last axis, CREPE's: each frame's pitch by the weighted top bins and its voicing "
               "at threshold; share of voiced frames within tol cents of FP32's), "
               "OUTPUT=embedding[:norm=l2|none,labels=NAME] (an embedding, no labels "
               "needed: the share of samples whose nearest other sample, by cosine (l2) or "
               "raw Euclidean distance (none), is FP32's; with labels=NAME, the data file's "
               "array of one label per sample, whose nearest other's label is; 3 samples or "
               "more), "
               "OUTPUT=tensor (fidelity only). Default: a detection head (a Concat of 4 box "
               "rows and score rows), a Softmax over the classes (axis 1 of an [N, C] or "
               "[N, C, H, W] output, the last of an [N, T, C] one) and a Sigmoid making "
               "the only output, one value per sample (a score at 0.5) are "
               "found in the graph; other outputs are tensors (docs/outside-the-zoo.md). An "
               "OUTPUT holding '=' is read up to the last '=KIND', or quote it: '\"a=b\"=map'")


def add_layout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layout", type=layout, action="append", default=[],
                   metavar="OUTPUT=KIND[:KEY=VALUE,...]", help=LAYOUT_HELP)


def stats_parent(*, required: bool = True, help: str | None = None) -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--stats", required=required, type=input_file("stats", STATS_FIX),
                   help=help or "stats file written by 'quantscope calibrate' (.npz)")
    return p


def plan_parent() -> argparse.ArgumentParser:
    p = _parent()
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--precision", type=precision, help="uniform precision: " + ", ".join(x.value for x in Precision))
    g.add_argument("--plan", type=input_file("plan", PLAN_FIX), help="plan JSON (group name -> precision, with a default)")
    return p


def target_parent(*, required: bool = True, help: str = "") -> argparse.ArgumentParser:
    names = ", ".join(n.replace("_", "-") for n in BUILTIN_TARGETS)
    p = _parent()
    p.add_argument("--target", required=required, type=target_spec,
                   help=f"{help}{': ' if help else ''}{names} or a target TOML file")
    return p


def tokenizer_parent() -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--tokenizer", type=tokenizer_spec,
                   help="tokenizer.json or Hugging Face model folder (text models; default: "
                   "the one the model names or sits with (tokenizer.json beside it), else "
                   "the packaged uncased BERT tokenizer of the MiniLMs)")
    add_prefixes(p)
    return p


PREFIX_HELP = ("text put before every {what} before tokenizing, for encoders trained with "
               "prefixes (e5: {e5}{bge}; text data only; quote it, e.g. {e5}; default: none)")


def prefix_text(text: str) -> str:
    """A text prefix: one line (a newline would change what the tokenizer splits on)."""
    if "\n" in text or "\r" in text:
        raise argparse.ArgumentTypeError(f"{text!r} holds a line break: a prefix is text put "
                                         "before each query or document on its line")
    return text


def add_prefixes(p: argparse.ArgumentParser) -> None:
    """--query-prefix / --doc-prefix: the text prefixes of retrieval data, on every command
    that reads text (they come with ``--tokenizer``)."""
    p.add_argument("--query-prefix", default="", metavar="TEXT", type=prefix_text,
                   help=PREFIX_HELP.format(what="query (and both sentences of similarity "
                                           "pairs)", e5="'query: '",
                                           bge="; bge: its query instruction"))
    p.add_argument("--doc-prefix", default="", metavar="TEXT", type=prefix_text,
                   help=PREFIX_HELP.format(what="document and calibration text",
                                           e5="'passage: '", bge=""))


def pairs_parent(default: int | None, what: str) -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--pairs", type=pair_count, default=default,
                   help=f"retrieval pairs {what} (text retrieval data; "
                   f"default: {default or 'all'}; 0 = all)")
    return p


def calib_texts_parent() -> argparse.ArgumentParser:
    """--calib-texts N: text data calibrates on its first N calibration texts."""
    p = _parent()
    p.add_argument("--calib-texts", type=positive_int, default=None, metavar="N",
                   help="calibrate on the first N calibration texts of text data (stdlib-docs: "
                   "its 512 calibration texts; a pairs file: the documents of its pairs; "
                   "default: all, up to 512): fewer calibrate faster and may set other "
                   "ranges, which every figure then measures")
    return p


RACE_CONFIDENCE = 0.95


def race_parent(what: str) -> argparse.ArgumentParser:
    """--race [CONFIDENCE]: race the candidates on prefixes of the pairs first."""
    p = _parent()
    p.add_argument("--race", nargs="?", const=RACE_CONFIDENCE, default=None, type=confidence,
                   metavar="CONFIDENCE",
                   help=f"race {what} on growing prefixes of the pairs first: a candidate "
                   "worse than its rival by more than its one-sided interval at this "
                   f"confidence (default {RACE_CONFIDENCE:g}) stops there and is not measured "
                   "in full; the survivors are (default: off, every candidate measured in "
                   "full)")
    return p


def ray_parent(what: str = "the sweep's candidates") -> argparse.ArgumentParser:
    """--ray [ADDRESS]: run the independent evaluations on a Ray cluster (the ray extra)."""
    p = _parent()
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   type=ray_address,
                   help=f"run {what} on Ray: a local cluster on this "
                   "machine's CPUs, or the existing cluster at ADDRESS (e.g. ray://head:10001 "
                   "or auto); the same results as without (needs: pip install ray)")
    return p


def rank_engine_parent() -> argparse.ArgumentParser:
    """--rank-engine auto|ort|torch: which engine ranks the planner's candidates (ORT
    measures the chosen plan and every reported figure)."""
    p = _parent()
    p.add_argument("--rank-engine", choices=("auto", "ort", "torch"), default="auto",
                   help="which engine ranks the candidate plans of the search: torch (the "
                   "fine-tune's fake-quant interpreter, on CUDA when PyTorch sees a GPU, else "
                   "the CPU) or ort; auto (default): torch on CUDA when there is one, else "
                   "ort. ONNX Runtime measures the chosen plan and every reported figure; the "
                   "output says which engine ranked and which measured")
    return p


def cache_parent(what: str) -> argparse.ArgumentParser:
    """--cache DIR: every candidate evaluation kept on disk (``analyze/evalcache.py``)."""
    p = _parent()
    p.add_argument("--cache", type=cache_folder, default=None, metavar="DIR",
                   help=f"keep {what} in DIR, one small JSON each under a hash of the "
                   "model's content, the stats, the plan, the scheme, the data and the "
                   "metric: a rerun reads them back instead of measuring (default: none)")
    return p


def allow_warning_parent(what: str) -> argparse.ArgumentParser:
    """--allow-warning RULE (repeatable): a warning rule of the target the user accepts
    (``quantscope.targets.accept``), checked against the target before any work."""
    p = _parent()
    p.add_argument("--allow-warning", dest="allow_warning", action="append", metavar="RULE",
                   help=f"a warning rule of the target (its id as the profile names it, e.g. "
                   f"hailo.super_defuse; or 'all': every warning rule) that {what}; "
                   "repeatable; an error rule or an id the target does not name is refused; "
                   "the outputs list each one accepted with the groups it lets through "
                   "(default: none: a warning that applies blocks)")
    return p


def budget_parent(default: float | None) -> argparse.ArgumentParser:
    """--budget 30m: the seconds the plan search may spend measuring candidates."""
    shown = "none" if default is None else (
        f"{default / 60:g}m" if default % 60 == 0 else f"{default:g}s")
    p = _parent()
    p.add_argument("--budget", type=duration, default=default, metavar="90s|30m|1h|none",
                   help="time the plan search may spend measuring candidates (in order of "
                   "expected gain per second); when spent, the plan is the best legal one "
                   "measured so far and the output says so; a rerun with a larger budget "
                   "continues from the evaluation cache; in run, what the search leaves is "
                   "the fine-tune's (--finetune); a decoder LLM's run spends all of it on "
                   f"the fine-tune (--finetune on) (default: {shown})")
    return p


SEQ_LEN_DEFAULT = "none: the shapes the model declares"


def seq_len_parent(*, several: bool = False,
                   default: str = SEQ_LEN_DEFAULT) -> argparse.ArgumentParser:
    """--seq-len (and --input-shape); ``default``: what the command does without it."""
    p = _parent()
    if several:
        p.add_argument("--seq-len", type=seq_lens, metavar="N[,N…]",
                       help="sequence length(s) for symbolic token dims: legality depends on "
                       "it, so a comma list (128,256) plans each and keeps the best, "
                       "showing every length's front and the fraction of texts that fit "
                       f"(default: {default})")
    else:
        p.add_argument("--seq-len", type=seq_len,
                       help="sequence length for symbolic token dims (rules and costs that "
                       f"depend on the tensor size; default: {default})")
    add_input_shape(p, "concrete shape of an input with symbolic dims other than the "
                    "sequence, e.g. pixel_values=1x3x224x224 (repeatable)")
    return p


def add_input_shape(p: argparse.ArgumentParser, help: str) -> None:
    """``--input-shape NAME=DxDx…`` (repeatable), with the command's own ``help``."""
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=DxDx…",
                   type=input_shape, help=help)


def method_parent(default: str | None) -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--method", default=default, choices=METHODS,
                   help=f"activation range setting (default: {default})" if default else
                   "activation range setting (default: the one the stats were made with)")
    return p


def hn_parent() -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--hn", type=input_file("HN", "check the path"), help="parsed model HN JSON (exact Hailo layer names)")
    return p


# ---------------------------------------------------------------- a command's parser


class HelpFormatter(argparse.HelpFormatter):
    """Help text in paragraphs (split at blank lines): a paragraph whose first line is
    indented (an example command, a list) is kept as written; any other is wrapped."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for para in text.split("\n\n"):
            if para.startswith("  "):
                out.append("\n".join(indent + line for line in para.splitlines()))
            else:
                out.append(super()._fill_text(para, width, indent))
        return "\n\n".join(out)


def command(sub: argparse._SubParsersAction, name: str, summary: str, *, example: str,
            details: str = "", parents: tuple[argparse.ArgumentParser, ...] = (),
            **kwargs: Any) -> argparse.ArgumentParser:
    """The subparser of command ``name``: its ``--help`` opens with ``summary`` (what it
    is for, the line ``quantscope --help`` lists), then ``example`` (the recommended
    invocation; one command per line), then ``details``."""
    examples = "\n".join(f"  {line}" for line in example.splitlines())
    text = f"{summary[0].upper()}{summary[1:]}.\n\n{examples}"
    # no abbreviations: 'evaluate --out x.json' was taken as '--output x.json' (another
    # option) and failed with a misleading line; a prefix is now an unknown option
    return sub.add_parser(name, parents=list(parents),
                          description=text + (f"\n\n{details}" if details else ""),
                          formatter_class=HelpFormatter, allow_abbrev=False, **kwargs)


# CliOption.kind -> the argument type checked while parsing
OPTION_TYPES: dict[str, Callable[[str], Any]] = {
    "int": positive_int, "float": positive_float, "float>=1": at_least_one}


def option_kwargs(o: CliOption) -> dict[str, Any]:
    """``add_argument`` keywords of a rewrite option (its help, type and metavar)."""
    if o.kind == "flag":
        return {"action": "store_true", "help": o.help}
    out: dict[str, Any] = {"type": OPTION_TYPES[o.kind], "default": o.default, "help": o.help}
    if o.metavar:
        out["metavar"] = o.metavar
    return out
