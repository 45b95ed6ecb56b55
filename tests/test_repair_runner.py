"""The repair registry and runner: names, skip-with-note, FP32 check, timing."""

import json
from dataclasses import replace

import numpy as np
import onnx
import pytest
import tiny_models as tm
from onnx import numpy_helper, parser

from quantscope.calibrate.collect import calibrate
from quantscope.cli import main
from quantscope.model.groups import find_groups
from quantscope.model.load import Model, load_proto
from quantscope.repair.apply import REPAIRS, RepairMemo, run_repairs
from quantscope.repair.bias_correction import bias_step
from quantscope.repair.equalize import equalize_pairs, equalize_step
from quantscope.repair.registry import DEFAULT_REPAIRS, REGISTRY, RepairSpec, repairs_help
from quantscope.types import Plan, Precision, QuantscopeError, Stats


def _sigmoid_net() -> onnx.ModelProto:
    """Conv -> Sigmoid -> Conv: no equalisation site (Sigmoid is not homogeneous)."""
    r = np.random.default_rng(5)
    model = parser.parse_model("""
    <ir_version: 9, opset_import: ["" : 17]>
    sig (float[N, 3, 8, 8] image) => (float[N, 4, 8, 8] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (image, w1, b1)
        s = Sigmoid (c1)
        y = Conv <pads = [1, 1, 1, 1]> (s, w2, b2)
    }
    """)
    weights = {"w1": (6, 3, 3, 3), "b1": (6,), "w2": (4, 6, 3, 3), "b2": (4,)}
    model.graph.initializer.extend(
        numpy_helper.from_array(r.normal(0, 0.3, s).astype(np.float32), k)
        for k, s in weights.items())
    onnx.checker.check_model(model)
    return model


def _setup(proto: onnx.ModelProto) -> tuple[Model, Stats, list[dict]]:
    m = load_proto(proto)
    feeds = [tm.sample_inputs(proto, n=8, seed=i) for i in range(2)]
    return m, calibrate(m, find_groups(m), iter(feeds)), feeds


