"""h44: the leftovers -- a --metric found too late by plan and whatif, text data's metric
check run on every pair, a killed stage resumed silently, dead channels, a plan worse held
out than uniform a8_w8 shipped."""

from __future__ import annotations

import json
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
    path.write_text("".join(
        json.dumps({"query": f"sort a list {i}", "document": f"sorted() returns {i}"}) + "\n"
        for i in range(n)))
    return str(path)


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
