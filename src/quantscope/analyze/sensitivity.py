"""Sensitivity sweeps in task terms: enable-one and disable-one, fast and naive.

==============  =======================================================================
enable-one g    plan: ``g`` at ``low``, every other group float
disable-one g   plan: every group at ``low`` except ``g`` at ``high``
naive           one full QDQ model per candidate (build_qdq + a fresh session), run on
                every batch: the reference the fast sweep is measured against
segments        the model is cut at single-activation boundaries
                (:mod:`quantscope.analyze.segments`); per batch the FP32 and the
                all-``low`` chains run once and cache every tensor crossing a cut; a
                candidate then runs its own segment (Q/DQ written by build_qdq for the
                candidate's plan) and only the segments after it, float (enable-one) or
                all-``low`` (disable-one). Exact: equals naive up to float rounding
fast            :func:`sweep_fast`: segments on two row subsets chosen per sweep.
                Enable-one: every ``k``-th row (stratified over the length-sorted
                batches). Disable-one: a pre-pass runs FP32 and all-``low`` on every
                row; rows are taken by noise density (output noise of the all-``low``
                model per unit of row cost) until the row-cost budget is spent. The
                metric being ranked sums noise over rows, and the rows that carry it
                (for mean-pooled text encoders: the short texts) are the ones that
                rank promotions; long rows add cost, little noise
==============  =======================================================================

The sweep streams: per batch only that batch's cached tensors are held; per candidate
only the reduced rows (see :mod:`quantscope.analyze.scoring`) are kept.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort

from quantscope.analyze.noise import NoiseAccumulator
from quantscope.analyze.scoring import Scorer
from quantscope.analyze.segments import (
    Segment,
    find_segments,
    restrict_encodings,
    segment_model,
    segment_qdq,
)
from quantscope.emulate.encode import encode
from quantscope.emulate.qdq import build_qdq
from quantscope.emulate.session import make_session, providers
from quantscope.model.load import Model
from quantscope.types import Encodings, Groups, Plan, Precision, QuantScheme, Stats

Batch = dict[str, np.ndarray]
SWEEPS = ("enable_one", "disable_one")


@dataclass(frozen=True)
class Candidate:
    group: str
    sweep: str  # "enable_one" | "disable_one"
    plan: Plan


def candidates(groups: Groups, low: Precision, high: Precision) -> tuple[Candidate, ...]:
    """Both sweeps over every group, enable-one first."""
    enable = [
        Candidate(g, "enable_one", Plan(Precision.FLOAT, ((g, low),))) for g in groups.names()
    ]
    disable = [Candidate(g, "disable_one", Plan(low, ((g, high),))) for g in groups.names()]
    return (*enable, *disable)


def encodings_table(
    model: Model,
    groups: Groups,
    stats: Stats,
    precisions: Iterable[Precision],
    scheme: QuantScheme | None = None,
) -> dict[Precision, Encodings]:
    return {
        p: encode(model, groups, stats, Plan.uniform(p), scheme=scheme)
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
    for g in groups.groups:
        p = plan.precision_of(g.name)
        if p is Precision.FLOAT:
            continue
        enc = table[p]
        acts.update({t: enc.activations[t] for t in g.outputs if t in enc.activations})
        if g.weight is not None and g.weight in enc.weights:
            weights[g.weight] = enc.weights[g.weight]
        notes.extend(n for n in enc.notes if n not in notes)
        for t in g.inputs:
            if t in groups.model_inputs and (t not in widest or p.act_bits > widest[t].act_bits):
                widest[t] = p
    acts.update({t: table[p].activations[t] for t, p in widest.items()})
    scheme = next(iter(table.values())).scheme
    return Encodings(activations=acts, weights=weights, scheme=scheme, notes=tuple(notes))


_SHARED_ARENA: list[bool] = []


def _shared_arena() -> None:
    """Register one process-wide CPU arena (once) that every sweep session allocates from."""
    if not _SHARED_ARENA:
        info = ort.OrtMemoryInfo(
            "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
        )
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))
        _SHARED_ARENA.append(True)


def _session(proto: onnx.ModelProto, *, optimize: bool) -> ort.InferenceSession:
    """As :func:`make_session` (same numerics), tuned for holding hundreds of sessions.

    One shared memory arena: a per-session arena would keep its peak batch (attention
    scores of the longest batch) allocated for the life of the sweep. Thread pools do not
    spin after a run, or idle sessions steal the cores of the running one.
    """
    _shared_arena()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        if optimize
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.use_env_allocators", "1")
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(proto.SerializeToString(), sess_options=opts, providers=providers())


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
) -> Chain:
    """One session per segment: float (``encodings`` None) or the writer's Q/DQ."""
    sessions, outputs = [], []
    plan = Plan.uniform(Precision.FLOAT)
    for seg in segments:
        taps = _taps(seg, groups)
        sm = segment_model(model, seg, extra_outputs=taps)
        proto = sm.proto if encodings is None else segment_qdq(model, sm, groups, plan, encodings)
        sessions.append(_session(proto, optimize=optimize))
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
    own_isolated: int  # the segment holding the group


