"""The incremental evaluator's caches: what a search will reuse, kept within a budget.

A search measures plans that mostly build on one plan, its *incumbent* (a greedy or refine
step measures the incumbent with one group changed, and keeps the change or not). Which
plan that is, the caches infer from the plans' keys alone (:class:`Lineage`):

================  =====================================================================
parent            of a new plan: the remembered plan (the last :data:`REMEMBER`) that
                  shares the longest prefix with it
line              the incumbent's keys: the first plan's, then a parent's that shares
                  more with the new plan than the line does (that parent was kept); on
                  a tie the line stays
own               the newest plan's prefixes past the line (kept only in case it
                  becomes the line)
================  =====================================================================

:class:`ActivationCache` evicts, when over its budget, first an entry of an abandoned run,
then entries neither on the line nor the newest plan's own (oldest first), then the
newest plan's own, then the line's; among the own or the line's, the entry whose cut
saves least per byte: (its cut - the previous kept cut) x (the next kept cut - its cut),
the segments it saves a plan times the changed segments it serves, so a budget smaller
than a plan's cuts keeps them spread over the depth. Before, one LRU evicted the
incumbent's entries for those of every rejected candidate (a sequential scan of the
cuts). A tensor held by several entries (one array crossing several cuts, as the mask or
mpnet-base's relative position bias crosses every cut: 12 MB a batch there, against 1 MB
for an 8-bit activation) counts once against the budget, as it is held once; before, each
entry counted it again, and on mpnet-base it filled 252 of the cache's 321 MB (8 pairs).
:class:`SessionCache` evicts sessions off the line first (least recently used),
so a candidate's own sessions never push out the incumbent's. :func:`cache_memory`
sizes both budgets, said before any plan runs.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from quantscope.analyze.cut_codes import Coded
from quantscope.analyze.memory import (
    GB,
    MB,
    available_bytes,
    batch_tensor_bytes,
    weight_bytes,
)
from quantscope.model.load import Model
from quantscope.types import Batch

CACHE_BYTES = 1 << 30  # the activation cache's budget where the available memory is unknown
CACHE_SHARE = 0.5  # the share of the available memory (less the sessions') it may take
# at most this many plans' cuts: the line's and the newest plan's own, which the plans
# after it read when it is kept (minilm-l6, 64 pairs, 7 of 16 promotions kept: with one
# plan's cuts the walk ran 283 segments, 263 with the old 1 GiB LRU, which held 3 plans')
CACHE_PLANS = 2
# the cache's cap: this share of the model's weights plus the largest batch's tensors at
# every cut (one plan's cuts on one batch). mpnet-base, 300 pairs at 256 tokens
# (bench/memory.py --search, FP32 inference 3.18 GB): 1.0 -> a 5.89 GB cache, the search
# at 8.25 GB (2.59x FP32 inference); 0.25 -> 1.47 GB, 5.91 GB (1.86x), 254 segments run
# instead of 242 for the same 7 plans (1.70 against 1.64 plans/min). Before, the cache
# took half of the available memory: 10 GB of 20 in mpnet's run
CACHE_FP32 = 0.25
CACHE_MIN = 64 << 20  # ... but never under this (a small model's cache costs nothing)
REMEMBER = 32  # plans whose keys are kept to find a new plan's parent


@dataclass(frozen=True)
class CutCounts:
    """Per cut ``k`` (after segment ``k``), what the activation cache did: entries
    ``stored`` (complete), ``dropped`` while being filled, ``evicted`` once complete,
    plans started from it (``hits``), a complete entry's bytes; and the segment sessions
    built again after their eviction (``sessions_rebuilt``)."""

    stored: tuple[int, ...]
    dropped: tuple[int, ...]
    evicted: tuple[int, ...]
    hits: tuple[int, ...]
    sessions_rebuilt: int = 0
    entry_bytes: tuple[int, ...] = ()  # per cut, a complete entry's bytes (0: none yet)

    def to_dict(self) -> dict[str, object]:
        return {"stored": list(self.stored), "dropped": list(self.dropped),
                "evicted": list(self.evicted), "hits": list(self.hits),
                "sessions_rebuilt": self.sessions_rebuilt,
                "entry_mb": [round(b / MB) for b in self.entry_bytes]}


class Tally:
    """The mutable counters behind :class:`CutCounts`."""

    def __init__(self, cuts: int) -> None:
        self.stored, self.dropped = [0] * cuts, [0] * cuts
        self.evicted, self.hits = [0] * cuts, [0] * cuts
        self.nbytes = [0] * cuts
        self.built: set[str] = set()
        self.rebuilt = 0

    def counts(self) -> CutCounts:
        return CutCounts(tuple(self.stored), tuple(self.dropped), tuple(self.evicted),
                         tuple(self.hits), self.rebuilt, tuple(self.nbytes))


@dataclass(frozen=True)
class CacheMemory:
    """The budgets of one runner and what they are made of (bytes), estimated before any
    plan runs."""

    cache_bytes: int  # the activation cache's budget
    plan_bytes: int  # the tensors crossing every cut of one plan, on every batch
    session_bytes: int  # the segment sessions' budget (their weights)
    available: int | None

    def text(self) -> str:
        free = f"; {self.available / GB:.1f} GB available" if self.available else ""
        return (f"incremental evaluation: activation cache up to {self.cache_bytes / GB:.2f} "
                f"GB (one plan's cuts at most ~{self.plan_bytes / GB:.2f} GB{free}), segment "
                f"sessions up to {self.session_bytes / MB:.0f} MB of weights")


def cache_memory(model: Model, batches: Sequence[Batch], crossing: Sequence[Sequence[str]],
                 session_bytes: int, *, cache_bytes: int | None = None,
                 cache_cap: int | None = None,
                 available: int | None = None) -> CacheMemory:
    """The activation cache's budget (``cache_bytes`` when given): :data:`CACHE_PLANS`
    plans' cuts, at most :data:`CACHE_FP32` of the weights and the largest batch's cut
    tensors (what ties it to one FP32 inference; never under :data:`CACHE_MIN`; the search's
    FP32 reference outputs beside it are not taken from it: FP32 inference holds them too,
    and on IS-Net a cache less them held no entry from 4 photos on, every plan run from
    its first segment at twice the wall time, h74) and
    :data:`CACHE_SHARE` of the available memory less the sessions' (:data:`CACHE_BYTES`
    where that is unknown), and ``cache_cap`` when given. One plan's cuts: the tensors
    crossing them at the largest batch (:func:`~quantscope.analyze.memory.batch_tensor_bytes`,
    one inference per number of cuts crossed: a tensor crossing two cuts is in both
    entries, counted as the cache counts it), scaled by the tokens of every batch."""
    times: dict[str, int] = {}  # the cuts each tensor crosses (each entry counts it)
    for c in crossing[:-1]:  # the last: the outputs, never stored
        for t in c:
            times[t] = times.get(t, 0) + 1
    tokens = [_tokens(b) for b in batches]
    largest = max(tokens, default=0)
    one = 0 if not largest else sum(  # the largest batch's
        n * batch_tensor_bytes(model, batches, [t for t in times if times[t] == n])
        for n in set(times.values()))
    plan = 0 if not largest else int(one * sum(tokens) / largest)
    avail = available if available is not None else available_bytes()
    if cache_bytes is None:
        room = CACHE_BYTES if avail is None else int(CACHE_SHARE * max(avail - session_bytes,
                                                                        0))
        fp32 = max(int(CACHE_FP32 * (weight_bytes(model) + one)), CACHE_MIN)
        cache_bytes = min(room, CACHE_PLANS * plan, fp32,
                          *(() if cache_cap is None else (cache_cap,)))
    return CacheMemory(cache_bytes, plan, session_bytes, avail)


def _tokens(b: Batch) -> int:
    """Rows x length of a batch's token inputs (what its activations grow with)."""
    arrays = [v for v in b.values() if getattr(v, "ndim", 0) >= 1]
    rows = max((int(v.shape[0]) for v in arrays), default=1)
    return rows * max((int(v.shape[1]) for v in arrays if v.ndim >= 2), default=1)


