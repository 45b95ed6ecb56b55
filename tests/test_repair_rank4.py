"""The rank-4 rewrite (QNN HTP v73 q::linearclip) on a tiny ViT block built here."""

import json

import numpy as np
import onnx
import tiny_vit

from quantscope.calibrate.collect import calibrate
from quantscope.cli import main
from quantscope.emulate.qdq import quantize_model
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.plan.check import check
from quantscope.repair.apply import run_repairs
from quantscope.repair.rank4 import UNVERIFIED, rank4_linears
from quantscope.repair.verify import run_all
from quantscope.targets import load_target
from quantscope.types import Plan, Precision

QNN = load_target("qnn-htp-v73")


def _setup():
    model = load_proto(tiny_vit.vit_block())
    feeds = [tiny_vit.tokens(4, seed=i) for i in range(2)]
    return model, feeds, calibrate(model, find_groups(model), iter(feeds))


def _linears(model) -> set[str]:
    return {n.name for n in model.graph.node
            if n.op_type == "MatMul" and n.input[1].startswith("w_")}


def _linearclip(model) -> set[str]:
    probs = check(Plan.uniform(Precision.A16_W8), find_groups(model), model, QNN)
    return {p.group for p in probs if p.rule == "qnn.linearclip_5d"}


def _groups_by_name(model):
    names = {model.graph.node[i].name: model.graph.node[i].op_type
             for i in range(len(model.graph.node))}
    return {g.name: (names[g.name], g.kind) for g in find_groups(model).groups}


def test_rewrite_keeps_fp32_and_removes_every_linearclip_finding():
    model, feeds, stats = _setup()
    assert len(_linears(model)) == 6 and _linearclip(model) == _linears(model)  # every 3-D Linear + bias, nothing else
    run = run_repairs(model, stats, Plan.uniform(Precision.A16_W8), feeds, repairs=["rank4"])
    (record,) = run.records
    assert record.skipped is None and record.fp32_check is not None
    assert record.fp32_check <= 1e-5 and UNVERIFIED in record.reason
    new = load_proto(run.proto)
    before, after = run_all(model.proto, feeds), run_all(new.proto, feeds)
    for b, a in zip(before, after, strict=True):
        assert a[0].shape == b[0].shape and np.abs(a[0] - b[0]).max() <= 1e-5
    assert _linearclip(new) == set()
    # the groups a plan decides on are the same (names and kinds)
    assert _groups_by_name(new) == _groups_by_name(model)
    shapes = new.value_shapes()
    assert len(shapes["q"]) == 3 and len(shapes["q/4d"]) == 4


def test_rewritten_qdq_runs_in_ort_and_tracks_the_original():
    model, feeds, stats = _setup()
    repaired = load_proto(rank4_linears(model).proto)
    new_stats = calibrate(repaired, find_groups(repaired), iter(feeds))
    plan = Plan.uniform(Precision.A16_W8)
    q_old = quantize_model(model, stats, plan, scheme=QNN.scheme).proto
    q_new = quantize_model(repaired, new_stats, plan, scheme=QNN.scheme).proto
    onnx.checker.check_model(q_new)
    ref, old, new = (run_all(p, feeds) for p in (model.proto, q_old, q_new))
    for r, o, n in zip(ref, old, new, strict=True):
        assert np.isfinite(n[0]).all()
        err = np.abs(n[0] - r[0]).max()
        assert 0 < err < 0.05 * np.abs(r[0]).max()  # quantized (not bypassed), a16 close
        # the same grids on the same tensors: the rewrite does not change the emulation
        assert np.abs(n[0] - o[0]).max() <= 1e-4 * np.abs(r[0]).max()


def test_cli_repair_rank4_then_check_is_clean(tmp_path, capsys):
    onnx.save(tiny_vit.vit_block(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", tiny_vit.tokens(8, seed=3)["x"])
    data = ["--data", str(tmp_path / "x.npy")]
    assert main(["calibrate", str(tmp_path / "m.onnx"), *data,
                 "--out", str(tmp_path / "s.npz")]) == 0
    assert main(["repair", str(tmp_path / "m.onnx"), *data, "--stats", str(tmp_path / "s.npz"),
                 "--precision", "a16_w8", "--repairs", "rank4", "--no-evaluate",
                 "--out-model", str(tmp_path / "r.onnx"), "--out-stats", str(tmp_path / "r.npz"),
                 "--out-plan", str(tmp_path / "p.json")]) == 0
    plan = json.loads((tmp_path / "p.json").read_text())
    assert [r["name"] for r in plan["repairs"]] == ["rank4"]
    assert "unverified on a device" in plan["repairs"][0]["reason"]
    capsys.readouterr()
    assert main(["check", str(tmp_path / "p.json"), "--model", str(tmp_path / "m.onnx"),
                 "--target", "qnn-htp-v73"]) == 1
    out = capsys.readouterr().out
    assert "qnn.linearclip_5d" in out and "UNVERIFIED ON A DEVICE" in out
    assert main(["check", str(tmp_path / "p.json"), "--model", str(tmp_path / "r.onnx"),
                 "--target", "qnn-htp-v73"]) == 0
