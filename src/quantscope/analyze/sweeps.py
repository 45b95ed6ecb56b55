"""Sensitivity sweeps in task terms: enable-one and disable-one, fast and naive.

==============  =======================================================================
enable-one g    plan: ``g`` at ``low``, every other group float
disable-one g   plan: every group at ``low`` except ``g`` at ``high``
naive           one full QDQ model per candidate (build_qdq + a fresh session), run on
                every batch: the reference the fast sweep is measured against
                (:mod:`quantscope.analyze.naive`)
segments        the model is cut where one activation crosses, and inside a segment
                those leave holding many groups (a U-Net's skips) where the
                activations crossing fit a budget (:mod:`quantscope.analyze.cuts`,
                :mod:`quantscope.analyze.segments`); per batch the FP32 chain
                (enable-one) or the all-``low`` chain (disable-one) runs up to the
                segment a candidate starts from, holding the tensors crossing the cut; the
                candidate then runs its own segment (Q/DQ written by build_qdq for the
                candidate's plan) and only the segments after it, float (enable-one) or
                all-``low`` (disable-one). Exact: equals naive up to float rounding.
                Before the windows, a sweep with the all-``low`` chain runs both chains
                alone over every batch (their output rows, the cumulative noise from
                every group output): no candidate's sessions or rows are held beside
                those taps. The engine (chains, runners) is in
                :mod:`quantscope.analyze.segments`.
fast            :func:`sweep_fast`: segments on two row subsets chosen per sweep
                (:mod:`quantscope.analyze.rows`).
                Enable-one: every ``k``-th row (stratified over the length-sorted
                batches). Disable-one: a pre-pass runs FP32 and all-``low`` on every
                row; rows are taken by noise density (output noise of the all-``low``
                model per unit of row cost) until the row-cost budget is spent. The
                metric being ranked sums noise over rows, and the rows that carry it
                (for mean-pooled text encoders: the short texts) are the ones that
                rank promotions; long rows add cost, little noise
==============  =======================================================================

The sweep streams: per batch only that batch's cached tensors are held; per candidate
only the reduced rows (see :mod:`quantscope.analyze.scoring`) are kept, and with a
``score`` only until the candidate's window of sessions is done: then its metrics are kept
and its rows dropped (an image model's rows are every output value: 118.5 MB a sample on
IS-Net at 1024 x 1024).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from quantscope.analyze.candidates import SWEEPS, Candidate, candidates, encodings_table
from quantscope.analyze.memory import MemoryPlan, plan_memory, tensor_sizer
from quantscope.analyze.noise import NoiseAccumulator
from quantscope.analyze.rows import density_batches, proxy_batches, row_noise
from quantscope.analyze.scoring import Scorer
from quantscope.analyze.segments import (
    Chain,
    Runner,
    Segment,
    build_chain,
    build_runners,
    drop_dead,
    find_segments,
    last_reads,
    live_tensors,
    owned_segments,
    run_segment,
    run_share,
    run_streaming,
    segment_bytes,
    segment_models,
)
from quantscope.emulate.release import STAGE_RELEASE_GROWTH, release_memory, resident_bytes
from quantscope.emulate.session import use_arena
from quantscope.model.load import Model
from quantscope.model.units import Unit
from quantscope.parallel import Executor, chunks
from quantscope.progress import Counter, feed_size, note_memory_estimate, say, track
from quantscope.types import Batch, Encodings, Groups, Precision, QuantScheme, Stats, batch_rows

# the group outputs a chain's segment returns at once for the cumulative noise (the rest
# on further runs of the segment); a segment's crossing tensors are returned whole
TAP_BYTES = 64 * 2**20
# a sweep's metrics of a candidate's reduced rows against FP32's (a Scorer, or fidelity)
ScoreFn = Callable[[np.ndarray, np.ndarray], dict[str, float]]


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
    # per candidate, when the sweep was given a ``score``: its metrics (``rows`` then empty)
    metrics: tuple[dict[str, float], ...] = ()

    def ref_of(self, i: int) -> np.ndarray:
        """FP32 rows matching ``rows[i]``."""
        return self.refs[i] if self.refs else self.ref_rows


@dataclass(eq=False)
class _Collected:
    """What a segment sweep keeps, filled batch by batch (mutable, private)."""

    rows: list[list[np.ndarray]]  # per candidate, per batch
    ref: list[np.ndarray] = field(default_factory=list)
    low: list[np.ndarray] = field(default_factory=list)
    cum: NoiseAccumulator = field(default_factory=NoiseAccumulator)
    iso: NoiseAccumulator = field(default_factory=NoiseAccumulator)


def _tap_parts(taps: Sequence[str], size: Callable[[Sequence[str]], int]) -> list[list[str]]:
    """``taps`` in consecutive parts of at most :data:`TAP_BYTES` each (a tap larger than
    that alone)."""
    parts: list[list[str]] = []
    held = 0
    for t in taps:
        b = size([t])
        if not parts or (parts[-1] and held + b > TAP_BYTES):
            parts.append([])
            held = 0
        parts[-1].append(t)
        held += b
    return parts


def _chains_stop(starts: dict[int, list[tuple[int, Runner]]], made_in: dict[str, int],
                 by: dict) -> int:
    """How many segments the chains run when only candidates read them: up to the last
    segment a candidate starts from (its env is the chain's at that cut) and the segments
    making the taps an enable-one candidate keeps (its isolated noise). IS-Net's last
    segment holds 226 of 258 groups: most candidates start there, and the chains ran it
    in every window for nothing."""
    need = list(starts)
    for runs in starts.values():
        for _, r in runs:
            if r.candidate.sweep == "enable_one":
                need += [made_in.get(t, r.own_isolated) + 1
                         for g in r.candidate.names for t in by[g].outputs]
    return max(need, default=0)


def _chains_segment(
    k: int, fp: Chain | None, lo: Chain | None, env_fp: dict, env_lo: dict,
    isolated: Sequence[dict[str, np.ndarray]], got: _Collected, *, cum_noise: bool,
    size: Callable[[Sequence[str]], int] | None,
) -> None:
    """The chains given run segment ``k`` on their envs (updated with its crossing
    tensors): the cumulative noise summed from its taps, ``TAP_BYTES`` at a time, when
    ``cum_noise``; the isolated noise of the taps enable-one candidates kept
    (``isolated``) against FP32's."""
    shape = fp if fp is not None else lo
    if shape is None:
        raise ValueError("a chain segment runs at least one chain")
    seg = shape.segments[k]
    wanted = {t for kept in isolated for t in kept}
    crossing = [t for t in shape.outputs[k] if t in seg.outputs]
    taps = [t for t in shape.outputs[k] if t not in seg.outputs]
    cum = taps if cum_noise else []
    parts = _tap_parts(cum, size) if size is not None and cum else [cum]
    for j, part in enumerate(parts):
        # the first run returns the crossing tensors (and the taps kept for the
        # isolated noise alone); each run one part of the cumulative noise's taps
        names_fp = ([*crossing, *(t for t in taps if t in wanted and t not in cum)]
                    if j == 0 else [])
        names_lo = crossing if j == 0 else []
        made_fp = (run_segment(fp.sessions[k], [*names_fp, *part], env_fp)
                   if fp is not None else {})
        made_lo = (run_segment(lo.sessions[k], [*names_lo, *part], env_lo)
                   if lo is not None else {})
        if cum_noise:
            for t in (t for t in shape.outputs[k] if t in made_lo and t in made_fp):
                got.cum.add(t, made_fp[t], made_lo[t])
        for kept in isolated:
            for t, v in kept.items():
                if t in made_fp:
                    got.iso.add(t, made_fp[t], v)
        if j == 0:
            for env, made in ((env_fp, made_fp), (env_lo, made_lo)):
                env.update({t: v for t, v in made.items() if t in seg.outputs})
        del made_fp, made_lo


def _sweep_batch(
    feeds: Batch, fp: Chain | None, lo: Chain | None, runners: Sequence[Runner],
    groups: Groups, outs: list[str], scorer: Scorer, got: _Collected, count: Counter | None,
    last: dict[str, int], first: int = 0, size: Callable[[Sequence[str]], int] | None = None,
    duties: bool = False, done: Callable[[int], None] | None = None,
) -> None:
    """One batch, streamed segment by segment: each chain given (FP32 ``fp``, all-``low``
    ``lo``; None: not run) runs segment ``k``, then every candidate whose own segments
    start at ``k`` runs from there to the end on its chain's env of that moment (enable-one
    on FP32's, disable-one on all-``low``'s); each env keeps only what a later segment
    reads (and a segment's taps while its noise is summed). The candidates are ``first``,
    ``first + 1`` … (``runners``); ``done(i)`` is called once candidate ``i``'s rows of
    this batch are kept. A chain stops at the last segment anything still reads.

    ``duties``: this pass also keeps the chains' output rows and sums the cumulative noise
    (when both chains run): the sweep's pass before its windows (with no candidates) or
    its first window. A chain's segment returns the group outputs (taps) only where a
    noise is summed from them: every tap in the duties pass (the cumulative noise), else
    those an enable-one candidate of the window kept (its isolated noise). The cumulative
    noise's taps come in parts of :data:`TAP_BYTES` (``size``: bytes of tensors), the
    segment run once more per part: IS-Net's last segment has 226 group outputs of
    1.2 GB a sample, which both chains returned at once in every window."""
    shape = fp if fp is not None else lo
    if shape is None:
        raise ValueError("a sweep batch runs at least one chain")
    by = groups.by_name()
    starts: dict[int, list[tuple[int, Runner]]] = {}
    for i, r in enumerate(runners, start=first):
        starts.setdefault(r.start, []).append((i, r))
    pending: dict[int, list[dict[str, np.ndarray]]] = {}  # isolated segment -> values
    made_in = {t: k for k, made in enumerate(shape.outputs) for t in made}
    env_fp = dict(feeds) if fp is not None else {}
    env_lo = dict(feeds) if lo is not None else {}
    cum_noise = duties and fp is not None and lo is not None
    stop = len(shape.segments) if duties else _chains_stop(starts, made_in, by)
    for k in range(len(shape.segments)):
        for i, r in starts.get(k, ()):
            enable = r.candidate.sweep == "enable_one"
            keep = [t for g in r.candidate.names for t in by[g].outputs] if enable else ()
            base, chain = (env_fp, fp) if enable else (env_lo, lo)
            if chain is None:
                raise ValueError(f"candidate {i} needs the chain its sweep reads")
            env, kept = run_streaming(r, base, chain, last, keep)
            for t, v in kept.items():  # compared where the FP32 chain makes t
                pending.setdefault(made_in.get(t, r.own_isolated), []).append({t: v})
            got.rows[i].append(scorer.reduce([env[o] for o in outs], feeds))
            del env, kept
            if done is not None:
                done(i)
            if count is not None:
                count.step(cost=feed_size(feeds))
        if k >= stop:
            continue
        _chains_segment(k, fp, lo, env_fp, env_lo, pending.pop(k, ()), got,
                        cum_noise=cum_noise, size=size)
        for env in (env_fp, env_lo):
            drop_dead(env, last, k)
    if duties:
        if fp is not None:
            got.ref.append(scorer.reduce([env_fp[o] for o in outs], feeds))
        if lo is not None:
            got.low.append(scorer.reduce([env_lo[o] for o in outs], feeds))


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
    executor: Executor | None = None,
    session_budget: int | None = None,
    only: Collection[str] | None = None,
    units: Sequence[Unit] | None = None,
    score: ScoreFn | None = None,
    row_bytes: int = 0,
    held_bytes: int = 0,
    run_bytes: int = 0,
    arena: bool | None = None,
) -> SweepResult:
    """The ``sweeps`` (default both) on every row, segment by segment (module docstring);
    ``only``: the groups swept (default every group); ``units``: these units swept instead,
    each moving all its members (:func:`quantscope.model.units.sweep_units`).

    ``score``: each candidate's metrics against FP32's rows, computed once its window is
    done (``metrics``); its rows are then dropped (``rows`` is empty). ``row_bytes``: the
    bytes of one reduced row (FP32's, when the caller has them), so that the windows also
    bound the rows held until scored; ``held_bytes``: what the caller holds meanwhile (in
    the estimate said); ``run_bytes``: what one FP32 run of a batch was measured to hold
    (the estimate takes the larger of it and the tensors' own count). ``arena``: whether the
    sessions allocate from ONNX Runtime's arena, when the caller has decided it (default:
    :func:`quantscope.emulate.session.use_arena` of the largest tensor).

    Memory stays bounded: the candidates' own sessions are built for a window of
    candidates at a time, within ``session_budget`` bytes of weights (default: from the
    memory available, :func:`quantscope.analyze.memory.plan_memory`), run on every batch
    and dropped before the next window's are built (the chains run once per window and
    batch). The peak is estimated and said before any session is built; the rows do not
    depend on the windows.

    ``executor`` (e.g. a Ray cluster, :mod:`quantscope.parallel`): the candidates are
    split into one contiguous chunk per worker; each task gets the model, statistics and
    rows (shared through the executor) and its chunk, builds its own chains and returns its
    candidates' rows, merged here in candidate order: the serial result, bit for bit.
    """
    t0 = time.perf_counter()
    unknown = set(sweeps) - set(SWEEPS)
    if unknown or not sweeps:
        raise ValueError(f"sweeps must be a non-empty subset of {SWEEPS}, got {sweeps}")
    only = None if only is None else frozenset(only)
    units = None if units is None else tuple(units)
    cands = tuple(c for c in candidates(groups, low, high, only, units) if c.sweep in sweeps)
    job = _SegmentJob(model, groups, stats, tuple(batches), scorer, low, high, scheme,
                      optimize_float, tuple(sweeps), session_budget, only, units, score,
                      row_bytes, held_bytes, run_bytes, arena)
    parts = chunks(len(cands), executor.workers if executor else 1)
    if executor is None or len(parts) <= 1:
        done = [_segment_part(job, range(len(cands)), progress=progress)]
    else:
        done = executor.map(_segment_part, job, parts)
    ref, lows, cum = done[0].ref, done[0].low, done[0].cum
    iso = {k: v for d in done for k, v in d.iso.items()}
    return SweepResult(
        cands,
        tuple(r for d in done for r in d.rows),
        ref,
        lows,
        cum,
        iso,
        time.perf_counter() - t0,
        "segments",
        refs=tuple(ref for _ in cands),
        metrics=tuple(m for d in done for m in d.metrics),
    )


