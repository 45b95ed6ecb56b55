"""The files of a decoder ``run`` folder (:mod:`.decoder`), and what a stage returns."""

from __future__ import annotations

from dataclasses import dataclass

MODEL_DIR, REWRITE, PLAN, EVALUATE = "model", "rewrite.json", "plan.json", "evaluate.json"
PLAN_TEXT, HOST, HOST_TEXT, TOKENIZER = "plan.txt", "host.json", "host.md", "tokenizer.json"
CANDIDATES, REPORT, VERDICT, VERDICT_TEXT = ("candidates.json", "report.html", "verdict.json",
                                             "verdict.txt")
W4, W4_PLAN = "w4.json", "plan.w4.json"
STATS = {"prefill": "stats.prefill.npz", "decode": "stats.decode.npz"}
PREFIX_NPZ, PREFIX_PY = "plan.prefix.npz", "plan.prefix.py"
PHASE_ALLS = ("prefill/model.alls", "decode/model.alls")  # the export stage's, for Hailo
WHATIF = "whatif.json"  # the whatif stage's (pipeline/decoder_whatif.py)
# the finetune stage's (pipeline/decoder_finetune.py); the rest only when it is kept
FINETUNE = "finetune.json"
TUNED_DIR = "model.tuned"
TUNED_STATS = {"prefill": "stats.tuned.prefill.npz", "decode": "stats.tuned.decode.npz"}
TUNED_PREFIX_NPZ, TUNED_PREFIX_PY = "finetune.prefix.npz", "finetune.prefix.py"


@dataclass(frozen=True)
class Done:
    """The files (run folder names) a stage wrote."""

    files: tuple[str, ...]
