"""A decoder's MLPs split along the tokens in prefill, so each gated product is 16-bit legal.

A Llama-style MLP computes ``down(silu(gate(x)) * up(x))``. In a prefill graph of ``T``
prompt tokens the gated product (the Mul's output, the down projection's input) is a
``[T, I]`` non-conv tensor: for smollm2-135m at 64 tokens 64 x 1536 = 98,304 values,
which hailo10h's ``hailo.super_defuse`` (``act16_wide_non_conv``) refuses at 16 bit, so it
stays at 8 bit in prefill while decode's 1-token one is at 16 (docs/benchmarks.md).
Every op of the MLP works token by token, so this splits it with
:func:`quantscope.repair.tokens.split_tokens` (``linears``, limited to the MLP's groups):

=================  ==================================================================
before             ``x -> gate (+ silu), up -> Mul (gated) -> down -> y``
after              ``Slice(x, chunk i) -> gate/tok{i}, up/tok{i} -> gated/tok{i} ->
                   down/tok{i}`` per chunk, then one Concat of the down projections'
                   chunks writes ``y`` (``<down>/concat``); the down projection reads the
                   gated chunk directly, so a 16-bit chunk is what it reads (no
                   full-width Concat of the gated product in between)
=================  ==================================================================

The chunk groups are ``<group>/tok<i>``; they read the same weight initializers as the
whole layers (the decode graph, unsplit, shares them by name). A plan names a group's
chunks and its Concat with the whole group as one unit
(:func:`quantscope.plan.phase_search.unit_of`). FP32 function unchanged (checked by the
caller). That the DFC compiles the chunks at 16 bit is the size rule applied per chunk
layer: :data:`~quantscope.repair.tokens.UNVERIFIED`.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.phases import phase_shapes
from quantscope.model.shapes import Shapes
from quantscope.repair import Repair
from quantscope.repair.tokens import sample_feeds, split_tokens
from quantscope.repair.verify import check_function
from quantscope.targets.profile import op_kind
from quantscope.types import Group

CHUNK = 32  # tokens per chunk: smollm2-135m's [32, 1536] gated product is under 98,304


def _consts(model: Model) -> set[str]:
    out = {t.name for t in model.graph.initializer}
    out.update(n.output[0] for n in model.graph.node if n.op_type == "Constant")
    return out


def _matmul_input(group: Group, nodes: dict[str, onnx.NodeProto], consts: set[str]
                  ) -> str | None:
    """The activation a weighted group's MatMul reads (None: not a MatMul by a constant)."""
    first = nodes[group.nodes[0]]
    if first.op_type != "MatMul" or first.input[1] not in consts:
        return None
    return first.input[0]


def gated_mlps(model: Model) -> dict[str, tuple[str, ...]]:
    """Per MLP (by its gated product's group): the groups ``(gate, up, gated, down)``.
    An MLP is a Mul of two weighted groups' outputs that read the same tensor (the gate's
    with its activation fused in), read only by one weighted group (the down projection)."""
    groups = find_groups(model)
    nodes = {n.name: n for n in model.graph.node}
    consts = _consts(model)
    by_node = {n: g for g in groups.groups for n in g.nodes}
    by_output = {o: g for g in groups.groups for o in g.outputs}
    readers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for t in n.input:
            readers.setdefault(t, []).append(n.name)
    out: dict[str, tuple[str, ...]] = {}
    for g in groups.groups:
        if len(g.nodes) != 1 or nodes[g.nodes[0]].op_type != "Mul":
            continue
        mul = nodes[g.nodes[0]]
        inputs = [by_output.get(t) for t in mul.input]
        if len(inputs) != 2 or any(p is None or op_kind(p) != "weighted" for p in inputs):
            continue
        gate, up = inputs  # type: ignore[misc]
        x = {_matmul_input(p, nodes, consts) for p in (gate, up)}  # type: ignore[arg-type]
        if len(x) != 1 or None in x or gate is up:
            continue
        down = {by_node[r] for r in readers.get(mul.output[0], []) if r in by_node}
        if len(down) != 1 or len(readers[mul.output[0]]) != 1:
            continue
        (d,) = down
        if op_kind(d) != "weighted" or _matmul_input(d, nodes, consts) != mul.output[0]:
            continue
        if "silu" not in " ".join(gate.nodes) and "Sigmoid" not in {  # type: ignore[union-attr]
                nodes[n].op_type for n in gate.nodes}:  # type: ignore[union-attr]
            gate, up = up, gate  # the gate is the one with the activation
        out[g.name] = (gate.name, up.name, g.name, d.name)  # type: ignore[union-attr]
    return out


def split_gated(model: Model, *, seq_len: int, shapes: Shapes | None = None,
                chunk: int = CHUNK) -> Repair:
    """``model`` (a prefill graph at ``seq_len`` prompt tokens) with each MLP
    (:func:`gated_mlps`) split into chunks of ``chunk`` tokens (module docstring);
    ``shapes``: its concrete input shapes (the phase's). No MLP, or ``seq_len <= chunk``:
    the model unchanged, with the reason."""
    mlps = gated_mlps(model)
    if not mlps:
        return Repair(name="gatedsplit", reason="no gated MLP (Mul of two Linears read by "
                      "one Linear)", proto=model.proto)
    if seq_len <= chunk:
        return Repair(name="gatedsplit", reason=f"{seq_len} tokens: not more than one chunk "
                      f"of {chunk}", proto=model.proto)
    only = frozenset(n for names in mlps.values() for n in names)
    r = split_tokens(model, shapes=shapes, chunk=chunk, linears=True, only=only)
    sites = dict(r.effect).get("sites", 0.0)
    return Repair(name="gatedsplit",
                  reason=f"{len(mlps)} MLP(s) ({int(sites)} groups) split along the tokens; "
                         f"{r.reason}",
                  proto=r.proto, changes=r.changes, skipped=r.skipped,
                  effect=(*r.effect, ("mlps", float(len(mlps)))))


def phase_maker(open_phase: Callable[[str], Model], seq_len: int, *,
                chunk: int | Callable[[Model, int], int] = CHUNK,
                rtol: float = 1e-5) -> Callable[[str], tuple[onnx.ModelProto, str]]:
    """For a decoder's phase files (``stages_llm.write_phase_files``): the prefill graph
    (``open_phase("prefill")``) split by :func:`split_gated` into ``chunk`` tokens (or
    ``chunk(graph, seq_len)``), its FP32 logits checked against the unsplit graph within
    ``rtol`` on token feeds of ``seq_len`` and ``chunk // 2`` tokens (a chunk past a
    shorter input is empty); the decode graph (one token: nothing to split) as it is.
    Returns phase -> (graph, what was done)."""

    def make(phase: str) -> tuple[onnx.ModelProto, str]:
        model = open_phase(phase)
        if phase != "prefill":
            return model.proto, f"unchanged ({phase}: one token per step, nothing to split)"
        size = chunk(model, seq_len) if callable(chunk) else chunk
        r = split_gated(model, seq_len=seq_len, chunk=size,
                        shapes=phase_shapes(model, phase, seq_len))
        if r.proto is model.proto:
            return model.proto, f"not applied: {r.reason}"
        feeds = sample_feeds(model, (seq_len, max(1, size // 2)), what="gatedsplit")
        diff = check_function(model.proto, r.proto, feeds, what="gatedsplit", rtol=rtol)
        return r.proto, f"{r.reason} (FP32 max relative diff {diff:.2g})"

    return make


__all__ = ["CHUNK", "gated_mlps", "phase_maker", "split_gated"]
