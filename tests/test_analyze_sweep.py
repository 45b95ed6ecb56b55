"""Segment sweeps equal naive full-model sweeps; analyze() end to end; the JSON round trip."""

import json

import numpy as np
import pytest
import tiny_models as tm

from quantscope.analyze import (
    Scorer,
    analysis_from_dict,
    analysis_to_dict,
    analyze,
    proxy_batches,
    summary_text,
    sweep_fast,
    sweep_naive,
    sweep_segments,
)
from quantscope.analyze.candidates import candidates, encodings_table, mixed_encodings
from quantscope.analyze.rows import density_batches
from quantscope.analyze.scoring import fidelity
from quantscope.analyze.segments import find_segments
from quantscope.calibrate.collect import calibrate
from quantscope.emulate.encode import encode
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.types import Precision, QuantScheme, QuantscopeError

LOW, HIGH = Precision.A8_W8, Precision.A16_W16


def _prepared(name, n=3):
    model = load_proto(tm.ALL[name](), name)
    groups = find_groups(model)
    feeds = [tm.sample_inputs(model.proto, seed=i) for i in range(n)]
    return model, groups, calibrate(model, groups, feeds), feeds


@pytest.mark.parametrize("name", list(tm.ALL))
def test_segment_sweep_equals_naive_full_model(name):
    model, groups, stats, feeds = _prepared(name)
    kw = {"scorer": Scorer(), "low": LOW, "high": HIGH}
    fast = sweep_segments(model, groups, stats, feeds, **kw, optimize_float=False)
    naive = sweep_naive(model, groups, stats, feeds, **kw)
    assert [c.group for c in fast.candidates] == [c.group for c in naive.candidates]
    for a, b in zip(fast.rows, naive.rows, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fast.low_rows, naive.low_rows, rtol=1e-6, atol=1e-6)


def test_sweep_fidelity_uses_the_one_zero_row_rule():
    ref = np.array([[0.0, 0.0], [1.0, 0.0], [3.0, 4.0]])
    test = np.array([[0.0, 0.0], [0.0, 0.0], [3.0, 4.0]])
    # zero on both sides: identical (1); zero on one side only: 0 (it was 1 in the sweeps)
    assert fidelity(ref, test)["cosine_mean"] == pytest.approx(2 / 3)
    assert fidelity(ref, test)["sqnr_db"] == pytest.approx(10 * np.log10(26.0))
    assert fidelity(ref, ref)["sqnr_db"] == float("inf")


def test_model_is_cut_into_several_segments():
    model, groups, _, _ = _prepared("layernorm_block")
    segs = find_segments(model, groups)
    assert len(segs) > 1
    assert sorted(g for s in segs for g in s.groups) == sorted(groups.names())


@pytest.mark.parametrize("name", ["residual_add", "attention"])
def test_mixed_encodings_equal_encode(name):
    model, groups, stats, _ = _prepared(name)
    table = encodings_table(model, groups, stats, (LOW, HIGH))
    for c in candidates(groups, LOW, HIGH):
        mine, ref = mixed_encodings(table, groups, c.plan), encode(model, groups, stats, c.plan, scheme=QuantScheme())
        assert set(mine.activations) == set(ref.activations)
        assert set(mine.weights) == set(ref.weights)
        for t, e in ref.activations.items():
            np.testing.assert_array_equal(mine.activations[t].scale, e.scale)
            assert mine.activations[t].bits == e.bits


def test_proxy_batches_keep_every_kth_row_and_pad():
    a = {"ids": np.ones((4, 3), np.int64)}
    b = {"ids": np.ones((4, 5), np.int64)}
    out = proxy_batches([a, b], 0.5, batch_size=8, max_pad=2.0)
    assert len(out) == 1 and out[0]["ids"].shape == (4, 5)
    assert out[0]["ids"][:2, 3:].sum() == 0


