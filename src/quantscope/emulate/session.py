"""ONNX Runtime sessions: the only executor quantscope uses.

Emulation sessions run with graph optimizations OFF so that ORT does not fold
QuantizeLinear/DequantizeLinear pairs into its own integer kernels: every Q/DQ node runs
as written, which reproduces the target's quantization grid in float arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort

from quantscope.types import QuantscopeError

Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def providers() -> list[str]:
    """CUDA when this ORT build and machine have it, else CPU."""
    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def make_session(
    proto: onnx.ModelProto,
    *,
    optimize: bool = False,
    integer_kernels: bool = False,
    arena: bool = True,
) -> ort.InferenceSession:
    """A session; ``integer_kernels`` turns on every ORT optimization, which fuses QDQ
    groups into ORT's integer kernels (used only to measure the emulator against them)."""
    opts = ort.SessionOptions()
    level = ort.GraphOptimizationLevel
    opts.graph_optimization_level = (
        level.ORT_ENABLE_ALL if integer_kernels
        else level.ORT_ENABLE_BASIC if optimize else level.ORT_DISABLE_ALL
    )
    opts.log_severity_level = 3
    opts.enable_cpu_mem_arena = arena  # off: memory goes back after each run (calibration)
    try:
        return ort.InferenceSession(
            proto.SerializeToString(), sess_options=opts, providers=providers()
        )
    except Exception as exc:  # ORT raises its own exception types
        msg = str(exc).strip().splitlines()[0][:200]
        raise QuantscopeError(
            f"ONNX Runtime cannot run this model ({msg}): check that every op is supported "
            "by onnxruntime on this machine"
        ) from None


def runner(session: ort.InferenceSession, outputs: list[str] | None = None) -> Runner:
    """A plain function ``feeds -> outputs`` over a session (feeds filtered to its inputs)."""
    names = {i.name for i in session.get_inputs()}

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return session.run(outputs, {k: v for k, v in feeds.items() if k in names})

    return run
