"""``--calib-texts N``: text data calibrates on its first N calibration texts; a pairs
file calibrates on the documents of the pairs opened, never on those ``run`` holds out."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_tasks_text import tiny_encoder

from quantscope import stages
from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.types import QuantscopeError, batch_rows


@pytest.fixture(scope="module")
def tiny():
    return load_proto(tiny_encoder(), "tiny")


def _rows(batches) -> int:
    return sum(batch_rows(b) for b in batches)


def test_stdlib_docs_calibrates_on_the_first_n_texts_and_says_so(tiny):
    every = stages.open_data("stdlib-docs", tiny, max_pairs=8)
    first = stages.open_data("stdlib-docs", tiny, max_pairs=8, calib_texts=40)
    assert (_rows(every.calibration), _rows(first.calibration)) == (512, 40)
    assert "calibration on the first 40 of 512 calibration texts (--calib-texts)" in \
        first.notes[0]
    assert "--calib-texts" not in every.notes[0]
    # the evaluation is the same pairs either way
    assert _rows(first.evaluation) == _rows(every.evaluation) == 16
    # the first 40 texts, not the 40 shortest: their token counts are the first 40's
    from quantscope.tasks.text import load_calibration_texts, load_tokenizer

    tok = load_tokenizer()
    want = sorted(min(len(e.ids), 512) for e in tok.encode_batch(
        list(load_calibration_texts("stdlib-docs")[:40])))
    got = sorted(int(n) for b in first.calibration for n in b["attention_mask"].sum(axis=1))
    assert got == want
    more = stages.open_data("stdlib-docs", tiny, max_pairs=8, calib_texts=5000)
    assert _rows(more.calibration) == 512  # at most all of them
    assert "the first 512 of 512" in more.notes[0]


def test_a_pairs_file_calibrates_on_the_documents_of_the_pairs_opened(tmp_path, tiny):
    """``run --pairs 4`` on a 10-pair file fits on pairs 1-4 and holds out 5-8: its
    calibration read the documents of all 10 pairs before (held-out ones among them)."""
    path = tmp_path / "pairs.jsonl"
    rows = [{"query": f"query number {i}", "document": f"document {i} " + "word " * i}
            for i in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = stages.open_data(str(path), tiny, max_pairs=4)
    assert _rows(ds.calibration) == 4
    lengths = sorted(int(n) for b in ds.calibration for n in b["attention_mask"].sum(axis=1))
    assert lengths == [4, 5, 6, 7]  # [CLS] document i word x i [SEP], i = 0..3
    assert _rows(stages.open_data(str(path), tiny).calibration) == 10
    assert _rows(stages.open_data(str(path), tiny, max_pairs=4, calib_texts=2).calibration) == 2
    from quantscope.pipeline.data import open_run_data

    rd = open_run_data(tiny, str(path), eval_data=None, pairs=4, tokenizer=None,
                       folder=tmp_path)
    assert "pairs 5-8 (held out" in rd.split
    assert rd.split.endswith("calibration uses the documents of pairs 1-4 (none held out)")
    assert _rows(rd.fit.calibration) == 4


def test_calib_texts_on_tensor_data_is_refused_in_one_line(tmp_path, capsys):
    import onnx

    x = tmp_path / "x.npy"
    np.save(x, np.zeros((4, 6), np.int64))
    onnx.save(tiny_encoder(), tmp_path / "m.onnx")
    with pytest.raises(QuantscopeError, match="--calib-texts applies to text data"):
        stages.open_data(str(x), load_proto(tiny_encoder(), "tiny"), calib_texts=8)
    out = tmp_path / "s.npz"
    assert main(["calibrate", str(tmp_path / "m.onnx"), "--data", str(x), "--calib-texts", "8",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "--calib-texts applies to text data" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_calibrate_command_takes_it(tmp_path, capsys):
    import onnx

    onnx.save(tiny_encoder(), tmp_path / "m.onnx")
    out = tmp_path / "s.npz"
    assert main(["calibrate", str(tmp_path / "m.onnx"), "--data", "stdlib-docs",
                 "--calib-texts", "24", "--out", str(out)]) == 0
    assert "24 samples" in capsys.readouterr().out
    assert stages.read_stats(out).num_samples == 24


def test_the_run_keys_its_data_on_it_only_when_given(tmp_path):
    """A folder made without --calib-texts keeps its keys (it resumes); a run with it
    (or with another N) is keyed apart, so its stages run again."""
    from quantscope.pipeline import RunOptions
    from quantscope.pipeline.auto import auto_key
    from quantscope.pipeline.context import Context

    def ident(opts: RunOptions) -> tuple[dict, dict]:
        ctx = Context(opts, Path(tmp_path), progress=False, _cache={})
        return ctx.data_identity(), auto_key(opts, lambda p: p)

    base = RunOptions(model="m.onnx", data="stdlib-docs", target="hailo10h", out=str(tmp_path))
    d0, a0 = ident(base)
    assert "calib_texts" not in d0 and "calib_texts" not in a0
    d1, a1 = ident(RunOptions(**{**base.__dict__, "calib_texts": 64}))
    assert d1 == {**d0, "calib_texts": 64} and a1 == {**a0, "calib_texts": 64}
    # a pairs file's folder made before its calibration left the held-out documents out
    # is keyed apart (it calibrates again); stdlib-docs' keys are unchanged
    (tmp_path / "p.jsonl").write_text('{"query": "q", "document": "d"}\n')
    d2, a2 = ident(RunOptions(**{**base.__dict__, "data": str(tmp_path / "p.jsonl")}))
    assert d2["calibration"] == a2["calibration"] == "the pairs' documents"
    assert "calibration" not in d0 and "calibration" not in a0
