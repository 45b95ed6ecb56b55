"""The planner's no-goal choice against the noise of a figure in dB.

Without a quality goal the planner takes the cheapest measured plan not worse than the
best beyond the noise of their difference; that noise was known for shares over counted
items only (h36). A figure in dB (a tensor model's ``sqnr_db_channel_min``, ``sqnr_db``)
had none, so the best figure was bought whatever it cost: a tiny tensor model bought 7.4x
for +0.1 dB (34.5 against 34.4 dB). A measured point now keeps the per-sample signal and
noise powers of its dB figure (sums per sample and channel, not tensors), and the choice
reads the jackknife bound of the paired difference, the bound ``run --rewrites auto``'s
tiebreak reads (:mod:`quantscope.tasks.db_noise`, one place).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import tiny_models
from onnx import helper, numpy_helper

from quantscope import stages
from quantscope.analyze.evalcache import EvalCache
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.plan.joint import Counted
from quantscope.plan.pareto import Budget, FrontPoint, noise, select
from quantscope.plan.search import search
from quantscope.rewrites import tie
from quantscope.targets import parse_target
from quantscope.tasks import db_noise
from quantscope.tasks.db_noise import Parts, pooled_db
from quantscope.types import Dataset, Plan, Precision, Sensitivity

A8, A16 = Precision.A8_W8, Precision.A16_W16
SAMPLES = 16


def _target(a16_cost: float = 7.4, *, elementwise_16: bool = True):
    kinds = ("weighted", "matmul", "softmax", "normalization", "elementwise", "other")
    return parse_target({
        "name": "toy", "vendor": "test", "sdk": "none",
        "precisions": {k: ["a8_w8"] if k == "elementwise" and not elementwise_16
                       else ["a8_w8", "a16_w16"] for k in kinds}, "rules": [],
        "cost": {"basis": "test", "boundary_macs": 0.0,
                 "relative": {k: {"a8_w8": 1.0, "a16_w16": a16_cost} for k in kinds}}})


def _fake_db(gain_db: float, scatter: float, *, parts: bool = True):
    """A fake measurement in dB over ``SAMPLES`` samples: uniform a8_w8 at 34.4 dB, each
    promoted group of three a third of ``gain_db`` more (pooled), each sample's noise
    moved by a factor of spread ``scatter`` (log-normal; 0: every sample alike); the
    per-sample powers said after each call as the planner's evaluator says them."""
    r = np.random.default_rng(7)
    signal = r.uniform(0.5, 1.5, SAMPLES)
    base = signal * r.uniform(0.5, 1.5, SAMPLES)
    base *= signal.sum() / base.sum() / 10 ** 3.44  # pooled: 34.4 dB
    moved = np.exp(r.normal(0.0, scatter, SAMPLES))

    def powers(k: int) -> Parts:
        n = base * moved ** (k / 3)
        n *= base.sum() / n.sum() / 10 ** (gain_db * k / 3 / 10)  # pooled: + k/3 of the gain
        return Parts(signal, n, "samples")

    def run(plan):
        p = powers(len(plan.overrides))
        evaluate.parts = p if parts else None
        return pooled_db(p)

    evaluate = Counted(run)
    return evaluate


def _search(evaluate, metric: str = "sqnr_db_channel_min"):
    model = load_proto(tiny_models.residual_add())  # MatMul_0, MatMul_3, Add_5
    groups = find_groups(model)
    sens = Sensitivity.from_gains(metric, 34.4, {g: {"a16_w16": 1.0} for g in groups.names()})
    return search(groups, sens, _target(), model, evaluate=evaluate, refine_steps=12,
                  measured_metric=metric)


def test_a_tenth_of_a_db_within_its_noise_buys_no_cost():
    """The lead's case: every group at 16 bit (7.4x) measured 34.5 dB against 34.4 dB at
    uniform a8_w8, a difference well inside the samples' scatter. Before, the best figure
    was bought (7.4x) and ``pareto.choice`` said "its figure counts no items, so no noise
    estimate"; now uniform a8_w8 is measured and chosen, and the record says what the
    dearer plan would gain and its noise."""
    r = _search(_fake_db(0.1, 0.3))
    assert r.cost == pytest.approx(1.0) and r.plan.overrides == ()
    assert r.measured == pytest.approx(34.4)
    c = r.to_dict()["choice"]
    assert c["best"]["measured"] == pytest.approx(34.5) and c["best"]["cost"] == pytest.approx(7.4)
    assert c["noise"]["half_width"] > 0.1 and "jackknife" in c["noise"]["words"]
    assert c["line"].startswith("34.4 dB at 1.000x, within noise of the best measured 34.5 dB")
    assert "7.40x would gain +0.1 dB, within its noise (±" in c["line"], c["line"]
    from quantscope.report.console import format_search

    assert f"chosen (fit data): {c['line']}" in format_search(r.to_dict()).splitlines()


