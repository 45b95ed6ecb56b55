"""Output scaling as a registry entry: :func:`quantscope.repair.outscale.outscale`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantscope.model.load import Model
from quantscope.repair import Repair as GraphRepair
from quantscope.repair.outscale import METADATA_KEY, MIN_RATIO, UNVERIFIED, outscale
from quantscope.rewrites.base import (
    CliOption,
    Precondition,
    Rewrite,
    RewriteInput,
    new_nodes,
    outlier_channels,
)
from quantscope.types import Stats

if TYPE_CHECKING:
    from quantscope.targets.profile import Target


@dataclass(frozen=True)
class OutscaleConfig:
    """``min_ratio``: only Linears whose output channel max / median is at least this."""

    min_ratio: float = MIN_RATIO


def _transform(model: Model, config: OutscaleConfig, inp: RewriteInput) -> GraphRepair:
    assert inp.stats is not None
    return outscale(model, inp.stats, min_ratio=config.min_ratio)


def _applies(model: Model, target: Target | None, seq_len: int | None,
             stats: Stats | None) -> Precondition:
    """Holds when the stats show an outlier output channel on a Linear (ratio >= 8)."""
    return outlier_channels(model, stats, MIN_RATIO, "outscale's min ratio")


def _lift(r: GraphRepair) -> tuple[str, ...]:
    """The skip-branch Muls and the residual Adds they feed: plan them at 16 bit."""
    ins = new_nodes(r, "/outscale/in")
    return tuple(x for n in ins for x in (n, n.removesuffix("/outscale/in")))


REWRITE = Rewrite(
    name="outscale", config=OutscaleConfig,
    summary="equalize the output channels of each residual-branch Linear with outlier "
            "channels (an FFN down-projection): its 8-bit output then fits every channel, "
            "the residual Add runs in the scaled basis (two 16-bit per-channel Muls); FP32 "
            "unchanged",
    unverified=UNVERIFIED,
    what="the FFN down-projections (residual-branch Linears with outlier output channels) "
         "write equalized channels, the residual Adds run in the scaled basis",
    metadata_key=METADATA_KEY, transform=_transform, applies=_applies, needs_stats=True,
    answers=("outlier channels",),
    cli_options=(
        CliOption(("--min-ratio",), "min_ratio", "float", None, metavar="R",
                  help="only Linears whose output channel max / median is at least R "
                  "(default 8)"),
        CliOption((), None, "flag", False, help="", switch=True, run_flag="--outscale",
                  run_field="outscale",
                  run_help="work on the model with its residual-branch Linears writing "
                  "equalized output channels ('quantscope outscale'; calibrates the given "
                  "model first): plan the new skip-branch Muls at 16 bit (unverified on a "
                  "device)"),
    ),
    lift=_lift, verdict_rank=2,
    example="quantscope outscale minilm-l6 --stats stats.npz --out outscaled.onnx",
    site_kinds=("divide", "split"),
    description="Needs the model's stats ('quantscope calibrate'). Run it before tokensplit; "
                "then calibrate the new model and plan its '<Add>/outscale/in' groups and "
                "residual Adds at 16 bit.",
)
