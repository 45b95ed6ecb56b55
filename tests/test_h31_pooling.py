"""A token output is mean pooled; a model whose sentence-transformers folder says it pools
by the CLS token (BGE, GTE, Arctic-embed) is refused in one line before any work, not
scored on mean-pooled embeddings it was never trained to give (h31)."""

from __future__ import annotations

import json

import onnx
import pytest
from unseen_encoder import unseen_encoder, write_pairs, write_tokenizer

from quantscope import stages
from quantscope.cli import main
from quantscope.types import QuantscopeError


def _folder(tmp_path, cls: bool, sub: str = ""):
    """A sentence-transformers folder: modules.json, 1_Pooling/config.json, the ONNX
    model (in ``sub``, as optimum's onnx/) and its tokenizer.json."""
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"}]))
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 16, "pooling_mode_cls_token": cls,
        "pooling_mode_mean_tokens": not cls, "pooling_mode_max_tokens": False}))
    where = tmp_path / sub if sub else tmp_path
    where.mkdir(exist_ok=True)
    onnx.save(unseen_encoder(), where / "model.onnx")
    write_tokenizer(where / "tokenizer.json")
    write_pairs(tmp_path / "pairs.jsonl")
    return where / "model.onnx"


@pytest.mark.parametrize("sub", ["", "onnx"])
def test_a_cls_pooled_model_is_refused_in_one_line(tmp_path, sub):
    path = _folder(tmp_path, cls=True, sub=sub)
    model = stages.open_model(path)
    with pytest.raises(QuantscopeError, match=r"pools by cls_token .*1_Pooling.*mean-pools "
                                              r"its token output 'last_hidden_state'"):
        stages.open_data(str(tmp_path / "pairs.jsonl"), model, max_pairs=8)


def test_run_stops_before_the_run_folder(tmp_path, capsys):
    path = _folder(tmp_path, cls=True)
    out = tmp_path / "W"
    code = main(["run", str(path), "--data", str(tmp_path / "pairs.jsonl"), "--target",
                 "hailo10h", "--pairs", "8", "--out", str(out)])
    err = capsys.readouterr().err
    assert code != 0 and not out.exists()
    assert "pools by cls_token" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_a_mean_pooled_folder_is_read_as_before(tmp_path):
    path = _folder(tmp_path, cls=False)
    model = stages.open_model(path)
    data = stages.open_data(str(tmp_path / "pairs.jsonl"), model, max_pairs=8)
    assert data is not None


def test_the_refusal_tells_run_no_option_it_lacks(tmp_path, capsys):
    """An export with its pooled output beside the token output was refused by run with
    'pass --output NAME', which run answers with 'unrecognized arguments' (h38)."""
    path = _folder(tmp_path, cls=True)
    code = main(["run", str(path), "--data", str(tmp_path / "pairs.jsonl"), "--target",
                 "hailo10h", "--pairs", "8", "--out", str(tmp_path / "W")])
    err = capsys.readouterr().err
    assert code == 2 and "pass --output" not in err
    assert "run takes no --output" in err
    assert main(["run", str(path), "--data", str(tmp_path / "pairs.jsonl"), "--target",
                 "hailo10h", "--output", "x", "--out", str(tmp_path / "W")]) == 2
    assert "unrecognized arguments: --output" in capsys.readouterr().err