def test_analyze_end_to_end_and_json_round_trip():
    model, groups, stats, feeds = _prepared("layernorm_block", n=4)
    a = analyze(
        model, groups, stats, feeds, scorer=Scorer(), proxy_fraction=1.0, recover_top=(1, 2)
    )
    assert {s.group for s in a.sensitivity} == set(groups.names())
    assert len(a.offenders) == len(groups.groups) and len(a.recovery) == 2
    assert set(a.baselines) == {"a8_w8", "a16_w16"} and set(a.collapse) == {"a8_w8", "a16_w16"}
    assert all(n.sqnr_cumulative_db is not None for n in a.noise)
    text = json.dumps(analysis_to_dict(a))
    back = analysis_from_dict(json.loads(text))
    assert analysis_to_dict(back) == analysis_to_dict(a)
    assert "top offenders" in summary_text(a)
    # promoting the top offender improves the low plan's output SQNR
    assert a.recovery[0].metrics["sqnr_db"] > a.baselines["a8_w8"]["sqnr_db"]


def test_analysis_rejects_unknown_keys():
    model, groups, stats, feeds = _prepared("residual_add")
    d = analysis_to_dict(
        analyze(model, groups, stats, feeds, scorer=Scorer(), proxy_fraction=1.0, recover_top=(1,))
    )
    with pytest.raises(QuantscopeError, match="unknown key 'bogus'"):
        analysis_from_dict({**d, "bogus": 1})
    with pytest.raises(QuantscopeError, match="format"):
        analysis_from_dict({**d, "format": "x/2"})


def test_density_batches_take_dense_rows_within_budget_in_order():
    short = {"ids": np.arange(8, dtype=np.int64).reshape(4, 2)}  # width 2
    long = {"ids": np.arange(16, dtype=np.int64).reshape(4, 4) + 100}  # width 4
    noise = [np.array([1.0, 9.0, 2.0, 8.0]), np.array([20.0, 1.0, 1.0, 30.0])]
    # densities: short 0.5 4.5 1 4; long 5 .25 .25 7.5 -> long[3], long[0], short[1], short[3]
    out, carried = density_batches([short, long], noise, budget=0.5, batch_size=8)
    ids = np.concatenate([b["ids"][:, 0] for b in out])
    # total cost 24, budget 12: long[3] (4), long[0] (4), short[1] (2), short[3] (2)
    assert sorted(ids.tolist()) == [2, 6, 100, 112]
    assert ids.tolist() == [2, 6, 100, 112]  # original (length-sorted) order kept
    assert carried == pytest.approx((30 + 20 + 9 + 8) / 72)
    assert out[0]["ids"].shape[1] == 4 and out[0]["ids"][0, 2:].sum() == 0  # zero-padded


def test_sweep_fast_rows_equal_the_exact_sweep_on_the_same_rows():
    model, groups, stats, feeds = _prepared("layernorm_block", n=4)
    kw = {"scorer": Scorer(), "low": LOW, "high": HIGH}
    fast = sweep_fast(model, groups, stats, feeds, fraction=0.5, **kw)
    counts = dict(fast.row_counts)
    total = sum(len(next(iter(f.values()))) for f in feeds)
    assert 0 < counts["enable_one"] < total and 0 < counts["disable_one"] < total
    exact = sweep_segments(model, groups, stats, feeds, **kw)
    ref_all = exact.ref_rows
    for i, c in enumerate(fast.candidates):
        j = exact.candidates.index(c)
        # every row the fast sweep scored is an FP32 row of the full data ...
        ref = fast.ref_of(i)
        hit = [np.flatnonzero(np.all(np.isclose(ref_all, r, atol=1e-6), axis=1)) for r in ref]
        assert all(len(h) == 1 for h in hit)
        # ... and the candidate's rows there equal the exact sweep's rows
        idx = np.array([h[0] for h in hit])
        np.testing.assert_allclose(fast.rows[i], exact.rows[j][idx], rtol=1e-5, atol=1e-5)


