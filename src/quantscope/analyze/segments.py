"""Cut a model into segments, and write Q/DQ per segment.

Why: ONNX Runtime cannot be fed an intermediate tensor, so a sweep that perturbs one
group would re-run the whole prefix. Cut the graph where few float activations cross
(the residual stream after each LayerNorm of a transformer; a U-Net's stream and its
skips), cache the tensors that cross each cut, and run only the segments from the
perturbed one onwards.

=========================  ==========================================================
cut                        :mod:`quantscope.analyze.cuts`: where exactly one ``act``
                           float tensor crosses, and inside a segment those leave
                           holding many groups, where the act tensors crossing fit a
                           budget; never inside a group; side/const tensors
                           (attention mask, shapes) may cross too: they are extra
                           segment inputs
segment inputs             every tensor its nodes read that earlier segments or the
                           graph inputs make (cached per batch, both FP32 and low)
segment outputs            every tensor it makes that later segments or the graph
                           outputs read
Q/DQ in a segment          :func:`quantscope.emulate.qdq.build_qdq` applied to the
                           segment model with the encodings of the tensors the
                           segment makes (and of real graph inputs it reads): the same
                           writer, so a chain of segments equals the full QDQ model
=========================  ==========================================================

The engine that runs a sweep on segments:

=========================  ==========================================================
:class:`Chain`             one session per segment for a whole-model plan (FP32 or
                           all-``low``); per batch it runs once and its env caches
                           every tensor crossing a cut
:class:`Runner`            a candidate's own sessions: the segment holding its group
                           (plus every segment reading a model input whose encoding
                           the candidate changes); the other segments are the chain's
:func:`run_candidate`      the chain's env, then the candidate's segments from its
                           first own one onwards (own session where it has one)
=========================  ==========================================================

Sessions use :func:`~quantscope.emulate.session.make_session` with ``shared_arena``
(a sweep holds hundreds of them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from quantscope.analyze.candidates import Candidate, mixed_encodings
from quantscope.analyze.cuts import cut_positions
from quantscope.emulate.qdq import build_qdq
from quantscope.emulate.session import make_session
from quantscope.model.load import Model
from quantscope.progress import track
from quantscope.types import Encodings, Groups, Plan, Precision


@dataclass(frozen=True)
class Segment:
    index: int
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    groups: tuple[str, ...]  # groups whose nodes lie in this segment


def find_segments(model: Model, groups: Groups, *, min_nodes: int = 1) -> tuple[Segment, ...]:
    """Segments of ``model`` in execution order (see the module docstring)."""
    nodes = list(model.graph.node)
    bounds = [0, *cut_positions(model, groups, min_nodes), len(nodes)]
    group_of = {n: g.name for g in groups.groups for n in g.nodes}
    graph_outs = set(model.output_names())
    made_at: dict[str, int] = {t: -1 for t in model.input_names()}
    for k, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        for node in nodes[lo:hi]:
            made_at.update({t: k for t in node.output})
    read_at: dict[str, set[int]] = {}
    for k, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        for node in nodes[lo:hi]:
            for t in node.input:
                read_at.setdefault(t, set()).add(k)
    segments = []
    for k, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        part = nodes[lo:hi]
        ins = dict.fromkeys(t for n in part for t in n.input if t and made_at.get(t, k) < k)
        outs = dict.fromkeys(
            t
            for n in part
            for t in n.output
            if t in graph_outs or any(j > k for j in read_at.get(t, ()))
        )
        names = tuple(dict.fromkeys(group_of[n.name] for n in part if n.name in group_of))
        segments.append(Segment(k, tuple(n.name for n in part), tuple(ins), tuple(outs), names))
    return tuple(segments)


def _value_info(model: Model, name: str) -> onnx.ValueInfoProto:
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        if vi.name == name:
            return vi
    return helper.make_empty_tensor_value_info(name)


def segment_model(model: Model, seg: Segment, *, extra_outputs: tuple[str, ...] = ()) -> Model:
    """The float sub-model of one segment (its inputs become graph inputs)."""
    wanted = set(seg.nodes)
    nodes = [n for n in model.graph.node if n.name in wanted]
    used = {t for n in nodes for t in n.input}
    inits = [t for t in model.graph.initializer if t.name in used]
    init_names = {t.name for t in inits}
    graph = helper.make_graph(
        nodes,
        f"segment_{seg.index}",
        [_value_info(model, t) for t in seg.inputs if t not in init_names],
        [_value_info(model, t) for t in dict.fromkeys([*seg.outputs, *extra_outputs])],
        initializer=inits,
    )
    # the types of the tensors its nodes read and make (not the whole model's: copying
    # every value_info into every segment was seconds per sweep on a 12-layer encoder)
    touched = used | {t for n in nodes for t in n.output}
    graph.value_info.extend(vi for vi in model.graph.value_info if vi.name in touched)
    proto = helper.make_model(graph, opset_imports=list(model.proto.opset_import))
    proto.ir_version = model.proto.ir_version
    return Model(proto=proto, source=f"{model.source}#segment{seg.index}")


def restrict_encodings(model: Model, seg_model: Model, encodings: Encodings) -> Encodings:
    """The encodings a segment writes: tensors it makes, graph inputs it reads, its weights."""
    return encodings_within(encodings, segment_tensors(model, seg_model.graph.node))


@dataclass(frozen=True)
class SegmentTensors:
    """What decides a segment's encodings: the tensors it makes, the real graph inputs it
    reads, the initializers it reads."""

    made: frozenset[str]
    inputs_read: frozenset[str]
    initializers: frozenset[str]


def segment_tensors(model: Model, nodes: Iterable[onnx.NodeProto]) -> SegmentTensors:
    """:class:`SegmentTensors` of the segment made of ``nodes`` of ``model``."""
    nodes = list(nodes)
    read = {t for n in nodes for t in n.input}
    inits = {t.name for t in model.graph.initializer}
    return SegmentTensors(frozenset(t for n in nodes for t in n.output),
                          frozenset(read & set(model.input_names())), frozenset(read & inits))


def encodings_within(encodings: Encodings, seg: SegmentTensors) -> Encodings:
    """``encodings`` restricted to one segment's (:func:`restrict_encodings`)."""
    acts = {t: e for t, e in encodings.activations.items()
            if t in seg.made or t in seg.inputs_read}
    weights = {t: e for t, e in encodings.weights.items() if t in seg.initializers}
    return Encodings(
        activations=acts, weights=weights, scheme=encodings.scheme, notes=encodings.notes
    )


