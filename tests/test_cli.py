import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
import tiny_models as tm

from quantscope.cli import main


@pytest.fixture()
def work(tmp_path):
    onnx.save(tm.layernorm_block(), tmp_path / "m.onnx")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(0, 1, (16, 5, 24)).astype(np.float32))
    return tmp_path


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_calibrate_evaluate_export_roundtrip(work, capsys):
    code, out, _ = run(["calibrate", work / "m.onnx", "--data", work / "x.npy",
                        "--out", work / "s.npz"], capsys)
    assert code == 0 and (work / "s.npz").exists()
    code, out, _ = run(["evaluate", work / "m.onnx", "--data", work / "x.npy", "--stats",
                        work / "s.npz", "--precision", "a8_w8", "--json", work / "r.json"], capsys)
    assert code == 0 and "cosine_mean" in out
    result = json.loads((work / "r.json").read_text())
    assert 0.9 < result["metrics"]["cosine_mean"] < 1.0
    code, _, _ = run(["export-qdq", work / "m.onnx", "--stats", work / "s.npz",
                      "--precision", "a16_w16", "--out", work / "q.onnx"], capsys)
    assert code == 0
    onnx.checker.check_model(onnx.load(work / "q.onnx"))


def test_plan_file_and_float_plan_is_exact(work, capsys):
    run(["calibrate", work / "m.onnx", "--data", work / "x.npy", "--out", work / "s.npz"], capsys)
    (work / "p.json").write_text(json.dumps({"default": "float", "groups": {}}))
    code, out, _ = run(["evaluate", work / "m.onnx", "--data", work / "x.npy", "--stats",
                        work / "s.npz", "--plan", work / "p.json", "--json", work / "r.json"], capsys)
    assert code == 0
    assert json.loads((work / "r.json").read_text())["metrics"]["cosine_min"] == 1.0