@dataclass(frozen=True, eq=False)
class _SegmentJob:
    """Everything a chunk of a segment sweep needs (shared by every chunk)."""

    model: Model
    groups: Groups
    stats: Stats
    batches: tuple[Batch, ...]
    scorer: Scorer
    low: Precision
    high: Precision
    scheme: QuantScheme | None
    optimize_float: bool
    sweeps: tuple[str, ...]
    session_budget: int | None = None
    only: frozenset[str] | None = None
    units: tuple[Unit, ...] | None = None
    score: ScoreFn | None = None
    row_bytes: int = 0
    held_bytes: int = 0
    run_bytes: int = 0
    arena: bool | None = None


@dataclass(frozen=True, eq=False)
class _PartResult:
    rows: tuple[np.ndarray, ...]  # per candidate of the chunk (empty when scored)
    ref: np.ndarray
    low: np.ndarray
    cum: dict[str, float]
    iso: dict[str, float]
    metrics: tuple[dict[str, float], ...] = ()  # per candidate, when the job scores


def _estimate(job: _SegmentJob, segments: Sequence[Segment], cand_bytes: Sequence[int],
              sizer: Callable[[Sequence[str]], int]) -> MemoryPlan:
    """The sweep's windows and peak (:func:`quantscope.analyze.memory.plan_memory`): the
    windows hold one env per chain they read and a candidate's; disable-one's read the
    all-low chain alone, with no taps; the chains' own pass (both chains, every tap one
    part at a time) comes first, with no candidate held."""
    model, groups = job.model, job.groups
    need_low = "disable_one" in job.sweeps
    rows = sum(batch_rows(b) for b in job.batches)  # each candidate's, FP32's, all-low's
    live = live_tensors(model, groups, segments)  # what an env holds while segment k runs
    by = groups.by_name()
    taps = [{t for g in seg.groups for t in by[g].outputs} - set(seg.outputs)
            for seg in segments]  # returned TAP_BYTES at a time (_sweep_batch)
    bare = [sizer([t for t in names if t not in tk]) for names, tk in zip(live, taps, strict=True)]
    # an env returning its taps: one part of them at a time (a tap larger than a part alone)
    tapped = max(b + min(sizer(list(tk)), max([TAP_BYTES, *(sizer([t]) for t in tk)]))
                 for b, tk in zip(bare, taps, strict=True))
    only_low = tuple(job.sweeps) == ("disable_one",)
    return plan_memory(model, cand_bytes, job.batches, (),
                       tensor_bytes=max(bare) if only_low else tapped,
                       chains=len(job.sweeps), budget=job.session_budget,
                       sizer=sizer, row_bytes=job.row_bytes * rows,
                       held_bytes=job.held_bytes + (1 + need_low) * job.row_bytes * rows,
                       measured=job.run_bytes, resident=resident_bytes() or 0,
                       prepass=(2, tapped) if need_low else None)