def _same(a: Encodings, b: Encodings) -> bool:
    def ids(d: dict) -> dict:
        return {k: id(v) for k, v in d.items()}

    return ids(a.activations) == ids(b.activations) and ids(a.weights) == ids(b.weights)


def build_runners(
    model: Model,
    groups: Groups,
    segments: tuple[Segment, ...],
    table: dict[Precision, Encodings],
    cands: Sequence[Candidate],
    low: Precision,
) -> tuple[Runner, ...]:
    seg_of = {g: seg.index for seg in segments for g in seg.groups}
    seg_models = {
        s.index: segment_model(model, s, extra_outputs=_taps(s, groups)) for s in segments
    }
    empty = Encodings(activations={}, weights={})
    runners = []
    for c in cands:
        enc = mixed_encodings(table, groups, c.plan)
        base = empty if c.sweep == "enable_one" else table[low]
        own = {}
        for k, sm in seg_models.items():
            mine = restrict_encodings(model, sm, enc)
            if k == seg_of[c.group] or not _same(mine, restrict_encodings(model, sm, base)):
                own[k] = _session(build_qdq(sm, groups, c.plan, mine), optimize=False)
        runners.append(Runner(c, min(own), own, seg_of[c.group]))
    return tuple(runners)


def run_candidate(r: Runner, base: dict, chain: Chain) -> dict[str, np.ndarray]:
    env = dict(base)
    for k in range(r.start, len(chain.segments)):
        sess = r.own.get(k, chain.sessions[k])
        env.update(run_segment(sess, chain.outputs[k], env))
    return env


@dataclass(frozen=True)
class SweepResult:
    """Reduced rows per candidate, noise per tensor, and timing of one sweep.

    ``ref_rows``/``low_rows`` are FP32 and all-``low`` on the rows the disable-one sweep
    ran on; ``refs[i]`` are FP32 on the rows candidate ``i`` ran on (the fast sweep uses
    different rows per sweep). ``row_counts``: rows per sweep.
    """

    candidates: tuple[Candidate, ...]
    rows: tuple[np.ndarray, ...]  # per candidate [N, D]
    ref_rows: np.ndarray
    low_rows: np.ndarray
    noise_cumulative: dict[str, float]  # tensor -> SQNR dB, everything at low
    noise_isolated: dict[str, float]  # tensor -> SQNR dB, only its group at low
    seconds: float
    method: str
    refs: tuple[np.ndarray, ...] = ()
    row_counts: tuple[tuple[str, int], ...] = ()

    def ref_of(self, i: int) -> np.ndarray:
        """FP32 rows matching ``rows[i]``."""
        return self.refs[i] if self.refs else self.ref_rows


def _progress(k: int, n: int, label: str, *, show: bool) -> None:
    if show:
        print(f"\r{label}: batch {k}/{n}", end="" if k < n else "\n", file=sys.stderr, flush=True)