def segment_qdq(
    model: Model, seg_model: Model, groups: Groups, plan: Plan, encodings: Encodings
) -> onnx.ModelProto:
    """The one writer applied to a segment: Q/DQ exactly where the full QDQ model has it."""
    return build_qdq(seg_model, restrict_encodings(model, seg_model, encodings))


# --- the segment engine ---------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Chain:
    """Segments of one model and one session per segment (float or all-low)."""

    segments: tuple[Segment, ...]
    sessions: tuple[ort.InferenceSession, ...]
    outputs: tuple[tuple[str, ...], ...]  # per segment: names its session returns

    def run(self, env: dict[str, np.ndarray], start: int = 0) -> dict[str, np.ndarray]:
        """Run segments ``start..`` reading from and writing into a copy of ``env``."""
        env = dict(env)
        for k in range(start, len(self.segments)):
            env.update(run_segment(self.sessions[k], self.outputs[k], env))
        return env


def run_segment(sess: ort.InferenceSession, names: Sequence[str], env: dict) -> dict:
    if not names:  # only dead nodes (nothing read later, no graph output): nothing to run
        return {}
    feeds = {i.name: env[i.name] for i in sess.get_inputs()}
    return dict(zip(names, sess.run(list(names), feeds), strict=True))


def _taps(segment: Segment, groups: Groups) -> tuple[str, ...]:
    by = groups.by_name()
    return tuple(dict.fromkeys(t for g in segment.groups for t in by[g].outputs))


