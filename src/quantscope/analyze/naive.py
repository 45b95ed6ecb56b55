"""The naive sensitivity sweep: one full QDQ model per candidate (build_qdq and a fresh
session), run on every batch; the slow reference the segment sweeps
(:mod:`quantscope.analyze.sweeps`) are measured against."""

from __future__ import annotations

import time
from collections.abc import Sequence

from quantscope.analyze.candidates import candidates
from quantscope.analyze.rows import run_plan_rows
from quantscope.analyze.scoring import Scorer
from quantscope.analyze.sweeps import SweepResult
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.model.load import Model
from quantscope.progress import track
from quantscope.types import Batch, Groups, Plan, Precision, QuantScheme, Stats


def sweep_naive(
    model: Model,
    groups: Groups,
    stats: Stats,
    batches: Sequence[Batch],
    *,
    scorer: Scorer,
    low: Precision,
    high: Precision,
    scheme: QuantScheme | None = None,
    progress: bool = False,
) -> SweepResult:
    """Both sweeps with one full QDQ model per candidate: the slow reference."""
    t0 = time.perf_counter()
    cands = candidates(groups, low, high)
    ref = run_plan_rows(model, groups, batches, model.proto, scorer)
    rows = []
    for c in track(cands, "analyze: naive sweep", unit="cand", show=progress):
        q = quantize_model(model, stats, c.plan, scheme=scheme_for(c.plan, scheme), groups=groups)
        rows.append(run_plan_rows(model, groups, batches, q.proto, scorer))
    low_plan = Plan.uniform(low)
    q = quantize_model(model, stats, low_plan, scheme=scheme_for(low_plan, scheme), groups=groups)
    low_rows = run_plan_rows(model, groups, batches, q.proto, scorer)
    return SweepResult(cands, tuple(rows), ref, low_rows, {}, {}, time.perf_counter() - t0, "naive",
                       row_counts=(("enable_one", len(ref)), ("disable_one", len(ref))))
