"""Run the FP32 and the QDQ model on the same batches and measure fidelity.

Fidelity per model output: cosine similarity between the FP32 and the emulated output
of each sample (flattened), mean and min over samples, and the SQNR of the whole output.
Task metrics (retrieval, verification) are computed by :mod:`quantscope.tasks` from the
same outputs.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx

from quantscope.emulate.session import make_session
from quantscope.model.load import Model
from quantscope.numerics import RESEMBLE_MIN_COSINE, row_cosines, sqnr_db, sqnr_db_from_powers
from quantscope.progress import track
from quantscope.types import Metrics, Outputs


def run_model(
    proto: onnx.ModelProto,
    batches: Iterable[dict[str, np.ndarray]],
    *,
    label: str = "",
    optimize: bool = False,
    integer_kernels: bool = False,
) -> Outputs:
    """Run ``proto`` over every batch (progress on stderr when ``label`` is given)."""
    session = make_session(proto, optimize=optimize, integer_kernels=integer_kernels)
    names = tuple(o.name for o in session.get_outputs())
    inputs = {i.name for i in session.get_inputs()}
    out = []
    for batch in track(batches, label, unit="batch", show=bool(label)):
        out.append(tuple(session.run(None, {n: v for n, v in batch.items() if n in inputs})))
    return Outputs(names=names, batches=tuple(out))


def output_fidelity(
    ref: Outputs, test: Outputs, *, only: str | None = None, judge: bool = True
) -> Metrics:
    """Cosine (mean, min, p01) and SQNR per output (``tables``); unprefixed: the worst
    output's value of each metric, so no output is left unscored (a note names which
    output is worst when there are several). ``judge``: say "NOT LIKE FP32" from the raw
    outputs (off when a task judges its own embeddings: raw token outputs include
    padding positions)."""
    values: dict[str, float] = {}
    tables: dict[str, dict[str, float]] = {}
    for i, name in enumerate(ref.names):
        cos = np.concatenate([row_cosines(a[i], b[i]) for a, b in zip(ref.batches, test.batches, strict=True)])
        noise = sum(float(np.sum((a[i].astype(np.float64) - b[i]) ** 2)) for a, b in zip(ref.batches, test.batches, strict=True))
        power = sum(float(np.sum(a[i].astype(np.float64) ** 2)) for a in ref.batches)
        sqnr = sqnr_db_from_powers(power, noise)
        row = {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()),
               "cosine_p01": float(np.percentile(cos, 1)), "sqnr_db": float(sqnr)}
        tables[name] = row
    scored = {only: tables[only]} if only else tables
    for key in ("cosine_mean", "cosine_min", "cosine_p01", "sqnr_db"):
        values[key] = min(t[key] for t in scored.values())
    notes: tuple[str, ...] = ()
    if judge and values["cosine_mean"] < RESEMBLE_MIN_COSINE:
        notes += (f"NOT LIKE FP32: output cosine to FP32 {values['cosine_mean']:.3f} < "
                  f"{RESEMBLE_MIN_COSINE:g} (worst output): the quantized model computes "
                  "something else",)
    if only and len(tables) > 1:
        notes += (f"scored on output '{only}' alone (--output); every output in 'outputs'",)
    elif len(tables) > 1:
        worst = min(tables, key=lambda n: tables[n]["sqnr_db"])
        notes += (f"{len(tables)} outputs scored; the metrics without an output name are the "
                 f"worst output's (lowest SQNR: '{worst}'); per output in 'outputs'",)
    return Metrics(values=values, tables=tables, notes=notes)


def evaluate_fidelity(
    model: Model,
    qdq: onnx.ModelProto,
    batches: list[dict[str, np.ndarray]],
    *,
    progress: bool = False,
) -> tuple[Metrics, Outputs, Outputs]:
    """FP32 vs emulated outputs on ``batches``: (fidelity, fp32 outputs, emulated outputs)."""
    ref = run_model(model.proto, batches, label="fp32" if progress else "")
    test = run_model(qdq, batches, label="emulated" if progress else "")
    return output_fidelity(ref, test), ref, test


__all__ = ["Outputs", "evaluate_fidelity", "output_fidelity", "run_model", "sqnr_db"]
