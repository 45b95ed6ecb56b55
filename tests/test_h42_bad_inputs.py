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


def test_eval_data_sharing_samples_with_data_is_refused(tmp_path, capsys):
    """--eval-data holding some of --data's samples (not the same bytes: h37 refused only a
    copy) was evaluated as held out."""
    model, data = _model_and_data(tmp_path)
    x = np.load(data)
    fresh = np.random.default_rng(1).normal(0, 1, (3, 5, 24)).astype(np.float32)
    np.save(tmp_path / "e.npy", np.concatenate([fresh, x[5:]]))  # 3 new, 3 of --data's
    out = tmp_path / "w"
    assert main(["run", model, "--data", data, "--eval-data", str(tmp_path / "e.npy"),
                 "--target", "hailo8", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"quantscope: error: --eval-data '{tmp_path / 'e.npy'}': 3 of its 6 samples are also "
        f"in --data '{data}'"), err
    assert not out.exists()
    np.save(tmp_path / "e.npy", fresh)
    assert main(["run", model, "--data", data, "--eval-data", str(tmp_path / "e.npy"),
                 "--target", "hailo8", "--out", str(out)]) == 0


def test_eval_pairs_sharing_pairs_with_data_are_refused(tmp_path, capsys):
    _bert_sized_encoder(tmp_path / "enc.onnx")
    data = _pairs(tmp_path / "p.jsonl", 8)
    held = _pairs(tmp_path / "h.jsonl", 6, start=6)  # pairs 6, 7 are --data's
    out = tmp_path / "w"
    assert main(["run", str(tmp_path / "enc.onnx"), "--data", data, "--eval-data", held,
                 "--target", "hailo8", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "2 of its 6 pairs are also in --data" in err, err
    assert not out.exists()
    # --pairs 6 fits on pairs 0-5 only: no overlap
    assert main(["run", str(tmp_path / "enc.onnx"), "--data", data, "--eval-data", held,
                 "--pairs", "6", "--target", "hailo8", "--out", str(out)]) == 0
