"""Rows: reduced rows of a full model, and the row subsets a fast sweep runs on.

==================  ====================================================================
full-model rows     :func:`run_plan_rows`: one QDQ (or FP32) model over every batch,
                    reduced by the scorer (:mod:`quantscope.analyze.scoring`)
stratified subset   :func:`proxy_batches`: every ``k``-th row of the length-sorted
                    batches, regrouped with little padding (enable-one)
noise-dense subset  :func:`density_batches`: rows by output noise of the all-``low``
                    model per unit of row cost (:func:`row_noise`,
                    :func:`squared_error_rows`) until a row-cost budget is spent
                    (disable-one)
==================  ====================================================================
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from quantscope import numerics
from quantscope.analyze.scoring import Scorer
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.emulate.session import make_session
from quantscope.model.load import Model
from quantscope.types import (
    SHARED,
    Batch,
    Feeds,
    Groups,
    Plan,
    Precision,
    QuantScheme,
    Stats,
    batch_rows,
    concat_rows,
    sample_axis,
    take_rows,
)


def run_plan_rows(
    model: Model,
    groups: Groups,
    batches: Sequence[Batch],
    proto: object,
    scorer: Scorer,
    *,
    arena: bool = True,
) -> np.ndarray:
    """Reduced rows of one full model (QDQ or FP32) over every batch (``arena``: off for
    a model of large tensors, :func:`quantscope.emulate.session.use_arena`)."""
    del groups
    sess = make_session(proto, arena=arena)
    outs = [o.name for o in sess.get_outputs()]
    names = {i.name for i in sess.get_inputs()}
    rows = []
    for feeds in batches:
        values = sess.run(outs, {k: v for k, v in feeds.items() if k in names})
        rows.append(scorer.reduce(values, feeds))
    return np.concatenate(rows)


def _pad_to(x: np.ndarray, shape: tuple[int, ...], axis: int = 0) -> np.ndarray:
    pad = [(0, 0) if i == axis else (0, s - d)
           for i, (s, d) in enumerate(zip(shape, x.shape, strict=True))]
    return np.pad(x, pad) if any(p[1] for p in pad) else x


def _merge(parts: list[Batch]) -> Batch:
    """The parts' samples in one batch, each input along its own sample axis, shorter
    non-sample axes zero-padded."""
    first = parts[0]
    padded = [{k: p[k] if sample_axis(first, k) == SHARED else _pad_to(
                   p[k], tuple(max(q[k].shape[i] for q in parts) for i in range(first[k].ndim)),
                   sample_axis(first, k))
               for k in first} for p in parts]
    return concat_rows([p.like(a) if isinstance(p, Feeds) else a
                        for p, a in zip(parts, padded, strict=True)])


def _most(batches: Sequence[Batch], batch_size: int) -> int:
    """``batch_size``, or less when the model takes fewer samples per run (static)."""
    limits = [b.limit for b in batches if isinstance(b, Feeds) and b.limit]
    return min([batch_size, *limits])


def proxy_batches(
    batches: Sequence[Batch], fraction: float, *, batch_size: int = 32, max_pad: float = 1.25
) -> list[Batch]:
    """Every ``1/fraction``-th row of every batch, regrouped into batches of ``batch_size``.

    Rows keep the data's length mix (batches are length-sorted). Consecutive subsets are
    merged only while the widest input is at most ``max_pad`` x the narrowest (zero
    padding, right for token ids and attention masks), so padding stays cheap.
    """
    step = max(1, round(1.0 / fraction))
    batch_size = _most(batches, batch_size)
    if batch_size == 1:  # a model that runs one sample at a time: every k-th batch
        picked = list(batches[::step])
    else:
        picked = [take_rows(b, slice(None, None, step)) for b in batches]
    picked = [p for p in picked if batch_rows(p)]
    out: list[Batch] = []
    group: list[Batch] = []
    for b in picked:
        width = max((v.shape[1] for v in b.values() if v.ndim > 1), default=1)
        first = group and max((v.shape[1] for v in group[0].values() if v.ndim > 1), default=1)
        rows = sum(batch_rows(g) for g in group)
        if group and (rows + batch_rows(b) > batch_size or width > max_pad * first):
            out.append(_merge(group))
            group = []
        group.append(b)
    if group:
        out.append(_merge(group))
    return out


def _width(b: Batch) -> int:
    """Row cost proxy of a batch: its widest second axis (sequence length), else 1."""
    return max((v.shape[1] for v in b.values() if v.ndim > 1), default=1)


def _take(b: Batch, idx: np.ndarray) -> Batch:
    return take_rows(b, idx)


def density_batches(
    batches: Sequence[Batch],
    noise: Sequence[np.ndarray],
    budget: float,
    *,
    batch_size: int = 32,
) -> tuple[list[Batch], float]:
    """Rows by noise density until ``budget`` (a fraction of the total row cost) is spent.

    ``noise[b][r]``: output noise of row ``r`` of batch ``b`` under the all-``low`` plan.
    A row costs its batch's width (:func:`_width`); rows are taken by ``noise / cost``,
    highest first, then regrouped in the original (length-sorted) order. Returns the
    batches and the fraction of the total noise they carry.
    """
    rows = [(b, r) for b, n in enumerate(noise) for r in range(len(n))]
    cost = np.array([_width(batches[b]) for b, _ in rows], dtype=np.float64)
    value = np.array([noise[b][r] for b, r in rows], dtype=np.float64)
    order = np.argsort(-(value / cost), kind="stable")
    spent = np.cumsum(cost[order])
    k = max(1, int(np.searchsorted(spent, budget * cost.sum(), side="right")))
    keep = sorted(order[:k].tolist())
    picked: dict[int, list[int]] = {}
    for i in keep:
        b, r = rows[i]
        picked.setdefault(b, []).append(r)
    parts = [_take(batches[b], np.array(r)) for b, r in sorted(picked.items())]
    out: list[Batch] = []
    group: list[Batch] = []
    for p in parts:
        n = batch_rows(p)
        if group and sum(batch_rows(g) for g in group) + n > _most(parts, batch_size):
            out.append(_merge(group))
            group = []
        group.append(p)
    if group:
        out.append(_merge(group))
    carried = float(value[order[:k]].sum() / value.sum()) if value.sum() > 0 else 1.0
    return out, carried


def row_noise(
    model: Model,
    groups: Groups,
    stats: Stats,
    batches: Sequence[Batch],
    *,
    scorer: Scorer,
    low: Precision,
    scheme: QuantScheme | None = None,
) -> list[np.ndarray]:
    """Per batch, per row: squared error of the reduced all-``low`` rows against FP32."""
    plan = Plan.uniform(low)
    q = quantize_model(model, stats, plan, scheme=scheme_for(plan, scheme), groups=groups)
    fp = make_session(model.proto, optimize=True, shared_arena=True)
    lo = make_session(q.proto, shared_arena=True)
    outs = model.output_names()
    out: list[np.ndarray] = []
    for feeds in batches:
        rows = []
        for sess in (fp, lo):
            names = {i.name for i in sess.get_inputs()}
            values = sess.run(outs, {k: v for k, v in feeds.items() if k in names})
            rows.append(scorer.reduce(values, feeds).astype(np.float64))
        out.append(squared_error_rows(rows[0], rows[1]))
    return out


def squared_error_rows(ref: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Per row: the summed squared difference of reduced rows (float64;
    :func:`quantscope.numerics.squared_error_rows`)."""
    return numerics.squared_error_rows(ref, test)
