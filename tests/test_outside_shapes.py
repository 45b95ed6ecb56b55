"""Shapes of models outside the zoo: ``run --input-shape`` reaches the plan and the check,
an unknown size is named as such (not blamed on a rule), sizes that shape inference cannot
compute come from one ORT run on a sample, and an error rule that cannot be evaluated
stays an error."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess

import numpy as np
import onnx
import pytest
from outside_models import computed_pad, feeds
from tiny_models import _with_weights

from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.model.shapes import resolve_shapes, sampled_tensors, shape_note


def ceil_pad(seed: int = 3) -> onnx.ModelProto:
    """``x [N, 3, H, W]`` padded up to a multiple of 8 with pads computed through float
    math (``Cast``, ``Div``, ``Ceil``): neither ONNX's nor ORT's symbolic shape inference
    follows it, even at a concrete input shape. Then Exp (a non-conv layer) and a conv head."""
    r = np.random.default_rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    ceilpad (float[N, 3, H, W] x) => (float[N, 8] y) {
        s = Shape (x)
        hw = Slice (s, i2, i4)
        hf = Cast <to = 1> (hw)
        q = Div (hf, eight)
        c = Ceil (q)
        m = Mul (c, eight)
        d = Sub (m, hf)
        di = Cast <to = 7> (d)
        pads = Concat <axis = 0> (z6, di)
        xp = Pad (x, pads)
        e = Exp (xp)
        c1 = Conv <pads = [1, 1, 1, 1]> (e, w1, b1)
        a = Relu (c1)
        p = GlobalAveragePool (a)
        f = Flatten (p)
        y = Gemm <transB = 1> (f, w2, b2)
    }
    """
    return _with_weights(text, {
        "i2": np.array([2], np.int64), "i4": np.array([4], np.int64),
        "eight": np.array([8.0], np.float32), "z6": np.zeros(6, np.int64),
        "w1": r.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32),
        "b1": r.normal(0, 0.1, 8).astype(np.float32),
        "w2": r.normal(0, 0.3, (8, 8)).astype(np.float32),
        "b2": r.normal(0, 0.1, 8).astype(np.float32)})


