"""The one bounded store of the process's memos (quantscope.kept.Kept)."""

import pytest

from quantscope.kept import Kept


def test_the_least_recently_used_goes_first_by_count():
    kept = Kept(2)
    kept.put("a", 1)
    kept.put("b", 2)
    assert kept.get("a") == 1  # now the most recently used
    kept.put("c", 3)
    assert list(kept) == ["a", "c"] and "b" not in kept
    assert kept.get("b") is None and (kept.hits, kept.misses) == (1, 1)


def test_by_weight_the_least_are_kept_whatever_they_weigh():
    gone = []
    kept = Kept(budget=10, weigh=len, least=2, dropped=gone.append)
    kept.put(1, "xxxxxx")
    kept.put(2, "yyyyyy")  # 12 > 10, but two are kept at least
    assert len(kept) == 2 and kept.weight == 12 and not gone
    kept.put(3, "z")  # three weigh 13: the oldest goes, 7 left
    assert list(kept) == [2, 3] and gone == ["xxxxxx"] and kept.weight == 7
    kept.put(2, "yy")  # put again: weighed again, the most recent
    assert list(kept) == [3, 2] and kept.weight == 3
    kept.clear()
    assert len(kept) == 0 and kept.weight == 0 and gone == ["xxxxxx", "z", "yy"]


def test_count_and_weight_together_and_a_budget_needs_a_weight():
    kept = Kept(3, budget=100, weigh=len)
    for k in range(5):
        kept.put(k, "x")
    assert list(kept) == [2, 3, 4]
    with pytest.raises(ValueError, match="budget"):
        Kept(budget=3)
    with pytest.raises(ValueError, match="budget"):
        Kept(weigh=len)
