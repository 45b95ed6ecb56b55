"""h44: the leftovers -- a --metric found too late by plan and whatif, text data's metric
check run on every pair, a killed stage resumed silently, dead channels, a plan worse held
out than uniform a8_w8 shipped."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_models as tm
from test_h37_bad_inputs import _bert_sized_encoder

from quantscope import stages
from quantscope.cli import main


def _model_data_stats(tmp_path: Path) -> dict[str, str]:
    onnx.save(tm.layernorm_block(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy",
            np.random.default_rng(0).normal(0, 1, (8, 5, 24)).astype(np.float32))
    f = {k: str(tmp_path / v) for k, v in (("model", "m.onnx"), ("data", "x.npy"),
                                           ("stats", "s.npz"), ("analysis", "a.json"))}
    assert main(["calibrate", f["model"], "--data", f["data"], "--out", f["stats"]]) == 0
    assert main(["analyze", f["model"], "--data", f["data"], "--stats", f["stats"],
                 "--target", "hailo8", "--out", f["analysis"]]) == 0
    return f


def _no_work(*args: object, **kwargs: object) -> None:
    raise AssertionError("measured before --metric was checked")


def test_plan_and_whatif_refuse_a_metric_before_measuring(tmp_path, capsys, monkeypatch):
    """plan --metric bogus (and whatif's) was refused only after the first plan (whatif:
    every lifted plan) had been built and measured."""
    f = _model_data_stats(tmp_path)
    assert main(["plan", f["model"], "--analysis", f["analysis"], "--target", "hailo8",
                 "--max-cost", "1.0", "--out", str(tmp_path / "p1.json")]) == 0
    capsys.readouterr()
    monkeypatch.setattr(stages, "plan_model", _no_work)
    monkeypatch.setattr(stages, "whatif_families", _no_work)
    out = tmp_path / "p.json"
    assert main(["plan", f["model"], "--analysis", f["analysis"], "--data", f["data"],
                 "--stats", f["stats"], "--target", "hailo8", "--metric", "bogus",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "quantscope: error: --metric 'bogus' is no figure of this data's task: use one of "
    ), err
    assert "sqnr_db_channel_min" in err[0] and not out.exists()
    assert main(["whatif", f["model"], "--data", f["data"], "--stats", f["stats"],
                 "--plan", str(tmp_path / "p1.json"), "--metric", "bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--metric 'bogus' is no figure" in err[0], err


def _pairs(path: Path, n: int) -> str:
    return tm.write_pairs(path, n)


def test_a_metric_on_text_pairs_is_checked_on_a_few_pairs(tmp_path, monkeypatch):
    """run --metric on text pairs ran FP32 on every evaluation text before the run folder
    existed (minilm-l3: 10 s); the figures' names come from the task on its first pairs."""
    from quantscope.analyze import measure

    _bert_sized_encoder(tmp_path / "enc.onnx")
    model = stages.open_model(str(tmp_path / "enc.onnx"))
    data = stages.open_data(_pairs(tmp_path / "p.jsonl", 40), model, show=False)
    rows: list[int] = []
    real = measure.run_model

    def counted(proto: onnx.ModelProto, batches: list, **kw: object) -> object:
        rows.extend(len(next(iter(b.values()))) for b in batches)
        return real(proto, batches, **kw)

    monkeypatch.setattr(measure, "run_model", counted)
    measure.check_metric(model, data, "recall@5")  # a figure of the task: passes
    assert sum(rows) == 2 * measure.CHECK_PAIRS, rows
    with pytest.raises(stages.QuantscopeError, match="'mask_iou' is no figure.*recall@5"):
        measure.check_metric(model, data, "mask_iou")


def _dead_channel_model(path: Path) -> None:
    """y = Relu(x W + b) + c - c: channel 0's bias keeps it at exactly 0 in FP32, while the
    quantized model's Add grid (c on it) lifts it off 0 by its rounding."""
    from onnx import TensorProto
    from onnx import helper as h
    from onnx import numpy_helper as nh

    r = np.random.default_rng(0)
    b = np.zeros(6, np.float32)
    b[0] = -1000.0
    g = h.make_graph([
        h.make_node("MatMul", ["x", "W"], ["m"]), h.make_node("Add", ["m", "b"], ["a"]),
        h.make_node("Relu", ["a"], ["r"]), h.make_node("Add", ["r", "c"], ["s"]),
        h.make_node("Sub", ["s", "c"], ["y"])], "dead",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])],
        [nh.from_array(r.normal(0, 1, (8, 6)).astype(np.float32), "W"), nh.from_array(b, "b"),
         nh.from_array(np.full(6, 0.37, np.float32), "c")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, path)


