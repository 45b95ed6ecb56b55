"""Incremental evaluation: a plan's emulated outputs, run only from its first changed segment.

Two plans that agree on every segment before cut ``k`` compute the same tensors up to
``k``. The model is cut as the sweeps cut it (:func:`~quantscope.analyze.segments.find_segments`),
and the plans of one search are run on the segment engine:

=========================  ==========================================================
segment key                a content hash of what the segment's Q/DQ depends on: the
                           plan's encodings restricted to it (the tensors it makes,
                           the graph inputs and weights it reads:
                           :func:`~quantscope.analyze.segments.encodings_within`)
prefix key                 the hash of the segment keys of segments ``0..k``
activation cache           per prefix key, per evaluation batch, the tensors crossing
                           cut ``k`` (made before, read after or graph outputs); a plan
                           starts after the deepest cached cut of its own prefix. Kept
                           for what the search will reuse
                           (:mod:`~quantscope.analyze.activation_cache`): the *line* (the
                           incumbent, inferred from the plans' keys) last, then the
                           newest plan's own cuts, stale entries first; a budget smaller
                           than a plan's cuts keeps the line's spread over the depth.
                           A quantized tensor is kept as its integer codes where they
                           give it back bit for bit
                           (:mod:`~quantscope.analyze.cut_codes`; one or two bytes a
                           value instead of four: two to four times the cuts).
                           Budget: two plans' cuts, at most half the available memory
                           less the sessions' (1 GiB where unknown), said in the
                           engine's notes before its first plan runs
session cache              one ORT session per segment key, written by the one writer
                           (:func:`~quantscope.emulate.qdq.build_qdq` on the segment);
                           the line's sessions evicted last, within ``session_bytes`` of
                           weights (default: one plan's sessions and the largest once
                           more: the line's and a candidate's changed one). Before, the
                           budget was the model's weights once, less than one plan's
                           sessions as counted (1 MiB for each without weights): a plan
                           run from segment 0 evicted the sessions it needed next (on
                           minilm-l6, 256 pairs: 306 sessions built for 17 plans)
exact                      the chain of segments computes what the full QDQ model
                           computes (``tests/test_incremental.py``: within 1e-6)
fallback                   a model with no cut, or a plan measured on another model
                           (repairs rewrite it): a full pass, said in a note
=========================  ==========================================================

:class:`IncrementalRunner` is one (model, statistics, scheme, method, batches, groups);
:class:`IncrementalEngine` makes it lazily for the plans of one search and says which
engine measured each (:attr:`IncrementalCounts.engine`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from quantscope.analyze.activation_cache import (
    ActivationCache,
    CacheMemory,
    CutCounts,
    Entry,
    Lineage,
    Seen,
    SessionCache,
    Tally,
    cache_memory,
)
from quantscope.analyze.cut_codes import Coded, coded, decode, expose_codes
from quantscope.analyze.segments import (
    Segment,
    encodings_within,
    find_segments,
    run_segment,
    segment_bytes,
    segment_model,
    segment_tensors,
)
from quantscope.emulate.coverage import Coverage
from quantscope.emulate.qdq import build_qdq, plan_encodings
from quantscope.emulate.session import make_session
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.types import (
    Batch,
    Encoding,
    Encodings,
    Groups,
    Outputs,
    Plan,
    QuantScheme,
    Stats,
    sample_first,
)

SESSION_MIN_BYTES = 1 << 20  # what a session without weights counts (its graph, buffers)
NO_CUT_NOTE = ("incremental evaluation: the model has no cut (no point where one activation "
               "crosses, nor few enough for a segment of many groups, analyze/cuts.py): "
               "every plan was measured by a full pass")


@dataclass(frozen=True)
class IncrementalConfig:
    """Budgets of one runner (bytes): ``cache_bytes`` for the activations crossing the
    cuts (None: sized by :func:`~quantscope.analyze.activation_cache.cache_memory`),
    ``session_bytes`` for the weights of the segment sessions kept between plans (None:
    one plan's sessions and the largest once more), ``cache_cap`` an upper bound on the
    sized cache budget (a caller whose plans share few prefixes: the length candidates),
    ``cut_codes`` whether a quantized tensor crossing a cut is cached as its codes where
    exact (:mod:`~quantscope.analyze.cut_codes`; off: float32, as before, for the bench)."""

    cache_bytes: int | None = None
    session_bytes: int | None = None
    cache_cap: int | None = None  # at most this for the sized budget (None: no cap)
    cut_codes: bool = True  # quantized tensors cached as their codes where exact (cut_codes)


@dataclass(frozen=True)
class IncrementalCounts:
    """What a runner (or an engine) did: plans, segments run and skipped, cache hits."""

    plans: int = 0
    segments_run: int = 0
    segments_skipped: int = 0
    cache_hits: int = 0  # plans that started from a cached cut
    sessions_built: int = 0
    sessions_reused: int = 0
    full_passes: int = 0  # plans measured by a full pass (no cut, another model)

    @property
    def segments(self) -> int:
        return self.segments_run + self.segments_skipped

    @property
    def engine(self) -> str:
        """Which engine measured, for the records: ``ort (incremental, N of M segments
        run)``, with the full passes counted beside."""
        if not self.plans:
            return "ort (full pass)" if self.full_passes else "ort"
        full = f"; {self.full_passes} plan(s) by a full pass" if self.full_passes else ""
        return f"ort (incremental, {self.segments_run} of {self.segments} segments run{full})"

    def plus(self, other: IncrementalCounts) -> IncrementalCounts:
        return IncrementalCounts(*(a + b for a, b in zip(
            _fields(self), _fields(other), strict=True)))

    def minus(self, other: IncrementalCounts) -> IncrementalCounts:
        return IncrementalCounts(*(a - b for a, b in zip(
            _fields(self), _fields(other), strict=True)))

    def to_dict(self) -> dict[str, int | str]:
        return {"engine": self.engine, "plans": self.plans, "segments_run": self.segments_run,
                "segments_skipped": self.segments_skipped, "cache_hits": self.cache_hits,
                "sessions_built": self.sessions_built, "sessions_reused": self.sessions_reused,
                "full_passes": self.full_passes}


def _fields(c: IncrementalCounts) -> tuple[int, ...]:
    return (c.plans, c.segments_run, c.segments_skipped, c.cache_hits, c.sessions_built,
            c.sessions_reused, c.full_passes)


def _digest_encodings(segment: int, enc: Encodings) -> str:
    """The key of one segment's session: its index and its encodings' content."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"segment {segment}|".encode())
    for kind, table in (("a", enc.activations), ("w", enc.weights)):
        for name in sorted(table):
            _digest_one(h, kind, name, table[name])
    return h.hexdigest()


def _digest_one(h: hashlib.blake2b, kind: str, name: str, e: Encoding) -> None:
    scale, zp = np.asarray(e.scale), np.asarray(e.zero_point)
    h.update(f"{kind}|{name}|{e.bits}|{e.signed}|{e.axis}|{scale.dtype}{scale.shape}|"
             f"{zp.dtype}{zp.shape}|".encode())
    h.update(np.ascontiguousarray(scale).tobytes())
    h.update(np.ascontiguousarray(zp).tobytes())


class IncrementalRunner:
    """The emulated outputs of plans of one model on fixed batches, each plan run from
    its first changed segment (module docstring). Stateful: the caches and the counts."""

    def __init__(self, model: Model, stats: Stats, batches: Sequence[Batch], *,
                 scheme: QuantScheme, method: str | None = None, groups: Groups | None = None,
                 config: IncrementalConfig = IncrementalConfig(),
                 sessions: SessionCache | None = None) -> None:
        """``sessions``: another runner's session cache to share (the same model,
        statistics and scheme: a segment key names the same session), e.g. a race's
        runners on the pairs of each look and the planner's own runner."""
        self.model, self.stats, self.batches = model, stats, tuple(batches)
        self.scheme, self.method, self.config = scheme, method, config
        self.groups = groups or find_groups(model)
        self.segments: tuple[Segment, ...] = find_segments(model, self.groups)
        by_name = {n.name: n for n in model.graph.node}
        self._tensors = tuple(segment_tensors(model, (by_name[n] for n in s.nodes))
                              for s in self.segments)
        self._crossing = crossing(model, self.segments)
        self._weights = segment_bytes(model, self.segments)
        self._session_size = [max(w, SESSION_MIN_BYTES) for w in self._weights]
        budget = config.session_bytes  # default: the line's sessions and a candidate's
        if budget is None:
            budget = session_budget(self._weights)
        self.memory: CacheMemory = cache_memory(model, self.batches, self._crossing, budget,
                                                cache_bytes=config.cache_bytes,
                                                cache_cap=config.cache_cap)
        self._lineage = Lineage()
        self._tally = Tally(len(self.segments) - 1)
        self._sessions = sessions if sessions is not None else SessionCache(
            budget, lambda key: key in self._lineage.line_keys)
        self._cache = ActivationCache(self.memory.cache_bytes, len(self.segments) - 1,
                                      len(self.batches), self._lineage, self._tally)
        self._counts = IncrementalCounts()
        self._exact: dict[tuple[str, str], bool] = {}  # (segment key, tensor): codes exact

    @property
    def usable(self) -> bool:
        """Whether the model has a cut (else every plan is one segment: a full pass)."""
        return len(self.segments) > 1

    @property
    def counts(self) -> IncrementalCounts:
        return self._counts

    @property
    def cuts(self) -> CutCounts:
        """Per cut, what the activation cache did (and the sessions built again)."""
        return self._tally.counts()

    @property
    def largest_session(self) -> int:
        """The bytes the largest segment session counts in the session budget."""
        return max(self._session_size)

    @property
    def sessions(self) -> SessionCache:
        """The segment sessions (by segment key), to share with another runner."""
        return self._sessions

    @property
    def cached_bytes(self) -> int:
        """The bytes the activation cache holds now."""
        return self._cache.held

    def encodings(self, plan: Plan) -> tuple[Encodings, Coverage]:
        return plan_encodings(self.model, self.stats, plan, scheme=self.scheme,
                              groups=self.groups, method=self.method)

    def outputs(self, plan: Plan, encodings: Encodings | None = None) -> Outputs:
        """The plan's emulated outputs on the batches (sample-first, as ``run_model``)."""
        out = list(self.iterate(plan, encodings))
        return Outputs(names=self.model.output_names(), batches=tuple(o for o, _ in out))

    def iterate(self, plan: Plan, encodings: Encodings | None = None
                ) -> Iterator[tuple[tuple[np.ndarray, ...], Batch]]:
        """Per batch, in order: the plan's outputs (sample-first) and the batch."""
        enc = encodings if encodings is not None else self.encodings(plan)[0]
        seg_encs = [encodings_within(enc, t) for t in self._tensors]
        keys = [_digest_encodings(k, e) for k, e in enumerate(seg_encs)]
        prefixes = _prefixes(keys)
        self._cache.plan += 1
        self._lineage.place(Seen(tuple(prefixes), tuple(keys)))
        start, cached = self._start(prefixes)
        sessions = [self._session(k, keys[k], seg_encs[k]) for k in range(start, len(keys))]
        self._count(start, len(keys), hit=start > 0)
        # the cuts after the start (the one after the last segment: the outputs)
        entries = {k: self._cache.open(prefixes[k], k) for k in range(start, len(keys) - 1)}
        parts = cached.parts if cached is not None else None  # held here even if evicted
        outs = self.model.output_names()
        for b, batch in enumerate(self.batches):
            env: dict[str, np.ndarray] = dict(batch)
            # this batch's tensors as their codes (cut_codes): stored so at every cut
            held: dict[str, np.ndarray | Coded] = {}
            if parts is not None:
                held = dict(parts[b])
                env.update({t: decode(v) for t, v in held.items()})
            for k, (sess, codes_of) in enumerate(sessions, start=start):
                extra = codes_of if k in entries else {}
                got = run_segment(sess, (*self.segments[k].outputs, *extra.values()), env)
                env.update(got)
                live = {t: env[t] for t in self._crossing[k]}
                for t, q in extra.items():
                    held[t] = self._coded(keys[k], t, got[q], got[t], enc)
                if k in entries:  # the cache holds a quantized tensor as its codes
                    self._cache.grow(entries[k], {t: held.get(t, v) for t, v in live.items()})
                # only what a later segment reads (or the graph returns) is held on: a
                # deep model's segment outputs of one batch would otherwise pile up
                env = {**batch, **live}
            yield tuple(sample_first([env[o] for o in outs], batch)), batch
        for e in entries.values():
            self._cache.close(e)

    def _start(self, prefixes: Sequence[str]) -> tuple[int, Entry | None]:
        for k in range(len(prefixes) - 2, -1, -1):  # the deepest cached cut first
            got = self._cache.get(prefixes[k])
            if got is not None:
                return k + 1, got
        return 0, None

    def _coded(self, key: str, t: str, codes: np.ndarray, value: np.ndarray,
                enc: Encodings) -> np.ndarray | Coded:
        """``t`` as its codes where they give ``value`` back (checked on the first batch
        of each tensor of each segment session), else ``value``."""
        c = coded(codes, enc.activations.get(t), value.ndim)
        if c is None:
            return value
        ok = self._exact.get((key, t))
        if ok is None:
            ok = self._exact[(key, t)] = bool(np.array_equal(c.decode(), value))
        return c if ok else value

    def _session(self, k: int, key: str, enc: Encodings
                 ) -> tuple[ort.InferenceSession, dict[str, str]]:
        """Segment ``k``'s session for ``enc`` and the names of the codes it also returns
        (per crossing tensor it dequantizes, :func:`expose_codes`)."""
        got = self._sessions.get(key)
        if got is not None:
            self._counts = self._counts.plus(IncrementalCounts(sessions_reused=1))
            return got  # type: ignore[return-value]
        self._tally.rebuilt += key in self._tally.built
        self._tally.built.add(key)
        proto = build_qdq(segment_model(self.model, self.segments[k]), enc)
        codes_of = expose_codes(proto, self._crossing[k]) if self.config.cut_codes else {}
        sess = make_session(proto, shared_arena=True)
        self._counts = self._counts.plus(IncrementalCounts(sessions_built=1))
        self._sessions.put(key, (sess, codes_of), self._session_size[k])
        return sess, codes_of

    def _count(self, start: int, n: int, *, hit: bool) -> None:
        self._counts = self._counts.plus(IncrementalCounts(
            plans=1, segments_run=n - start, segments_skipped=start, cache_hits=int(hit)))


def plan_digest(enc: Encodings) -> str:
    """A content key of a plan's whole encodings (the same key: the same emulated model)."""
    return _digest_encodings(-1, enc)


def _prefixes(keys: Sequence[str]) -> list[str]:
    out, h = [], hashlib.blake2b(digest_size=16)
    for key in keys:
        h.update(key.encode())
        out.append(h.copy().hexdigest())
    return out


def session_budget(weights: Sequence[int]) -> int:
    """The segment sessions' default budget: one plan's sessions and the largest once more
    (the line's and a candidate's changed one), each at least :data:`SESSION_MIN_BYTES`;
    ``weights``: per segment, the bytes of its weights."""
    sizes = [max(w, SESSION_MIN_BYTES) for w in weights]
    return sum(sizes) + max(sizes, default=0)


def crossing(model: Model, segments: Sequence[Segment]) -> tuple[tuple[str, ...], ...]:
    """Per cut ``k`` (after segment ``k``): the tensors made up to it that a later segment
    reads or the graph returns (graph inputs come from the batch)."""
    graph_outs, out = set(model.output_names()), []
    made: list[str] = []
    for k, seg in enumerate(segments):
        made += seg.outputs
        later = {t for s in segments[k + 1:] for t in s.inputs}
        out.append(tuple(dict.fromkeys(t for t in made if t in later or t in graph_outs)))
    return tuple(out)


_MADE: ContextVar[list[IncrementalEngine] | None] = ContextVar("incremental_engines",
                                                               default=None)


@contextmanager
def engines_made() -> Iterator[list[IncrementalEngine]]:
    """The engines made inside the block, for a caller that passes on the making of them
    (the planner's evaluator) and records what they did."""
    made: list[IncrementalEngine] = []
    token = _MADE.set(made)
    try:
        yield made
    finally:
        _MADE.reset(token)


def engines_counts(engines: Sequence[IncrementalEngine]) -> IncrementalCounts:
    total = IncrementalCounts()
    for e in engines:
        total = total.plus(e.counts)
    return total


class IncrementalEngine:
    """The evaluator of several plans of one model and data: makes the
    :class:`IncrementalRunner` of (statistics, scheme) on first use and reuses it; a plan
    on another model (its repairs rewrote it) or a model without a cut gets ``None`` (a
    full pass) and one note."""

    def __init__(self, model: Model, batches: Sequence[Batch], *, method: str | None = None,
                 config: IncrementalConfig = IncrementalConfig()) -> None:
        self.model, self.batches, self.method, self.config = model, tuple(batches), method, config
        self._runner: IncrementalRunner | None = None
        self._past = IncrementalCounts()  # of runners replaced (other statistics or scheme)
        self._full = 0
        self.notes: list[str] = []
        made = _MADE.get()
        if made is not None:
            made.append(self)

    def __getstate__(self) -> dict[str, object]:
        """Sent to another process (``plan --ray`` ships the evaluator): without the
        runner (its sessions cannot travel), which the copy makes again on first use."""
        return {**self.__dict__, "_runner": None, "_past": self.counts, "_full": 0}

    def runner(self, model: Model, stats: Stats, scheme: QuantScheme
               ) -> tuple[IncrementalRunner | None, str | None]:
        """The runner for a plan of ``model`` with ``stats`` in ``scheme``, or (None, the
        note why the plan is measured by a full pass)."""
        if model is not self.model:
            return self._fallback("incremental evaluation: a plan whose repairs change the "
                                  "model was measured by a full pass")
        r = self._runner
        if r is None or r.stats is not stats or r.scheme != scheme:
            if r is not None:
                self._past = self._past.plus(r.counts)
            r = self._runner = IncrementalRunner(model, stats, self.batches, scheme=scheme,
                                                 method=self.method, config=self.config)
        if not r.usable:
            return self._fallback(NO_CUT_NOTE)
        if r.memory.text() not in self.notes:  # said once, before its first plan runs
            self.notes.append(r.memory.text())
        return r, None

    def current(self, model: Model, stats: Stats, scheme: QuantScheme, *,
                make: bool = False) -> IncrementalRunner | None:
        """The runner made already for these (model, statistics, scheme), if any (none
        replaced: a race shares its sessions without changing the engine); ``make``: when
        the engine has made no runner yet, make that one now, so that a race run before
        the first measurement shares its sessions with the measurements after it (before,
        the batch race built its own and the survivors' measurement built them again:
        +340 MB on minilm-l3's plan stage)."""
        if make and self._runner is None and model is self.model:
            self.runner(model, stats, scheme)
        r = self._runner
        if r is None or model is not self.model or r.stats is not stats or r.scheme != scheme:
            return None
        return r if r.usable else None

    def _fallback(self, note: str) -> tuple[None, str]:
        self._full += 1
        if note not in self.notes:
            self.notes.append(note)
        return None, note

    @property
    def cuts(self) -> CutCounts | None:
        """The current runner's :class:`CutCounts` (None before any)."""
        return None if self._runner is None else self._runner.cuts

    @property
    def counts(self) -> IncrementalCounts:
        base = self._runner.counts if self._runner is not None else IncrementalCounts()
        return self._past.plus(base).plus(IncrementalCounts(full_passes=self._full))
