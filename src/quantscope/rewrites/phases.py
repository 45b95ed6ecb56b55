"""A rewrite applied to both phase graphs of a decoder (prefill and decode), consistently.

=================  ===================================================================
each graph         :func:`~quantscope.rewrites.base.run_rewrite` of the same entry and
                   config, its FP32 check on that phase's feeds (prefill: ``seq_len``
                   prompt tokens; decode: ``seq_len`` new tokens after a random cache of
                   ``seq_len`` positions, :func:`~quantscope.model.phases.phase_shapes`)
consistent         every initializer the two rewritten graphs share by name is equal
                   (so one plan, one export and one set of weights serve both phases);
                   a difference is one line naming the first one
all or nothing     a phase where the rewrite fails its check or changes nothing makes
                   the whole call fail with that phase's reason
=================  ===================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from quantscope.model.load import Model
from quantscope.model.phases import phase_shapes
from quantscope.rewrites.base import Rewrite, RewriteResult, run_rewrite
from quantscope.types import QuantscopeError, Stats


def rewrite_phases(rw: Rewrite, models: Mapping[str, Model], config: Any = None, *,
                   seq_len: int, stats: Stats | None = None) -> dict[str, RewriteResult]:
    """``rw`` applied to each phase graph of ``models`` (phase -> graph), checked per phase
    and for equal shared weights (module docstring)."""
    out: dict[str, RewriteResult] = {}
    for phase, model in models.items():
        shapes = tuple(phase_shapes(model, phase, seq_len).items())
        r = run_rewrite(rw, model, config, stats=stats, seq_len=seq_len, input_shapes=shapes)
        if r.failed is not None or not r.changes:
            raise QuantscopeError(f"{rw.name} on the {phase} graph: {r.failed or r.reason}")
        out[phase] = r
    same_weights(rw.name, {p: r.proto for p, r in out.items()})
    return out


def same_weights(what: str, protos: Mapping[str, onnx.ModelProto]) -> None:
    """Refuse phase graphs (phase -> graph) whose initializers of one name differ (one
    line naming the first, ``what`` made them)."""
    (first, proto), *others = protos.items()
    ref = {t.name: t for t in proto.graph.initializer}
    for phase, other in others:
        for t in other.graph.initializer:
            if t.name in ref and not np.array_equal(numpy_helper.to_array(t),
                                                    numpy_helper.to_array(ref[t.name])):
                raise QuantscopeError(
                    f"{what}: weight '{t.name}' differs between the {first} and {phase} "
                    "graphs after the rewrite: one plan cannot serve both")


__all__ = ["rewrite_phases", "same_weights"]
