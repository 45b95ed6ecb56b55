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


def _sorted_sweep(counter_of, seconds_per_token=1e-3, overhead=0.05):
    """A synthetic enable-one sweep over length-sorted text batches (candidates inside
    batches, as the segment sweep runs them): each step takes an overhead plus time per
    token. Returns (ETA said after the first quarter of the steps, the true time left)."""
    lengths = [16, 24, 32, 48, 64, 96, 128, 192, 256, 256]  # 32 rows each, sorted
    n_cands = 20
    sizes = [32.0 * n for n in lengths]
    steps = [s for s in sizes for _ in range(n_cands)]
    took = [overhead + seconds_per_token * s for s in steps]
    now = [0.0]
    c = counter_of(sizes, n_cands, lambda: now[0])
    quarter = len(steps) // 4
    for s, t in zip(steps[:quarter], took[:quarter], strict=True):
        now[0] += t
        c.step(cost=s)
    return c.eta(), sum(took[quarter:])


def test_sweep_eta_is_not_optimistic_on_length_sorted_batches():
    """The analysis counted steps: after the short first batches it promised about half
    the time that was left (778 s shown, 1,558 s taken). Weighted by each batch's size,
    the estimate after the first quarter of the steps is not below the time left."""
    def weighted(sizes, n, clock):
        return progress.Counter("sweep", total=n * len(sizes), total_cost=n * sum(sizes),
                                show=False, clock=clock)

    def counted(sizes, n, clock):
        return progress.Counter("sweep", total=n * len(sizes), show=False, clock=clock)

    said, left = _sorted_sweep(weighted)
    assert left <= said <= 2.0 * left
    said, left = _sorted_sweep(counted)
    assert said < 0.5 * left  # what it said before
    assert progress.eta(10.0, 0.0, 5.0) is None and progress.eta(10.0, 1.0, 5.0) == 40.0


def test_the_segment_sweep_weighs_its_steps_by_batch_size(monkeypatch):
    import tiny_models as tm

    from quantscope.analyze import Scorer, sweeps
    from quantscope.calibrate.collect import calibrate
    from quantscope.model.groups import find_groups
    from quantscope.model.load import load_proto
    from quantscope.types import Precision

    seen = []

    class Recorded(progress.Counter):
        def step(self, n=1, *, cost=0.0):
            seen.append(cost)
            super().step(n, cost=cost)

        def close(self):
            seen.append(("total", self.total_cost))
            super().close()

    monkeypatch.setattr(sweeps, "Counter", Recorded)
    model = load_proto(tm.layernorm_block())
    groups = find_groups(model)
    rng = np.random.default_rng(0)
    batches = [{"x": rng.normal(0, 1, (n, 6, 24)).astype(np.float32)} for n in (2, 5)]
    stats = calibrate(model, groups, iter(batches))
    sweeps.sweep_segments(model, groups, stats, batches, scorer=Scorer(), low=Precision.A8_W8,
                          high=Precision.A16_W16, sweeps=("enable_one",))
    costs = [c for c in seen if not isinstance(c, tuple)]
    total = seen[-1][1]
    assert set(costs) == {2 * 6 * 24.0, 5 * 6 * 24.0} and total == sum(costs)