@dataclass(frozen=True)
class Seen:
    """One plan as the caches know it: its prefix keys and segment keys."""

    prefixes: tuple[str, ...]
    keys: tuple[str, ...]


class Lineage:
    """Which plan the search builds on (module docstring), mutable."""

    def __init__(self) -> None:
        self.recent: deque[Seen] = deque(maxlen=REMEMBER)
        self.line: frozenset[str] = frozenset()  # the line's prefix keys
        self.line_keys: frozenset[str] = frozenset()  # its segment keys
        self.own: frozenset[str] = frozenset()
        self._line: Seen | None = None

    def place(self, plan: Seen) -> int:
        """Take the newest plan; return how many of its prefixes are on the line."""
        line = self._line or plan
        depth = _shared(plan.prefixes, line.prefixes)
        for old in reversed(self.recent):  # the most recent wins a tie among them
            d = _shared(plan.prefixes, old.prefixes)
            if d > depth:
                line, depth = old, d
        if line is not self._line:
            self._line = line
            self.line, self.line_keys = frozenset(line.prefixes), frozenset(line.keys)
        self.own = frozenset(plan.prefixes[depth:])
        self.recent.append(plan)
        return depth


def _shared(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(eq=False)
class Entry:
    """The tensors crossing one cut for one prefix, per batch (filled batch by batch)."""

    key: str
    cut: int
    stamp: int  # the plan that opened it or last started from it
    parts: list[dict[str, np.ndarray | Coded]] = field(default_factory=list)  # cut_codes
    nbytes: int = 0
    complete: bool = False
    dropped: bool = False


class ActivationCache:
    """Entries by prefix key within a budget, evicted as the module docstring says."""

    def __init__(self, budget: int, cuts: int, batches: int, lineage: Lineage,
                 tally: Tally) -> None:
        self.budget, self.cuts, self.batches = budget, cuts, batches
        self.lineage, self.tally = lineage, tally
        self.entries: dict[str, Entry] = {}
        self.held = 0  # bytes, each array once however many entries hold it
        self._arrays: dict[int, list] = {}  # id -> [the array, entries holding it]
        self.plan = 0  # the plan now running (its stamp)

    def get(self, key: str) -> Entry | None:
        """The complete entry of ``key`` (marked used by the plan now running), or None."""
        e = self.entries.get(key)
        if e is None or not e.complete:
            return None
        e.stamp = self.plan
        self.tally.hits[e.cut] += 1
        return e

    def open(self, key: str, cut: int) -> Entry:
        old = self.entries.get(key)
        if old is not None:  # an abandoned run's
            self._drop(old)
        e = self.entries[key] = Entry(key, cut, self.plan)
        return e

    def grow(self, e: Entry, tensors: dict[str, np.ndarray | Coded]) -> None:
        if e.dropped:
            return
        e.parts.append(tensors)
        e.nbytes += sum(int(v.nbytes) for v in tensors.values())
        for v in tensors.values():
            got = self._arrays.get(id(v))
            if got is not None and got[0] is v:
                got[1] += 1
            else:
                self._arrays[id(v)] = [v, 1]
                self.held += int(v.nbytes)
        while self.held > self.budget and self.entries:
            self._drop(self._victim())

    def close(self, e: Entry) -> None:
        """The run that opened ``e`` is done: complete unless it was dropped."""
        if not e.dropped:
            e.complete = True
            self.tally.stored[e.cut] += 1
            self.tally.nbytes[e.cut] = e.nbytes

    def _drop(self, e: Entry) -> None:
        del self.entries[e.key]
        for part in e.parts:
            for v in part.values():
                got = self._arrays[id(v)]
                got[1] -= 1
                if got[1] == 0:
                    del self._arrays[id(v)]
                    self.held -= int(v.nbytes)
        (self.tally.evicted if e.complete else self.tally.dropped)[e.cut] += 1
        e.dropped, e.parts = True, []  # a run reading it keeps its own reference

    def _rank(self, e: Entry) -> int:
        if not e.complete and e.stamp < self.plan:
            return -1  # an abandoned run's
        return 2 if e.key in self.lineage.line else 1 if e.key in self.lineage.own else 0

    def _victim(self) -> Entry:
        ranks = {e.key: self._rank(e) for e in self.entries.values()}
        low = min(ranks.values())
        group = sorted((e for e in self.entries.values() if ranks[e.key] == low),
                       key=lambda e: (e.cut, e.stamp))
        if low <= 0:
            return min(group, key=lambda e: e.stamp)
        cuts = [-1, *(e.cut for e in group), self.cuts]
        return min(group, key=lambda e: self._worth(e, cuts[group.index(e)],
                                                    cuts[group.index(e) + 2]))

    def _worth(self, e: Entry, before: int, after: int) -> float:
        size = self.tally.nbytes[e.cut] or e.nbytes * self.batches / max(len(e.parts), 1)
        return (e.cut - before) * (after - e.cut) / max(size, 1.0)


class SessionCache:
    """Sessions by segment key within a budget of weights: over it, the least recently
    used off the line goes first, then the line's (mutable)."""

    def __init__(self, budget: int, pinned: Callable[[str], bool]) -> None:
        self.budget, self.held, self.pinned = budget, 0, pinned
        self.items: OrderedDict[str, tuple[object, int]] = OrderedDict()

    def get(self, key: str) -> object | None:
        got = self.items.get(key)
        if got is None:
            return None
        self.items.move_to_end(key)
        return got[0]

    def put(self, key: str, value: object, size: int) -> None:
        old = self.items.pop(key, None)
        self.held += size - (0 if old is None else old[1])
        self.items[key] = (value, size)
        while self.held > self.budget and self.items:
            victim = next((k for k in self.items if not self.pinned(k)), None)
            _, size = self.items.pop(victim if victim is not None else next(iter(self.items)))
            self.held -= size