def sweep_segments(
    model: Model,
    groups: Groups,
    stats: Stats,
    batches: Sequence[Batch],
    *,
    scorer: Scorer,
    low: Precision,
    high: Precision,
    scheme: QuantScheme | None = None,
    optimize_float: bool = True,
    sweeps: Sequence[str] = SWEEPS,
    progress: bool = False,
) -> SweepResult:
    """The ``sweeps`` (default both) on every row, segment by segment (module docstring)."""
    t0 = time.perf_counter()
    unknown = set(sweeps) - set(SWEEPS)
    if unknown or not sweeps:
        raise ValueError(f"sweeps must be a non-empty subset of {SWEEPS}, got {sweeps}")
    segments = find_segments(model, groups)
    table = encodings_table(model, groups, stats, (low, high), scheme)
    fp = build_chain(model, groups, segments, None, optimize=optimize_float)
    lo = build_chain(model, groups, segments, table[low], optimize=False)
    cands = tuple(c for c in candidates(groups, low, high) if c.sweep in sweeps)
    runners = build_runners(model, groups, segments, table, cands, low)
    rows: list[list[np.ndarray]] = [[] for _ in cands]
    ref_rows, low_rows = [], []
    cum, iso = NoiseAccumulator(), NoiseAccumulator()
    by = groups.by_name()
    outs = model.output_names()
    need_low = "disable_one" in sweeps
    for b, feeds in enumerate(batches, 1):
        env_fp = fp.run(feeds)
        env_lo = lo.run(feeds) if need_low else {}
        ref_rows.append(scorer.reduce([env_fp[o] for o in outs], feeds))
        if need_low:
            low_rows.append(scorer.reduce([env_lo[o] for o in outs], feeds))
        for t in (t for names in fp.outputs for t in names if t in env_lo):
            cum.add(t, env_fp[t], env_lo[t])
        for i, r in enumerate(runners):
            enable = r.candidate.sweep == "enable_one"
            env = run_candidate(r, env_fp if enable else env_lo, fp if enable else lo)
            if enable:
                for t in by[r.candidate.group].outputs:
                    iso.add(t, env_fp[t], env[t])
            rows[i].append(scorer.reduce([env[o] for o in outs], feeds))
        _progress(b, len(batches), "sweep " + "+".join(sweeps), show=progress)
    ref = np.concatenate(ref_rows)
    lows = np.concatenate(low_rows) if low_rows else np.empty((0, *ref.shape[1:]), ref.dtype)
    return SweepResult(
        cands,
        tuple(np.concatenate(r) for r in rows),
        ref,
        lows,
        cum.sqnr(),
        iso.sqnr(),
        time.perf_counter() - t0,
        "segments",
        refs=tuple(ref for _ in cands),
    )


def run_plan_rows(
    model: Model,
    groups: Groups,
    batches: Sequence[Batch],
    proto: object,
    scorer: Scorer,
) -> np.ndarray:
    """Reduced rows of one full model (QDQ or FP32) over every batch."""
    del groups
    sess = make_session(proto)
    outs = [o.name for o in sess.get_outputs()]
    names = {i.name for i in sess.get_inputs()}
    rows = []
    for feeds in batches:
        values = sess.run(outs, {k: v for k, v in feeds.items() if k in names})
        rows.append(scorer.reduce(values, feeds))
    return np.concatenate(rows)


