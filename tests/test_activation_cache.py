"""The incremental evaluator's cache policy on a tiny encoder: in a greedy walk the
incumbent's cuts and sessions outlive any number of rejected candidates within a budget
of a few entries, the line moves to a kept candidate, and every output stays the full QDQ
model's."""

from __future__ import annotations

import numpy as np
import pytest
from incremental_models import encoder, feeds

from quantscope.analyze.activation_cache import (
    CACHE_FP32,
    ActivationCache,
    CacheMemory,
    Lineage,
    Seen,
    Tally,
    cache_memory,
)
from quantscope.analyze.incremental import IncrementalConfig, IncrementalEngine, IncrementalRunner
from quantscope.analyze.memory import weight_bytes
from quantscope.calibrate.collect import calibrate
from quantscope.emulate.evaluate import run_model
from quantscope.emulate.qdq import quantize_model
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.types import Plan, Precision, QuantScheme

SCHEME = QuantScheme()
LOW, HIGH = Precision.A8_W8, Precision.A16_W16


@pytest.fixture(scope="module")
def prepared():
    model = load_proto(encoder(layers=3), "tiny-encoder")
    batches = [feeds(n=3, s=5 + i, seed=i) for i in range(3)]
    return model, calibrate(model, find_groups(model), batches), batches


def _same_as_full(runner, plan, model, stats, batches):
    full = run_model(quantize_model(model, stats, plan, scheme=SCHEME).proto, batches)
    for x, y in zip(runner.outputs(plan).batches, full.batches, strict=True):
        for u, v in zip(x, y, strict=True):
            np.testing.assert_allclose(u, v, rtol=0, atol=1e-6)


def _promote(groups, *names):
    return Plan(default=LOW, overrides=tuple((g, HIGH) for g in groups if g in names))


def _first_group(runner, segment):
    return next(s.groups[0] for s in runner.segments if s.index == segment)


def test_the_incumbents_cut_outlives_many_rejected_candidates_in_a_small_budget(prepared):
    """Budget: three of the ten cuts' entries. The incumbent (uniform a8_w8) runs, then
    eight rejected candidates each change segment 1 (writing their own entries for every
    later cut), then a candidate changing the last segment starts from a cut of the
    incumbent kept deep in the model. The old LRU kept the rejected candidates' newest
    entries instead: that candidate ran all 11 segments (no hit)."""
    model, stats, batches = prepared
    probe = IncrementalRunner(model, stats, batches, scheme=SCHEME)
    probe.outputs(Plan.uniform(LOW))
    entry = max(probe.cuts.entry_bytes)
    runner = IncrementalRunner(model, stats, batches, scheme=SCHEME,
                               config=IncrementalConfig(cache_bytes=3 * entry))
    n = len(runner.segments)
    assert n == 11
    incumbent = Plan.uniform(LOW)
    _same_as_full(runner, incumbent, model, stats, batches)
    early = next(s for s in runner.segments if s.index == 1).groups
    assert len(early) >= 7
    for g in early[:8]:  # rejected: the walk stays on the incumbent
        _same_as_full(runner, _promote(early, g), model, stats, batches)
        assert runner.cached_bytes <= 3 * entry
    before = runner.counts
    late = _promote(runner.groups.names(), _first_group(runner, n - 1))
    _same_as_full(runner, late, model, stats, batches)
    done = runner.counts.minus(before)
    assert done.cache_hits == 1 and done.segments_skipped >= 6, done
    assert sum(runner.cuts.dropped) + sum(runner.cuts.evicted) > 0  # the budget bit


def test_a_rejected_candidate_never_pushes_out_the_incumbents_sessions(prepared):
    """No activation cache (every plan runs from segment 0), the default session budget:
    the incumbent's sessions are built once and only each candidate's changed segment is
    new. Before, the budget (the model's weights once) held exactly one plan's sessions:
    every candidate's new session evicted the least recently used, which the next plan
    running from segment 0 needed first (a scan: 5 sessions rebuilt in this walk)."""
    model, stats, batches = prepared
    runner = IncrementalRunner(model, stats, batches, scheme=SCHEME,
                               config=IncrementalConfig(cache_bytes=0))
    n = len(runner.segments)
    _same_as_full(runner, Plan.uniform(LOW), model, stats, batches)
    names = [_first_group(runner, k) for k in (1, 5, 7, 4, 6, 8)]
    for g in names:
        _same_as_full(runner, _promote(names, g), model, stats, batches)
    assert runner.cuts.sessions_rebuilt == 0
    assert runner.counts.sessions_built == n + len(names)
    assert runner.counts.segments_skipped == 0  # no activations kept: a budget of 0


