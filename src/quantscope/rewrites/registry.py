"""Every graph rewrite by name: one dict literal, in the order a run applies them.

Adding a rewrite: a module in this package with a ``REWRITE = Rewrite(...)`` entry
(:class:`quantscope.rewrites.base.Rewrite`: its config, precondition, transform, options
and texts), and one line below. The run (``open_run_model``, its model digest), the
verdict and the plan's hints read it from here; nothing else names it.

Order: the stats rewrites first (they read the given model's channel ranges; outscale
keeps the hidden tensors peel reads), then headsplit (it matches Softmax chains),
rowscale after it, tokensplit (it chunks what the others produced), then rotate (a
decoder's residual stream; after the stats rewrites, whose ranges are the given model's),
vrotate (each attention head's values; it commutes with rotate), smooth (a decoder's gated MLP products, in the rotated basis) and gatedsplit (a decoder's
prefill MLPs in token chunks, last: it splits what the others rewrote).

The decoder run's recipe (``stages_llm.RECIPE``: rotate, vrotate, smooth, gatedsplit) is entries
here too: each runs on a decoder's pair of phase graphs through
:func:`quantscope.rewrites.phases.on_phases` (its own ``phases`` step, or its transform
per phase). Their preconditions say no on an encoder (no RMSNorm residual stream, no V read
through a cache-shaped head split into one output projection, no gated MLP), so ``run --rewrites auto`` never tries them there.
"""

from __future__ import annotations

from collections.abc import Collection

import onnx

from quantscope.rewrites import (
    gatedsplit,
    headsplit,
    outscale,
    peel,
    rotate,
    rowscale,
    smooth,
    tokensplit,
    vrotate,
)
from quantscope.rewrites.base import Rewrite, recorded
from quantscope.types import QuantscopeError

REWRITES: dict[str, Rewrite] = {
    "outscale": outscale.REWRITE,
    "peel": peel.REWRITE,
    "headsplit": headsplit.REWRITE,
    "rowscale": rowscale.REWRITE,
    "tokensplit": tokensplit.REWRITE,
    "rotate": rotate.REWRITE,
    "vrotate": vrotate.REWRITE,
    "smooth": smooth.REWRITE,
    "gatedsplit": gatedsplit.REWRITE,
}


def applied_rewrites(proto: onnx.ModelProto) -> frozenset[str]:
    """Names of the rewrites a model carries (its record, or the key the rewrite's own
    transform writes, for models rewritten before the record existed)."""
    keys = {p.key for p in proto.metadata_props}
    return frozenset({r["name"] for r in recorded(proto)}
                     | {n for n, rw in REWRITES.items() if rw.metadata_key in keys})


def hint_for(rule: str | None, done: Collection[str] = ()) -> str | None:
    """The hint of the first rewrite that answers target rule ``rule`` and is not
    ``done`` already (None: no rewrite answers it)."""
    return next((rw.hint for rw in REWRITES.values()
                 if rw.hint and rw.name not in done and rw.answers_rule(rule)), None)


def parse_rewrites(text: str) -> tuple[str, ...]:
    """``none`` or a comma list of registry names (``run --rewrites``), in the registry's
    order; an unknown name is a one-line error naming the known ones."""
    if text.strip() == "none":
        return ()
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in REWRITES]
    if unknown or not names:
        raise QuantscopeError(f"--rewrites: unknown rewrite '{unknown[0] if unknown else text}'"
                              f": use 'none' or a comma list of {', '.join(REWRITES)}")
    return tuple(n for n in REWRITES if n in names)


def rewrites_help() -> str:
    """One line per rewrite for ``--help``: name and summary."""
    return "; ".join(f"{n}: {rw.summary}" for n, rw in REWRITES.items())