def _cli(*args: str) -> subprocess.CompletedProcess:
    """``quantscope ARGS`` in this process (the CLI's ``main``, as the other tests call it:
    a ``python -m quantscope`` per call had spent most of this file's time importing), its
    exit code and its two streams as a finished process's."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(["quantscope", *args], code, out.getvalue(),
                                       err.getvalue())


def test_sample_run_gives_the_shapes_inference_cannot():
    m = load_proto(ceil_pad())
    before = m.proto.SerializeToString()
    assert not all(isinstance(d, int) for d in resolve_shapes(m)["xp"])
    shapes = resolve_shapes(m, {"x": (1, 3, 12, 12)})
    assert m.proto.SerializeToString() == before  # the sample run leaves the model as it was
    assert shapes["xp"] == (1, 3, 16, 16) and shapes["c1"] == (1, 8, 16, 16)
    assert "xp" in sampled_tensors(m, {"x": (1, 3, 12, 12)})
    note = shape_note(m, {"x": (1, 3, 12, 12)})
    assert note and "sample" in note and "x=1x3x12x12" in note and "Pad" in note
    # inference had every shape of the plain computed-pad fixture: no sample run, no note
    plain = load_proto(computed_pad())
    assert resolve_shapes(plain, {"x": (1, 3, 12, 12)})["xp"] == (1, 3, 16, 16)
    assert shape_note(plain, {"x": (1, 3, 12, 12)}) is None


@pytest.fixture
def a16_plan(tmp_path):
    model, plan = tmp_path / "ceil.onnx", tmp_path / "p.json"
    onnx.save(ceil_pad(), model)
    plan.write_text(json.dumps({"format": "quantscope.plan/1", "default": "a16_w16",
                                "target": "hailo10h"}))
    return model, plan


def test_check_unknown_size_fails_an_error_rule_then_a_given_shape_settles_it(a16_plan):
    model, plan = a16_plan
    r = _cli("check", str(plan), "--model", str(model), "--target", "hailo10h")
    assert r.returncode == 1, r.stdout + r.stderr  # was: a warning, exit 0
    # the Exp after the pad (the zero Pad itself shares its input's grid: no decision)
    assert "error: [hailo.super_defuse] Exp_10: could not evaluate: size unknown" in r.stdout
    assert "x [N, 3, H, W]" in r.stdout and "--input-shape x=1x3x<H>x<W>" in r.stdout
    r = _cli("check", str(plan), "--model", str(model), "--target", "hailo10h",
             "--input-shape", "x=1x3x12x12")
    assert r.returncode == 0, r.stdout + r.stderr  # 3 x 16 x 16 values: far under the limit
    assert "could not evaluate" not in r.stdout
    assert "note: shapes of" in r.stdout and "synthetic sample at x=1x3x12x12" in r.stdout


def test_plan_names_an_unknown_size_not_the_rule(tmp_path):
    """Without a shape, the Exp's 16 bit (after a pad computed through float math) is
    refused for an unknown size, and the plan says so (not "blocked by
    hailo.super_defuse"). The gains are given (a sensitivity file in which the Exp is worth
    promoting), so the planner tries that move whatever a measured analysis of this tiny
    model would rank first."""
    model = tmp_path / "pad.onnx"
    onnx.save(ceil_pad(), model)
    sens = {"format": "quantscope.sensitivity/1", "metric": "sqnr_db", "base": 30.0,
            "gains": {"Exp_10": {"a16_w16": 5.0}, "Conv_11": {"a16_w16": 1.0},
                      "GlobalAveragePool_13": {"a16_w16": 0.5}, "Gemm_15": {"a16_w16": 1.0}}}
    (tmp_path / "sens.json").write_text(json.dumps(sens))
    r = _cli("plan", str(model), "--analysis", str(tmp_path / "sens.json"), "--target",
             "hailo8", "--max-cost", "10", "--out", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr[-2000:]
    blockers = json.loads((tmp_path / "p.json").read_text())["pareto"]["blockers"]
    unknown = "hailo.super_defuse (size unknown: give --input-shape NAME=… or --seq-len)"
    assert [b["rule"] for b in blockers] == [unknown]
    assert blockers[0]["groups"] == ["Exp_10"]


def test_run_input_shape_reaches_plan_and_check(tmp_path):
    """Without --input-shape, run takes the size every sample of the data has (12 x 12)
    and says so; the same folder rerun with another --input-shape plans again (the shape
    is in the plan's key) and nothing is blocked; check.json records the shape."""
    model, data, out = tmp_path / "pad.onnx", tmp_path / "d.npz", tmp_path / "run"
    onnx.save(computed_pad(), model)
    np.savez(data, **feeds("computed_pad", 16))
    base = ["run", str(model), "--data", str(data), "--target", "hailo8", "--out", str(out)]
    r = _cli(*base)
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("input-shape: x=1x3x12x12, the size of every sample in the data (plan, check and "
            "compile at it; give --input-shape NAME=DxDx… for another)") in r.stderr
    assert json.loads((out / "check.json").read_text())["input_shapes"] == {"x": [1, 3, 12, 12]}
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["host_steps"][-1].endswith("x=1x3x12x12 (x as the data's samples, the "
                                              "shape checked)")
    r = _cli(*base, "--input-shape", "x=1x3x14x14")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "[plan] done already" not in r.stdout + r.stderr
    assert "the size of every sample in the data" not in r.stderr
    plan = json.loads((out / "plan.json").read_text())
    assert not any("super_defuse" in b["rule"] for b in plan["pareto"]["blockers"])
    check = json.loads((out / "check.json").read_text())
    assert check["input_shapes"] == {"x": [1, 3, 14, 14]}
    # every rule passes; the Hailo operators are said as in no list held (docs/targets.md)
    assert all(r["passed"] for r in check["rules"] if r["rule"] != "ops.unlisted")


def test_run_records_shapes_from_a_sample_run(tmp_path):
    model, data, out = tmp_path / "ceil.onnx", tmp_path / "d.npz", tmp_path / "run"
    onnx.save(ceil_pad(), model)
    np.savez(data, x=np.random.default_rng(0).random((12, 3, 12, 12), np.float32))
    r = _cli("run", str(model), "--data", str(data), "--target", "hailo10h", "--out", str(out),
             "--input-shape", "x=1x3x12x12", "--repairs", "none")
    assert r.returncode == 0, r.stderr[-2000:]
    check = json.loads((out / "check.json").read_text())
    assert "synthetic sample at x=1x3x12x12" in check["shape_note"]
    plan = json.loads((out / "plan.json").read_text())
    assert not any("size unknown" in b["rule"] for b in plan["pareto"]["blockers"])


@pytest.mark.parametrize("specs, says", [
    (["x=1x4x12x12"], "dim 1 is 4, but the model fixes it at 3"),
    (["x=1x3x12"], "has rank 3"),
    (["y=1x3x12x12"], "names 'y', which is no model input"),
    (["x=1x3x12x12", "x=1x3x16x16"], "gives input 'x' twice"),
])
def test_run_refuses_a_contradicted_input_shape_before_any_work(tmp_path, specs, says):
    model, data, out = tmp_path / "pad.onnx", tmp_path / "d.npz", tmp_path / "run"
    onnx.save(computed_pad(), model)
    np.savez(data, **feeds("computed_pad", 4))
    before = model.read_bytes()
    shapes = [a for s in specs for a in ("--input-shape", s)]
    r = _cli("run", str(model), "--data", str(data), "--target", "hailo8", "--out", str(out),
             *shapes)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not out.exists() and model.read_bytes() == before