def test_analyze_default_fast_path_selects_rows_by_the_uniform_low_noise():
    model, groups, stats, feeds = _prepared("layernorm_block", n=4)
    a = analyze(model, groups, stats, feeds, scorer=Scorer(), proxy_fraction=0.5,
                recover_top=(1,))
    rows = a.method["rows_per_sweep"]
    total = a.method["rows"]
    assert 0 < rows["enable_one"] < total and 0 < rows["disable_one"] < total
    assert a.method["sweep"] == "segments+density"
    assert len(a.offenders) == len(groups.groups)


def test_a_dead_node_does_not_break_the_segment_sweep():
    """A node whose output nothing reads (and is no graph output) is a segment with no
    outputs: it is skipped, not run (ORT refuses a run with no output requested)."""
    import onnx
    from onnx import helper

    proto = tm.layernorm_block()
    proto.graph.node.append(helper.make_node("ReduceMean", ["y"], ["dead"], axes=[1],
                                             keepdims=0, name="dead_mean"))
    onnx.checker.check_model(proto)
    model = load_proto(proto, "dead")
    groups = find_groups(model)
    feeds = [tm.sample_inputs(model.proto, seed=i) for i in range(3)]
    stats = calibrate(model, groups, feeds)
    kw = {"scorer": Scorer(), "low": LOW, "high": HIGH}
    fast = sweep_segments(model, groups, stats, feeds, **kw, optimize_float=False)
    naive = sweep_naive(model, groups, stats, feeds, **kw)
    for a, b in zip(fast.rows, naive.rows, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_a_group_gaining_nothing_promoted_alone_is_not_listed_as_an_offender():
    """analyze's 'top offenders' listed groups whose promotion alone lowered the output's
    SQNR (20.4 -> 14.3 dB on a small conv model); analysis.json keeps every row."""
    import dataclasses

    from quantscope.analyze.report import Offender

    model, groups, stats, feeds = _prepared("residual_add")
    a = analyze(model, groups, stats, feeds, scorer=Scorer(), proxy_fraction=1.0)
    rows = (Offender("good", 3.0, ()), Offender("worse", -6.1, ("x",)))
    text = summary_text(dataclasses.replace(a, offenders=rows))
    assert "good  (+3.0 dB)" in text and "worse" not in text
    assert "(1 group(s) gain nothing promoted alone: not listed)" in text
    none = summary_text(dataclasses.replace(a, offenders=rows[1:]))
    assert "none: promoting any one group alone gains nothing" in none
    from quantscope.report.build import analysis_section

    html = analysis_section(analysis_to_dict(dataclasses.replace(a, offenders=rows)))
    assert "good" in html and "worse" not in html


def test_the_planner_names_the_key_the_offenders_were_ranked_by():
    """Tensor data ranks offenders by the worst output channel's SQNR; the planner read
    their gains as 'output_sqnr_db' from the whole output's baseline, and every reason said
    '+0.000 dB output_sqnr_db predicted'. The analysis records its key; an older file
    without it reads as before."""
    from quantscope.serde import sensitivity_from_dict

    model, groups, stats, feeds = _prepared("conv_net")
    a = analysis_to_dict(analyze(model, groups, stats, feeds, scorer=Scorer(),
                                 proxy_fraction=1.0))
    assert a["method"]["ranked_by"] == "sqnr_db"  # this scorer reports no channel
    low = {**a["baselines"]["a8_w8"], "sqnr_db_channel_min": 12.5}
    a = {**a, "primary": "sqnr_db_channel_min", "baselines": {**a["baselines"], "a8_w8": low},
         "method": {**a["method"], "ranked_by": "sqnr_db_channel_min"}}  # as run's tensors
    sens = sensitivity_from_dict(a)
    assert sens.metric == "sqnr_db_channel_min"
    assert sens.base == pytest.approx(a["baselines"]["a8_w8"]["sqnr_db_channel_min"])
    old = {**a, "method": {k: v for k, v in a["method"].items() if k != "ranked_by"}}
    sens = sensitivity_from_dict(old)
    assert sens.metric == "output_sqnr_db"
    assert sens.base == pytest.approx(a["baselines"]["a8_w8"]["sqnr_db"])
