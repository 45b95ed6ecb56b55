import tracemalloc

import numpy as np
import pytest
import tiny_models as tm

from quantscope.calibrate.collect import calibrate
from quantscope.calibrate.observe import HIST_BINS, Observer
from quantscope.emulate.ranges import tensor_range
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.serde import read_stats, write_stats
from quantscope.types import QuantscopeError


def _attention():
    model = load_proto(tm.attention(), "attention")
    return model, find_groups(model)


def _batches(n, *, seed=0, max_seq=24):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        seq = int(rng.integers(2, max_seq))
        yield {"x": rng.normal(0, 1, (4, seq, 16)).astype(np.float32)}


def _peak(n):
    model, groups = _attention()
    tracemalloc.start()
    calibrate(model, groups, _batches(n))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def test_memory_flat_as_batches_grow():
    _peak(5)  # warm-up (imports, ORT session caches)
    small, large = _peak(20), _peak(400)
    assert large < small * 1.25 + 256 * 1024, (small, large)


def test_variable_length_batches_calibrate():
    model, groups = _attention()
    stats = calibrate(model, groups, _batches(10))
    assert stats.num_batches == 10 and stats.num_samples == 40
    s = stats.tensors["p"]  # softmax output, per-row lengths differ across batches
    assert 0.0 <= s.min and s.max <= 1.0 and s.count > 0
    assert s.hist.sum() == s.count


def test_minmax_equals_true_extremes():
    model, groups = _attention()
    batches = list(_batches(6, seed=3))
    stats = calibrate(model, groups, iter(batches))
    xs = np.concatenate([b["x"].ravel() for b in batches])
    assert stats.tensors["x"].min == pytest.approx(float(xs.min()))
    assert stats.tensors["x"].max == pytest.approx(float(xs.max()))


def test_histogram_doubling_is_exact():
    rng = np.random.default_rng(0)
    small, big = rng.normal(0, 0.1, 1000), rng.normal(0, 9.0, 1000)
    a, b = Observer("a"), Observer("b")
    a.update(small)
    a.update(big)
    b.update(np.concatenate([small, big]))
    assert a.r == b.r
    np.testing.assert_array_equal(a.hist, b.hist) if a.r == b.r else None
    assert a.hist.sum() == 2000 and a.hist.size == HIST_BINS


def test_percentile_and_mse_clip_outliers_at_8_bit_only():
    obs = Observer("t")
    x = np.random.default_rng(1).normal(0, 1, 200_000).astype(np.float32)
    x[:3] = [60.0, -55.0, 70.0]
    obs.update(x)
    ts = obs.freeze()
    assert tensor_range(ts, "minmax", 8) == (ts.min, ts.max)
    lo, hi = tensor_range(ts, "percentile", 8)
    assert -6 < lo < -3 and 3 < hi < 6
    from quantscope.numerics import fake_quant, qparams

    def mse(rng_):
        enc = qparams(rng_[0], rng_[1], 8, signed=False, symmetric=False)
        return float(np.mean((fake_quant(x, enc) - x) ** 2))

    best = mse(tensor_range(ts, "mse", 8))
    assert best <= mse(tensor_range(ts, "minmax", 8)) * 1.01
    assert best <= mse(tensor_range(ts, "percentile", 8)) * 1.01
    assert tensor_range(ts, "mse", 16) == (ts.min, ts.max)


def test_an_mse_range_is_searched_once_per_statistics_and_width():
    import dataclasses

    from quantscope.emulate import ranges

    obs = Observer("t")
    obs.update(np.random.default_rng(2).standard_t(3, 50_000).astype(np.float32))
    ts = obs.freeze()
    first = tensor_range(ts, "mse", 8)
    assert first == ranges._mse_search(ts, 8, symmetric=False)  # kept: what it searched
    assert tensor_range(ts, "mse", 8) == first
    assert tensor_range(ts, "mse", 8, symmetric=True) == ranges._mse_search(
        ts, 8, symmetric=True) != first  # another key, searched on its own
    assert tensor_range(ts, "mse", 4) == ranges._mse_search(ts, 4, symmetric=False)
    wider = dataclasses.replace(ts, hist=ts.hist * 0 + np.where(  # other statistics:
        np.arange(ts.hist.size) % 7 == 0, 1, 0))  # searched again, not the first's
    assert tensor_range(wider, "mse", 8) == ranges._mse_search(wider, 8, symmetric=False)
    assert tensor_range(wider, "mse", 8) != first


