"""A release of memory walks every object the process holds (a full collection): 65 ms in
a test worker after a few hundred tests, 215 ms after a Ray cluster came and went. The tiny
decoder's rewrite search released 342 times (23 of its 50 s; 75 of 100 s after the Ray
tests), which made it 3-4x slower in the suite than alone. Now a release happens only
when the resident set has grown by RELEASE_GROWTH since the last one."""

from __future__ import annotations

import numpy as np

from quantscope.emulate import release


def test_a_release_happens_only_after_the_resident_set_grew(monkeypatch) -> None:
    collected = []
    monkeypatch.setattr(release.gc, "collect", lambda: collected.append(1) or 0)
    assert release.release_memory(force=True) and collected == [1]
    assert release.release_memory() is False and collected == [1]  # nothing grew: no walk
    big = np.ones(release.RELEASE_GROWTH // 8 + 2**22)  # > RELEASE_GROWTH, touched
    assert release.release_memory() is True and collected == [1, 1]
    del big  # the resident set falls: the mark follows it down, no release
    assert release.release_memory() is False and collected == [1, 1]
    monkeypatch.setattr(release, "resident_bytes", lambda: None)  # no /proc: always
    assert release.release_memory() is True and collected == [1, 1, 1]


def test_the_resident_set_is_read() -> None:
    now = release.resident_bytes()
    assert now is not None and 10 * 2**20 < now < 64 * 2**30