def test_default_repairs_skip_with_a_note_where_equalisation_finds_no_site(tmp_path, capsys):
    onnx.save(_sigmoid_net(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(0, 1, (16, 3, 8, 8)).astype(
        np.float32))
    args = ["--data", str(tmp_path / "x.npy")]
    assert main(["calibrate", str(tmp_path / "m.onnx"), *args,
                 "--out", str(tmp_path / "s.npz")]) == 0
    code = main(["repair", str(tmp_path / "m.onnx"), *args, "--stats", str(tmp_path / "s.npz"),
                 "--precision", "a8_w8", "--no-evaluate", "--out-model", str(tmp_path / "r.onnx"),
                 "--out-stats", str(tmp_path / "r.npz"), "--out-plan", str(tmp_path / "p.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    records = {r["name"]: r for r in json.loads((tmp_path / "p.json").read_text())["repairs"]}
    assert list(records) == list(DEFAULT_REPAIRS)
    eq = records["equalize"]
    assert eq["changed"] == [] and "Sigmoid" in eq["skipped"] and eq["notes"]
    assert eq["fp32_check"] is None  # nothing applied, nothing to check
    assert "skipped: nothing to change" in out
    assert records["bias"]["skipped"] is None and records["bias"]["changed"]  # the rest ran
    load_proto(onnx.load(tmp_path / "r.onnx"))


def test_registry_names_are_the_cli_names_and_the_records_names():
    assert tuple(REGISTRY) == REPAIRS
    assert set(DEFAULT_REPAIRS) == {"equalize", "smooth", "bias", "ranges"}
    assert all(f"{n}: " in repairs_help() for n in REGISTRY)
    m, stats, feeds = _setup(tm.conv_net())
    run = run_repairs(m, stats, Plan.uniform(Precision.A8_W8), feeds, repairs=list(REPAIRS))
    assert [r.name for r in run.records] == list(REPAIRS)
    assert all(r.seconds > 0 for r in run.records)  # every repair is timed
    fp32 = {r.name: r.fp32_check for r in run.records}
    assert fp32["bias"] is None and fp32["adaround"] is None  # they change FP32 on purpose
    assert fp32["ranges"] == 0.0  # no graph edit
    eq = run.records[0]
    assert eq.changed and eq.skipped is None
    assert 0.0 < eq.fp32_check < 1e-4  # measured against the model before it


def test_runner_keeps_the_repairs_numbers():
    m, stats, feeds = _setup(tm.conv_net())
    run = run_repairs(m, stats, Plan.uniform(Precision.A8_W8), feeds, repairs=["equalize"])
    direct = equalize_pairs(m, feeds)
    assert run.proto.SerializeToString() == direct.proto.SerializeToString()
    assert run.records[0].changed == tuple(c.tensor for c in direct.changes)


def test_a_repair_that_breaks_its_fp32_promise_is_not_applied():
    m, stats, feeds = _setup(tm.conv_net())
    liar = {"bias": RepairSpec(bias_step, keeps_fp32=True, default=False, help="bias, as if "
                               "it kept the FP32 function")}  # a new repair: one entry
    run = run_repairs(m, stats, Plan.uniform(Precision.A8_W4), feeds, repairs=["bias"],
                      registry=liar)
    (r,) = run.records
    assert r.skipped and "changed the FP32 outputs" in r.skipped and r.changed == ()
    assert r.fp32_check is not None and r.fp32_check > 0
    assert run.proto.SerializeToString() == m.proto.SerializeToString()
    assert run.stats is stats


def test_unknown_repair_names_the_known_ones():
    m, stats, feeds = _setup(tm.conv_net())
    with pytest.raises(QuantscopeError, match="unknown repair 'equalize_pairs': use equalize"):
        run_repairs(m, stats, Plan.uniform(Precision.A8_W8), feeds, repairs=["equalize_pairs"])


def test_a_search_runs_the_plan_free_steps_once_with_the_same_result():
    """``RepairMemo``: two plans repaired with equalize (never reads the plan) then bias
    (reads it): equalize and its recalibration run once, bias for each plan, and every
    repaired model, stats and plan equal those of a run without the memo."""
    m, stats, feeds = _setup(tm.conv_net())
    calls: dict[str, int] = {"equalize": 0, "bias": 0}

    def counted(name: str, step):
        def run(inp):
            calls[name] += 1
            return step(inp)
        return run

    reg = {"equalize": replace(REGISTRY["equalize"], run=counted("equalize", equalize_step)),
           "bias": replace(REGISTRY["bias"], run=counted("bias", bias_step))}
    assert not reg["equalize"].reads_plan and reg["bias"].reads_plan
    memo = RepairMemo()
    plans = [Plan.uniform(Precision.A8_W8), Plan.uniform(Precision.A8_W4)]
    for plan in plans * 2:
        got = run_repairs(m, stats, plan, feeds, repairs=["equalize", "bias"], registry=reg,
                          memo=memo)
        want = run_repairs(m, stats, plan, feeds, repairs=["equalize", "bias"])
        assert got.proto.SerializeToString() == want.proto.SerializeToString()
        assert got.plan == want.plan
        assert [r.changed for r in got.records] == [r.changed for r in want.records]
        assert got.stats.tensors.keys() == want.stats.tensors.keys()
        for name, w in want.stats.tensors.items():
            g = got.stats.tensors[name]
            assert (g.min, g.max, g.count) == (w.min, w.max, w.count)
            assert np.array_equal(g.hist, w.hist) and np.array_equal(g.channel_absmax,
                                                                     w.channel_absmax)
    assert calls == {"equalize": 1, "bias": 4}  # without the memo: 4 and 4
    assert (memo.hits, memo.misses) == (3, 1)
    # a memo entry is kept only while no step before it read the plan
    run_repairs(m, stats, plans[0], feeds, repairs=["bias", "ranges"], memo=memo)
    assert (memo.hits, memo.misses) == (3, 1)