def build_chain(
    model: Model,
    groups: Groups,
    segments: tuple[Segment, ...],
    encodings: Encodings | None,
    *,
    optimize: bool,
    label: str = "",
    seg_models: dict[int, Model] | None = None,
    arena: bool = True,
) -> Chain:
    """One session per segment: float (``encodings`` None) or the writer's Q/DQ
    (``label``: progress over the segments, on stderr; ``seg_models``:
    :func:`segment_models`, when the caller has them; ``arena``: off for a model of
    large tensors, :func:`quantscope.emulate.session.use_arena`)."""
    sessions, outputs = [], []
    plan = Plan.uniform(Precision.FLOAT)
    for seg in track(segments, label, unit="segment", show=bool(label)):
        taps = _taps(seg, groups)
        sm = seg_models[seg.index] if seg_models is not None else \
            segment_model(model, seg, extra_outputs=taps)
        proto = sm.proto if encodings is None else segment_qdq(model, sm, groups, plan, encodings)
        sessions.append(make_session(proto, optimize=optimize, shared_arena=True, arena=arena))
        outputs.append(tuple(dict.fromkeys([*seg.outputs, *taps])))
    return Chain(segments, tuple(sessions), tuple(outputs))


@dataclass(frozen=True, eq=False)
class Runner:
    """A candidate's own sessions for the segments its plan changes; the rest is shared.

    Usually that is the one segment holding its group; a candidate that changes how a
    model input is quantized also owns every segment that reads that input.
    """

    candidate: Candidate
    start: int
    own: dict[int, ort.InferenceSession]
    own_isolated: int  # the segment holding the group (a unit's first member)


def _same(a: Encodings, b: Encodings) -> bool:
    def ids(d: dict) -> dict:
        return {k: id(v) for k, v in d.items()}

    return ids(a.activations) == ids(b.activations) and ids(a.weights) == ids(b.weights)


def owned_segments(
    model: Model,
    groups: Groups,
    segments: tuple[Segment, ...],
    table: dict[Precision, Encodings],
    cands: Sequence[Candidate],
    low: Precision,
    *,
    seg_models: dict[int, Model] | None = None,
) -> tuple[dict[int, Encodings], ...]:
    """Per candidate, the segments it needs a session of its own for (the one holding its
    group, and any whose encodings its plan changes) with their encodings: no session is
    built, so what the sessions will hold can be told before (:func:`segment_bytes`).
    ``seg_models``: :func:`segment_models` of ``segments``, when the caller has them."""
    seg_models = seg_models if seg_models is not None else segment_models(model, groups,
                                                                         segments)
    # what decides each segment's encodings, found once (not once per candidate)
    within = {k: segment_tensors(model, sm.graph.node) for k, sm in seg_models.items()}
    empty = Encodings(activations={}, weights={})
    low_of = {k: encodings_within(table[low], t) for k, t in within.items()} \
        if any(c.sweep != "enable_one" for c in cands) else {}
    seg_of = {g: seg.index for seg in segments for g in seg.groups}
    out = []
    for c in cands:
        enc = mixed_encodings(table, groups, c.plan)
        own = {}
        for k, seg in within.items():
            mine = encodings_within(enc, seg)
            base = empty if c.sweep == "enable_one" else low_of[k]
            if k in {seg_of[g] for g in c.names} or not _same(mine, base):
                own[k] = mine
        out.append(own)
    return tuple(out)


def segment_models(model: Model, groups: Groups, segments: tuple[Segment, ...]
                   ) -> dict[int, Model]:
    """Each segment's float sub-model with its groups' outputs as extra outputs (what
    chains and candidates build their sessions from; build them once per sweep)."""
    return {s.index: segment_model(model, s, extra_outputs=_taps(s, groups)) for s in segments}


def segment_bytes(model: Model, segments: tuple[Segment, ...]) -> tuple[int, ...]:
    """Per segment, the bytes of the weights its nodes read (what a session of it holds,
    besides the activations of a batch)."""
    from quantscope.analyze.memory import itemsize

    size = {t.name: int(np.prod(t.dims, dtype=np.int64)) * itemsize(t.data_type)
            for t in model.graph.initializer}
    by_node = {n.name: n for n in model.graph.node}
    return tuple(sum(size.get(t, 0) for t in {t for name in seg.nodes
                                             for t in by_node[name].input})
                 for seg in segments)


def run_share(segments: Sequence[Segment], owned: Sequence[dict[int, Encodings]]) -> float:
    """The share of the nodes the candidates (``owned``: :func:`owned_segments`) run from
    their first own segment on, of what a full pass each would run."""
    total = sum(len(s.nodes) for s in segments)
    ran = sum(sum(len(s.nodes) for s in segments[min(own, default=0):]) for own in owned)
    return ran / (total * len(owned)) if total and owned else 1.0


