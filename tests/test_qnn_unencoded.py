"""The tensors inside a group get no QNN encoding, and that is said.

The emulation keeps a tensor made inside a group (a Conv's output before the Relu and
Sigmoid fused with it, a decomposed GELU's steps) float, the group's wide accumulator:
there is no grid for it, so the encodings file has no entry and the QNN converter picks
its own for each it does not fuse away. That used to happen without a word; now
``export --format qnn`` prints one line naming them, and a run on qnn_htp_v73 says it at
its export, in verdict.json (``export_warnings`` and the full ``qnn_unencoded`` list) and
in the report.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tiny_models import conv_sigmoid

from quantscope.cli import main


def _conv(path: Path) -> None:
    conv_sigmoid(path, relu=True)


def _names(doc: dict) -> set[str]:
    return {e["name"] for e in doc["activation_encodings"]}


def test_a_qnn_run_and_its_export_name_the_tensors_without_encoding(tmp_path, capsys):
    model, data, out = tmp_path / "m.onnx", tmp_path / "x.npy", tmp_path / "run"
    _conv(model)
    np.save(data, np.random.default_rng(6).normal(0, 1, (16, 3, 8, 8)).astype(np.float32))
    assert main(["run", str(model), "--target", "qnn_htp_v73", "--data", str(data),
                 "--out", str(out)]) == 0
    said = capsys.readouterr()
    doc = json.loads((out / "qnn.encodings.json").read_text())
    assert {"x", "y"} <= _names(doc) and not {"c", "r"} & _names(doc)
    line = "qnn.encodings.json: 2 tensor(s) inside groups have no encoding: c (in conv), r (in conv)"
    assert line in said.out + said.err
    verdict_lines = said.out[said.out.index("verdict:"):]  # the final summary says it too
    assert "note: 2 tensor(s) inside groups have no QNN encoding" in verdict_lines
    verdict = json.loads((out / "verdict.json").read_text())
    assert any(w.startswith(line) and "picks its own encoding" in w
               for w in verdict["export_warnings"]), verdict["export_warnings"]
    assert verdict["qnn_unencoded"] == [{"tensor": "c", "group": "conv"},
                                        {"tensor": "r", "group": "conv"}]
    assert "c (in conv)" in (out / "report.html").read_text()
    # the export command, alone
    again = tmp_path / "again.json"
    assert main(["export", "--model", str(model), "--stats", str(out / "stats.npz"),
                 str(out / "plan.json"), "--format", "qnn", "--out", str(again)]) == 0
    printed = capsys.readouterr().out
    assert "warning: again.json: 2 tensor(s) inside groups have no encoding" in printed
    assert json.loads(again.read_text()) == doc


def test_decoder_run_on_qnn_says_each_phase_unencoded_tensors(tmp_path: Path, capsys) -> None:
    """A decoder run on qnn_htp_v73 writes ``{prefill,decode}/qnn.encodings.json``; its
    verdict's export warnings read only the .alls scripts, so the tensors inside groups
    (RoPE rotations, attention scores, the gate's sigmoid) went unsaid. Now each phase's
    file has its line in verdict.json, the console's verdict and the report, and the export
    stage's progress says it as the encoder run's does (``steps.export_file``)."""
    from decoder_tiny import AMOUNTS, SEQ, byte_decoder, run_cli

    out = tmp_path / "run"
    code, printed = run_cli(["run", str(byte_decoder(tmp_path)), "--data", "stdlib-docs",
                             "--target", "qnn_htp_v73", "--rewrites", "none", "--prefix",
                             "none", "--w4", "off", "--seq-len", str(SEQ), *AMOUNTS,
                             "--out", str(out)])
    assert code == 0, printed
    progress = capsys.readouterr().err  # the stages' progress lines
    v = json.loads((out / "verdict.json").read_text())
    rows = v["qnn_unencoded"]
    assert {r["phase"] for r in rows} == {"prefill", "decode"}
    assert any(r["tensor"] == "layers.0.attn.scaled" and r["group"] == "layers.0.attn.scores"
               for r in rows)
    report = (out / "report.html").read_text()
    for phase in ("prefill", "decode"):
        n = sum(r["phase"] == phase for r in rows)
        head = f"{phase}/qnn.encodings.json: {n} tensor(s) inside groups have no encoding"
        assert any(w.startswith(head) for w in v["export_warnings"])
        assert f"warning: {head}" in printed and head in report
        assert f"[export] {phase}: warning: {head}" in progress, progress[-2000:]
