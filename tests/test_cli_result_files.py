"""The result files the CLI writes carry their ``format`` tag (``evaluate --json``,
``whatif --json``, ``io --json``) and ``serde.read_result`` reads each back as its type;
``export --format`` offers exactly the export-format registry's formats."""

import json

import numpy as np
import onnx
import pytest
import tiny_models as tm

from quantscope.cli import main
from quantscope.export.formats import FORMATS
from quantscope.results import DeviceIOResult, EvaluateResult, WhatifResult
from quantscope.serde import read_result


@pytest.fixture()
def work(tmp_path, capsys):
    onnx.save(tm.layernorm_block(), tmp_path / "m.onnx")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(0, 1, (16, 5, 24)).astype(np.float32))
    assert main(["calibrate", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npy"),
                 "--out", str(tmp_path / "s.npz")]) == 0
    (tmp_path / "p.json").write_text(json.dumps({"default": "a8_w8", "groups": {}}))
    capsys.readouterr()
    return tmp_path


@pytest.mark.parametrize(("command", "extra", "kind"), [
    ("evaluate", ["--data", "x.npy"], EvaluateResult),
    ("whatif", ["--data", "x.npy"], WhatifResult),
    ("io", [], DeviceIOResult),
])
def test_each_result_file_carries_its_tag_and_reads_back(work, capsys, command, extra, kind):
    argv = [command, "m.onnx", "--stats", "s.npz", "--plan", "p.json", *extra, "--json",
            "r.json"]
    assert main([str(work / a) if a.endswith((".onnx", ".npz", ".json", ".npy")) else a
                 for a in argv]) == 0, capsys.readouterr().err
    doc = json.loads((work / "r.json").read_text())
    assert next(iter(doc)) == "format" and doc["format"] == kind.FORMAT
    back = read_result(work / "r.json")
    assert isinstance(back, kind) and back.to_dict() == doc


def test_export_offers_the_registry_formats(monkeypatch):
    """A format added to the registry is an ``export --format`` choice with no CLI edit."""
    from quantscope.cli.commands import parser
    from quantscope.export.formats import ExportFormat

    monkeypatch.setitem(FORMATS, "raw", ExportFormat("raw", "model.raw", None,
                                                     "raw bytes: a test format",
                                                     lambda inp: b""))
    export = next(a for a in parser(["export"])._actions if a.dest == "command"
                  ).choices["export"]
    choices = next(a.choices for a in export._actions if a.dest == "format")
    assert list(choices) == ["alls", "qnn", "qdq", "raw"]
    assert "raw: raw bytes" in next(a.help for a in export._actions if a.dest == "format")
