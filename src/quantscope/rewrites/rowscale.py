"""Row scaling as a registry entry: :func:`quantscope.repair.rowscale.rowscale`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantscope.model.load import Model
from quantscope.repair import Repair as GraphRepair
from quantscope.repair.rowscale import GROWTH, METADATA_KEY, UNVERIFIED, rowscale
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
class RowscaleConfig:
    """``growth``: the most the context MatMul's output grows (>= 1)."""

    growth: float = GROWTH


def _transform(model: Model, config: RowscaleConfig, inp: RewriteInput) -> GraphRepair:
    return rowscale(model, growth=config.growth)


def _applies(model: Model, target: Target | None, seq_len: int | None,
             stats: Stats | None) -> Precondition:
    """Holds when the model has attention Softmax chains."""
    return softmax_chains(model)


ANSWERS = ("attention_16bit",)


def _binds(model: Model, target: Target | None, seq_len: int | None) -> Precondition:
    """Binds where the target keeps attention (Softmax, activation x activation MatMuls)
    at 8 bit: the rule refuses them at a16_w16 on this model."""
    return rule_binds(model, target, seq_len, ANSWERS, "attention")


REWRITE = Rewrite(
    name="rowscale", config=RowscaleConfig,
    summary="feed each attention's context MatMul its 8-bit weights scaled per row by "
            "min(Z, growth) (Z: the row's sum of exp(s - max)) and divide the context by "
            "their sum afterwards, so a flat row's weights use more of the 8-bit grid "
            "(hailo.attention_16bit keeps them at 8 bit); FP32 unchanged",
    unverified=UNVERIFIED,
    what="each attention's 8-bit weights are scaled per row before the context MatMul and "
         "the context divided by their sum",
    metadata_key=METADATA_KEY, transform=_transform, applies=_applies,
    answers=ANSWERS, binds=_binds,
    cli_options=(
        CliOption(("--growth",), "growth", "float>=1", None,
                  help="most the context MatMul's output grows, >= 1 (default 2: the best "
                  "measured on minilm-l6; 1 is the Softmax's own grid)"),
        CliOption((), None, "flag", False, help="", switch=True, run_flag="--rowscale",
                  run_field="rowscale",
                  run_help="work on the model with each attention's 8-bit weights scaled per "
                  "row before the context MatMul and the context divided by their sum "
                  "('quantscope rowscale', after --headsplit): plan '<Softmax>/w' at 8 bit "
                  "(unverified on a device)"),
    ),
    verdict_rank=4,
    example="quantscope rowscale heads.onnx --seq-len 128 --out rows.onnx",
    out_help="rewritten FP32 model to write (.onnx); its attention-weight groups are "
             "'<Softmax>/w'",
    description="Run it after headsplit (which matches Softmax chains) and before "
                "tokensplit; plan '<Softmax>/w' at 8 bit and the row statistics at 16 bit "
                "where the size rules allow.",
)
