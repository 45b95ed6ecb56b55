"""h49: ``run``'s held-out check of a figure in dB judged the plan worse than uniform a8_w8
against a flat 0.1 dB margin ("no noise estimate"), whatever the samples said: a plan worse
by 0.05 dB on many steady samples was "within" it, one worse by 0.5 dB on five noisy
samples "beyond" it, and the verdict told the user to ship uniform a8_w8 on noise. The
evaluate stage now keeps the headline's per-sample powers for the plan and a8_w8 (the same
held-out samples: a paired difference), and the check reads its jackknife noise."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from held_out_helpers import assert_beyond_noise, check_held_out, measured
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main
from quantscope.pipeline.held_out import headline_parts
from quantscope.tasks.db_noise import Parts, db_noise, parts_of, parts_record, pooled_db

METRIC = "sqnr_db"


def _held_out(samples: int, spread: float, worse: float, seed: int) -> dict:
    """evaluate.json's plan and a8_w8 results on ``samples`` held-out outputs: a8_w8's
    error per sample scaled by a spread factor (``spread``: how much the samples' noise
    differs), the plan's by ``worse`` more, measured as ``run``'s evaluate measures them
    (per-sample powers kept) and written as JSON."""
    rng = np.random.default_rng(seed)
    ref = rng.normal(0, 1, (samples, 64)).astype(np.float32)
    scale = np.exp(rng.normal(0, spread, (samples, 1))).astype(np.float32)
    err = rng.normal(0, 0.01, (samples, 64)).astype(np.float32) * scale
    grow = rng.normal(worse, worse * spread, (samples, 1)).astype(np.float32)
    return measured({"y": ref}, {"a8_w8": {"y": ref + err},
                                 "plan": {"y": ref + err * (1 + grow)}}, METRIC)


def _worse(results: dict) -> dict | None:
    return check_held_out(results, METRIC)


def test_worse_by_less_than_0_1_db_beyond_its_jackknife_noise_says_ship_uniform():
    """Many steady samples: 0.05 dB worse is measurably worse; the flat margin called it
    within noise and gave no advice."""
    results = _held_out(200, 0.5, 0.006, seed=0)
    assert_beyond_noise(_worse(results), 200)


def test_worse_by_more_than_0_1_db_within_its_jackknife_noise_gives_no_advice():
    """Five samples whose error differs widely: 0.5 dB worse is within the noise of the
    difference; the flat margin said beyond it and told the user to ship a8_w8."""
    results = _held_out(5, 1.0, 0.05, seed=0)
    rec = _worse(results)
    assert rec is not None and rec["worse_by"] > 0.1, rec
    assert rec["noise_from"] == "jackknife" and rec["margin"] > rec["worse_by"], rec
    assert not rec["beyond_noise"], rec
    assert "within one-sided 95% jackknife noise" in rec["line"], rec["line"]
    assert "ship uniform" not in rec["line"]


def test_the_verdict_reads_the_powers_evaluate_json_keeps():
    """run's verdict hands the kept powers to the check (it judged by 0.1 dB before)."""
    from quantscope.pipeline.verdict import _worse

    results = _held_out(200, 0.5, 0.006, seed=0)
    ev = {"metric": METRIC, "unit": "dB", "higher_is_better": True, "results": results}
    quality = {k: {METRIC: r["metrics"][METRIC]} for k, r in results.items()}
    rec = _worse(ev, {"ships": "plan"}, quality, 1.3, {})
    assert rec["noise_from"] == "jackknife" and rec["beyond_noise"], rec
    assert rec["worse_by"] < 0.1


def test_without_powers_the_flat_margin_stays_and_says_why():
    """An evaluate.json written before the powers were kept (a resumed run folder), or
    powers of another figure: the 0.1 dB margin, said as no noise estimate."""
    results = _held_out(50, 0.02, 0.006, seed=0)
    old = {k: {"metrics": r["metrics"]} for k, r in results.items()}
    rec = _worse(old)
    assert rec["noise_from"] == "margin" and rec["margin"] == pytest.approx(0.1)
    assert "no noise estimate: evaluate.json keeps no per-sample powers" in rec["line"]
    # powers that do not pool to the figure reported are not its powers
    results["plan"]["metrics"][METRIC] -= 0.01
    assert set(headline_parts(results, METRIC)) == {"a8_w8"}
    # fewer than 3 samples: no jackknife, said
    two = _held_out(2, 0.02, 0.05, seed=0)
    assert set(headline_parts(two, METRIC)) == {"plan", "a8_w8"}
    assert "fewer than 3 samples" in _worse(two)["noise"]


