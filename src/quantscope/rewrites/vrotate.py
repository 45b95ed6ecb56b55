"""Each attention head's values rotated (QuaRot R2) as a registry entry:
:func:`quantscope.repair.rotate_heads.rotate_values`.

Offline and with no extra op: the value projection's columns and the output projection's
rows, per head, by one head_dim x head_dim Hadamard matrix. The V cache then holds rotated
values, so the FP32 check feeds the rewritten graph its cache inputs rotated and compares
its cache outputs rotated back (:attr:`Rewrite.basis`,
:func:`~quantscope.repair.rotate_heads.value_basis`). The matrix is fixed per head_dim,
so a decoder's two phase graphs, rewritten separately, get the same weights
(:func:`quantscope.rewrites.phases.on_phases`, checked).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from quantscope.model.load import Model
from quantscope.repair import Repair as GraphRepair
from quantscope.repair.rotate_heads import (
    METADATA_KEY,
    UNVERIFIED,
    find_value_heads,
    rotate_values,
    value_basis,
)
from quantscope.rewrites.base import CliOption, Precondition, Rewrite, RewriteInput
from quantscope.types import Stats

if TYPE_CHECKING:
    from quantscope.targets.profile import Target

FP32_RTOL = 1e-4  # float32 rounding through 30 layers, as rotate's


@dataclass(frozen=True)
class VrotateConfig:
    """``seed``: of the random orthogonal matrix used for a head_dim with no Hadamard
    matrix built (:func:`~quantscope.repair.rotate.rotation_matrix`)."""

    seed: int = 0


def _transform(model: Model, config: VrotateConfig, inp: RewriteInput) -> GraphRepair:
    return rotate_values(model, seed=config.seed)


def _basis(model: Model, config: VrotateConfig) -> dict[str, np.ndarray]:
    return value_basis(model, config.seed)


def _applies(model: Model, target: Target | None, seq_len: int | None,
             stats: Stats | None) -> Precondition:
    """Holds on a graph whose attentions' value paths can be followed (a decoder's)."""
    heads = find_value_heads(model)
    if isinstance(heads, str):
        return Precondition(False, heads)
    caches = sum(len(h.caches) for h in heads)
    return Precondition(True, f"{len(heads)} attention(s) with {heads[0].head_dim}-wide "
                              f"value heads read by one output projection each"
                              + (f"; {caches} V-cache tensor(s)" if caches else ""))


def _verdict(config: VrotateConfig, seq_len: int | None, repaired: str) -> dict[str, Any]:
    return {"note": "each attention head's values rotated (R2) in the value and output "
                    f"projections, no extra op; the V cache holds rotated values "
                    f"({repaired} is the rewritten model); {UNVERIFIED}"}


REWRITE = Rewrite(
    name="vrotate", config=VrotateConfig,
    summary="rotate each attention head's values (QuaRot R2: a head_dim Hadamard in the "
            "value projection's columns, undone in the output projection's rows), offline, "
            "no extra op; flattens the V cache's and the output projection input's "
            "channel outliers; the V cache holds rotated values; FP32 unchanged",
    unverified=UNVERIFIED,
    what="each attention head's values rotated (R2), the V cache in the rotated basis",
    metadata_key=METADATA_KEY, transform=_transform, applies=_applies,
    answers=("value outliers",),
    cli_options=(CliOption((), None, "flag", False, help="", switch=True),),
    verdict=_verdict, verdict_rank=7, rtol=FP32_RTOL, basis=_basis,
    example="quantscope vrotate decoder.prefill.onnx --out rotated.prefill.onnx",
    site_kinds=(),
    description="For a decoder's two phase graphs use the stage "
                "quantscope.stages_llm.recipe_phase_files (names ('vrotate',)): both "
                "graphs, the same weights.",
)
