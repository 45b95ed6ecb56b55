"""Where the segment engine cuts a model (:func:`~quantscope.analyze.segments.find_segments`).

A cut is a position in topological node order; the tensors made before it and read after
it (or returned by the graph) *cross* it and are what the engine holds, and caches, per
batch there. Cuts are never inside a group.

=========================  ==========================================================
single-stream cut          exactly one ``act`` float tensor crosses (the residual
                           stream after each LayerNorm of a transformer), or one and
                           its token chunks (a ``tokensplit`` model's stream), with a
                           group since the last cut; side/const tensors (attention
                           mask, shapes) may cross too
refined cut                inside a segment that the single-stream cuts leave holding
                           more than :data:`REFINE_GROUPS` groups (a U-Net's skips, the
                           graph outputs a deeply supervised model makes early, an
                           LLM's rotary tables: several activations cross everywhere):
                           a position where the ``act`` float tensors crossing hold at
                           most :data:`CUT_BUDGET` x the model's largest activation
                           (per sample, from the shapes), placed every ``ceil(G / P)``
                           groups for ``P = ceil(sqrt(G))`` parts of the segment's
                           ``G`` groups
=========================  ==========================================================

Why refine: a sweep's candidate runs from its group's segment to the end. IS-Net (a
U-Net, 258 groups) had 4 segments, 226 groups in the last: nearly every candidate ran
nearly the whole model. Parts of ``sqrt(G)`` groups take most of the saving (a
candidate runs on average half the segment's nodes plus ``1 / (2P)`` of it) for ``P``
sessions more per chain; a segment of at most :data:`REFINE_GROUPS` groups (a
transformer block's 8: minilm, mpnet, DINOv2 at most 11) is left as it was, so the
models the single-stream cuts serve keep their segments (and figures, and speed).

Memory: what crosses a refined cut is what a full run holds at that point anyway, bounded
by the budget; the engines' estimates size the tensors crossing each cut as they are
(:func:`~quantscope.analyze.segments.live_tensors` for the sweep,
:func:`~quantscope.analyze.activation_cache.cache_memory` for the incremental evaluator).
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left

import numpy as np

from quantscope.analyze.memory import itemsize
from quantscope.model.groups import tensor_kinds
from quantscope.model.load import FLOAT_TYPES, Model
from quantscope.types import Groups

# a segment holding more groups than this is refined at multi-tensor cuts
REFINE_GROUPS = 16
# a refined cut holds at most this many of the model's largest activation (per sample):
# a plain U-Net's skips at a decoder position sum to under twice its largest map
CUT_BUDGET = 2.0

_CHUNK = re.compile(r"/tok\d+$")


def one_stream(live: set[str]) -> bool:
    """One activation, or one and its token chunks (``X``, ``X/tok0``, ``X/tok1`` … of
    :mod:`quantscope.repair.tokens`: the residual stream of a token-split model)."""
    return len({_CHUNK.sub("", t) for t in live}) == 1


def sample_bytes(model: Model) -> dict[str, int]:
    """Per tensor whose shape inference typed it, its bytes for one sample (a symbolic
    or unknown dim read as 1)."""
    types = model.value_types()
    out = {}
    for t, shape in model.value_shapes().items():
        n = int(np.prod([d if isinstance(d, int) and d > 0 else 1 for d in shape],
                        dtype=np.int64))
        out[t] = n * itemsize(types.get(t, 1))
    return out


def cut_positions(model: Model, groups: Groups, min_nodes: int = 1) -> list[int]:
    """The cuts (module docstring) of ``model``: node positions, ascending."""
    nodes = list(model.graph.node)
    kinds, types = tensor_kinds(model), model.value_types()
    last_use = {t: len(nodes) for t in model.output_names()}
    for i, node in enumerate(nodes):
        for t in node.input:
            last_use[t] = max(last_use.get(t, -1), i)
    group_of = {n: g.name for g in groups.groups for n in g.nodes}
    span: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        if node.name in group_of:
            span.setdefault(group_of[node.name], [i, i])[1] = i
    inside = {k for lo, hi in span.values() for k in range(lo + 1, hi + 1)}
    live: set[str] = set()
    lives: dict[int, frozenset[str]] = {}  # position -> the act tensors crossing it
    cuts, last, grouped = [], 0, False
    for i, node in enumerate(nodes[:-1]):
        grouped = grouped or node.name in group_of
        live = {t for t in live if last_use.get(t, -1) > i}
        live |= {
            t
            for t in node.output
            if last_use.get(t, -1) > i and kinds.get(t) == "act" and types.get(t) in FLOAT_TYPES
        }
        lives[i + 1] = frozenset(live)
        if one_stream(live) and grouped and i + 1 not in inside and i + 1 - last >= min_nodes:
            cuts.append(i + 1)
            last, grouped = i + 1, False
    starts = sorted(lo for lo, _ in span.values())
    return _refine(model, cuts, len(nodes), starts, lives, inside, min_nodes)


def _refine(model: Model, cuts: list[int], n: int, starts: list[int],
            lives: dict[int, frozenset[str]], inside: set[int], min_nodes: int) -> list[int]:
    """``cuts`` with the refined cuts added (module docstring); ``starts``: each group's
    first node position; ``lives``: per position, the act tensors crossing it."""
    bounds = [0, *cuts, n]
    if all(bisect_left(starts, hi) - bisect_left(starts, lo) <= REFINE_GROUPS
           for lo, hi in zip(bounds, bounds[1:], strict=False)):
        return cuts  # nothing to refine (no shapes read)
    size = sample_bytes(model)
    acts = {t for live in lives.values() for t in live}
    largest = max((size[t] for t in acts if t in size), default=0)
    if not largest:
        return cuts  # no activation's shape known: no cut can be sized
    budget = CUT_BUDGET * largest

    def fits(p: int) -> bool:  # a tensor of unknown shape counts as the largest
        return sum(size.get(t, largest) for t in lives[p]) <= budget

    out: list[int] = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        mine = [s for s in starts if lo <= s < hi]
        if len(mine) > REFINE_GROUPS:
            step = math.ceil(len(mine) / math.ceil(math.sqrt(len(mine))))
            last = lo
            for p in range(lo + 1, hi):
                since = bisect_left(mine, p) - bisect_left(mine, last)
                after = len(mine) - bisect_left(mine, p)
                if (since >= step and after and p not in inside and p - last >= min_nodes
                        and fits(p)):
                    out.append(p)
                    last = p
        if hi < n:
            out.append(hi)
    return out
