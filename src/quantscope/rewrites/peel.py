"""Channel peeling as a registry entry: :func:`quantscope.repair.peel.peel`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantscope.model.load import Model
from quantscope.repair import Repair as GraphRepair
from quantscope.repair.peel import FACTOR, MAX_PEEL, METADATA_KEY, UNVERIFIED, peel
from quantscope.rewrites.base import (
    CliOption,
    Precondition,
    Rewrite,
    RewriteInput,
    outlier_channels,
)
from quantscope.types import Stats

if TYPE_CHECKING:
    from quantscope.targets.profile import Target


@dataclass(frozen=True)
class PeelConfig:
    """``factor``: peel hidden channels at >= this many medians; ``max_channels``: at most
    this many per FFN (the largest)."""

    factor: float = FACTOR
    max_channels: int = MAX_PEEL


def _transform(model: Model, config: PeelConfig, inp: RewriteInput) -> GraphRepair:
    assert inp.stats is not None
    return peel(model, inp.stats, factor=config.factor, max_peel=config.max_channels)


def _applies(model: Model, target: Target | None, seq_len: int | None,
             stats: Stats | None) -> Precondition:
    """Holds when the stats show an outlier channel on a Linear output (>= 4 medians)."""
    return outlier_channels(model, stats, FACTOR, "peel's factor")


def _lift(r: GraphRepair) -> tuple[str, ...]:
    """The new Adds that join the peeled FFNs to the residual stream: plan them at 16 bit."""
    return tuple(n.name for n in r.proto.graph.node if n.op_type == "Add"
                 and re.search(r"/peel\d*$", n.name)
                 and n.output[0].endswith("/" + n.name.rsplit("/", 1)[0]))


REWRITE = Rewrite(
    name="peel", config=PeelConfig,
    summary="move each FFN's few outlier hidden channels (after its activation) into a "
            "small FFN of their own that joins the residual stream through an Add: the big "
            "FFN's 8-bit hidden grid then fits the other channels; FP32 unchanged",
    unverified=UNVERIFIED,
    what="each FFN's outlier hidden channels run in a small FFN of their own that joins the "
         "residual stream through an Add",
    metadata_key=METADATA_KEY, transform=_transform, applies=_applies, needs_stats=True,
    answers=("outlier channels",),
    cli_options=(
        CliOption(("--factor",), "factor", "float", None, metavar="F",
                  help="peel hidden channels whose max |h| is at least F x the median "
                  "channel's (default 4)"),
        CliOption(("--max-channels",), "max_channels", "int", None, metavar="N",
                  help="peel at most N channels per FFN, the largest (default 8)"),
        CliOption((), None, "flag", False, help="", switch=True, run_flag="--peel",
                  run_field="peel",
                  run_help="work on the model with each FFN's outlier hidden channels in a "
                  "small FFN of their own ('quantscope peel'; calibrates the given model "
                  "first, once with --outscale): plan the new '<Add>/peel' groups at 16 bit "
                  "(unverified on a device)"),
    ),
    lift=_lift, verdict_rank=3,
    example="quantscope peel minilm-l6 --stats stats.npz --out peeled.onnx",
    site_kinds=("divide", "split"),
    description="Needs the model's stats ('quantscope calibrate'). Run it before tokensplit "
                "(after outscale, with the same stats); then calibrate the new model and plan "
                "its '<Add>/peel' groups at 16 bit like the residual stream.",
)
