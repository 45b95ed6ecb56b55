"""A run's resume key holds every option its data is opened with (issue 32: a rerun with
another --seq-len printed "[calibrate] done already (same inputs): skipped" on texts
truncated at another length)."""

from __future__ import annotations

import dataclasses

from test_task_headline import sts_inputs

from quantscope.cli import main
from quantscope.pipeline import STAGES
from quantscope.pipeline.context import Context, RunOptions


def _run(m, tsv, out, *extra):
    return ["run", str(m), "--data", str(tsv), "--target", "hailo8", "--out", str(out),
            *extra]


def test_another_seq_len_reruns_calibrate(tmp_path, capsys):
    m, tsv = sts_inputs(tmp_path)
    out = tmp_path / "W"
    assert main(_run(m, tsv, out, "--seq-len", "8")) == 0
    capsys.readouterr()
    assert main(_run(m, tsv, out, "--seq-len", "8")) == 0  # the same: all skipped
    assert f"skipped (done): {', '.join(STAGES)}" in capsys.readouterr().out
    assert main(_run(m, tsv, out, "--seq-len", "4")) == 0  # texts cut elsewhere: redo all
    text = capsys.readouterr().out
    assert "stages run: calibrate, analyze, plan" in text
    assert "[calibrate] done already" not in text


def test_every_data_option_is_in_every_data_stages_key(tmp_path):
    """Each option the data opener reads changes the identity the keys are built from."""
    m, tsv = sts_inputs(tmp_path)
    base = RunOptions(model=str(m), data=str(tsv), target="hailo8", out=str(tmp_path / "W"))
    ident = Context(base, tmp_path).data_identity()
    assert set(Context(base, tmp_path).data_options()) == set(ident)
    other = tmp_path / "q.tsv"
    other.write_text(tsv.read_text().replace("4.8", "4.7"))
    for change in ({"seq_len": 16}, {"pairs": 3}, {"eval_data": str(tsv)},
                   {"data": str(other)}):
        changed = Context(dataclasses.replace(base, **change), tmp_path).data_identity()
        assert changed != ident, change
    same = Context(dataclasses.replace(base, data=str(tsv)), tmp_path).data_identity()
    assert same == ident  # by content, not by object
