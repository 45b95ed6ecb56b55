"""SmoothQuant on a decoder's gated products as a registry entry:
:func:`quantscope.repair.smooth.smooth_outliers` (the decoder recipe's second step).

On one graph (``quantscope smooth X.prefill.onnx --stats S``) it smooths with that
graph's stats. On a decoder's pair of phase graphs (:attr:`Rewrite.phases`, the recipe
and ``stages_llm.smooth_phase_files``) the scales come from one calibration of the
prefill graph with the KV prefix in the cache (:attr:`PhaseJob.calibrate`: the sink
token's activation does not set them), so both graphs get the same weights (checked),
each FP32 checked on its phase's feeds within ``rtol``.

``sites``: ``norms`` (the RMSNorm outputs: gains / s, the Linears reading them x s; and
any other site a producer's weights can take), ``gated`` (only each MLP's gated product
``silu(gate) * up``: up projection columns / s, down projection rows x s; the recipe's),
``all`` (both).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx

from quantscope.model.load import Model
from quantscope.model.phases import phase_shapes
from quantscope.repair import Repair as GraphRepair
from quantscope.repair.gated import gated_mlps
from quantscope.repair.smooth import smooth_outliers
from quantscope.repair.tokens import sample_feeds
from quantscope.rewrites.base import CliOption, PhaseJob, Precondition, Rewrite, RewriteInput
from quantscope.types import Batch, QuantscopeError, Stats

if TYPE_CHECKING:
    from quantscope.targets.profile import Target

# no transform writes it: a smoothed model is known by its record (RECORD_KEY)
METADATA_KEY = "quantscope.smooth"
ALPHA = 0.5  # the recipe's SmoothQuant strength (docs/benchmarks.md)
# the FP32 check in the recipe: the decode graph is checked on a random KV cache, whose
# arbitrary attention amplifies float32 rounding (smollm2-135m: 3.0e-5 at 64 cached
# positions, 4.0e-5 at 48, 1.6e-4 at 32; prefill 2.6e-6 at each); a wrong transform
# moves the logits by O(1)
RTOL = 1e-3
# sites -> (smooth_outliers' gated, producers)
SITES: dict[str, tuple[bool, tuple[str, ...] | None]] = {
    "norms": (False, None), "gated": (True, ("Mul",)), "all": (True, None)}
NO_MLP = ("no gated MLP (a Mul of two Linears that read one tensor, read by one Linear): "
          "smooth is SmoothQuant on a Llama-style decoder's gated products")
UNVERIFIED = ("unverified on a device: the smoothed weights are ordinary dense weights "
              "(nothing new asked of the compiler); the gain is the 8-bit gated product's "
              "range, measured in emulation")


@dataclass(frozen=True)
class SmoothConfig:
    """``alpha``: SmoothQuant's migration strength; ``sites``: where (module docstring);
    ``rtol``: the FP32 check's bound on each graph."""

    alpha: float = ALPHA
    sites: str = "gated"
    rtol: float = RTOL

    def __post_init__(self) -> None:
        if self.sites not in SITES:
            raise QuantscopeError(f"smooth sites must be one of {', '.join(SITES)}, "
                                  f"not '{self.sites}'")


def _smooth(model: Model, stats: Stats, feeds: Sequence[Batch], config: SmoothConfig
            ) -> GraphRepair:
    gated, producers = SITES[config.sites]
    return smooth_outliers(model, stats, feeds, alpha=config.alpha, rtol=config.rtol,
                           gated=gated, producers=producers)


def _transform(model: Model, config: SmoothConfig, inp: RewriteInput) -> GraphRepair:
    assert inp.stats is not None
    if config.sites == "gated" and not gated_mlps(model):
        return GraphRepair(name="smooth", proto=model.proto, reason=NO_MLP)
    feeds = sample_feeds(model, (inp.seq_len or 32,), what="smooth", shapes=inp.shapes)
    return _smooth(model, inp.stats, feeds, config)


def _applies(model: Model, target: Target | None, seq_len: int | None,
             stats: Stats | None) -> Precondition:
    """Holds on a graph with gated MLPs (a Llama-style decoder's: the recipe's sites);
    an encoder has none."""
    mlps = gated_mlps(model)
    if not mlps:
        return Precondition(False, NO_MLP)
    return Precondition(True, f"{len(mlps)} gated MLP product(s) to smooth")


def _phases(job: PhaseJob, config: SmoothConfig) -> dict[str, str]:
    """Both graphs smoothed with the scales of one prefill calibration (module docstring)."""
    stats = job.calibrate()

    def one(phase: str) -> tuple[onnx.ModelProto, str]:
        model = job.open(phase)
        feeds = sample_feeds(model, (job.seq_len,), what="smooth",
                             shapes=phase_shapes(model, phase, job.seq_len))
        r = _smooth(model, stats, feeds, config)
        return r.proto, f"{r.reason} {dict(r.effect)}"

    return job.write(one)


REWRITE = Rewrite(
    name="smooth", config=SmoothConfig,
    summary="SmoothQuant on each gated MLP product silu(gate) * up of a decoder (at alpha "
            "0.5): its outlier channels divided into the up projection's columns and "
            "multiplied into the down projection's rows; FP32 unchanged",
    unverified=UNVERIFIED,
    what="SmoothQuant on each MLP's gated product silu(gate) * up",
    metadata_key=METADATA_KEY, transform=_transform, applies=_applies, needs_stats=True,
    answers=("outlier channels",),
    cli_options=(
        CliOption(("--alpha",), "alpha", "float", None, metavar="A",
                  help="SmoothQuant's migration strength (default 0.5)"),
        CliOption((), None, "flag", False, help="", switch=True),
    ),
    phases=_phases, rtol=RTOL,
    example="quantscope smooth decoder.prefill.onnx --stats stats.npz --seq-len 64 "
            "--out smoothed.prefill.onnx",
    description="Needs the graph's stats ('quantscope calibrate'). For a decoder's two "
                "phase graphs use the stage quantscope.stages_llm.smooth_phase_files (one "
                "prefill calibration with the KV prefix, the same weights in both).",
)