def _cut(model: Model, groups: Groups, *, progress: bool) -> tuple[Segment, ...]:
    say(f"analyze: cutting {len(model.graph.node)} nodes into segments, encodings of "
        f"{len(groups.groups)} groups", show=progress)
    return find_segments(model, groups)


@dataclass(frozen=True, eq=False)
class _PartSetup:
    """One part of a segment sweep before any session: its cuts, encodings, candidates
    and the segments each owns, the tensor sizer, the memory plan (said) and the arena."""

    segments: tuple[Segment, ...]
    table: dict[Precision, Encodings]
    cands: tuple[Candidate, ...]
    models: dict[int, Model]  # built once, read by every session
    owned: tuple[dict[int, Encodings], ...]  # per candidate, its own segments' encodings
    sizer: Callable[[Sequence[str]], int]
    mem: MemoryPlan
    arena: bool


def _part_setup(job: _SegmentJob, part: range, *, progress: bool) -> _PartSetup:
    """Cut, encode and size ``part`` of ``job``; say the share run and the estimate."""
    model, groups, low = job.model, job.groups, job.low
    # what an earlier sweep freed, before its resident is read
    release_memory(growth=STAGE_RELEASE_GROWTH)
    segments = _cut(model, groups, progress=progress)
    table = encodings_table(model, groups, job.stats, (low, job.high), job.scheme)
    cands = tuple(c for c in candidates(groups, low, job.high, job.only, job.units)
                  if c.sweep in job.sweeps)[part.start:part.stop]
    models = segment_models(model, groups, segments)
    owned = owned_segments(model, groups, segments, table, cands, low, seg_models=models)
    say(f"analyze: {len(segments)} segments; the {len(cands)} candidates run "
        f"{100 * run_share(segments, owned):.0f} % of the nodes full passes would", show=progress)
    sizes, sizer = segment_bytes(model, segments), tensor_sizer(model, job.batches)
    mem = _estimate(job, segments, [sum(sizes[k] for k in own) for own in owned], sizer)
    say(f"analyze: {mem.text()}", show=progress)
    note_memory_estimate(f"{mem.text()} (analyze's sweep)", mem.peak)  # run.json keeps it (a SIGKILL)
    arena = job.arena if job.arena is not None else use_arena(
        max((sizer([t]) for n in model.graph.node for t in n.output if t), default=0))
    return _PartSetup(segments, table, cands, models, owned, sizer, mem, arena)