def test_a_db_gain_beyond_its_noise_still_buys_it():
    """+6 dB on every sample alike: far beyond the noise, every group is bought, and the
    record says no cheaper plan was within it."""
    r = _search(_fake_db(6.0, 0.02))
    assert r.cost == pytest.approx(7.4) and r.measured == pytest.approx(40.4)
    c = r.to_dict()["choice"]
    assert c["chosen"] == c["best"] and c["noise"]["half_width"] < 1.0
    assert "no cheaper measured plan within its noise: the closest, " in c["line"]
    assert c["closest"]["cost"] < 7.4 and "dB below it (noise ±0.0" in c["line"], c["line"]


def test_a_db_figure_without_per_sample_scores_says_there_was_no_estimate():
    """An evaluator that keeps no per-sample powers (a task's dB figure, a figure measured
    as parallel tasks): the best quality, then the cheapest, and the record says why there
    was no noise estimate."""
    r = _search(_fake_db(0.1, 0.3, parts=False))
    assert r.cost == pytest.approx(7.4)
    c = r.to_dict()["choice"]
    assert c["noise"] is None
    assert "counts no items and keeps no per-sample scores, so no noise estimate" in c["line"]


def test_select_reads_the_jackknife_of_two_db_points():
    """:func:`select` and :func:`noise` on two points of paired per-sample powers: the
    bound is the tiebreak's (one place: ``rewrites.tie.gain_interval`` is
    ``tasks.db_noise``'s against its margin)."""
    ev = _fake_db(0.1, 0.3)
    ev(Plan.uniform(A8))
    low = ev.parts
    ev(Plan(default=A8, overrides=(("a", A16), ("b", A16), ("c", A16))))
    high = ev.parts

    def point(cost: float, parts: Parts) -> FrontPoint:
        return FrontPoint(cost=cost, predicted=0.0, measured=pooled_db(parts),
                          overrides=((f"g{cost}", A16),), parts=parts)

    cheap, dear = point(1.0, low), point(7.4, high)
    half, words = noise(dear, cheap)
    iv = tie.gain_interval(high, low)
    assert half == pytest.approx(iv["upper"] - iv["difference"])
    assert iv == db_noise.gain_interval(high, low, margin=tie.TIE_MARGIN)
    assert select([cheap, dear], Budget())[0] is cheap
    # the same figures with no per-sample powers: the best, then the cheapest (as before)
    assert select([replace(cheap, parts=None), dear], Budget())[0] is dear


# ------------------------------------------------------------------ a real tiny model

