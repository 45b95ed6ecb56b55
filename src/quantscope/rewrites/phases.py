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

:func:`on_phases` is how a decoder's recipe step runs (``stages_llm.recipe_phase_files``):
the entry's own :attr:`~quantscope.rewrites.base.Rewrite.phases` step when it has one
(``smooth``, ``gatedsplit``), else the above per phase through the step's
:class:`~quantscope.rewrites.base.PhaseJob` (``rotate``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from quantscope.model.load import Model
from quantscope.model.phases import phase_shapes
from quantscope.rewrites.base import PhaseJob, Rewrite, RewriteResult, run_rewrite
from quantscope.types import QuantscopeError, Stats


def rewrite_phase(rw: Rewrite, model: Model, phase: str, config: Any = None, *,
                  seq_len: int, stats: Stats | None = None) -> RewriteResult:
    """``rw`` applied to one phase graph, FP32 checked on that phase's feeds; a failed
    check or no change is one line naming the phase."""
    shapes = tuple(phase_shapes(model, phase, seq_len).items())
    r = run_rewrite(rw, model, config, stats=stats, seq_len=seq_len, input_shapes=shapes)
    if r.failed is not None or not r.changes:
        raise QuantscopeError(f"{rw.name} on the {phase} graph: {r.failed or r.reason}")
    return r


def on_phases(rw: Rewrite, job: PhaseJob, config: Any = None) -> dict[str, str]:
    """``rw`` with ``config`` (default: the entry's) on both phase graphs of ``job.spec``,
    written by ``job.write``: its own :attr:`Rewrite.phases` step, or else
    :func:`rewrite_phase` on each graph (one in memory at a time). Returns phase -> what
    was done."""
    config = rw.config() if config is None else config
    if rw.phases is not None:
        return rw.phases(job, config)

    def one(phase: str) -> tuple[onnx.ModelProto, str]:
        r = rewrite_phase(rw, job.open(phase), phase, config, seq_len=job.seq_len)
        return r.proto, f"{r.reason} (FP32 max relative diff {r.fp32_diff:.2g})"

    return job.write(one)


def rewrite_phases(rw: Rewrite, models: Mapping[str, Model], config: Any = None, *,
                   seq_len: int, stats: Stats | None = None) -> dict[str, RewriteResult]:
    """``rw`` applied to each phase graph of ``models`` (phase -> graph), checked per phase
    and for equal shared weights (module docstring)."""
    out = {phase: rewrite_phase(rw, model, phase, config, seq_len=seq_len, stats=stats)
           for phase, model in models.items()}
    same_weights(rw.name, {p: weight_digests(r.proto) for p, r in out.items()})
    return out


def weight_digests(proto: onnx.ModelProto) -> dict[str, str]:
    """Initializer name -> SHA-256 of its values (compared across phases without keeping
    two graphs' weights in memory)."""
    return {t.name: hashlib.sha256(np.ascontiguousarray(numpy_helper.to_array(t)).tobytes()
                                   ).hexdigest() for t in proto.graph.initializer}


def same_weights(what: str, digests: Mapping[str, Mapping[str, str]]) -> None:
    """Refuse phase graphs (phase -> :func:`weight_digests`) whose initializers of one
    name differ (one line naming the first; ``what`` made them)."""
    (first, ref), *others = digests.items()
    for phase, other in others:
        for name, digest in other.items():
            if name in ref and ref[name] != digest:
                raise QuantscopeError(
                    f"{what}: weight '{name}' differs between the {first} and {phase} "
                    "graphs after the rewrite: one plan cannot serve both")


__all__ = ["on_phases", "rewrite_phase", "rewrite_phases", "same_weights", "weight_digests"]
