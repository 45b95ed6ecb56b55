"""A decoder's MLPs split along the tokens as a registry entry:
:func:`quantscope.repair.gated.split_gated` (the decoder recipe's last step).

On one graph (``quantscope gatedsplit X.prefill.onnx --seq-len T``) it splits each gated
MLP into chunks of tokens. On a decoder's pair of phase graphs (:attr:`Rewrite.phases`,
the recipe) only the prefill graph is split, in chunks of the largest token count the
target's size rule allows at 16 bit (:func:`~quantscope.rewrites.tokensplit.needed_chunk`;
none when it allows all, or when the run accepts it as a warning with ``--allow-warning``:
the target as the run reads it, :func:`quantscope.targets.accept.for_run`; the prefill
note says which), its FP32 logits checked against the unsplit graph; the decode
graph (one token per step) is left as it is (:func:`quantscope.repair.gated.phase_maker`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx

from quantscope.model.load import Model
from quantscope.model.shapes import given_shapes
from quantscope.repair import Repair as GraphRepair
from quantscope.repair.gated import gated_mlps, phase_maker, split_gated
from quantscope.repair.tokens import UNVERIFIED
from quantscope.rewrites.base import CliOption, PhaseJob, Precondition, Rewrite, RewriteInput
from quantscope.rewrites.tokensplit import needed_chunk, sized_chunk
from quantscope.types import Stats

if TYPE_CHECKING:
    from quantscope.targets.profile import Target

# no transform writes it: a gated-split model is known by its record (RECORD_KEY)
METADATA_KEY = "quantscope.gatedsplit"
NO_MLP = ("no gated MLP (a Mul of two Linears that read one tensor, read by one Linear): "
          "gatedsplit is for a Llama-style decoder's MLPs")


@dataclass(frozen=True)
class GatedsplitConfig:
    """``chunk``: tokens per chunk (None: the largest the target's size rule allows at
    16 bit at the length, :func:`~quantscope.rewrites.tokensplit.needed_chunk`; on one
    graph, which has no target, half the tokens)."""

    chunk: int | None = None


def _transform(model: Model, config: GatedsplitConfig, inp: RewriteInput) -> GraphRepair:
    if inp.seq_len is None:
        return GraphRepair(name="gatedsplit", proto=model.proto,
                           reason="the prompt length is not known: give --seq-len")
    chunk = config.chunk or needed_chunk(model, None, inp.seq_len)
    shapes = inp.shapes or given_shapes(model, inp.seq_len)  # the phase's, else --seq-len's
    return split_gated(model, seq_len=inp.seq_len, chunk=chunk, shapes=shapes)


def _applies(model: Model, target: Target | None, seq_len: int | None,
             stats: Stats | None) -> Precondition:
    """Holds on a graph with gated MLPs (a Llama-style decoder's); an encoder has none."""
    mlps = gated_mlps(model)
    if not mlps:
        return Precondition(False, NO_MLP)
    return Precondition(True, f"{len(mlps)} gated MLP(s) to split along the tokens")


def _phases(job: PhaseJob, config: GatedsplitConfig) -> dict[str, str]:
    """The prefill graph split (chunks: ``config.chunk``, else the target's as the run
    reads it, its accepted warning rules passing: :func:`sized_chunk`, whose why ends the
    prefill graph's note), the decode graph as it is."""
    if config.chunk:
        return job.write(phase_maker(job.open, job.seq_len, chunk=config.chunk))
    why: list[str] = []

    def chunk(model: Model, seq_len: int) -> int:
        size, reason = sized_chunk(model, job.target, seq_len)
        why.append(reason)
        return size

    make = phase_maker(job.open, job.seq_len, chunk=chunk)

    def noted(phase: str) -> tuple[onnx.ModelProto, str]:
        proto, note = make(phase)
        return proto, (f"{note}; {why[-1]}" if phase == "prefill" and why and why[-1]
                       else note)

    return job.write(noted)


REWRITE = Rewrite(
    name="gatedsplit", config=GatedsplitConfig,
    summary="split each gated MLP of a decoder's prefill graph (silu(gate) * up, then down) "
            "into chunks of tokens, so each chunk's gated product fits a target's 16-bit "
            "size rule; FP32 unchanged",
    unverified=UNVERIFIED,
    what="each MLP split into chunks of tokens in the prefill graph, so its gated product "
         "fits 16 bit (decode unchanged)",
    metadata_key=METADATA_KEY, transform=_transform, applies=_applies,
    answers=("super_defuse",),
    cli_options=(
        CliOption(("--chunk",), "chunk", "int", None, metavar="N",
                  help="tokens per chunk (default: half the tokens)"),
        CliOption((), None, "flag", False, help="", switch=True),
    ),
    phases=_phases,
    example="quantscope gatedsplit decoder.prefill.onnx --seq-len 64 --out split.prefill.onnx",
    site_kinds=(),
    description="For a decoder's two phase graphs use the stage "
                "quantscope.stages_llm.recipe_phase_files (names ('gatedsplit',)): the "
                "prefill graph split in chunks the target allows, the decode graph as it is.",
)