def test_the_line_moves_to_a_kept_candidate_and_stays_on_a_tie():
    """Prefix keys as letters: I = abcdef; C = abXyzw (changed at 2) is kept when a later
    plan shares more with it than with I; a plan changed before 2 ties and keeps I."""
    lin = Lineage()

    def seen(s: str) -> Seen:
        return Seen(tuple(s), tuple(s))

    assert lin.place(seen("abcdef")) == 6 and lin.line == set("abcdef")
    assert lin.place(seen("abXyzw")) == 2 and lin.own == set("Xyzw")
    assert lin.place(seen("Qrstuv")) == 0 and lin.line == set("abcdef")  # a rejected sibling
    assert lin.place(seen("aPqrst")) == 1 and lin.line == set("abcdef")  # a tie: I stays
    assert lin.place(seen("abXyQR")) == 4 and lin.line == set("abXyzw")  # C was kept
    assert lin.own == {"Q", "R"}


def test_the_budget_is_sized_from_the_available_memory_and_said(prepared):
    model, stats, batches = prepared
    runner = IncrementalRunner(model, stats, batches, scheme=SCHEME,
                               config=IncrementalConfig(cut_codes=False))
    runner.outputs(Plan.uniform(LOW))
    plan = sum(runner.cuts.entry_bytes)
    mem = runner.memory
    assert abs(mem.plan_bytes - plan) <= 0.05 * plan  # the estimate, before any plan ran
    coded = IncrementalRunner(model, stats, batches, scheme=SCHEME)  # the cut codes on
    coded.outputs(Plan.uniform(LOW))  # ... the estimate (float32) bounds what is held
    assert coded.memory.plan_bytes == mem.plan_bytes and sum(coded.cuts.entry_bytes) < 0.5 * plan
    assert mem.cache_bytes == 2 * mem.plan_bytes  # the line's cuts and the newest plan's
    # ... at most CACHE_FP32 of the weights and the largest batch's cut tensors (batches of
    # 3 x 5, 6, 7 tokens), never under CACHE_MIN: with a floor of 0 that cap binds here
    crossing = runner._crossing
    one = round(mem.plan_bytes * 21 / (15 + 18 + 21))
    capped = cache_memory(model, batches, crossing, 10 << 20, available=64 << 30)
    assert capped.cache_bytes == 2 * mem.plan_bytes  # the floor: 64 MB
    import quantscope.analyze.activation_cache as ac

    floor = ac.CACHE_MIN
    try:
        ac.CACHE_MIN = 0
        fp32 = CACHE_FP32 * (weight_bytes(model) + one)
        capped = cache_memory(model, batches, crossing, 10 << 20, available=64 << 30)
        assert abs(capped.cache_bytes - fp32) <= 64 and capped.cache_bytes < 2 * mem.plan_bytes
    finally:
        ac.CACHE_MIN = floor
    tight = cache_memory(model, batches, crossing, 10 << 20, available=(10 << 20) + 40_000)
    assert tight.cache_bytes == 20_000  # half of what the sessions leave
    assert cache_memory(model, batches, crossing, 0, cache_bytes=7).cache_bytes == 7
    # a cap bounds the sized budget, and only when it is lower
    assert cache_memory(model, batches, crossing, 10 << 20, available=64 << 30,
                        cache_cap=1000).cache_bytes == 1000
    assert cache_memory(model, batches, crossing, 10 << 20, available=64 << 30,
                        cache_cap=1 << 40).cache_bytes == 2 * mem.plan_bytes
    text = CacheMemory(3 << 30, 1 << 30, 64 << 20, 8 << 30).text()
    assert text == ("incremental evaluation: activation cache up to 3.00 GB (one plan's "
                    "cuts at most ~1.00 GB; 8.0 GB available), segment sessions up to 64 MB "
                    "of weights")
    engine = IncrementalEngine(model, batches)
    engine.runner(model, stats, SCHEME)
    assert any(n.startswith("incremental evaluation: activation cache up to")
               for n in engine.notes)


def test_an_array_held_by_several_entries_counts_once():
    """A tensor crossing several cuts (a mask, a position bias) is one array in each
    entry: held once, counted once, let go with the last entry that holds it."""
    cache = ActivationCache(10_000, 3, 1, Lineage(), Tally(3))
    shared, a, b = (np.zeros(500, np.float32) for _ in range(3))  # 2,000 bytes each
    first, second = cache.open("p0", 0), cache.open("p1", 1)
    cache.grow(first, {"mask": shared, "x": a})
    cache.grow(second, {"mask": shared, "y": b})
    assert cache.held == 6_000 and first.nbytes == second.nbytes == 4_000
    cache.close(first)
    cache.close(second)
    cache._drop(first)
    assert cache.held == 4_000  # the mask is still held by the second entry
    cache._drop(second)
    assert cache.held == 0
    tight = ActivationCache(6_000, 3, 1, Lineage(), Tally(3))  # over budget: evicts
    for k in range(3):
        tight.grow(tight.open(f"q{k}", k), {"mask": shared, f"t{k}": np.zeros(500, np.float32)})
    assert tight.held == 6_000 and len(tight.entries) == 2  # the mask counted once
