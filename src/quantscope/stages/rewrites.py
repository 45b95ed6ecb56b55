"""The graph rewrites as commands run them (token split, head split, row scaling,
output scaling, channel peeling), each with its FP32 function checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.types import GroupKind, QuantscopeError, Stats

if TYPE_CHECKING:
    from quantscope.repair import Repair as GraphRepair


def split_tokens(model: Model, *, seq_len: int | None = None, chunk: int | None = None,
                 input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = (),
                 linears: bool = False) -> tuple[GraphRepair, float]:
    """:func:`quantscope.repair.tokens.split_tokens`, its FP32 function checked.

    Returns the rewrite and the largest relative output difference to the original on
    sample inputs: token feeds of ``seq_len`` tokens and of half a chunk (empty later
    chunks), or float inputs at their shapes.
    """
    from quantscope.model.shapes import given_shapes
    from quantscope.repair.tokens import sample_feeds
    from quantscope.repair.tokens import split_tokens as split
    from quantscope.repair.verify import check_function

    given = dict(given_shapes(model, None, input_shapes) or {})
    r = split(model, shapes=given, chunk=chunk, seq_len=seq_len, linears=linears)
    if not r.changes:
        return r, 0.0
    effect = dict(r.effect)  # a static token input runs at its own length only
    lengths = ((seq_len, max(1, int(effect["chunk"]) // 2)) if seq_len
               else (int(effect["tokens"]),))
    feeds = sample_feeds(model, lengths, shapes=given)
    return r, check_function(model.proto, r.proto, feeds, what="tokensplit")


def split_heads(model: Model, *, seq_len: int | None = None,
                input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
                ) -> tuple[GraphRepair, float]:
    """:func:`quantscope.repair.heads.split_heads`, its FP32 function checked.

    Returns the rewrite and the largest relative output difference to the original on
    sample inputs (token feeds of ``seq_len`` tokens, else of 32 and 7 tokens; or float
    inputs at their shapes).
    """
    from quantscope.model.shapes import given_shapes
    from quantscope.repair.heads import split_heads as split
    from quantscope.repair.tokens import sample_feeds
    from quantscope.repair.verify import check_function

    given = dict(given_shapes(model, None, input_shapes) or {})
    r = split(model, shapes=given, seq_len=seq_len)
    if not r.changes:
        return r, 0.0
    feeds = sample_feeds(model, (seq_len,) if seq_len else (32, 7), shapes=given,
                         what="headsplit")
    return r, check_function(model.proto, r.proto, feeds, what="headsplit")


def scale_rows(model: Model, *, growth: float | None = None, seq_len: int | None = None,
               input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
               ) -> tuple[GraphRepair, float]:
    """:func:`quantscope.repair.rowscale.rowscale`, its FP32 function checked (token feeds
    of ``seq_len`` tokens, else of 32 and 7 tokens; or float inputs at their shapes)."""
    from quantscope.model.shapes import given_shapes
    from quantscope.repair.rowscale import GROWTH, rowscale
    from quantscope.repair.tokens import sample_feeds
    from quantscope.repair.verify import check_function

    given = dict(given_shapes(model, None, input_shapes) or {})
    r = rowscale(model, growth=GROWTH if growth is None else growth)
    if not r.changes:
        return r, 0.0
    feeds = sample_feeds(model, (seq_len,) if seq_len else (32, 7), shapes=given,
                         what="rowscale")
    return r, check_function(model.proto, r.proto, feeds, what="rowscale")


def _stats_rewrite(model: Model, stats: Stats, rewrite: Any, what: str, *,
                   seq_len: int | None,
                   input_shapes: tuple[tuple[str, tuple[int, ...]], ...]
                   ) -> tuple[GraphRepair, float]:
    """``rewrite(model, stats)`` with its FP32 function checked on sample feeds (token
    feeds of ``seq_len`` tokens, else 32 and 7; or float inputs at their shapes). Refused
    when the stats know none of the model's Linear outputs."""
    from quantscope.model.shapes import given_shapes
    from quantscope.repair.tokens import sample_feeds
    from quantscope.repair.verify import check_function

    weighted = [g for g in find_groups(model).groups if g.kind is GroupKind.WEIGHTED]
    if weighted and not any(t in stats.tensors for g in weighted for t in g.outputs):
        raise QuantscopeError(
            "the stats file has no statistics for this model's Linear outputs: it was "
            "calibrated on another model; run 'quantscope calibrate' on this one")
    given = dict(given_shapes(model, None, input_shapes) or {})
    r = rewrite(model, stats)
    if not r.changes:
        return r, 0.0
    feeds = sample_feeds(model, (seq_len,) if seq_len else (32, 7), shapes=given, what=what)
    return r, check_function(model.proto, r.proto, feeds, what=what)


def out_scale(model: Model, stats: Stats, *, min_ratio: float | None = None,
              seq_len: int | None = None,
              input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
              ) -> tuple[GraphRepair, float]:
    """:func:`quantscope.repair.outscale.outscale`, FP32 checked (:func:`_stats_rewrite`)."""
    from quantscope.repair.outscale import MIN_RATIO, outscale

    ratio = MIN_RATIO if min_ratio is None else min_ratio
    return _stats_rewrite(model, stats, lambda m, s: outscale(m, s, min_ratio=ratio),
                          "outscale", seq_len=seq_len, input_shapes=input_shapes)


def peel_channels(model: Model, stats: Stats, *, factor: float | None = None,
                  max_channels: int | None = None, seq_len: int | None = None,
                  input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
                  ) -> tuple[GraphRepair, float]:
    """:func:`quantscope.repair.peel.peel`, FP32 checked (:func:`_stats_rewrite`)."""
    from quantscope.repair.peel import FACTOR, MAX_PEEL, peel

    f = FACTOR if factor is None else factor
    k = MAX_PEEL if max_channels is None else max_channels
    return _stats_rewrite(model, stats, lambda m, s: peel(m, s, factor=f, max_peel=k), "peel",
                          seq_len=seq_len, input_shapes=input_shapes)