def _bad(work, capsys, argv, needle, out_file=None):
    code, _, err = run(argv, capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    if out_file is not None:
        assert not out_file.exists()
        assert not list(out_file.parent.glob(f".{out_file.name}*"))  # no temp left behind


def test_missing_model(work, capsys):
    _bad(work, capsys, ["calibrate", work / "nope.onnx", "--data", work / "x.npy", "--out",
                        work / "s.npz"], "does not exist", work / "s.npz")


def test_non_onnx_file(work, capsys):
    (work / "bad.onnx").write_text("this is not a model")
    _bad(work, capsys, ["calibrate", work / "bad.onnx", "--data", work / "x.npy", "--out",
                        work / "s.npz"], "ONNX", work / "s.npz")


def test_truncated_onnx_file(work, capsys):
    data = (work / "m.onnx").read_bytes()
    (work / "t.onnx").write_bytes(data[: len(data) // 2])
    _bad(work, capsys, ["calibrate", work / "t.onnx", "--data", work / "x.npy", "--out",
                        work / "s.npz"], "t.onnx", work / "s.npz")


def test_unknown_precision(work, capsys):
    run(["calibrate", work / "m.onnx", "--data", work / "x.npy", "--out", work / "s.npz"], capsys)
    _bad(work, capsys, ["export-qdq", work / "m.onnx", "--stats", work / "s.npz", "--precision",
                        "a12_w3", "--out", work / "q.onnx"], "unknown precision", work / "q.onnx")


def test_plan_with_unknown_group(work, capsys):
    run(["calibrate", work / "m.onnx", "--data", work / "x.npy", "--out", work / "s.npz"], capsys)
    (work / "p.json").write_text(json.dumps({"default": "a8_w8", "groups": {"MatMul_9": "a16_w16"}}))
    _bad(work, capsys, ["export-qdq", work / "m.onnx", "--stats", work / "s.npz", "--plan",
                        work / "p.json", "--out", work / "q.onnx"], "MatMul_9", work / "q.onnx")


def test_plan_with_unknown_key(work, capsys):
    run(["calibrate", work / "m.onnx", "--data", work / "x.npy", "--out", work / "s.npz"], capsys)
    (work / "p.json").write_text(json.dumps({"default": "a8_w8", "layers": {}}))
    _bad(work, capsys, ["export-qdq", work / "m.onnx", "--stats", work / "s.npz", "--plan",
                        work / "p.json", "--out", work / "q.onnx"], "layers", work / "q.onnx")


@pytest.mark.parametrize("array,needle", [
    (np.zeros((4, 5, 23), np.float32), "shape"),
    (np.zeros((4, 24), np.float32), "shape"),
    (np.zeros((4, 5, 24), np.int64), "int64"),
])
def test_data_of_wrong_shape_or_dtype(work, capsys, array, needle):
    np.save(work / "bad.npy", array)
    _bad(work, capsys, ["calibrate", work / "m.onnx", "--data", work / "bad.npy", "--out",
                        work / "s.npz"], needle, work / "s.npz")


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_data_with_nan_or_inf(work, capsys, value):
    x = np.ones((4, 5, 24), np.float32)
    x[1, 2, 3] = value
    np.save(work / "bad.npy", x)
    _bad(work, capsys, ["calibrate", work / "m.onnx", "--data", work / "bad.npy", "--out",
                        work / "s.npz"], "NaN or Inf", work / "s.npz")


def test_empty_data_folder(work, capsys):
    (work / "empty").mkdir()
    _bad(work, capsys, ["calibrate", work / "m.onnx", "--data", work / "empty", "--out",
                        work / "s.npz"], "no .npy or .npz", work / "s.npz")


def test_stats_file_not_stats(work, capsys):
    (work / "s.npz").write_text("garbage")
    _bad(work, capsys, ["export-qdq", work / "m.onnx", "--stats", work / "s.npz", "--precision",
                        "a8_w8", "--out", work / "q.onnx"], "stats", work / "q.onnx")


def test_module_entry_point_has_no_traceback(work):
    proc = subprocess.run(
        [sys.executable, "-m", "quantscope", "calibrate", str(work / "nope.onnx"), "--data",
         str(work / "x.npy"), "--out", str(work / "s.npz")],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_outputs_are_ordinary_readable_files(work, capsys):
    run(["calibrate", work / "m.onnx", "--data", work / "x.npy", "--out", work / "s.npz"], capsys)
    assert (work / "s.npz").stat().st_mode & 0o044  # group/other readable under usual umask


def test_io_command_prints_transforms(work, capsys):
    run(["calibrate", work / "m.onnx", "--data", work / "x.npy", "--out", work / "s.npz"], capsys)
    code, out, _ = run(["io", work / "m.onnx", "--stats", work / "s.npz", "--precision",
                        "a16_w16"], capsys)
    assert code == 0
    assert "uint16" in out and "from device: x = (q - " in out


def test_report_from_evaluate_result(work, capsys):
    run(["calibrate", work / "m.onnx", "--data", work / "x.npy", "--out", work / "s.npz"], capsys)
    run(["evaluate", work / "m.onnx", "--data", work / "x.npy", "--stats", work / "s.npz",
         "--precision", "a8_w8", "--json", work / "r.json"], capsys)
    code, _, err = run(["report", "--out", work / "rep.html", "--results", work / "r.json"], capsys)
    assert code == 0, err
    page = (work / "rep.html").read_text()
    assert page.startswith("<!doctype html>") and "data:image/png;base64," in page
    assert "cosine_mean" in page


# ---- the CLI surface: --version, models, help on every flag, README ----------------


def _subparsers():
    from quantscope.cli.commands import parser

    action = next(a for a in parser()._actions if a.dest == "command")
    return action.choices


def test_every_command_has_a_function():
    from quantscope.cli import COMMANDS

    assert list(COMMANDS) == list(_subparsers())


def test_version(capsys):
    import quantscope

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"quantscope {quantscope.__version__}"


def test_every_flag_of_every_command_has_help():
    missing = [f"{name} {a.option_strings or a.dest}" for name, sub in _subparsers().items()
               for a in sub._actions if a.dest != "help" and not a.help]
    assert missing == []


def test_data_commands_share_data_tokenizer_and_pairs_options():
    subs = _subparsers()
    for name in ("evaluate", "repair", "analyze", "plan"):
        flags = {s for a in subs[name]._actions for s in a.option_strings}
        assert {"--data", "--tokenizer", "--pairs", "--stats"} <= flags, name
    defaults = {n: subs[n].get_default("pairs") for n in ("evaluate", "analyze", "plan",
                                                         "repair")}
    assert defaults == {"evaluate": None, "analyze": 128, "plan": 300, "repair": 1000}


def test_models_lists_package_version_licence_and_cache(tmp_path, monkeypatch, capsys):
    from quantscope.zoo import BUILTIN_MODELS, resolve_model

    monkeypatch.setenv("QUANTSCOPE_CACHE", str(tmp_path / "cache"))
    code, out, _ = run(["models", "--json", tmp_path / "m.json"], capsys)
    assert code == 0
    rows = {r["name"]: r for r in json.loads((tmp_path / "m.json").read_text())}
    assert set(rows) == set(BUILTIN_MODELS)
    for name, spec in BUILTIN_MODELS.items():
        assert rows[name]["cached"] is None
        line = next(x for x in out.splitlines() if x.startswith(name))
        assert f"{spec.package} {spec.version}" in line and spec.licence in line
        assert " no" in line
    assert rows["minilm-l3"]["licence"] == "Apache-2.0"
    # the columns line up whatever the name's length (mobilefacenet, smollm2-135m)
    header = out.splitlines()[0]
    for name, spec in BUILTIN_MODELS.items():
        line = next(x for x in out.splitlines() if x.startswith(name + " "))
        assert line.index(spec.package) == header.index("package"), line
    if rows["minilm-l3"]["missing"]:
        pytest.skip("building minilm-l3 needs the models extra")
    built = resolve_model("minilm-l3")
    code, out, _ = run(["models"], capsys)
    line = next(x for x in out.splitlines() if x.startswith("minilm-l3"))
    assert f"yes: {built}" in line


def test_builtin_model_registry_names_installed_versions():
    import importlib.metadata

    from quantscope.zoo import BUILTIN_MODELS

    for name, spec in BUILTIN_MODELS.items():
        if spec.package.startswith("npm:"):  # not a Python package: the builder pins its hash
            continue
        assert spec.package in spec.requires, name
        try:
            installed = importlib.metadata.version(spec.package)
        except importlib.metadata.PackageNotFoundError:
            continue
        assert installed == spec.version, name


def test_readme_lists_every_command():
    import re
    from pathlib import Path

    root = Path(__file__).parents[1]  # the README and the expert page it links
    readme = (root / "README.md").read_text() + (root / "docs" / "expert.md").read_text()
    assert "quantscope --version" in readme
    missing = [name for name in _subparsers()
               if not re.search(rf"quantscope +{re.escape(name)}(?![\w-])", readme)]
    assert missing == []