def _dead_outputs() -> tuple[object, object]:
    from quantscope.types import Outputs

    r = np.random.default_rng(1)
    ref = r.normal(0, 1, (16, 4)).astype(np.float32)
    ref[:, 0] = 0.0  # a ReLU unit the data never activates
    test = ref + r.normal(0, 1e-3, ref.shape).astype(np.float32)  # lifted off 0 a little
    return (Outputs(names=("y",), batches=((ref,),)), Outputs(names=("y",), batches=((test,),)))


def test_channels_with_no_fp32_signal_are_counted_where_left_out():
    """Both paths computing the worst channel left out channels FP32 holds at 0 but said
    nothing: the figure read as every channel's worst, and nobody knew 1 of 4 was not in it."""
    from quantscope.analyze.scoring import outputs_scorer
    from quantscope.emulate.evaluate import output_fidelity

    ref, test = _dead_outputs()
    m = output_fidelity(ref, test)
    assert np.isfinite(m.values["sqnr_db_channel_min"]) and m.values["sqnr_db_channel_min"] > 40
    assert m.tables["y"]["channels_left_out"] == 1 and m.values["channels_left_out"] == 1
    assert any("1 of 4 channels of axis 1 are 0 in FP32 on every value" in n
               for n in m.notes), m.notes
    # the analysis' scorer: the same rule, the same count
    scorer = outputs_scorer()
    rows = scorer.reduce(ref.batches[0], {"x": np.zeros((16, 8), np.float32)})
    got = scorer.score(rows, scorer.reduce(test.batches[0], {"x": np.zeros((16, 8))}))
    assert got["sqnr_db_channel_min"] == pytest.approx(m.values["sqnr_db_channel_min"])
    assert got["channels_left_out"] == 1.0
    # every channel alive: nothing counted, no key
    live = output_fidelity(test, ref)
    assert "channels_left_out" not in live.values


def test_run_says_how_many_channels_its_headline_leaves_out(tmp_path, capsys):
    _dead_channel_model(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy",
            np.random.default_rng(0).normal(0, 1, (16, 8)).astype(np.float32))
    out = tmp_path / "w"
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npy"),
                 "--target", "hailo8", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert ("warning: output 'y': 1 of 6 channels of axis 1 are 0 in FP32 on every value of "
            "this data: left out of sqnr_db_channel_min") in said, said
    v = json.loads((out / "verdict.json").read_text())
    assert len(v["channels_left_out"]) == 1
    assert v["quality"]["plan"]["sqnr_db_channel_min"] > 20
    ev = json.loads((out / "evaluate.json").read_text())
    assert ev["results"]["plan"]["metrics"]["channels_left_out"] == 1
    assert "worse_held_out" in v  # None here: the plan is not worse held out


def _verdict(plan: float, uni: float, *, metric: str = "psnr_db", cost: float = 7.37,
             items: int | None = None) -> dict:
    from quantscope.pipeline.held_out import worse_held_out

    quality = {"plan": {metric: plan}, "a8_w8": {metric: uni}}
    if items:
        quality["plan"][f"{metric}_items"] = quality["a8_w8"][f"{metric}_items"] = items
    v = {"metric": metric, "higher_is_better": True, "quality": quality, "goal": 45.0,
         "uniform_meets_goal": False}
    v["worse_held_out"] = worse_held_out(metric, "dB" if items is None else "",
                                         quality, cost, higher=True, uniform_meets_goal=False)
    return v


def test_a_plan_worse_held_out_than_uniform_beyond_noise_says_ship_uniform():
    """esrgan-thick on hailo8: the plan bought 7.37x for 38.9 dB held out against uniform
    a8_w8's 42.4 dB, and the verdict only appended 'held out, the plan is -3.5 dB against
    uniform a8_w8 (chosen on the fit data)' to its cost line: nothing said what to do,
    and verdict.json carried nothing."""
    from quantscope.report.summary import _worse_than_uniform

    v = _verdict(38.9, 42.4)
    rec = v["worse_held_out"]
    assert rec["beyond_noise"] and rec["worse_by"] == pytest.approx(3.5)
    line = _worse_than_uniform(v)
    assert line.startswith("held out, the plan is worse than uniform a8_w8 by 3.5 dB "
                           "(38.9 dB at 7.370x against 42.4 dB at 1x; beyond the 0.1 dB "
                           "margin"), line
    assert "ship uniform a8_w8 or add data" in line
    # within the margin: said as a difference, no advice
    near = _verdict(42.35, 42.4)
    assert not near["worse_held_out"]["beyond_noise"]
    assert "ship uniform" not in _worse_than_uniform(near)
    # a share the task counts items of: its binomial noise decides
    few, many = (_verdict(0.90, 0.95, metric="top1_agreement", items=n) for n in (40, 2000))
    assert not few["worse_held_out"]["beyond_noise"]
    assert many["worse_held_out"]["beyond_noise"]
    assert "binomial noise" in many["worse_held_out"]["line"]
    # a plan no dearer than a8_w8, or better held out: nothing to say
    assert _verdict(38.9, 42.4, cost=1.0)["worse_held_out"] is None
    assert _verdict(42.5, 42.4)["worse_held_out"] is None


