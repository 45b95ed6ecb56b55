"""A structural candidate: the weightless layers left below both their neighbours.

The greedy path ranks promotions by each group's own gain. A layer with no weights between
two promoted layers (a U-Net's Resize or Concat, a pooling) gains nothing promoted alone:
its consumer re-quantizes its output on the same 8-bit grid. With its neighbours at 16 bit,
its 8-bit output is the one coarse step left on that path (a tiny U-Net, hailo8: 38.6 dB
with its two Resizes at a8_w8 between a16_w16 Convs and Concats, 42.8 dB with them at
a16_w16, for next to no cost). :func:`between_point` promotes each such layer to its
neighbours' activation width, where legal and within the cost cap; the refinement measures
it as one more candidate (origin ``between``), so the measurement decides.
"""

from __future__ import annotations

from quantscope.plan.pareto import FrontPoint
from quantscope.plan.predict import predict
from quantscope.plan.start import Space
from quantscope.types import GroupKind, Precision

FLOAT_BITS = 32  # a float neighbour or layer: wider than any grid


def _bits(p: Precision) -> int:
    return p.act_bits or FLOAT_BITS


def between_point(space: Space, best: FrontPoint) -> FrontPoint | None:
    """``best`` with every weightless activation layer whose producers and readers all sit
    at wider activations than it promoted to the narrowest of those widths (the widest
    legal candidate not above it); None if there is none."""
    groups = space.legal.groups
    root = {t: chain[0] for chain in groups.shared for t in chain[1:]}
    writer = {t: g.name for g in groups.groups for t in g.outputs}
    readers: dict[str, set[str]] = {}
    for g in groups.groups:
        for t in g.inputs:
            w = writer.get(root.get(t, t))
            if w is not None and w != g.name:
                readers.setdefault(w, set()).add(g.name)
    base = {**space.start, **dict(best.overrides)}
    prec = dict(base)
    for g in (x for x in groups.groups if x.name in prec):
        if g.kind is not GroupKind.ACTIVATION or g.weight:
            continue
        ins = {writer[root.get(t, t)] for t in g.inputs if root.get(t, t) in writer} - {g.name}
        outs = readers.get(g.name, set())
        if not ins or not outs:
            continue
        width = min(_bits(prec[n]) for n in ins | outs)
        if _bits(prec[g.name]) >= width:
            continue
        for precision in sorted(space.candidates, key=lambda p: (-_bits(p), -(p.weight_bits or 0))):
            if _bits(precision) > width or _bits(precision) <= _bits(prec[g.name]):
                continue
            if space.legal.screen(space.plan(prec), g.name, precision):
                continue
            trial = {**prec, g.name: precision}
            if space.budget.within_cost(predict(space, trial, best.repairs, "between", 0).cost):
                prec = trial
                break
    for _ in range(2):  # rules that judge a group with its neighbours
        wrong = {p.group for p in space.legal.blocking(space.plan(prec))}
        prec = {n: (base[n] if n in wrong else p) for n, p in prec.items()}
    if prec == base or space.legal.blocking(space.plan(prec)):
        return None
    return predict(space, prec, best.repairs, "between", 0)
