"""A resumed run redoes little before its first unfinished stage: the fit text pairs are
tokenized once per process (the stages reuse what the run's checks opened), and its
files are the same as the first run's."""

from __future__ import annotations

from pathlib import Path

import onnx
from test_tasks_text import tiny_encoder

from quantscope import stages
from quantscope.cli import main
from quantscope.pipeline.manifest import MANIFEST, file_digest


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: file_digest(p) for p in sorted(folder.iterdir())
            if p.is_file() and p.name not in (MANIFEST, ".run.lock")}


def test_a_forced_rerun_tokenizes_the_fit_pairs_once_and_writes_the_same_files(
        tmp_path, capsys, monkeypatch):
    m = tmp_path / "tiny.onnx"
    onnx.save(tiny_encoder(inputs=("input_ids", "attention_mask")), m)
    out = tmp_path / "W"
    args = ["run", str(m), "--data", "stdlib-docs", "--pairs", "12", "--target", "ort-cpu",
            "--max-cost", "1.5", "--lengths", "off", "--rewrites", "none", "--out", str(out)]
    assert main(args) == 0
    first = _digests(out)
    opened = []
    real = stages.open_data
    monkeypatch.setattr(stages, "open_data",
                        lambda spec, *a, **k: opened.append(str(spec)) or real(spec, *a, **k))
    capsys.readouterr()
    assert main([*args, "--force", "calibrate"]) == 0
    assert "stages run: calibrate, analyze" in capsys.readouterr().out
    # stdlib-docs (the fit pairs) once, for the checks and every stage; the held-out once
    assert opened.count("stdlib-docs") == 1
    assert [Path(s).name for s in opened if s != "stdlib-docs"] == ["heldout.jsonl"]
    assert _digests(out) == first
    # run.json keeps each stage's wall seconds and, on Linux, its peak resident set
    import json

    from quantscope.analyze.memory import peak_bytes

    done = json.loads((out / MANIFEST).read_text())["stages"]
    assert done and all(s["seconds"] >= 0 for s in done.values())
    if peak_bytes() is not None:
        assert all(0 < s["peak_rss_mb"] < 64 << 10 for s in done.values())
        # the first stage this invocation ran also keeps the peak before it
        assert done["calibrate"]["before_peak_rss_mb"] > 0
        assert not any("before_peak_rss_mb" in s for k, s in done.items() if k != "calibrate")


def test_the_run_keeps_what_tells_text_reading_apart_not_the_given_model():
    """``run`` holds the given model's text-reading identity (inputs, outputs, metadata,
    source) instead of the model: equal for a copy, different for other metadata or
    another source."""
    from quantscope.pipeline.context import reads_text_as

    proto = tiny_encoder(inputs=("input_ids", "attention_mask"))
    a, b = stages.load_proto(proto, "tiny"), stages.load_proto(onnx.ModelProto.FromString(
        proto.SerializeToString()), "tiny")
    assert reads_text_as(a) == reads_text_as(b)
    other = onnx.ModelProto.FromString(proto.SerializeToString())
    onnx.helper.set_model_props(other, {"tokenizer": "another"})
    assert reads_text_as(stages.load_proto(other, "tiny")) != reads_text_as(a)
    assert reads_text_as(stages.load_proto(proto, "elsewhere")) != reads_text_as(a)
