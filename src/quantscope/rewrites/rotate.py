"""The residual-stream rotation as a registry entry: :func:`quantscope.repair.rotate.rotate_stream`.

A decoder has two phase graphs with the same layer names; the rotation is a fixed matrix
per width and seed, so :func:`quantscope.rewrites.phases.rewrite_phases` applies this
entry to each graph and checks that their shared weights came out equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quantscope.model.load import Model
from quantscope.repair import Repair as GraphRepair
from quantscope.repair.rotate import METADATA_KEY, UNVERIFIED, find_stream, rotate_stream
from quantscope.rewrites.base import CliOption, Precondition, Rewrite, RewriteInput, new_nodes
from quantscope.types import Stats

if TYPE_CHECKING:
    from quantscope.targets.profile import Target

FP32_RTOL = 1e-4  # float32 rounding of 30 rotated layers: the brief's bound for this entry


@dataclass(frozen=True)
class RotateConfig:
    """``online``: also R4 before each FFN down projection (one extra dense MatMul per
    layer); ``seed``: of the random orthogonal matrix used for widths with no Hadamard
    matrix built (:func:`~quantscope.repair.rotate.rotation_matrix`)."""

    online: bool = False
    seed: int = 0


def _transform(model: Model, config: RotateConfig, inp: RewriteInput) -> GraphRepair:
    return rotate_stream(model, online=config.online, seed=config.seed)


def _applies(model: Model, target: Target | None, seq_len: int | None,
             stats: Stats | None) -> Precondition:
    """Holds on an RMSNorm decoder graph whose residual stream can be followed."""
    stream = find_stream(model)
    if isinstance(stream, str):
        return Precondition(False, stream)
    return Precondition(True, f"an RMSNorm decoder: {len(stream.norms)} RMSNorms on a "
                              f"{stream.width}-wide residual stream, {len(stream.readers)} "
                              f"Linears read it, {len(stream.writers)} write it")


def _lift(r: GraphRepair) -> tuple[str, ...]:
    """R4's MatMuls: their input is the un-rotated FFN activation, so plan them at 16 bit."""
    return new_nodes(r, "/rotate_in")


def _verdict(config: RotateConfig, seq_len: int | None, repaired: str) -> dict[str, Any]:
    what = ("the residual stream rotated (R1) with the RMSNorm gains folded into the Linears"
            + ("; R4 before each FFN down projection (one extra dense MatMul per layer, "
               "counted in the cost)" if config.online else "; no extra op"))
    return {"note": f"{what} ({repaired} is the rewritten model); {UNVERIFIED}"}


REWRITE = Rewrite(
    name="rotate", config=RotateConfig,
    summary="rotate the residual stream of an RMSNorm decoder (QuaRot R1: Hadamard, or "
            "random orthogonal when no Hadamard matrix of that width is built) after folding "
            "each RMSNorm gain into the Linears that read it; --online adds R4 before each "
            "FFN down projection (an extra MatMul); FP32 unchanged",
    unverified=UNVERIFIED,
    what="the residual stream rotated (R1), RMSNorm gains folded into the Linears",
    metadata_key=METADATA_KEY, transform=_transform, applies=_applies,
    answers=("residual outliers",),
    cli_options=(
        CliOption(("--online",), "online", "flag", False,
                  help="also rotate each FFN down projection's input (R4): one extra dense "
                  "ffn x ffn MatMul per layer, planned as a weighted layer"),
        CliOption((), None, "flag", False, help="", switch=True),
    ),
    lift=_lift, verdict=_verdict, verdict_rank=6, rtol=FP32_RTOL,
    example="quantscope rotate decoder.prefill.onnx --out rotated.prefill.onnx",
    site_kinds=("insert",),
    description="For a decoder's two phase graphs use the stage "
                "quantscope.stages_llm.rewrite_phase_files (both graphs, the same weights).",
)
