"""The graph rewrites as commands run them (token split, head split, row scaling,
output scaling, channel peeling): each one call of the registry's runner
(:func:`quantscope.rewrites.base.run_rewrite`), which checks its FP32 function.

Each returns the rewrite (:class:`quantscope.repair.Repair`) and the largest relative
output difference to the original on sample inputs; a failed check raises
:class:`quantscope.repair.RepairError` (one line).
"""

from __future__ import annotations

from quantscope.model.load import Model
from quantscope.repair import Repair as GraphRepair
from quantscope.rewrites.base import InputShapes, legacy, run_rewrite
from quantscope.rewrites.registry import REWRITES
from quantscope.types import Stats


def split_tokens(model: Model, *, seq_len: int | None = None, chunk: int | None = None,
                 input_shapes: InputShapes = (), linears: bool = False
                 ) -> tuple[GraphRepair, float]:
    """Token split, FP32 checked on token feeds of ``seq_len`` tokens and of half a chunk
    (empty later chunks), or float inputs at their shapes."""
    rw = REWRITES["tokensplit"]
    return legacy(run_rewrite(rw, model, rw.configure(chunk=chunk, linears=linears),
                              seq_len=seq_len, input_shapes=input_shapes))


def split_heads(model: Model, *, seq_len: int | None = None, input_shapes: InputShapes = ()
                ) -> tuple[GraphRepair, float]:
    """Head split, FP32 checked on token feeds of ``seq_len`` tokens, else of 32 and 7
    tokens; or float inputs at their shapes."""
    return legacy(run_rewrite(REWRITES["headsplit"], model, seq_len=seq_len,
                              input_shapes=input_shapes))


def scale_rows(model: Model, *, growth: float | None = None, seq_len: int | None = None,
               input_shapes: InputShapes = ()) -> tuple[GraphRepair, float]:
    """Row scaling, FP32 checked (as :func:`split_heads`)."""
    rw = REWRITES["rowscale"]
    return legacy(run_rewrite(rw, model, rw.configure(growth=growth), seq_len=seq_len,
                              input_shapes=input_shapes))


def out_scale(model: Model, stats: Stats, *, min_ratio: float | None = None,
              seq_len: int | None = None, input_shapes: InputShapes = ()
              ) -> tuple[GraphRepair, float]:
    """Output scaling with the model's stats, FP32 checked; refused when the stats know
    none of the model's Linear outputs."""
    rw = REWRITES["outscale"]
    return legacy(run_rewrite(rw, model, rw.configure(min_ratio=min_ratio), stats=stats,
                              seq_len=seq_len, input_shapes=input_shapes))


def peel_channels(model: Model, stats: Stats, *, factor: float | None = None,
                  max_channels: int | None = None, seq_len: int | None = None,
                  input_shapes: InputShapes = ()) -> tuple[GraphRepair, float]:
    """Channel peeling with the model's stats, FP32 checked (as :func:`out_scale`)."""
    rw = REWRITES["peel"]
    return legacy(run_rewrite(rw, model, rw.configure(factor=factor, max_channels=max_channels),
                              stats=stats, seq_len=seq_len, input_shapes=input_shapes))