def sweep_naive(
    model: Model,
    groups: Groups,
    stats: Stats,
    batches: Sequence[Batch],
    *,
    scorer: Scorer,
    low: Precision,
    high: Precision,
    scheme: QuantScheme | None = None,
    progress: bool = False,
) -> SweepResult:
    """Both sweeps with one full QDQ model per candidate: the slow reference."""
    t0 = time.perf_counter()
    cands = candidates(groups, low, high)
    ref = run_plan_rows(model, groups, batches, model.proto, scorer)
    rows = []
    for i, c in enumerate(cands, 1):
        enc = encode(model, groups, stats, c.plan, scheme=scheme)
        rows.append(
            run_plan_rows(model, groups, batches, build_qdq(model, groups, c.plan, enc), scorer)
        )
        _progress(i, len(cands), "naive sweep (candidates)", show=progress)
    enc = encode(model, groups, stats, Plan.uniform(low), scheme=scheme)
    low_rows = run_plan_rows(
        model, groups, batches, build_qdq(model, groups, Plan.uniform(low), enc), scorer
    )
    return SweepResult(cands, tuple(rows), ref, low_rows, {}, {}, time.perf_counter() - t0, "naive",
                       row_counts=(("enable_one", len(ref)), ("disable_one", len(ref))))


def _pad_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    pad = [(0, 0)] + [(0, s - d) for s, d in zip(shape[1:], x.shape[1:], strict=True)]
    return np.pad(x, pad) if any(p[1] for p in pad) else x


def _merge(parts: list[Batch]) -> Batch:
    out = {}
    for k in parts[0]:
        shape = tuple(max(p[k].shape[i] for p in parts) for i in range(parts[0][k].ndim))
        out[k] = np.concatenate([_pad_to(p[k], shape) for p in parts])
    return out


def proxy_batches(
    batches: Sequence[Batch], fraction: float, *, batch_size: int = 32, max_pad: float = 1.25
) -> list[Batch]:
    """Every ``1/fraction``-th row of every batch, regrouped into batches of ``batch_size``.

    Rows keep the data's length mix (batches are length-sorted). Consecutive subsets are
    merged only while the widest input is at most ``max_pad`` x the narrowest (zero
    padding, right for token ids and attention masks), so padding stays cheap.
    """
    step = max(1, round(1.0 / fraction))
    picked = [{k: v[::step] for k, v in b.items()} for b in batches]
    picked = [p for p in picked if len(next(iter(p.values())))]
    out: list[Batch] = []
    group: list[Batch] = []
    for b in picked:
        width = max((v.shape[1] for v in b.values() if v.ndim > 1), default=1)
        first = group and max((v.shape[1] for v in group[0].values() if v.ndim > 1), default=1)
        rows = sum(len(next(iter(g.values()))) for g in group)
        if group and (rows + len(next(iter(b.values()))) > batch_size or width > max_pad * first):
            out.append(_merge(group))
            group = []
        group.append(b)
    if group:
        out.append(_merge(group))
    return out


def _width(b: Batch) -> int:
    """Row cost proxy of a batch: its widest second axis (sequence length), else 1."""
    return max((v.shape[1] for v in b.values() if v.ndim > 1), default=1)


def _take(b: Batch, idx: np.ndarray) -> Batch:
    return {k: v[idx] for k, v in b.items()}


def density_batches(
    batches: Sequence[Batch],
    noise: Sequence[np.ndarray],
    budget: float,
    *,
    batch_size: int = 32,
) -> tuple[list[Batch], float]:
    """Rows by noise density until ``budget`` (a fraction of the total row cost) is spent.

    ``noise[b][r]``: output noise of row ``r`` of batch ``b`` under the all-``low`` plan.
    A row costs its batch's width (:func:`_width`); rows are taken by ``noise / cost``,
    highest first, then regrouped in the original (length-sorted) order. Returns the
    batches and the fraction of the total noise they carry.
    """
    rows = [(b, r) for b, n in enumerate(noise) for r in range(len(n))]
    cost = np.array([_width(batches[b]) for b, _ in rows], dtype=np.float64)
    value = np.array([noise[b][r] for b, r in rows], dtype=np.float64)
    order = np.argsort(-(value / cost), kind="stable")
    spent = np.cumsum(cost[order])
    k = max(1, int(np.searchsorted(spent, budget * cost.sum(), side="right")))
    keep = sorted(order[:k].tolist())
    picked: dict[int, list[int]] = {}
    for i in keep:
        b, r = rows[i]
        picked.setdefault(b, []).append(r)
    parts = [_take(batches[b], np.array(r)) for b, r in sorted(picked.items())]
    out: list[Batch] = []
    group: list[Batch] = []
    for p in parts:
        n = len(next(iter(p.values())))
        if group and sum(len(next(iter(g.values()))) for g in group) + n > batch_size:
            out.append(_merge(group))
            group = []
        group.append(p)
    if group:
        out.append(_merge(group))
    carried = float(value[order[:k]].sum() / value.sum()) if value.sum() > 0 else 1.0
    return out, carried


