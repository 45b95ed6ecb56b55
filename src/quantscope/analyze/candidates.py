"""What a sensitivity sweep evaluates: one plan per (group, sweep), and their encodings.

==============  =======================================================================
enable-one g    plan: ``g`` at ``low``, every other group float
disable-one g   plan: every group at ``low`` except ``g`` at ``high``
==============  =======================================================================

``units`` (:func:`quantscope.model.units.sweep_units`): a token- or head-split layer's
groups are one candidate, ``g`` standing for all its members at once.

A tensor's encoding depends only on its bit width (and the stats), so every candidate's
encodings are assembled from one uniform encoding per precision
(:func:`encodings_table`, :func:`mixed_encodings`) instead of one ``encode`` per plan.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from quantscope.emulate.encode import encode
from quantscope.model.load import Model
from quantscope.model.units import Unit
from quantscope.types import Encodings, Groups, Plan, Precision, QuantScheme, Stats

SWEEPS = ("enable_one", "disable_one")


@dataclass(frozen=True)
class Candidate:
    group: str  # the group, or the unit its members are swept as
    sweep: str  # "enable_one" | "disable_one"
    plan: Plan
    members: tuple[str, ...] = ()  # a unit's groups (empty: just ``group``)

    @property
    def names(self) -> tuple[str, ...]:
        """The groups this candidate moves."""
        return self.members or (self.group,)


def candidates(groups: Groups, low: Precision, high: Precision,
               only: Collection[str] | None = None,
               units: Sequence[Unit] | None = None) -> tuple[Candidate, ...]:
    """Both sweeps over every group (``only``: over these groups, in group order; ``units``:
    over these units instead, each moving all its members), enable-one first."""
    if units is None:
        units = [(g, (g,)) for g in groups.names() if only is None or g in only]

    def cand(name: str, members: tuple[str, ...], sweep: str, base: Precision,
             moved: Precision) -> Candidate:
        return Candidate(name, sweep, Plan(base, tuple((g, moved) for g in members)),
                         members if members != (name,) else ())

    enable = [cand(u, m, "enable_one", Precision.FLOAT, low) for u, m in units]
    disable = [cand(u, m, "disable_one", low, high) for u, m in units]
    return (*enable, *disable)


def encodings_table(
    model: Model,
    groups: Groups,
    stats: Stats,
    precisions: Iterable[Precision],
    scheme: QuantScheme | None = None,
) -> dict[Precision, Encodings]:
    return {
        p: encode(model, groups, stats, Plan.uniform(p), scheme=scheme or QuantScheme())
        for p in precisions
        if p is not Precision.FLOAT
    }


def mixed_encodings(table: dict[Precision, Encodings], groups: Groups, plan: Plan) -> Encodings:
    """What :func:`encode` returns for ``plan``, assembled from per-precision encodings.

    A tensor's encoding depends only on its bit width (and the stats), so each group takes
    its outputs and weight from the uniform encodings of its precision; a model input
    takes the encoding of its widest reader.
    """
    acts, weights, notes = {}, {}, []
    widest: dict[str, Precision] = {}
    root = groups.root_of()
    for g in groups.groups:
        p = plan.precision_of(g.name)
        if p is Precision.FLOAT:
            continue
        enc = table[p]
        acts.update({t: enc.activations[t] for t in g.outputs if t in enc.activations})
        if g.weight is not None and g.weight in enc.weights:
            weights[g.weight] = enc.weights[g.weight]
        notes.extend(n for n in enc.notes if n not in notes)
        for t in (root.get(t, t) for t in g.inputs):
            if t in groups.model_inputs and (t not in widest or p.act_bits > widest[t].act_bits):
                widest[t] = p
    acts.update({t: table[p].activations[t] for t, p in widest.items()})
    scheme = next(iter(table.values())).scheme
    return Encodings(activations=acts, weights=weights, scheme=scheme, notes=tuple(notes))