KILLED_AFTER_ESTIMATE = """
import os, signal, sys
from quantscope.analyze import sweeps
from quantscope.cli import main
said = sweeps.note_memory_estimate
def killed(text, peak=None):
    said(text, peak)  # kept in run.json, then the kernel's OOM killer: SIGKILL, no word
    os.kill(os.getpid(), signal.SIGKILL)
sweeps.note_memory_estimate = killed
sys.exit(main(sys.argv[1:]))
"""


def test_a_run_killed_by_sigkill_is_said_on_the_rerun_with_its_memory_estimate(tmp_path,
                                                                               capsys):
    """A run the kernel's out-of-memory killer ends (SIGKILL) printed nothing, and the
    rerun resumed without a word: nobody learnt which stage died, nor what it needed."""
    import subprocess
    import sys

    onnx.save(tm.layernorm_block(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy",
            np.random.default_rng(0).normal(0, 1, (8, 5, 24)).astype(np.float32))
    out = tmp_path / "w"
    args = ["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npy"), "--target",
            "hailo8", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    p = subprocess.run([sys.executable, "-c", KILLED_AFTER_ESTIMATE, *args], env=env,
                       check=False, capture_output=True)
    assert p.returncode == -9, p.stderr.decode()[-500:]
    left = json.loads((out / "run.json").read_text())["started"]
    assert left["stage"] == "analyze" and "GB peak" in left["memory_estimate"], left
    assert "ended" not in left
    capsys.readouterr()
    assert main(args) == 0  # the rerun, in this process (the killed run was another one)
    p = capsys.readouterr()
    said = [ln for ln in p.err.splitlines() if "never finished" in ln]
    assert len(said) == 1, p.err[-2000:]
    assert said[0].startswith(f"[analyze] started {left['at']} (pid {left['pid']}) and never "
                              "finished: the process ended without finishing it and without "
                              "a word (killed: SIGKILL"), said
    assert f"the stage estimated {left['memory_estimate']}" in said[0]
    assert "to lower it: give smaller samples (a smaller --input-shape or --seq-len)" in said[0]
    assert said[0].endswith(": resuming at it")
    assert "stages run: analyze," in p.out  # resumed there
    assert "note: resumed: [analyze] started" in p.out
    manifest = json.loads((out / "run.json").read_text())
    assert "started" not in manifest and manifest["unfinished"][0]["stage"] == "analyze"
    v = json.loads((out / "verdict.json").read_text())
    assert v["resumed_after"][0].endswith("resumed by a later run")
    assert "note: resumed: [analyze] started" in (out / "report.html").read_text()


def test_a_run_interrupted_is_said_as_interrupted_on_the_rerun(tmp_path, capsys,
                                                               monkeypatch):
    import dataclasses

    from quantscope import pipeline

    f = {"m": tmp_path / "m.onnx", "x": tmp_path / "x.npy"}
    onnx.save(tm.layernorm_block(), f["m"])
    np.save(f["x"], np.random.default_rng(0).normal(0, 1, (8, 5, 24)).astype(np.float32))
    args = ["run", str(f["m"]), "--data", str(f["x"]), "--target", "hailo8",
            "--out", str(tmp_path / "w")]
    spec = pipeline.STAGES["plan"]

    def interrupted(ctx: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setitem(pipeline.STAGES, "plan", dataclasses.replace(spec, run=interrupted))
    assert main(args) == 130
    left = json.loads((tmp_path / "w" / "run.json").read_text())["started"]
    assert left["stage"] == "plan" and left["ended"] == "interrupted (Ctrl-C)"
    monkeypatch.setitem(pipeline.STAGES, "plan", spec)
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert f"[plan] started {left['at']} (pid {left['pid']}) and never finished: the process " \
           "ended without finishing it: interrupted (Ctrl-C): resuming at it" in err, err[-1500:]


def test_a_stage_that_failed_for_memory_is_said_with_its_estimate():
    from quantscope.pipeline.manifest import _ended, unfinished_line

    left = {"stage": "analyze", "at": "2026-11-30 12:00:00 UTC", "pid": 7,
            "memory_estimate": "~5.20 GB peak (...)",
            "ended": _ended(MemoryError("Unable to allocate 3.1 GiB for an array"))}
    line = unfinished_line(left)
    assert line.startswith("[analyze] started 2026-11-30 12:00:00 UTC (pid 7) and never "
                           "finished: the process ended without finishing it: failed: "
                           "MemoryError: Unable to allocate 3.1 GiB for an array (the stage "
                           "estimated ~5.20 GB peak (...); to lower it: give smaller samples"), line
    assert unfinished_line({**left, "ended": _ended(KeyboardInterrupt())}).endswith(
        "interrupted (Ctrl-C): resuming at it")
