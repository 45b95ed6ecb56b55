"""The head split as a registry entry: :func:`quantscope.repair.heads.split_heads`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantscope.model.load import Model
from quantscope.repair import Repair as GraphRepair
from quantscope.repair.heads import METADATA_KEY, UNVERIFIED, split_heads
from quantscope.rewrites.base import (
    CliOption,
    Precondition,
    Rewrite,
    RewriteInput,
    rule_binds,
    softmax_chains,
)
from quantscope.types import Stats

if TYPE_CHECKING:
    from quantscope.targets.profile import Target


@dataclass(frozen=True)
class HeadsplitConfig:
    """No options: the head count comes from the shapes."""


def _transform(model: Model, config: HeadsplitConfig, inp: RewriteInput) -> GraphRepair:
    return split_heads(model, shapes=inp.shapes, seq_len=inp.seq_len)


def _applies(model: Model, target: Target | None, seq_len: int | None,
             stats: Stats | None) -> Precondition:
    """Holds when the model has multi-head attention Softmax chains."""
    return softmax_chains(model)


ANSWERS = ("attention_16bit",)


def _binds(model: Model, target: Target | None, seq_len: int | None) -> Precondition:
    """Binds where the target keeps attention (Softmax, activation x activation MatMuls)
    at 8 bit: the rule refuses them at a16_w16 on this model."""
    return rule_binds(model, target, seq_len, ANSWERS, "attention")


HINT = (
    "hint: attention stays at 8 bit; 'quantscope headsplit MODEL --out split.onnx' makes "
    "each head a layer of its own, so every head's scores, Softmax and context get their "
    "own 8-bit grid (unverified on a device); calibrate, analyze and plan the split model")

REWRITE = Rewrite(
    name="headsplit", config=HeadsplitConfig,
    summary="split each multi-head attention into one layer per head, so that every head's "
            "scores, Softmax and context get their own 8-bit grid (hailo.attention_16bit "
            "keeps attention at 8 bit); FP32 unchanged",
    unverified=UNVERIFIED, what="each attention head a layer of its own",
    metadata_key=METADATA_KEY, transform=_transform, applies=_applies,
    answers=ANSWERS, binds=_binds, hint=HINT,
    cli_options=(
        CliOption((), None, "flag", False, help="", switch=True, run_flag="--headsplit",
                  run_field="heads",
                  run_help="work on the model with each attention head a layer of its own "
                  "('quantscope headsplit'): every head's 8-bit scores, Softmax and "
                  "context get their own grid (unverified on a device)"),
    ),
    verdict_rank=1,
    example="quantscope headsplit minilm-l6 --seq-len 128 --out heads.onnx",
    out_help="split FP32 model to write (.onnx); analyze, plan, repair, tokensplit and export "
             "it like any model (its head groups are '<group>/head<h>')",
    left="left whole",
    description="The head count comes from shape inference at --seq-len (or 16 tokens), or "
                "the static/--input-shape shape.",
)
