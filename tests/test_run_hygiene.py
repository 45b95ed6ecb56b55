"""A run folder reused by another run: no file of the earlier run is left to be handed
over or read back, and a manifest edited by hand is one line, not an internal error."""

import json
import shutil

import numpy as np
import onnx
import pytest
import tiny_models as tm

from quantscope.cli import main
from quantscope.pipeline.manifest import MANIFEST
from quantscope.serde import read_json


def _inputs(tmp_path):
    m, x = tmp_path / "m.onnx", tmp_path / "x.npy"
    onnx.save(tm.layernorm_block(), m)
    np.save(x, np.random.default_rng(0).normal(0, 1, (32, 6, 24)).astype(np.float32))
    return m, x


def _args(m, x, out, target):
    return ["run", str(m), "--data", str(x), "--target", target, "--goal", "30",
            "--out", str(out)]


@pytest.fixture(scope="module")
def hailo_run(tmp_path_factory):
    """_inputs' m.onnx and x.npy with W/, their hailo10h run (_args), made once for the
    module: a test that only reads it reads it here, one that changes it copies it."""
    folder = tmp_path_factory.mktemp("hailo")
    m, x = _inputs(folder)
    assert main(_args(m, x, folder / "W", "hailo10h")) == 0
    return folder


def _copied(folder, tmp_path):
    """hailo_run's model, data and run folder copied into tmp_path: the same files, so
    every stage's key but the report's (it names the folder) is the same there."""
    m, x = tmp_path / "m.onnx", tmp_path / "x.npy"
    shutil.copy2(folder / "m.onnx", m)
    shutil.copy2(folder / "x.npy", x)
    shutil.copytree(folder / "W", tmp_path / "W")
    return m, x, tmp_path / "W"


def test_another_target_leaves_no_compiler_file_of_the_first(tmp_path, capsys, hailo_run):
    m, x, out = _copied(hailo_run, tmp_path)  # the hailo10h run, copied
    assert (out / "model.alls").is_file()
    assert main(_args(m, x, out, "qnn-htp-v73")) == 0
    assert (out / "qnn.encodings.json").is_file()
    # the Hailo script of the first run is not handed over, nor read by the report
    assert not (out / "model.alls").exists()
    clean = tmp_path / "C"
    assert main(_args(m, x, clean, "qnn-htp-v73")) == 0
    verdict, fresh = read_json(out / "verdict.json", "v"), read_json(clean / "verdict.json", "v")
    # the QNN file's own notes (tensors inside groups it encodes none for), none of the script
    assert verdict["export_warnings"] == fresh["export_warnings"]
    assert not [w for w in verdict["export_warnings"] if ".alls" in w], verdict["export_warnings"]
    assert verdict["compiler_files"] == fresh["compiler_files"]
    assert "model.alls" not in (out / "report.html").read_text(encoding="utf-8")
    # and back: the QNN encodings go
    assert main(_args(m, x, out, "hailo10h")) == 0
    assert (out / "model.alls").is_file() and not (out / "qnn.encodings.json").exists()


@pytest.mark.parametrize("stages", [{"plan": 3}, [["plan", 3]],
                                    {"plan": {"key": "k", "files": ["plan.json"]}}])
def test_a_malformed_stage_entry_in_run_json_is_one_line(tmp_path, capsys, stages):
    m, x = _inputs(tmp_path)
    out = tmp_path / "W"
    out.mkdir()
    (out / MANIFEST).write_text(json.dumps({"format": "quantscope.run/1", "stages": stages}))
    assert main(_args(m, x, out, "hailo10h")) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("quantscope: error:") and "run.json" in last and "malformed" in last
    assert "internal error" not in err and "Traceback" not in err


def test_out_inside_the_data_folder_is_refused_before_any_work(tmp_path, capsys):
    """The next run would read the run's files as data (a folder of arrays with
    sub-folders reads as face identities): refused at once, nothing written."""
    m, x = _inputs(tmp_path)
    data = tmp_path / "D"
    data.mkdir()
    x.rename(data / "x.npy")
    for out in (data, data / "W"):
        assert main(_args(m, data, out, "hailo10h")) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert "inside the --data folder" in last and "internal error" not in last
    assert [p.name for p in data.iterdir()] == ["x.npy"]


def test_an_input_the_run_writes_in_its_folder_is_refused(tmp_path, capsys, hailo_run):
    """``run W/repaired.onnx --out W`` would overwrite its own model in the repair stage."""
    m, x, out = _copied(hailo_run, tmp_path)  # the hailo10h run, copied
    before = (out / "repaired.onnx").read_bytes()
    assert main(_args(out / "repaired.onnx", x, out, "hailo10h")) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "MODEL" in last and "a file the run writes" in last
    assert (out / "repaired.onnx").read_bytes() == before
    # a file of another name in the folder is an input like any other
    (out / "mine.npy").write_bytes(x.read_bytes())
    assert main(_args(m, out / "mine.npy", out, "hailo10h")) == 0


def test_a_folder_in_use_is_said_before_any_work(tmp_path, capsys, monkeypatch):
    """A second run into a folder a run is using stops before it opens the model (the
    auto rewrites measure for minutes on a real encoder before the stages lock it)."""
    import fcntl

    from quantscope import stages

    m, x = _inputs(tmp_path)
    w = tmp_path / "W"
    w.mkdir()
    monkeypatch.setattr(stages, "open_model", lambda *a, **k: pytest.fail("model opened"))
    with (w / ".run.lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # as a concurrent run holds it
        assert main(_args(m, x, w, "hailo10h")) == 2
    assert "another quantscope run is using" in capsys.readouterr().err


def test_report_given_another_file_of_a_run_says_what_it_is(tmp_path, capsys, hailo_run):
    """``quantscope report --results W/verdict.json`` (or check.json) named the file 'no
    quantscope results file: give the JSON that quantscope wrote', which it is."""
    out = hailo_run / "W"  # read only
    capsys.readouterr()
    for name, what in (("verdict.json", "a run's verdict"), ("check.json", "a check result"),
                       ("io.json", "a device I/O file")):
        assert main(["report", "--results", str(out / name), "--out",
                     str(tmp_path / "r.html")]) == 2
        err = capsys.readouterr().err.strip()
        assert what in err and "evaluate.json" in err and len(err.splitlines()) == 1
    assert main(["report", "--results", str(out / "evaluate.json"), "--out",
                 str(tmp_path / "r.html")]) == 0


def test_a_stage_redone_for_an_edited_or_deleted_file_says_so(tmp_path, capsys, hailo_run):
    m, x, out = _copied(hailo_run, tmp_path)  # the hailo10h run, copied
    assert main(_args(m, x, out, "hailo10h")) == 0  # its report redone: it names the folder
    assert "stages run: report;" in capsys.readouterr().out
    (out / "plan.json").write_text("{}")  # edited by hand
    (out / "check.json").unlink()
    capsys.readouterr()
    assert main(_args(m, x, out, "hailo10h")) == 0
    said = capsys.readouterr()
    text = said.out + said.err
    assert "[plan] … (plan.json changed or missing since this stage wrote it: redone)" in text
    assert "[check] … (check.json changed or missing" in text
    assert "stages run: plan, check;" in said.out  # the same plan again: nothing after it