def test_stats_roundtrip(tmp_path):
    model, groups = _attention()
    stats = calibrate(model, groups, _batches(3))
    path = write_stats(tmp_path / "s.npz", stats)
    back = read_stats(path)
    assert back.tensors.keys() == stats.tensors.keys()
    for k, v in stats.tensors.items():
        assert back.tensors[k].min == v.min and back.tensors[k].max == v.max
        np.testing.assert_array_equal(back.tensors[k].hist, v.hist)


def test_empty_calibration_is_an_error():
    model, groups = _attention()
    with pytest.raises(QuantscopeError, match="empty"):
        calibrate(model, groups, iter([]))


def test_bin_counts_equal_numpy_histogram_at_the_edges():
    from quantscope.calibrate.observe import bin_counts

    rng = np.random.default_rng(2)
    for r in (2.0**-130, 2.0**-3, 1.0, 8.0, 2.0**12, 2.0**64):
        x = (rng.uniform(-1, 1, 5000) * r).astype(np.float32)
        step = r / (HIST_BINS // 2)
        edges = np.array([-r, r, 0.0, -0.0, step, -step, 3 * step, -3 * step], np.float32)
        tiny = np.array([np.nextafter(np.float32(0), np.float32(1)),
                         -np.nextafter(np.float32(0), np.float32(1))], np.float32)
        x = np.concatenate([x, edges, tiny, np.nextafter(edges, np.float32(0))])
        want, _ = np.histogram(x, bins=HIST_BINS, range=(-r, r))
        np.testing.assert_array_equal(bin_counts(x, r), want)


def test_the_rows_per_run_follow_the_budget_and_leave_the_stats_unchanged(monkeypatch):
    """A run takes one row first, then as many as the tapped tensors' budget allows; the
    statistics are the same float for float whatever the split, but for the floor cluster
    of a tensor without one (values near half its minimum: merged approximately, and read
    only where a sentinel fill makes a cluster, which merges exactly)."""
    import dataclasses

    from quantscope.calibrate import collect
    from quantscope.calibrate.collect import rows_per_run

    model, groups = _attention()
    batches = [{"x": b["x"].repeat(3, axis=0)} for b in _batches(5, seed=7)]  # 12 rows each
    for i, b in enumerate(batches):  # a sentinel fill on the input, in some rows
        b["x"][(i * 5) % 12: (i * 5) % 12 + 2, :, :3] = -1e4
    seen: list[int] = []
    real = collect.make_session

    def counting(*a, **k):
        s = real(*a, **k)

        class Counted:
            def get_inputs(self):
                return s.get_inputs()

            def run(self, names, feeds):
                seen.append(len(feeds["x"]))
                return s.run(names, feeds)
        return Counted()

    monkeypatch.setattr(collect, "make_session", counting)
    whole = calibrate(model, groups, iter(batches), max_rows=64, budget=2**40)
    assert seen[:2] == [1, 11] and all(n == 12 for n in seen[2:])  # 1 row, then the rest
    seen.clear()
    one = calibrate(model, groups, iter(batches), budget=1)
    assert set(seen) == {1}
    seen.clear()
    some = calibrate(model, groups, iter(batches), max_rows=5)
    assert seen[:3] == [1, 5, 5] and max(seen) == 5
    for other in (one, some):
        assert other.tensors.keys() == whole.tensors.keys()
        for name, s in whole.tensors.items():
            for f in dataclasses.fields(s):
                if f.name in ("bulk_min", "floor_count") and name != "x":
                    continue
                a, b = getattr(s, f.name), getattr(other.tensors[name], f.name)
                assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, (name, f.name)
    # the rows per run from the measured bytes per input value
    feeds = {"x": np.zeros((32, 256, 16), np.float32)}
    assert rows_per_run(feeds, None, 8) == 1
    assert rows_per_run(feeds, 1000.0, 8, budget=3 * 1000 * 256 * 16) == 3
    assert rows_per_run(feeds, 1.0, 8) == 8 and rows_per_run(feeds, 1e12, 8) == 1