def row_noise(
    model: Model,
    groups: Groups,
    stats: Stats,
    batches: Sequence[Batch],
    *,
    scorer: Scorer,
    low: Precision,
    scheme: QuantScheme | None = None,
) -> list[np.ndarray]:
    """Per batch, per row: squared error of the reduced all-``low`` rows against FP32."""
    enc = encode(model, groups, stats, Plan.uniform(low), scheme=scheme)
    fp = _session(model.proto, optimize=True)
    lo = _session(build_qdq(model, groups, Plan.uniform(low), enc), optimize=False)
    outs = model.output_names()
    out: list[np.ndarray] = []
    for feeds in batches:
        rows = []
        for sess in (fp, lo):
            names = {i.name for i in sess.get_inputs()}
            values = sess.run(outs, {k: v for k, v in feeds.items() if k in names})
            rows.append(scorer.reduce(values, feeds).astype(np.float64))
        out.append(squared_error_rows(rows[0], rows[1]))
    return out


def squared_error_rows(ref: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Per row: the summed squared difference of reduced rows (float64)."""
    d = np.asarray(test, np.float64) - np.asarray(ref, np.float64)
    return (d**2).reshape(len(d), -1).sum(axis=1)


def sweep_fast(
    model: Model,
    groups: Groups,
    stats: Stats,
    batches: Sequence[Batch],
    *,
    scorer: Scorer,
    low: Precision,
    high: Precision,
    fraction: float = 0.125,
    scheme: QuantScheme | None = None,
    noise: Sequence[np.ndarray] | None = None,
    progress: bool = False,
) -> SweepResult:
    """Both sweeps by segments, each on its own row subset (module docstring, ``fast``).

    ``noise``: per batch, per row output noise of uniform ``low`` (as :func:`row_noise`
    returns), when the caller has already run FP32 and ``low`` on every row.

    Enable-one runs on every ``round(2 / fraction)``-th row; disable-one on the rows of
    highest all-``low`` noise density, ``fraction`` of the total row cost. Measured on
    minilm-l6 (docs/benchmarks.md): rank agreement with the exact sweep on every row
    >= 0.95 for both sweeps.
    """
    t0 = time.perf_counter()
    batches = list(batches)
    kw = {"scorer": scorer, "low": low, "high": high, "scheme": scheme, "progress": progress}
    enable = sweep_segments(
        model, groups, stats, proxy_batches(batches, fraction / 2), sweeps=("enable_one",), **kw
    )
    if noise is None:
        noise = row_noise(model, groups, stats, batches, scorer=scorer, low=low, scheme=scheme)
    chosen, carried = density_batches(batches, noise, fraction)
    disable = sweep_segments(model, groups, stats, chosen, sweeps=("disable_one",), **kw)
    if progress:
        print(
            f"sweep: disable-one on {len(disable.ref_rows)} rows carrying "
            f"{100 * carried:.0f} % of the all-{low.value} output noise",
            file=sys.stderr,
        )
    iso = enable.noise_isolated
    return SweepResult(
        (*enable.candidates, *disable.candidates),
        (*enable.rows, *disable.rows),
        disable.ref_rows,
        disable.low_rows,
        disable.noise_cumulative,
        iso,
        time.perf_counter() - t0,
        "segments+density",
        refs=(*(enable.ref_rows for _ in enable.rows), *(disable.ref_rows for _ in disable.rows)),
        row_counts=(("enable_one", len(enable.ref_rows)), ("disable_one", len(disable.ref_rows))),
    )