def build_runners(
    model: Model,
    groups: Groups,
    segments: tuple[Segment, ...],
    table: dict[Precision, Encodings],
    cands: Sequence[Candidate],
    low: Precision,
    *,
    owned: Sequence[dict[int, Encodings]] | None = None,
    label: str = "",
    seg_models: dict[int, Model] | None = None,
    arena: bool = True,
) -> tuple[Runner, ...]:
    """Each candidate's own sessions (``owned``: :func:`owned_segments` of ``cands``, when
    already found; ``label``: progress over the candidates, on stderr; ``seg_models``:
    :func:`segment_models`, when the caller has them; ``arena``: as :func:`build_chain`)."""
    seg_of = {g: seg.index for seg in segments for g in seg.groups}
    seg_models = seg_models if seg_models is not None else segment_models(model, groups,
                                                                         segments)
    if owned is None:
        owned = owned_segments(model, groups, segments, table, cands, low,
                               seg_models=seg_models)
    runners = []
    for c, own in track(list(zip(cands, owned, strict=True)), label, unit="cand",
                        show=bool(label)):
        sessions = {k: make_session(build_qdq(seg_models[k], enc), shared_arena=True,
                                    arena=arena)
                    for k, enc in own.items()}
        runners.append(Runner(c, min(sessions), sessions, seg_of[c.names[0]]))
    return tuple(runners)


def run_candidate(r: Runner, base: dict, chain: Chain) -> dict[str, np.ndarray]:
    env = dict(base)
    for k in range(r.start, len(chain.segments)):
        sess = r.own.get(k, chain.sessions[k])
        env.update(run_segment(sess, chain.outputs[k], env))
    return env


# --- streaming: only the tensors a later segment reads are held ------------------------


def last_reads(model: Model, segments: Sequence[Segment]) -> dict[str, int]:
    """Per tensor crossing a cut (or fed in), the last segment that reads it; a graph
    output is read "after" every segment (``len(segments)``)."""
    last: dict[str, int] = {}
    for seg in segments:
        for t in seg.inputs:
            last[t] = max(last.get(t, -1), seg.index)
    last.update(dict.fromkeys(model.output_names(), len(segments)))
    return last


def drop_dead(env: dict[str, np.ndarray], last: dict[str, int], k: int) -> None:
    """Remove from ``env`` every tensor no segment after ``k`` reads (nor the graph)."""
    for t in [t for t in env if last.get(t, -1) <= k]:
        del env[t]


def live_tensors(model: Model, groups: Groups, segments: Sequence[Segment]
                 ) -> tuple[tuple[str, ...], ...]:
    """Per segment ``k``, what a streaming env holds while ``k`` runs: the tensors made
    before ``k`` and read at or after it, and ``k``'s own outputs and taps (what the
    memory estimate sums, :mod:`quantscope.analyze.memory`)."""
    last = last_reads(model, segments)
    made: list[str] = []
    out = []
    for seg in segments:
        live = [t for t in made if last.get(t, -1) >= seg.index]
        out.append(tuple(dict.fromkeys([*live, *seg.outputs, *_taps(seg, groups)])))
        made = [*live, *seg.outputs]
    return tuple(out)


def run_streaming(r: Runner, base: dict[str, np.ndarray], chain: Chain, last: dict[str, int],
                  keep: Sequence[str] = ()) -> tuple[dict[str, np.ndarray], dict]:
    """:func:`run_candidate` holding only what later segments read: each segment returns
    its crossing tensors (and ``keep``, e.g. the group's outputs, where it makes them);
    the rest is dropped as it dies. Returns the env (the graph outputs) and ``keep``'s
    values; the same values as :func:`run_candidate`."""
    env, kept = dict(base), {}
    wanted = set(keep)
    for k in range(r.start, len(chain.segments)):
        seg = chain.segments[k]
        names = [t for t in chain.outputs[k] if t in seg.outputs or t in wanted]
        got = run_segment(r.own.get(k, chain.sessions[k]), names, env)
        kept.update({t: v for t, v in got.items() if t in wanted})
        env.update({t: v for t, v in got.items() if t in seg.outputs})
        drop_dead(env, last, k)
    return env, kept
