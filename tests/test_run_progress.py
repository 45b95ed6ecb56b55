"""The one progress helper: quiet line-based progress off a terminal, nothing when off."""

import io
import sys

import numpy as np

from quantscope import progress


def test_lines_off_a_terminal(monkeypatch):
    err = io.StringIO()  # not a TTY, as in CI logs
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    assert list(progress.track(range(3), "calibrate", unit="batch")) == [0, 1, 2]
    lines = err.getvalue().splitlines()
    assert lines[0] == "calibrate: 0/3 batch"
    assert "calibrate: 1/3 batch, ETA" in lines[1]
    assert lines[-1].startswith("calibrate: 3/3 batch done in ")
    assert "\r" not in err.getvalue()


def test_counter_and_silence(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    c = progress.Counter("sweep", total=4, unit="cand", show=False)
    for _ in range(4):
        c.step()
    c.close()
    assert list(progress.track([1, 2], "x", show=False)) == [1, 2]
    progress.say("hidden", show=False)
    assert err.getvalue() == ""
    c = progress.Counter("sweep", total=2, unit="cand")
    c.step()
    c.step()
    c.close()
    assert err.getvalue().splitlines()[0] == "sweep: 0/2 cand"
    assert err.getvalue().splitlines()[-1].startswith("sweep: 2 cand done in")


def test_eta_follows_the_cost_of_each_item(monkeypatch):
    """Text batches come sorted by length: the ETA must weigh the long ones."""
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    clock = iter(range(100))
    monkeypatch.setattr(progress.time, "perf_counter", lambda: float(next(clock)))
    sizes = [1.0, 1.0, 8.0]  # one second per item so far; the last item is 8x the work
    assert list(progress.track(sizes, "emulated", unit="batch", cost=lambda s: s)) == sizes
    lines = err.getvalue().splitlines()
    assert lines[1] == "emulated: 1/3 batch, ETA 9 s"  # by count it would say 2 s
    assert lines[2] == "emulated: 2/3 batch, ETA 8 s"
    streamed = iter(sizes)  # not sized: counted by items, never materialised
    err.truncate(0)
    assert list(progress.track(streamed, "x", total=3, cost=lambda s: s)) == sizes
    assert progress.feed_size({"ids": np.zeros((4, 7)), "mask": np.zeros((4, 7))}) == 28
