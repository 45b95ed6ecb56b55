"""ONNX Runtime sessions: the only executor quantscope uses.

Emulation sessions run with graph optimizations OFF so that ORT does not fold
QuantizeLinear/DequantizeLinear pairs into its own integer kernels: every Q/DQ node runs
as written, which reproduces the target's quantization grid in float arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from quantscope.types import QuantscopeError

Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]
_SHARED_ARENA: list[bool] = []


def providers() -> list[str]:
    """CUDA when this ORT build and machine have it, else CPU."""
    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def make_session(
    proto: onnx.ModelProto | Path,
    *,
    optimize: bool = False,
    integer_kernels: bool = False,
    arena: bool = True,
    shared_arena: bool = False,
) -> ort.InferenceSession:
    """A session; ``integer_kernels`` turns on every ORT optimization, which fuses QDQ
    groups into ORT's integer kernels (used only to measure the emulator against them).

    ``shared_arena``: for holding hundreds of sessions at once (sensitivity sweeps), same
    numerics. Every such session allocates from one process-wide CPU arena (a
    per-session arena would keep its peak batch allocated for the session's life), and
    thread pools do not spin after a run (idle sessions would steal the running one's
    cores).
    """
    opts = ort.SessionOptions()
    level = ort.GraphOptimizationLevel
    opts.graph_optimization_level = (
        level.ORT_ENABLE_ALL if integer_kernels
        else level.ORT_ENABLE_BASIC if optimize else level.ORT_DISABLE_ALL
    )
    opts.log_severity_level = 3
    opts.enable_cpu_mem_arena = arena  # off: memory goes back after each run (calibration)
    if shared_arena:
        _register_shared_arena()
        opts.add_session_config_entry("session.use_env_allocators", "1")
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(  # a file path: ORT reads it, weights held once
            str(proto) if isinstance(proto, Path) else proto.SerializeToString(),
            sess_options=opts, providers=providers()
        )
    except Exception as exc:  # ORT raises its own exception types
        msg = str(exc).strip().splitlines()[0][:200]
        raise QuantscopeError(
            f"ONNX Runtime cannot run this model ({msg}): check that every op is supported "
            "by onnxruntime on this machine"
        ) from None


def _register_shared_arena() -> None:
    """Register one process-wide CPU arena (once) for ``shared_arena`` sessions."""
    if not _SHARED_ARENA:
        info = ort.OrtMemoryInfo(
            "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
        )
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))
        _SHARED_ARENA.append(True)


def runner(session: ort.InferenceSession, outputs: list[str] | None = None) -> Runner:
    """A plain function ``feeds -> outputs`` over a session (feeds filtered to its inputs)."""
    names = {i.name for i in session.get_inputs()}

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return session.run(outputs, {k: v for k, v in feeds.items() if k in names})

    return run
