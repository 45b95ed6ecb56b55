"""The last values a process computed, kept by key: one bounded store for every memo.

A calibration, a converted graph, a tokenizer, FP32's greedy continuations, a drawn
figure: each is found again by its content key and the least recently used is dropped
first, by count (``most``), by weight (``budget`` over ``weigh``) with ``least`` kept
whatever they weigh, or both. ``dropped`` is called with each value let go (a kept
tokenizer's untruncated twin goes with it). ``hits`` and ``misses`` count :meth:`get`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Kept(Generic[K, V]):
    """Values by key, least recently used dropped first while more than ``most`` are
    kept, or while they weigh more than ``budget`` and more than ``least`` are kept."""

    def __init__(self, most: int | None = None, *, budget: int | None = None,
                 weigh: Callable[[V], int] | None = None, least: int = 1,
                 dropped: Callable[[V], None] | None = None) -> None:
        if (budget is None) != (weigh is None):
            raise ValueError("a budget needs a weigh function, and only with one")
        self.most, self.budget, self.least = most, budget, least
        self._weigh, self._dropped = weigh, dropped
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.weight = 0  # of the values kept now, by ``weigh``
        self.hits = 0
        self.misses = 0

    def get(self, key: K) -> V | None:
        """The value kept for ``key`` (now the most recently used), or None."""
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return item[0]

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` for ``key`` as the most recently used; drop what is over the
        bounds (the value just put too, where ``most`` or ``least`` is 0). Returns ``value``."""
        old = self._items.pop(key, None)
        if old is not None:
            self.weight -= old[1]
        weight = self._weigh(value) if self._weigh is not None else 0
        self._items[key] = (value, weight)
        self.weight += weight
        while self._items and self._over():
            _, (gone, w) = self._items.popitem(last=False)
            self.weight -= w
            if self._dropped is not None:
                self._dropped(gone)
        return value

    def _over(self) -> bool:
        n = len(self._items)
        if self.most is not None and n > self.most:
            return True
        return self.budget is not None and n > self.least and self.weight > self.budget

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def values(self) -> Iterator[V]:
        return (v for v, _ in self._items.values())

    def clear(self) -> None:
        if self._dropped is not None:
            for v, _ in self._items.values():
                self._dropped(v)
        self._items.clear()
        self.weight = 0
