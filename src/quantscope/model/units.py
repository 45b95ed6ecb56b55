"""Sweep units: the groups a rewrite made of one layer, swept as one candidate.

``tokensplit`` writes a layer once per chunk of tokens (``<node>/tok<i>``) and ``headsplit``
once per attention head (``<node>/head<h>``, ``<node>/head<h>/<part>``); the rewrites
record themselves in the model's metadata under :data:`TOKENS_KEY` and :data:`HEADS_KEY`.
On mpnet-base at 256 tokens the two rewrites turn about 200 sweepable groups into 1,410,
and the sensitivity sweeps, one candidate per group, became the longest stage of ``run``.

A layer's chunks carry the same weights and the same grid rule on other tokens, and a
layer's heads the same op on other channels: :func:`sweep_units` names them as one unit
(``<node>/tok*``, ``<node>/head*/<part>``), which the analysis sweeps once, promoting or
demoting every member together. Only the patterns whose rewrite the model's metadata
records are merged, so an original model's own names (a detector's ``/head1/Conv``) are
never; and only members of the same op type.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from quantscope.model.load import Model
from quantscope.types import Groups

TOKENS_KEY = "quantscope.tokensplit"  # metadata: the model was token-split (repair.tokens)
HEADS_KEY = "quantscope.headsplit"  # metadata: the model was head-split (repair.heads)
_PATTERNS = {TOKENS_KEY: re.compile(r"/tok\d+(?=/|$)"), HEADS_KEY: re.compile(r"/head\d+(?=/|$)")}
_STAR = {TOKENS_KEY: "/tok*", HEADS_KEY: "/head*"}

Unit = tuple[str, tuple[str, ...]]  # (unit name, member groups in group order)


def split_by(model: Model) -> tuple[str, ...]:
    """The rewrites (their metadata keys) whose per-chunk / per-head groups ``model`` holds."""
    keys = {p.key for p in model.proto.metadata_props}
    return tuple(k for k in _PATTERNS if k in keys)


def unit_name(group: str, keys: Collection[str]) -> str:
    """``group``'s unit: its chunk and head indices (of the rewrites ``keys``) as ``*``."""
    for k in keys:
        group = _PATTERNS[k].sub(_STAR[k], group)
    return group


def sweep_units(model: Model, groups: Groups, names: Collection[str] | None = None
                ) -> tuple[Unit, ...]:
    """The units of the groups ``names`` (default all), in the order of their first member.

    A unit has two or more members when ``model`` was token- or head-split (metadata) and
    its groups differ only in their chunk or head index and share an op type; every other
    group is a unit of its own, named as the group."""
    keys = split_by(model)
    wanted = [g for g in groups.groups if names is None or g.name in names]
    found: dict[tuple[str, str], list[str]] = {}
    for g in wanted:
        found.setdefault((unit_name(g.name, keys) if keys else g.name, g.op_type), []).append(
            g.name)
    return tuple((name if len(members) > 1 else members[0], tuple(members))
                 for (name, _), members in found.items())