@dataclass(eq=False)
class _PartScores:
    """Each candidate's metrics, scored once its rows and FP32's are all kept (then its
    rows dropped); ``ref`` is FP32's rows once they are all there (mutable, private)."""

    job: _SegmentJob
    got: _Collected
    metrics: list[dict[str, float] | None]
    ref: np.ndarray | None = None

    def score(self, i: int) -> None:
        if self.job.score is not None and self.ref is not None:
            self.metrics[i] = dict(self.job.score(self.ref, np.concatenate(self.got.rows[i])))
            self.got.rows[i] = []


def _part_chains(job: _SegmentJob, s: _PartSetup, *, progress: bool
                 ) -> tuple[Chain | None, Chain | None]:
    """The FP32 chain and, for disable-one, the all-low chain."""
    model, groups, n = job.model, job.groups, len(s.segments)
    fp = build_chain(model, groups, s.segments, None, optimize=job.optimize_float,
                     label=f"analyze: FP32 sessions of {n} segments" * progress,
                     seg_models=s.models, arena=s.arena)
    lo = build_chain(model, groups, s.segments, s.table[job.low], optimize=False,
                     label=f"analyze: all-{job.low.value} sessions" * progress,
                     seg_models=s.models, arena=s.arena) if "disable_one" in job.sweeps else None
    return fp, lo


