"""Progress on stderr: one helper for every long loop (batches, candidates, plans, repairs).

On a terminal, a ``tqdm`` bar with rate and ETA; when stderr is not a terminal (CI logs,
a file), quiet line-based progress: a start line, a line at most every ``LOG_EVERY_S``
seconds, and an end line with the elapsed time. ``show=False`` prints nothing, so library
calls stay silent unless the CLI asks.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")
LOG_EVERY_S = 10.0


def say(text: str, *, show: bool = True) -> None:
    """One status line on stderr (above a running bar on a terminal)."""
    if not show:
        return
    if sys.stderr.isatty():
        from tqdm import tqdm

        tqdm.write(text, file=sys.stderr)
    else:
        print(text, file=sys.stderr, flush=True)


MEMORY_FIX = ("give smaller samples (a smaller --input-shape or --seq-len) or fewer "
              "(--pairs, a smaller data file), or use a machine with more memory")
"""What lowers a run's memory: the CLI's out-of-memory line and a rerun's line after a
SIGKILL (``pipeline.manifest.unfinished_line``) end with it."""

_KEEPERS: list[Callable[[str, int | None], None]] = []  # who keeps the estimates said now


def note_memory_estimate(text: str, peak: int | None = None) -> None:
    """A stage's memory estimate, said by the stage, handed to whoever keeps it: ``run``
    writes it to ``run.json`` before the work it estimates, so a rerun after a SIGKILL (the
    kernel's out-of-memory killer) can quote it; ``peak``: the estimated peak in bytes
    (kept beside the stage's measured peak once it finishes)."""
    for keep in list(_KEEPERS):
        keep(text, peak)


@contextmanager
def keeping_estimates(keep: Callable[[str, int | None], None]) -> Iterator[None]:
    """``keep`` is handed every :func:`note_memory_estimate` while the body runs."""
    _KEEPERS.append(keep)
    try:
        yield
    finally:
        _KEEPERS.remove(keep)


def track(items: Iterable[T], label: str, *, total: int | None = None, unit: str = "it",
          show: bool = True, cost: Callable[[T], float] | None = None) -> Iterator[T]:
    """Yield ``items`` while showing progress of ``label`` (a bar with ETA on a terminal).

    ``cost``: the relative work of one item (e.g. the values in a batch: text batches
    come sorted by length, so the last batches take far longer than the first); the ETA
    and the bar then follow the work done, not the count of items. Used only when
    ``items`` is sized (its costs are summed up front); a stream is counted by items.
    """
    if not show:
        yield from items
        return
    costs = None
    if cost is not None and hasattr(items, "__len__"):  # a stream stays a stream
        costs = [max(float(cost(item)), 0.0) for item in items]
        if sum(costs) <= 0:
            costs = None
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    if sys.stderr.isatty():
        from tqdm import tqdm

        if costs is None:
            yield from tqdm(items, desc=label, total=total, unit=unit, file=sys.stderr,
                            dynamic_ncols=True, leave=False)
            return
        yield from _weighted_bar(items, costs, label, unit)
        return
    yield from _lines(items, label, total, unit, costs)


def _weighted_bar(items: Iterable[T], costs: list[float], label: str, unit: str
                  ) -> Iterator[T]:
    from tqdm import tqdm

    scale = 100.0 / sum(costs)
    with tqdm(desc=label, total=100.0, unit="%", file=sys.stderr, dynamic_ncols=True,
              leave=False, bar_format="{l_bar}{bar}|{postfix} [{elapsed}<{remaining}]") as bar:
        for k, (item, c) in enumerate(zip(items, costs, strict=True), start=1):
            yield item
            bar.set_postfix_str(f"{k}/{len(costs)} {unit}", refresh=False)
            bar.update(c * scale)


def feed_size(feeds: dict[str, Any]) -> float:
    """The work of one batch of feeds, for ``track(cost=...)``: its largest input's size."""
    return float(max((getattr(v, "size", 1) for v in feeds.values()), default=1))


def _lines(items: Iterable[T], label: str, total: int | None, unit: str,
           costs: list[float] | None = None) -> Iterator[T]:
    start = last = time.perf_counter()
    of = f"/{total}" if total else ""
    print(f"{label}: 0{of} {unit}", file=sys.stderr, flush=True)
    k, done = 0, 0.0
    for k, item in enumerate(items, start=1):
        yield item
        now = time.perf_counter()
        if costs is not None:
            done += costs[k - 1]
        if now - last >= LOG_EVERY_S and (total is None or k < total):
            if costs is not None and done > 0:
                eta = f", ETA {(now - start) / done * (sum(costs) - done):.0f} s"
            else:
                eta = f", ETA {(now - start) / k * (total - k):.0f} s" if total else ""
            print(f"{label}: {k}{of} {unit}{eta}", file=sys.stderr, flush=True)
            last = now
    print(f"{label}: {k}{of} {unit} done in {time.perf_counter() - start:.1f} s",
          file=sys.stderr, flush=True)


def eta(elapsed: float, done: float, total: float) -> float | None:
    """Seconds left when ``done`` of ``total`` units of work took ``elapsed`` seconds (the
    units: items, or their costs for length-sorted batches); None before any work."""
    if done <= 0 or total <= 0:
        return None
    return elapsed / done * max(total - done, 0.0)


class Counter:
    """Progress of work counted by the caller (``step()`` after each unit), for loops
    that are not one iterable (e.g. candidates inside batches, plans measured on demand).

    ``total_cost``: the work of every step together (e.g. each batch's :func:`feed_size`
    times the candidates that run it); ``step(cost=...)`` then adds that step's share,
    and the ETA and the bar follow the work done, not the count of steps (text batches
    come sorted by length: the last take far longer than the first). ``clock``: where
    the time comes from (a test gives its own)."""

    def __init__(self, label: str, *, total: int | None = None, unit: str = "it",
                 show: bool = True, total_cost: float | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.label, self.total, self.unit, self.show = label, total, unit, show
        self.total_cost = total_cost if total_cost and total_cost > 0 else None
        self.clock = clock
        self.k, self.done, self.start = 0, 0.0, clock()
        self.last, self._bar = self.start, None
        if show and sys.stderr.isatty():
            from tqdm import tqdm

            if self.total_cost is None:
                self._bar = tqdm(desc=label, total=total, unit=unit, file=sys.stderr,
                                 dynamic_ncols=True, leave=False)
            else:
                self._bar = tqdm(desc=label, total=100.0, unit="%", file=sys.stderr,
                                 dynamic_ncols=True, leave=False,
                                 bar_format="{l_bar}{bar}|{postfix} [{elapsed}<{remaining}]")
        elif show:
            of = f"/{total}" if total else ""
            print(f"{label}: 0{of} {unit}", file=sys.stderr, flush=True)

    def eta(self) -> float | None:
        """Seconds left: by the cost done when a ``total_cost`` was given, else by steps."""
        elapsed = self.clock() - self.start
        if self.total_cost is not None:
            return eta(elapsed, self.done, self.total_cost)
        return eta(elapsed, self.k, self.total) if self.total else None

    def step(self, n: int = 1, *, cost: float = 0.0) -> None:
        self.k += n
        self.done += cost
        if self._bar is not None:
            if self.total_cost is None:
                self._bar.update(n)
            else:
                self._bar.set_postfix_str(f"{self.k}/{self.total} {self.unit}", refresh=False)
                self._bar.update(100.0 * cost / self.total_cost)
            return
        now = self.clock()
        if self.show and now - self.last >= LOG_EVERY_S:
            of = f"/{self.total}" if self.total else ""
            left = self.eta() if self.total and self.k < self.total else None
            eta_text = f", ETA {left:.0f} s" if left is not None else ""
            print(f"{self.label}: {self.k}{of} {self.unit}{eta_text}", file=sys.stderr,
                  flush=True)
            self.last = now

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.show:
            print(f"{self.label}: {self.k} {self.unit} done in "
                  f"{self.clock() - self.start:.1f} s", file=sys.stderr, flush=True)
