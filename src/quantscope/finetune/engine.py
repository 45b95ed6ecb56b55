"""Which engine ranks the planner's candidate plans (``--rank-engine``); ORT measures.

==========  =====================================================================
``ort``     ONNX Runtime ranks and measures (the planner's evaluator as it was)
``torch``   the fake-quant torch interpreter (:mod:`.rank`) ranks, on CUDA when
            PyTorch sees a GPU, else on the CPU; the chosen plan and every
            reported figure are then measured in ONNX Runtime
``auto``    ``torch`` on CUDA when torch is importable and
            ``torch.cuda.is_available()``, else ``ort``
==========  =====================================================================

Importing this module never imports torch: only resolving ``auto`` or ``torch`` does.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from quantscope.types import QuantscopeError

RANK_ENGINES = ("auto", "ort", "torch")
MEASURED_BY = "onnxruntime"
TORCH_MISSING = ("--rank-engine torch needs PyTorch, which is not installed here: install "
                 "the finetune extra (pip install 'quantscope[finetune]') or use "
                 "--rank-engine ort")


@dataclass(frozen=True)
class RankEngine:
    """The resolved engine: ``name`` ``ort`` or ``torch``; ``device`` ``cuda``/``cpu`` for
    torch (``None`` for ort); ``asked``: what the user chose (``auto``, ``ort``, ``torch``)."""

    name: str
    device: str | None = None
    asked: str = "ort"

    @property
    def ranked_by(self) -> str:
        return MEASURED_BY if self.name == "ort" else f"torch ({self.device})"

    @property
    def line(self) -> str:
        """What the output, plan.json and the verdict say."""
        if self.name == "ort":
            return f"ranked and measured by {MEASURED_BY}"
        return f"ranked by {self.ranked_by}, measured by {MEASURED_BY}"

    def to_dict(self) -> dict[str, str]:
        return {"asked": self.asked, "ranked_by": self.ranked_by, "measured_by": MEASURED_BY,
                "line": self.line}


def torch_available() -> bool:
    """Whether torch can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a None entry in sys.modules: blocked on purpose
        return False


# device files whose absence means no GPU that torch.cuda could see (NVIDIA, WSL, ROCm)
GPU_DEVICES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/dxg", "/dev/kfd")


def gpu_device_present() -> bool:
    """Whether a GPU device file is here (without importing torch)."""
    import os

    return any(map(os.path.exists, GPU_DEVICES))


def _cuda() -> bool:
    """Whether torch sees a CUDA GPU; False without a GPU device file, torch not imported
    (``--rank-engine auto``, run's default, imported it to ask on every plan stage: about
    185 MB resident and seconds, on a machine with no GPU)."""
    if not gpu_device_present():
        return False
    import torch

    return bool(torch.cuda.is_available())


def resolve_engine(asked: str, *, device: str | None = None) -> RankEngine:
    """``asked`` (one of :data:`RANK_ENGINES`) made concrete on this machine; ``device``
    forces torch's device (``cpu`` or ``cuda``; default: CUDA when present)."""
    if asked not in RANK_ENGINES:
        raise QuantscopeError(f"unknown rank engine '{asked}': use {', '.join(RANK_ENGINES)}")
    if asked == "ort":
        return RankEngine("ort", asked=asked)
    if not torch_available():
        if asked == "torch":
            raise QuantscopeError(TORCH_MISSING)
        return RankEngine("ort", asked=asked)
    cuda = _cuda()
    if asked == "auto" and not cuda:
        return RankEngine("ort", asked=asked)
    if device not in (None, "cpu", "cuda"):
        raise QuantscopeError(f"rank engine device '{device}': use cpu or cuda")
    if device == "cuda" and not cuda:
        raise QuantscopeError("rank engine device 'cuda' asked for, but PyTorch sees no CUDA "
                              "GPU here: use cpu")
    return RankEngine("torch", device or ("cuda" if cuda else "cpu"), asked=asked)