def _part_windows(job: _SegmentJob, s: _PartSetup, fp: Chain | None, lo: Chain | None,
                  scores: _PartScores, last: dict[str, int], *, progress: bool) -> None:
    """The candidates window by window (each window's sessions built, run over every
    batch beside the chains it reads, then given back), scored as they complete."""
    model, groups, got, outs = job.model, job.groups, scores.got, job.model.output_names()
    count: Counter | None = None
    for w, window in enumerate(s.mem.windows):
        label = (f"analyze: candidate sessions {window.start + 1}-{window.stop}"
                 f"{f' (window {w + 1}/{len(s.mem.windows)})' if len(s.mem.windows) > 1 else ''}")
        runners = build_runners(model, groups, s.segments, s.table,
                                s.cands[window.start:window.stop], job.low,
                                owned=s.owned[window.start:window.stop], label=label * progress,
                                seg_models=s.models, arena=s.arena)
        if count is None:  # started once the first sessions are there
            count = Counter(f"analyze: {'+'.join(job.sweeps)} ({len(s.cands)} candidates x "
                            f"{len(job.batches)} batches)", total=len(s.cands) * len(job.batches),
                            unit="cand", show=progress,
                            # length-sorted batches: the ETA follows their sizes, not count
                            total_cost=len(s.cands) * sum(feed_size(b) for b in job.batches))
        duties = lo is None and w == 0  # FP32's rows, when no chains' pass came first
        sweeps_here = {r.candidate.sweep for r in runners}
        fp_here = fp if duties or "enable_one" in sweeps_here else None
        lo_here = lo if "disable_one" in sweeps_here else None
        for b, feeds in enumerate(job.batches if fp_here or lo_here else ()):  # else empty
            _sweep_batch(feeds, fp_here, lo_here, runners, groups, outs, job.scorer, got, count,
                         last, first=window.start, size=s.sizer, duties=duties,
                         done=scores.score if b == len(job.batches) - 1 else None)
        del runners  # this window's sessions go before the next window's are built
        release_memory()  # and their arena chunks (when the resident set grew)
        if scores.ref is None:
            scores.ref = np.concatenate(got.ref)
        for i in window:  # those the first window kept until FP32's rows were there
            if job.score is not None and scores.metrics[i] is None:
                scores.score(i)
    if count is not None:
        count.close()


