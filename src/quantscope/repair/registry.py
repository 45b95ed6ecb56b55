"""Every repair by its CLI name: one dict literal, in the order the runner applies them.

Each entry's ``run`` has the one signature of a repair,
``run(RepairInput) -> RepairStep`` (:mod:`quantscope.repair`), and sees the model, stats
and plan the entries before it left. ``keeps_fp32``: the repair promises an unchanged FP32
function, and :func:`~quantscope.repair.apply.run_repairs` checks that on the calibration
feeds. ``default``: part of ``quantscope repair`` without ``--repairs``. ``help``: one line
for ``--help``. ``answers``: the target rule ids (a vendor prefix may precede them) the
repair makes legal: ``run --rewrites auto`` adds it where such a rule refuses the run's
uniform a8_w8 plan (:func:`quantscope.pipeline.auto.auto_repairs`). ``reads_plan``
False: the step never reads the plan (a search's many plans share its result).

Adding a repair: a module in this package with a ``*_step(RepairInput) -> RepairStep``
function, and one entry below (its position is its place in the order). Graph edits
come first, ``ranges`` chooses ranges for the final graph, and ``finetune`` trains last
(it starts from those ranges and pins what it learns).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from quantscope.repair import RepairInput, RepairStep
from quantscope.repair.adaround import adaround_step
from quantscope.repair.bias_correction import bias_step
from quantscope.repair.equalize import equalize_step
from quantscope.repair.finetune import finetune_step
from quantscope.repair.gptq import gptq_step
from quantscope.repair.ranges import ranges_step
from quantscope.repair.rank4 import rank4_step
from quantscope.repair.smooth import smooth_step
from quantscope.repair.split import split_step


@dataclass(frozen=True)
class RepairSpec:
    """How the runner calls one repair and what it promises."""

    run: Callable[[RepairInput], RepairStep]
    keeps_fp32: bool
    default: bool
    help: str
    answers: tuple[str, ...] = ()
    # False: the step reads the model, its stats and the feeds only, never the plan, so a
    # search that repairs many plans of one model reuses it (``run_repairs``' ``memo``)
    reads_plan: bool = True


REGISTRY: dict[str, RepairSpec] = {
    "equalize": RepairSpec(equalize_step, keeps_fp32=True, default=True,
                           help="cross-layer equalisation of Conv/linear pairs across "
                           "ReLU-like ops", reads_plan=False),
    "smooth": RepairSpec(smooth_step, keeps_fp32=True, default=True,
                         help="LayerNorm -> linear outlier migration (SmoothQuant)",
                         reads_plan=False),
    "split": RepairSpec(split_step, keeps_fp32=True, default=False,
                        help="outlier channel splitting (widens layers: never a default)",
                        reads_plan=False),
    "rank4": RepairSpec(rank4_step, keeps_fp32=True, default=False,
                        help="Linear + bias on 4-D tensors, legal for QNN HTP v73 "
                        "q::linearclip (target-specific; unverified on a device)",
                        answers=("linearclip_5d",)),
    "gptq": RepairSpec(gptq_step, keeps_fp32=False, default=False,
                       help="GPTQ rounding of the plan's 4/8-bit MatMul/Gemm weights onto "
                       "their grid (second-order error feedback; FP32 changes on purpose)"),
    "bias": RepairSpec(bias_step, keeps_fp32=False, default=True,
                       help="empirical bias correction for the plan's quantized weights"),
    "adaround": RepairSpec(adaround_step, keeps_fp32=False, default=False,
                           help="weight rounding optimisation (AdaRound) for the plan"),
    "ranges": RepairSpec(ranges_step, keeps_fp32=True, default=True,
                         help="per-tensor range method chosen by measured error "
                         "(no graph edit)"),
    "finetune": RepairSpec(finetune_step, keeps_fp32=False, default=False,
                           help="quantization-aware distillation from the FP32 model "
                           "(PyTorch, the finetune extra; learns weights and ranges; last, "
                           "on the final graph; 300 steps, at most 15 min)"),
}

DEFAULT_REPAIRS: tuple[str, ...] = tuple(n for n, s in REGISTRY.items() if s.default)


def repairs_help() -> str:
    """One line per repair for ``--help``: name, description, whether it is a default."""
    return "; ".join(
        f"{n}: {s.help}" + (" [default]" if s.default else "") for n, s in REGISTRY.items()
    )
