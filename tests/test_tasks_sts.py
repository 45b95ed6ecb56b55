"""Sentence similarity (STS-style): loaders, Spearman, and the task through evaluate."""

import json

import numpy as np
import onnx
import pytest
from test_tasks_text import tiny_encoder

from quantscope import stages
from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.tasks import text
from quantscope.tasks.metrics import spearman
from quantscope.types import Plan, Precision, QuantscopeError

PAIRS = [("a cat sits on the mat", "a cat is on a mat", 4.8),
         ("a man plays the guitar", "someone plays an instrument", 3.6),
         ("the stock market fell", "a cat is on a mat", 0.2),
         ("it is raining today", "the weather is wet", 3.9),
         ("python lists are mutable", "tuples cannot be changed", 2.1),
         ("open the file for reading", "read the file contents", 4.0)]


def _tsv(path, header=True):
    lines = (["sentence1\tsentence2\tscore"] if header else []) + [
        f"{a}\t{b}\t{s}" for a, b, s in PAIRS]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_spearman_matches_the_definition_with_ties():
    a = np.array([1.0, 2.0, 2.0, 3.0, 5.0])
    assert spearman(a, a) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    assert spearman(np.array([1.0, 2, 3, 4]), np.array([1.0, 3, 2, 4])) == pytest.approx(0.8)
    assert np.isnan(spearman(a, np.ones(5)))


def test_loaders_tsv_and_jsonl(tmp_path):
    sts = text.load_sts(_tsv(tmp_path / "p.tsv"))
    assert len(sts) == 6 and sts.scores[0] == 4.8
    j = tmp_path / "p.jsonl"
    j.write_text("\n".join(json.dumps({"sentence1": a, "sentence2": b, "score": s})
                           for a, b, s in PAIRS))
    assert text.is_sts_file(j) and text.load_sts(j).first == sts.first
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\tc\nx\ty\tnot-a-number\n")
    with pytest.raises(QuantscopeError, match="line 2"):
        text.load_sts(bad)


def test_sts_task_through_evaluate_and_plan_metric(tmp_path):
    m = tmp_path / "enc.onnx"
    onnx.save(tiny_encoder(), m)
    model = load_proto(tiny_encoder(), "enc")
    data = stages.open_data(str(_tsv(tmp_path / "p.tsv")), model)
    assert stages.default_metric(data) == "score_agreement"
    stats = stages.calibrate_model(model, data)
    good = stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.A16_W16))["metrics"]
    assert good["score_agreement"] == pytest.approx(1.0)
    assert good["spearman"] == pytest.approx(good["spearman_fp32"])
    low = stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.A8_W4))["metrics"]
    assert -1.0 <= low["score_agreement"] <= 1.0 and low["similarity_mae"] >= 0
    out = tmp_path / "r.json"
    assert main(["evaluate", str(m), "--data", str(tmp_path / "p.tsv"), "--stats",
                 str(_stats(tmp_path, m)), "--precision", "a8_w8", "--json", str(out)]) == 0
    assert "spearman_fp32" in json.loads(out.read_text())["metrics"]


def _stats(tmp_path, m):
    s = tmp_path / "s.npz"
    assert main(["calibrate", str(m), "--data", str(tmp_path / "p.tsv"), "--out", str(s)]) == 0
    return s


def test_evaluate_with_other_stats_does_not_say_it_calibrated_on_the_pairs(tmp_path, capsys):
    """STS data has no calibration texts of its own; the note said 'calibrated on the
    pairs' own sentences' on every command, also on an evaluate given stats calibrated on
    a text file: a false statement of where the ranges came from."""
    m = tmp_path / "enc.onnx"
    onnx.save(tiny_encoder(), m)
    texts = tmp_path / "calib.txt"
    texts.write_text("\n".join(f"{a} and {b}" for a, b, _ in PAIRS) + "\n")
    s = tmp_path / "s.npz"
    assert main(["calibrate", str(m), "--data", str(texts), "--out", str(s)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(m), "--data", str(_tsv(tmp_path / "p.tsv")), "--stats",
                 str(s), "--precision", "a8_w8"]) == 0
    out = capsys.readouterr().out
    assert "calibrated on the pairs' own sentences" not in out
    assert "calibrating on this data uses the pairs' own sentences" in out