def _skip_model(scale: float):
    """``y = x + x @ W`` (a MatMul beside an identity path, summed by an Add)."""
    r = np.random.default_rng(0)
    w = numpy_helper.from_array(r.normal(0, scale, (16, 16)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="MatMul_0"),
             helper.make_node("Add", ["x", "m"], ["y"], name="Add_1")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, ["N", 16])],
                          [helper.make_tensor_value_info("y", 1, ["N", 16])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return load_proto(model, "skip")


def _tensor_data():
    r = np.random.default_rng(1)
    b = tuple({"x": r.normal(0, 1, (4, 16)).astype(np.float32)} for _ in range(3))
    return Dataset(name="x.npz", calibration=b, evaluation=b, task=None)


def _evaluator(model, data, stats, metric, cache=None):
    """The planner's evaluator of the toy target's plans (a target made in the test has no
    profile to load: its plans are measured with the default scheme, as the toy's)."""
    inner = stages.plan_evaluator(model, data, stats, metric, cache=cache)

    def run(plan):
        value = inner(replace(plan, target=None))
        outer.items, outer.parts = inner.items, inner.parts
        return value

    outer = Counted(run)
    return outer


@pytest.mark.parametrize("metric, columns", [("sqnr_db", 1), ("sqnr_db_channel_min", 16)])
def test_the_planners_evaluator_keeps_each_samples_powers(metric, columns, tmp_path):
    """Measuring a plan keeps, per sample (12) and column (the output, or its 16
    channels), the signal and noise powers whose pooled figure is the figure measured; a
    figure read back from the evaluation cache keeps them too."""
    model, data = _skip_model(0.1), _tensor_data()
    stats = stages.calibrate_model(model, data)
    plan = Plan.uniform(A8)
    ev = stages.plan_evaluator(model, data, stats, metric, cache=EvalCache(tmp_path / "e"))
    value = ev(plan)
    assert ev.parts is not None and ev.parts.unit == "samples"
    assert ev.parts.signal.shape == (12, columns)
    assert pooled_db(ev.parts) == pytest.approx(value, abs=1e-6)
    again = stages.plan_evaluator(model, data, stats, metric, cache=EvalCache(tmp_path / "e"))
    assert again(plan) == value and np.array_equal(again.parts.noise, ev.parts.noise)


def test_a_tiny_tensor_model_buys_16_bit_only_for_a_gain_beyond_its_noise():
    """``y = x + x @ W`` on a target whose Add stays at 8 bit: the MatMul at 16 bit (7.02x)
    moves the worst channel +0.7 dB on 12 samples, inside the noise of a worst-channel
    figure (about ±2 dB): uniform a8_w8 is chosen (before: 7.02x). The pooled SQNR of the
    same plans gains beyond its noise: 16 bit is still bought."""
    model, data = _skip_model(0.1), _tensor_data()
    stats = stages.calibrate_model(model, data)
    groups = find_groups(model)
    target = _target(elementwise_16=False)
    chosen = {}
    for metric in ("sqnr_db_channel_min", "sqnr_db"):
        sens = Sensitivity.from_gains(metric, 30.0, {g: {"a16_w16": 1.0} for g in groups.names()})
        r = search(groups, sens, target, model, evaluate=_evaluator(model, data, stats, metric),
                   refine_steps=12, measured_metric=metric)
        chosen[metric] = r
    low = chosen["sqnr_db_channel_min"]
    c = low.to_dict()["choice"]
    assert low.cost == pytest.approx(1.0) and c["best"]["cost"] > 7.0
    assert 0.0 < c["best"]["measured"] - low.measured < c["noise"]["half_width"]
    high = chosen["sqnr_db"]
    d = high.to_dict()["choice"]
    assert high.cost > 7.0 and d["chosen"] == d["best"] and d["noise"] is not None


def test_a_retrieval_embedding_sqnr_keeps_one_part_per_pair():
    """``plan --metric embedding_sqnr_db`` on text pairs: the planner's evaluator keeps
    one unit per pair (20 pairs), pooling to the figure it measured (the task's
    ``sample_parts``, which ``run --rewrites auto``'s tiebreak reads too)."""
    from test_tasks_text import tiny_encoder

    from quantscope.pipeline.data import open_fit_data

    model = load_proto(tiny_encoder(), "tiny")
    fit = open_fit_data(model, "stdlib-docs", eval_data=None, pairs=20, tokenizer=None)
    stats = stages.calibrate_model(model, fit, progress=False)
    ev = stages.plan_evaluator(model, fit, stats, "embedding_sqnr_db")
    value = ev(Plan.uniform(A8))
    assert ev.parts is not None and ev.parts.unit == "pairs" and len(ev.parts.signal) == 20
    assert pooled_db(ev.parts) == pytest.approx(value, abs=1e-6)


def test_a_wide_output_keeps_only_the_columns_near_its_lowest():
    """Thousands of channels: the worst-channel figure's parts keep those within 20 dB of
    the lowest (at most 256), pooling to the same figure."""
    from quantscope.emulate.sample_powers import MAX_COLUMNS, lowest_columns

    r = np.random.default_rng(3)
    signal = r.uniform(0.5, 1.5, (12, 4000))
    noise = signal * 10 ** -r.uniform(3.0, 9.0, 4000)  # columns at 30 to 90 dB
    s, n = lowest_columns(signal, noise)
    assert 1 <= s.shape[1] <= MAX_COLUMNS and s.shape == n.shape
    assert pooled_db(Parts(s, n)) == pytest.approx(pooled_db(Parts(signal, noise)), abs=1e-12)
    db = 10 * np.log10(s.sum(0) / n.sum(0))
    assert db.max() <= db.min() + 20.0


def test_a_raced_batch_keeps_each_figures_noise():
    """``--race``: the batch's survivors were measured one by one but kept neither their
    items nor their per-sample powers, so the choice had no noise estimate for them (a
    share's items were lost the same way); now each keeps what its evaluator said."""
    from types import SimpleNamespace

    model = load_proto(tiny_models.residual_add())
    groups = find_groups(model)
    sens = Sensitivity.from_gains("sqnr_db_channel_min", 34.4,
                                  {g: {"a16_w16": 1.0} for g in groups.names()})

    def race(plans, margin=None):  # every raced plan survives
        return SimpleNamespace(survivors=range(len(plans)))

    r = search(groups, sens, _target(), model, evaluate=_fake_db(0.1, 0.3), refine_steps=12,
               measured_metric="sqnr_db_channel_min", race=race)
    assert all(t.parts is not None for t in r.trials)
    assert r.cost == pytest.approx(1.0) and r.to_dict()["choice"]["noise"] is not None