def _segment_part(job: _SegmentJob, part: range, *, progress: bool = False) -> _PartResult:
    """The candidates ``part`` of ``job`` on every row (one task of a distributed sweep):
    set up (:func:`_part_setup`), the chains' own pass when disable-one runs, the windows
    (:func:`_part_windows`)."""
    s = _part_setup(job, part, progress=progress)
    fp, lo = _part_chains(job, s, progress=progress)
    got = _Collected(rows=[[] for _ in s.cands])
    scores = _PartScores(job, got, [None] * len(s.cands))
    last = last_reads(job.model, s.segments)
    if lo is not None:  # the chains' own pass: their rows and the cumulative noise, with
        # no candidate's sessions, rows or env held beside the taps
        for feeds in track(job.batches, f"analyze: FP32 and all-{job.low.value} chains "
                           "(cumulative noise)" * progress, unit="batch", show=progress):
            _sweep_batch(feeds, fp, lo, (), job.groups, job.model.output_names(), job.scorer,
                         got, None, last, size=s.sizer, duties=True)
        if "enable_one" not in job.sweeps:  # no window reads FP32's chain: its sessions go
            fp = None
            release_memory()
    scores.ref = np.concatenate(got.ref) if got.ref else None
    _part_windows(job, s, fp, lo, scores, last, progress=progress)
    ref = np.concatenate(got.ref) if scores.ref is None else scores.ref
    lows = np.concatenate(got.low) if got.low else np.empty((0, *ref.shape[1:]), ref.dtype)
    rows = () if job.score is not None else tuple(np.concatenate(r) for r in got.rows)
    return _PartResult(rows, ref, lows, got.cum.sqnr(), got.iso.sqnr(),
                       tuple(m for m in scores.metrics if m is not None))


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
    executor: Executor | None = None,
    only: Collection[str] | None = None,
    units: Sequence[Unit] | None = None,
    score: ScoreFn | None = None,
    row_bytes: int = 0,
    held_bytes: int = 0,
    run_bytes: int = 0,
    arena: bool | None = None,
) -> SweepResult:
    """Both sweeps by segments, each on its own row subset (module docstring, ``fast``);
    ``only``: the groups swept (default every group); ``units``, ``score``, ``row_bytes``,
    ``held_bytes``, ``run_bytes``, ``arena``: as :func:`sweep_segments`.

    ``noise``: per batch, per row output noise of uniform ``low`` (as :func:`row_noise`
    returns), when the caller has already run FP32 and ``low`` on every row.

    Enable-one runs on every ``round(2 / fraction)``-th row; disable-one on the rows of
    highest all-``low`` noise density, ``fraction`` of the total row cost. Measured on
    minilm-l6 (docs/benchmarks.md): rank agreement with the exact sweep on every row
    >= 0.95 for both sweeps.
    """
    t0 = time.perf_counter()
    batches = list(batches)
    kw = {"scorer": scorer, "low": low, "high": high, "scheme": scheme, "progress": progress,
          "executor": executor, "only": only, "units": units, "score": score,
          "row_bytes": row_bytes, "held_bytes": held_bytes, "run_bytes": run_bytes,
          "arena": arena}
    enable = sweep_segments(
        model, groups, stats, proxy_batches(batches, fraction / 2), sweeps=("enable_one",), **kw
    )
    if noise is None:
        noise = row_noise(model, groups, stats, batches, scorer=scorer, low=low, scheme=scheme)
    chosen, carried = density_batches(batches, noise, fraction)
    disable = sweep_segments(model, groups, stats, chosen, sweeps=("disable_one",), **kw)
    say(f"analyze: disable-one on {len(disable.ref_rows)} rows carrying "
        f"{100 * carried:.0f} % of the all-{low.value} output noise", show=progress)
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
        refs=(*(enable.ref_rows for _ in enable.candidates),
              *(disable.ref_rows for _ in disable.candidates)),
        row_counts=(("enable_one", len(enable.ref_rows)), ("disable_one", len(disable.ref_rows))),
        metrics=(*enable.metrics, *disable.metrics),
    )
