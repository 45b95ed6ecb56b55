"""A token-split layer's chunks are swept as one unit (model.units): one candidate moving
every chunk, exact against a full QDQ model of the same plan, its gain split evenly."""

import numpy as np
import onnx
from test_repair_tokens import SEQ, _encoder

from quantscope.analyze import Scorer, sweep_segments
from quantscope.analyze.diagnose import analyze
from quantscope.analyze.report import analysis_from_dict, analysis_to_dict
from quantscope.analyze.rows import run_plan_rows
from quantscope.calibrate.collect import calibrate
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.model.units import TOKENS_KEY, sweep_units
from quantscope.repair.tokens import sample_feeds, split_tokens
from quantscope.serde import sensitivity_from_dict
from quantscope.types import Precision

LOW, HIGH = Precision.A8_W8, Precision.A16_W16


def _split():
    return load_proto(split_tokens(load_proto(_encoder()), seq_len=SEQ, chunk=4).proto)


def _without_metadata(model):
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    kept = [p for p in proto.metadata_props if p.key != TOKENS_KEY]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    return load_proto(proto)


def test_a_split_layers_chunks_are_one_unit_only_when_the_model_says_it_was_split():
    model = _split()
    groups = find_groups(model)
    units = dict(sweep_units(model, groups))
    chunked = {u: m for u, m in units.items() if len(m) > 1}
    assert chunked, units
    for u, members in chunked.items():
        assert u.endswith("/tok*") and all(m.startswith(u[:-1]) for m in members)
        assert [m.rsplit("/tok", 1)[1] for m in members] == ["0", "1"]
        assert len({groups.by_name()[m].op_type for m in members}) == 1
    # every group in exactly one unit, in group order of first members
    flat = [g for m in units.values() for g in m]
    assert sorted(flat) == sorted(groups.names())
    # the same names without the rewrite's record: every group alone
    plain = _without_metadata(model)
    assert all(len(m) == 1 for _, m in sweep_units(plain, find_groups(plain)))
    # ``names``: only these groups, still merged
    some = [g for g in groups.names() if g.endswith("/tok1")]
    assert all(len(m) == 1 and m[0] in some
               for _, m in sweep_units(model, groups, set(some)))


def test_a_units_candidate_is_exactly_its_plan_run_whole():
    model = _split()
    groups = find_groups(model)
    feeds = sample_feeds(model, (SEQ, SEQ, SEQ), seed=3)
    stats = calibrate(model, groups, iter(feeds))
    units = sweep_units(model, groups)
    res = sweep_segments(model, groups, stats, feeds, scorer=Scorer(), low=LOW, high=HIGH,
                         optimize_float=False, units=units)
    assert len(res.candidates) == 2 * len(units) < 2 * len(groups.groups)
    for c, rows in zip(res.candidates, res.rows, strict=True):
        assert set(dict(c.plan.overrides)) == set(c.names)
        q = quantize_model(model, stats, c.plan, scheme=scheme_for(c.plan, None), groups=groups)
        whole = run_plan_rows(model, groups, feeds, q.proto, Scorer())
        np.testing.assert_allclose(rows, whole, rtol=1e-6, atol=1e-6)
    # the isolated noise of every chunk's output is measured, not only the first's
    for _, members in units:
        for g in members:
            for t in groups.by_name()[g].outputs:
                assert t in res.noise_isolated, t


def test_the_analysis_splits_a_units_gain_evenly_and_says_so():
    model = _split()
    groups = find_groups(model)
    feeds = sample_feeds(model, (SEQ, SEQ, SEQ), seed=3)
    stats = calibrate(model, groups, iter(feeds))
    a = analyze(model, groups, stats, feeds, scorer=Scorer(), proxy_fraction=1.0)
    rows = {s.group: s for s in a.sensitivity}
    assert len(rows) == len(groups.groups)
    chunked = [s for s in a.sensitivity if s.unit_size > 1]
    assert chunked and all(s.unit.endswith("/tok*") and s.unit_size == 2 for s in chunked)
    assert a.method["candidates_per_sweep"] < a.method["groups_swept"] == len(groups.groups)
    assert any("swept as" in n and "split evenly" in n for n in a.notes)
    low = a.baselines[LOW.value]["sqnr_db"]
    score = {o.group: o.score_db for o in a.offenders}
    for s in chunked:
        assert np.isclose(score[s.group], (s.disable_one["sqnr_db"] - low) / 2)
        assert rows[s.group.replace("/tok0", "/tok1")].disable_one == s.disable_one \
            if s.group.endswith("/tok0") else True
    # the file form keeps the unit; the planner's gains of a unit's parts add to its gain
    back = analysis_from_dict(analysis_to_dict(a))
    assert back.sensitivity == a.sensitivity
    gains = dict(sensitivity_from_dict(analysis_to_dict(a)).gains)
    s = chunked[0]
    parts = [g for g in rows if rows[g].unit == s.unit]
    total = sum(dict(gains[g])[HIGH] for g in parts)
    assert np.isclose(total, max(s.disable_one["sqnr_db"] - low, 0.0))


def test_a_head_split_layers_heads_are_one_unit():
    from test_repair_heads import HEADS
    from test_repair_heads import _encoder as attention_encoder

    from quantscope.repair.heads import split_heads

    model = load_proto(split_heads(load_proto(attention_encoder())).proto)
    groups = find_groups(model)
    joint = {u: m for u, m in sweep_units(model, groups) if len(m) > 1}
    assert joint and all("/head*" in u and len(m) == HEADS for u, m in joint.items())
    for u, members in joint.items():
        assert [m.replace(u.split("/head*")[0], "", 1).split("/")[1] for m in members] \
            == [f"head{h}" for h in range(HEADS)]