def test_parts_record_reads_back_bit_for_bit():
    rng = np.random.default_rng(1)
    p = Parts(rng.random((7, 3)), rng.random((7, 3)), "samples")
    got = parts_of(json.loads(json.dumps(parts_record(p))))
    assert got is not None and got.unit == "samples"
    assert np.array_equal(got.signal, p.signal) and np.array_equal(got.noise, p.noise)
    assert parts_of(None) is None and parts_of({"signal": [1.0], "noise": [[1.0]]}) is None


def _mlp(path) -> None:
    """x [N, 16] -> MatMul -> Relu -> MatMul -> y [N, 8], built with onnx.helper."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(0, 0.5, (16, 32)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.5, (32, 8)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], [w1, w2])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_run_keeps_the_headline_powers_of_the_plan_and_a8_w8_held_out(tmp_path):
    """The evaluate stage writes each compared result's per-sample powers of the headline
    (tensor data: the worst channel's SQNR), a few floats per sample, and the verdict's
    check reads them: the jackknife noise of the paired difference exists."""
    _mlp(tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(0, 1, (24, 16)).astype(np.float32))
    out = tmp_path / "w"
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npy"),
                 "--target", "hailo8", "--out", str(out)]) == 0
    ev = json.loads((out / "evaluate.json").read_text())
    metric = ev["metric"]
    assert metric == "sqnr_db_channel_min"
    assert "sample_powers" not in ev["results"]["fp32"]
    parts = headline_parts(ev["results"], metric)
    assert set(parts) == {"plan", "a8_w8"}
    for label, p in parts.items():
        assert p.signal.shape[0] == 12 and p.signal.shape[1] <= 8  # held-out half, channels
        assert pooled_db(p) == pytest.approx(ev["results"][label]["metrics"][metric], abs=1e-9)
    assert db_noise(parts["a8_w8"], parts["plan"]) is not None
    v = json.loads((out / "verdict.json").read_text())
    assert "worse_held_out" in v


def test_the_kept_columns_give_the_interval_of_all_columns():
    """evaluate.json keeps, of a lowest-of-k figure (the worst channel's SQNR over 112
    channels of dlib-face: 1.1 MB of JSON), only the columns the jackknife reads: the
    figure and the interval are those of all the columns."""
    from quantscope.tasks.db_noise import gain_interval, jackknife_columns

    rng = np.random.default_rng(0)
    for _ in range(200):
        units, k = int(rng.integers(3, 40)), int(rng.integers(1, 60))

        def parts(units=units, k=k):
            s = rng.random((units, k)) * np.exp(rng.normal(0, 1, (1, k)))
            n = rng.random((units, k)) ** 3 * np.exp(rng.normal(0, 2, (1, k)))
            if rng.random() < 0.1:  # a column one unit holds all the noise of
                n[1:, 0] = 0.0
            return Parts(s, n, "samples")

        a, b = parts(), parts()
        ra, rb = jackknife_columns(a), jackknife_columns(b)
        assert ra.signal.shape[1] <= k and ra.unit == "samples"
        assert pooled_db(ra) == pytest.approx(pooled_db(a), abs=1e-12)
        full, kept = gain_interval(a, b), gain_interval(ra, rb)
        assert (full is None) == (kept is None)
        if full is not None:
            for key in ("difference", "half_width"):
                assert kept[key] == pytest.approx(full[key], abs=1e-9)


def test_a_retrieval_run_keeps_the_embedding_sqnr_per_held_out_pair(tmp_path):
    """--metric embedding_sqnr_db on text pairs: the powers are per held-out pair (a
    query's and its document's rows together, as the planner's and the tiebreak's)."""
    import tiny_models as tm
    from test_h37_bad_inputs import _bert_sized_encoder

    _bert_sized_encoder(tmp_path / "enc.onnx")
    tm.write_pairs(tmp_path / "pairs.jsonl", 12)
    out = tmp_path / "w"
    assert main(["run", str(tmp_path / "enc.onnx"), "--data", str(tmp_path / "pairs.jsonl"),
                 "--pairs", "6", "--metric", "embedding_sqnr_db", "--target", "hailo8",
                 "--out", str(out)]) == 0
    ev = json.loads((out / "evaluate.json").read_text())
    parts = headline_parts(ev["results"], "embedding_sqnr_db")
    assert set(parts) == {"plan", "a8_w8"}
    assert {p.unit for p in parts.values()} == {"pairs"}
    assert {p.signal.shape for p in parts.values()} == {(6, 1)}
