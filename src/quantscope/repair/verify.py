"""Checks run after every repair.

=====================  ===============================================================
check_function         FP32 outputs of the repaired model equal the original's on sample
                       inputs: ``max|after - before| / max|before| <= rtol`` (1e-5) for
                       every output; raises :class:`RepairError` naming the output
quantized_error        the emulated model's error against FP32 for a plan: relative MSE
                       and SQNR of the outputs (calibrates the given model afresh, since
                       a repair moves ranges)
=====================  ===============================================================
Both run ONNX Runtime with graph optimizations off, as the emulator does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from quantscope.calibrate.collect import calibrate
from quantscope.emulate.qdq import quantize_model as build_for_plan
from quantscope.emulate.qdq import scheme_for
from quantscope.emulate.session import make_session, runner
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.numerics import sqnr_db_from_powers
from quantscope.repair import RepairError, as_model
from quantscope.types import Plan, QuantScheme

Batch = dict[str, np.ndarray]
FP32_RTOL = 1e-5


def run_all(proto: onnx.ModelProto, feeds: Sequence[Batch]) -> list[list[np.ndarray]]:
    run = runner(make_session(proto))
    return [run(f) for f in feeds]


def max_relative_diff(ref: list[list[np.ndarray]], test: list[list[np.ndarray]]) -> float:
    """Largest ``max|test - ref| / max|ref|`` over the outputs (batches pooled)."""
    worst = 0.0
    for k in range(len(ref[0])):
        scale = max(float(np.abs(r[k]).max()) for r in ref) or 1.0
        diff = max(
            float(np.abs(t[k].astype(np.float64) - r[k]).max())
            for r, t in zip(ref, test, strict=True)
        )
        worst = max(worst, diff / scale)
    return worst


def _in_basis(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``x`` times ``m`` on its last axis (float64)."""
    return x.astype(np.float64) @ m


def check_function(
    before: onnx.ModelProto,
    after: onnx.ModelProto,
    feeds: Sequence[Batch],
    *,
    what: str = "repair",
    rtol: float = FP32_RTOL,
    basis: Mapping[str, np.ndarray] | None = None,
) -> float:
    """Raise :class:`RepairError` unless FP32 outputs agree within ``rtol``; return the diff.

    ``basis``: graph inputs / outputs the repair stores in another basis (a rotated V
    cache): name -> the orthogonal matrix ``M`` with new = old ``M`` on the last axis; the
    repaired graph is fed ``x M`` and its outputs compared as ``y Mᵀ``."""
    if not feeds:
        raise RepairError(f"{what}: no sample inputs to check the FP32 function on")
    test_feeds: Sequence[Batch] = feeds
    if basis:
        test_feeds = [{k: (_in_basis(v, basis[k]).astype(v.dtype) if k in basis else v)
                       for k, v in f.items()} for f in feeds]
    test = run_all(after, test_feeds)
    if basis:
        names = [o.name for o in after.graph.output]
        test = [[_in_basis(y, basis[n].T) if n in basis else y for n, y in zip(names, ys,
                                                                           strict=True)]
                for ys in test]
    diff = max_relative_diff(run_all(before, feeds), test)
    if not diff <= rtol:
        raise RepairError(
            f"{what} changed the FP32 outputs by {diff:.3g} (relative, limit {rtol:g}): "
            "the transform is not function-preserving on this model; it was not applied"
        )
    return diff


def calibrate_and_quantize(
    model: Model | onnx.ModelProto,
    batches: Sequence[Batch],
    plan: Plan,
    *,
    scheme: QuantScheme | None = None,
    method: str = "minmax",
) -> onnx.ModelProto:
    """Calibrate ``model`` on ``batches`` and return its QDQ model for ``plan``."""
    m = as_model(model)
    groups = find_groups(m)
    stats = calibrate(m, groups, batches, method=method)
    return build_for_plan(m, stats, plan, scheme=scheme_for(plan, scheme), groups=groups).proto


def quantized_error(
    reference: onnx.ModelProto, qdq: onnx.ModelProto, feeds: Sequence[Batch]
) -> dict[str, float]:
    """Relative MSE and SQNR (dB) of ``qdq``'s outputs against ``reference``'s."""
    ref, test = run_all(reference, feeds), run_all(qdq, feeds)
    noise = sum(
        float(np.sum((t[k].astype(np.float64) - r[k]) ** 2))
        for r, t in zip(ref, test, strict=True)
        for k in range(len(r))
    )
    power = sum(float(np.sum(r[k].astype(np.float64) ** 2)) for r in ref for k in range(len(r)))
    rel = noise / power if power > 0 else float("inf")
    sqnr = sqnr_db_from_powers(power, noise)
    return {"rel_mse": rel, "sqnr_db": sqnr}
