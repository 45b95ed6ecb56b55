"""h42's bad inputs, round 2: the leftovers h37 named, each refused before any work and
any file (or said), and the resumable run folder under kills and tampering."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import tiny_models as tm
from test_h37_bad_inputs import _bert_sized_encoder

from quantscope.cli import main


def _model_and_data(tmp_path: Path, n: int = 8) -> tuple[str, str]:
    onnx.save(tm.layernorm_block(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy",
            np.random.default_rng(0).normal(0, 1, (n, 5, 24)).astype(np.float32))
    return str(tmp_path / "m.onnx"), str(tmp_path / "x.npy")


def _pairs(path: Path, n: int, start: int = 0) -> str:
    path.write_text("".join(
        json.dumps({"query": f"sort a list {i}", "document": f"sorted() returns {i}"}) + "\n"
        for i in range(start, start + n)))
    return str(path)


def test_a_metric_the_task_lacks_is_refused_before_any_file(tmp_path, capsys):
    """run --metric bogus: found at the plan stage, after calibrate and analyze had written
    their files (and the auto rewrites had 'chosen by bogus')."""
    model, data = _model_and_data(tmp_path)
    out = tmp_path / "w"
    assert main(["run", model, "--data", data, "--target", "hailo8", "--metric", "bogus",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("quantscope: error: --metric 'bogus' is no figure of this "
                              "data's task: use one of "), err
    assert "sqnr_db_channel_min" in err[-1] and "cosine_min" in err[-1]
    assert not out.exists()
    # a figure of the task (not its headline) runs
    assert main(["run", model, "--data", data, "--target", "hailo8", "--metric", "cosine_min",
                 "--out", str(out)]) == 0


def test_a_metric_retrieval_pairs_lack_is_refused_before_any_file(tmp_path, capsys):
    _bert_sized_encoder(tmp_path / "enc.onnx")
    pairs = _pairs(tmp_path / "p.jsonl", 8)
    out = tmp_path / "w"
    assert main(["run", str(tmp_path / "enc.onnx"), "--data", pairs, "--target", "hailo8",
                 "--metric", "mask_iou", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--metric 'mask_iou' is no figure" in err and "recall@5" in err, err
    assert not out.exists()
