"""h42's bad inputs, round 2: the leftovers h37 named, each refused before any work and
any file (or said), and the resumable run folder under kills and tampering."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_models as tm
from test_h37_bad_inputs import _bert_sized_encoder

from quantscope.cli import main


def _model_and_data(tmp_path: Path, n: int = 8) -> tuple[str, str]:
    onnx.save(tm.layernorm_block(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy",
            np.random.default_rng(0).normal(0, 1, (n, 5, 24)).astype(np.float32))
    return str(tmp_path / "m.onnx"), str(tmp_path / "x.npy")


def _pairs(path: Path, n: int, start: int = 0) -> str:
    return tm.write_pairs(path, n, start)


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory) -> Path:
    """One folder holding _model_and_data's m.onnx and x.npy and w/, the plain run
    ``run m.onnx --data x.npy --target hailo8 --out w`` on them, made once for the module:
    tests that only read it read it here, those that change it copy it (_copy_run)."""
    folder = tmp_path_factory.mktemp("plain")
    model, data = _model_and_data(folder)
    assert main(["run", model, "--data", data, "--target", "hailo8", "--out",
                 str(folder / "w")]) == 0
    return folder


def _copy_run(folder: Path, tmp_path: Path) -> tuple[str, str, Path]:
    """The shared run's model, data and run folder copied into tmp_path (the same files:
    every stage's key but the report's, which names the folder, is the same there)."""
    for name in ("m.onnx", "x.npy"):
        shutil.copy2(folder / name, tmp_path / name)
    shutil.copytree(folder / "w", tmp_path / "w")
    return str(tmp_path / "m.onnx"), str(tmp_path / "x.npy"), tmp_path / "w"


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


def _expanding_model(path: Path) -> None:
    """x [1, 4] -> Expand to [1, 4, 2**22, 2**22] (256 TiB of float32, beyond any address
    space, so the allocation fails whatever the kernel's overcommit) -> ReduceMean."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.array([1, 4, 2**22, 2**22], np.int64), "shape"),
             numpy_helper.from_array(np.eye(4, dtype=np.float32), "w"),
             numpy_helper.from_array(np.array([1, 4, 1, 1], np.int64), "s4")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Reshape", ["h", "s4"], ["h4"]),
             helper.make_node("Expand", ["h4", "shape"], ["big"], name="the_expand"),
             helper.make_node("ReduceMean", ["big"], ["y"], axes=[1, 2, 3], keepdims=0)]
    graph = helper.make_graph(
        nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_out_of_memory_names_what_asked_for_it(tmp_path, capsys):
    """ONNX Runtime's failed allocation was an internal error; numpy's MemoryError said
    'use fewer or smaller batches', which no option sets."""
    from quantscope.cli import memory_line

    _expanding_model(tmp_path / "big.onnx")
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    out = tmp_path / "s.npz"
    assert main(["calibrate", str(tmp_path / "big.onnx"), "--data", str(tmp_path / "x.npy"),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("quantscope: error: out of memory in ONNX Runtime's Expand node "
                          "'the_expand'"), err
    assert "smaller --input-shape or --seq-len" in err and "batches" not in err
    assert not out.exists()
    try:
        np.empty((2**24, 2**24), np.float32)  # 1 PiB
    except MemoryError as e:
        line = memory_line(e)
    assert line is not None and line.startswith("out of memory (Unable to allocate 1.00 PiB "
                                                "for an array with shape (16777216, "
                                                "16777216)"), line
    assert memory_line(ValueError("bad_alloc")) is None


@pytest.mark.parametrize("extra, words", [
    (["--new-tokens", "1000000000"], "grow each prompt's KV cache past the longest sequence "
     "quantscope runs a model at (65536)"),
    (["--lm-tokens", "1000000000"], "needs 15,873,016 evaluation windows of 64 tokens (63 "
     "predicted tokens each), and the built-in text has 1,500 documents, one window each: "
     "give --lm-tokens 94500 or less"),
    (["--decode-steps", "1000000000"], "give --decode-steps 12000 or less"),
    (["--prompts", "1000000000"], "give --prompts 1501 or less"),
])
def test_a_decoders_huge_counts_are_refused_before_any_work(tmp_path, capsys, extra, words):
    """--prompts, --new-tokens, --decode-steps, --lm-tokens had no upper bound: the run
    converted, calibrated and planned, and ran out of text (or ran on) after."""
    from decoder_tiny import byte_decoder

    model = byte_decoder(tmp_path)
    out = tmp_path / "run"
    assert main(["run", str(model), "--data", "stdlib-docs", "--target", "hailo10h",
                 "--seq-len", "64", *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not out.exists()


def test_the_report_says_fit_data_where_nothing_is_held_out(tmp_path, plain_run):
    """Retrieval pairs too few to split (6 pairs, --pairs 300): the verdict said 'NOT held
    out', the report's configurations and whatif sections 'on the held-out data (n=6 fit
    pairs, NOT held out)' and its data table 'held-out evaluation'."""
    _bert_sized_encoder(tmp_path / "enc.onnx")
    out = tmp_path / "w"
    assert main(["run", str(tmp_path / "enc.onnx"), "--data", _pairs(tmp_path / "p.jsonl", 6),
                 "--target", "hailo8", "--goal", "0.5", "--whatif", "--out", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "held-out data" not in page and "held-out evaluation" not in page
    assert "on the fit data (n=6 fit pairs, NOT held out)" in page
    assert "whatif, on the fit data, NOT held out" in page
    assert "evaluation (the fit data, NOT held out)" in page
    # split data keeps its words (the plain run of _model_and_data, shared)
    page = (plain_run / "w" / "report.html").read_text()
    assert "on the held-out data (n=4 held-out samples)" in page
    assert "held-out evaluation" in page


def _rewrite_in_place(path: Path, data: bytes) -> None:
    """New contents of the same size into the same inode, its times set back (cp -p,
    touch -r)."""
    st = path.stat()
    assert len(data) == st.st_size
    with path.open("r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (st.st_ino, st.st_mtime_ns)


def test_a_model_or_data_rewritten_in_place_with_its_times_kept_is_seen(tmp_path, capsys,
                                                                       plain_run):
    """A settled model (or data) file given new contents of the same size, its mtime set
    back: its digest was taken from the inode, size and mtime recorded, and a rerun skipped
    every stage on the other model."""
    import time

    from onnx import numpy_helper

    from quantscope.pipeline import manifest

    model, data, out = _copy_run(plain_run, tmp_path)  # the plain run, copied
    old = time.time_ns() - 10 * manifest.SETTLED_NS  # settled: its digest is remembered
    for p in (model, data):
        os.utime(p, ns=(old, old))
    args = ["run", model, "--data", data, "--target", "hailo8", "--out", str(out)]
    assert main(args) == 0  # the copy's report redone (it names the folder), no other stage
    assert "stages run: report;" in capsys.readouterr().out
    proto = onnx.load(model)
    t = proto.graph.initializer[0]
    a = numpy_helper.to_array(t).copy()
    a.flat[0] += 0.5
    t.CopyFrom(numpy_helper.from_array(a, t.name))
    _rewrite_in_place(Path(model), proto.SerializeToString())
    capsys.readouterr()
    assert main(args) == 0
    assert "stages run: calibrate, analyze, plan" in capsys.readouterr().out
    x = np.load(data)
    x[0, 0, 0] += 1
    np.save(tmp_path / "x2.npy", x)
    _rewrite_in_place(Path(data), (tmp_path / "x2.npy").read_bytes())
    assert main(args) == 0
    assert "stages run: calibrate, analyze, plan" in capsys.readouterr().out
    assert main(args) == 0  # and settled again: nothing to redo
    assert "stages run: none" in capsys.readouterr().out


def test_a_target_profile_edited_under_its_path_redoes_the_stages_it_feeds(tmp_path, capsys):
    """--target my.toml, then the profile's costs edited: every stage was skipped and the
    verdict kept the old plan's cost (6.816x where the profile now gave 1.932x)."""
    model, data = _model_and_data(tmp_path)
    src = Path(__file__).parents[1] / "src" / "quantscope" / "targets" / "hailo8.toml"
    profile = tmp_path / "my.toml"
    profile.write_text(src.read_text().replace('name = "hailo8"', 'name = "mine"', 1))
    out = tmp_path / "w"
    args = ["run", model, "--data", data, "--target", str(profile), "--out", str(out)]
    assert main(args) == 0
    before = json.loads((out / "verdict.json").read_text())["cost"]
    text = profile.read_text()
    cheap = text.replace("weighted = { a8_w8 = 1.0, a8_w4 = 0.9, a16_w8 = 3.7, a16_w16 = 7.4 }",
                         "weighted = { a8_w8 = 1.0, a8_w4 = 0.9, a16_w8 = 1.5, a16_w16 = 2.0 }")
    assert cheap != text
    profile.write_text(cheap)
    capsys.readouterr()
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "stages run: analyze, plan, repair, check, evaluate" in printed, printed
    assert "skipped (done): calibrate;" in printed  # calibration reads no target
    after = json.loads((out / "verdict.json").read_text())["cost"]
    fresh = tmp_path / "fresh"
    assert main([*args[:-1], str(fresh)]) == 0
    assert after == json.loads((fresh / "verdict.json").read_text())["cost"] != before


KILLED_AFTER_FIRST_RENAME = """
import os, signal, sys
from quantscope import serde
real = os.replace
def replace(a, b):
    real(a, b)
    os.kill(os.getpid(), signal.SIGKILL)
serde.os.replace = replace
serde.write_text(sys.argv[1], "new")
"""


def test_a_file_rewritten_is_the_old_or_the_new_one_whenever_killed(tmp_path):
    """serde moved the earlier file aside before renaming the new one in: SIGKILL between
    the two renames left the file missing (run.json: every stage redone) and a hidden
    '.NAME.….tmp.old' copy in the run folder for good (a repaired model's size)."""
    import subprocess
    import sys

    f = tmp_path / "run.json"
    f.write_text("old")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    p = subprocess.run([sys.executable, "-c", KILLED_AFTER_FIRST_RENAME, str(f)], env=env,
                       check=False)
    assert p.returncode == -9
    assert f.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_killed_file_sets_moved_aside_file_is_removed_on_resume(tmp_path, capsys,
                                                                 plain_run):
    model, data, out = _copy_run(plain_run, tmp_path)  # the plain run, copied
    args = ["run", model, "--data", data, "--target", "hailo8", "--out", str(out)]
    assert main(args) == 0  # the copy's report redone (it names the folder): a finished run
    aside = out / ".verdict.json.x1y2z3.tmp.old"  # as a set's rename leaves it when killed
    aside.write_text("{}")
    assert main(args) == 0
    assert not aside.exists()


def test_a_layout_anchor_file_edited_under_its_path_redoes_the_data_stages(tmp_path, capsys):
    """--layout …,anchors=A.npy: the resume key held the layout's text, so anchor centres
    edited under the same path left every stage skipped, its detections decoded with the
    old centres."""
    from test_h29_ssd_heads import _centres, ssd_two_heads

    onnx.save(ssd_two_heads(), tmp_path / "ssd.onnx")
    np.savez(tmp_path / "ssd.npz",
             input=np.random.default_rng(0).random((12, 3, 8, 8), np.float32))
    np.save(tmp_path / "a.npy", _centres())
    layout = (f"regressors=detect:axis=2,scores_from=classificators,"
              f"anchors={tmp_path / 'a.npy'},threshold=0")
    args = ["run", str(tmp_path / "ssd.onnx"), "--data", str(tmp_path / "ssd.npz"),
            "--target", "hailo8", "--layout", layout, "--out", str(tmp_path / "w")]
    assert main(args) == 0
    np.save(tmp_path / "a.npy", _centres(spacing=3.0))
    capsys.readouterr()
    assert main(args) == 0
    assert "stages run: calibrate, analyze, plan" in capsys.readouterr().out
    assert main(args) == 0
    assert "stages run: none" in capsys.readouterr().out


def test_a_tokenizer_beside_the_model_edited_redoes_the_data_stages(tmp_path, capsys):
    """Text read with the tokenizer.json beside the model (no --tokenizer): that file was in
    no resume key, so another casing or vocabulary left every stage skipped."""
    _bert_sized_encoder(tmp_path / "enc.onnx")
    packaged = Path(__file__).parents[1] / "src" / "quantscope" / "data"
    tok = json.loads((packaged / "bert-uncased-tokenizer.json").read_text())
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    args = ["run", str(tmp_path / "enc.onnx"), "--data", _pairs(tmp_path / "p.jsonl", 12),
            "--target", "hailo8", "--out", str(tmp_path / "w")]
    assert main(args) == 0
    tok["normalizer"]["lowercase"] = False
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    capsys.readouterr()
    assert main(args) == 0
    assert "stages run: calibrate, analyze, plan" in capsys.readouterr().out
    assert main(args) == 0
    assert "stages run: none" in capsys.readouterr().out


KILLED_IN_STAGE = """
import dataclasses, os, signal, sys
from quantscope import pipeline
from quantscope.cli import main
stage, when = sys.argv[1], sys.argv[2]
spec = pipeline.STAGES[stage]
def run(ctx, _run=spec.run):
    if when == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    done = _run(ctx)  # its files written, not yet recorded in run.json
    os.kill(os.getpid(), signal.SIGKILL)
pipeline.STAGES[stage] = dataclasses.replace(spec, run=run)
sys.exit(main(sys.argv[3:]))
"""


@pytest.fixture(scope="module")
def goal_run(tmp_path_factory) -> tuple[list[str], Path]:
    """The never-killed run of the test below (``--goal 20``), made once for both of its
    cases, which only read it: its arguments but the folder, and its folder."""
    folder = tmp_path_factory.mktemp("goal")
    model, data = _model_and_data(folder)
    args = ["run", model, "--data", data, "--target", "hailo8", "--goal", "20", "--out"]
    assert main([*args, str(folder / "ref")]) == 0
    return args, folder / "ref"


@pytest.mark.parametrize("stage, when", [("analyze", "after"), ("evaluate", "before")])
def test_a_run_killed_in_a_stage_resumes_there_with_the_same_files(tmp_path, stage, when,
                                                                   goal_run):
    """SIGKILL inside a stage (before its work, or after its files are written but before
    run.json records them): the rerun runs that stage and those after it, and ends with the
    files of a run never killed."""
    import subprocess
    import sys

    from quantscope.pipeline.manifest import file_digest

    args, ref = goal_run  # the same model and data files, read only
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    out = tmp_path / "w"
    p = subprocess.run([sys.executable, "-c", KILLED_IN_STAGE, stage, when, *args, str(out)],
                       env=env, check=False, capture_output=True)
    assert p.returncode == -9, p.stderr.decode()[-500:]
    import io
    from contextlib import redirect_stderr, redirect_stdout

    buf, err = io.StringIO(), io.StringIO()
    with redirect_stdout(buf), redirect_stderr(err):
        assert main([*args, str(out)]) == 0
    ran = buf.getvalue().split("stages run: ")[1].split(";")[0].split(", ")
    assert ran[0] == stage and "calibrate" not in ran, ran
    # h44: the rerun says which stage was left unfinished, and the verdict keeps it
    said = [ln for ln in err.getvalue().splitlines() if "never finished" in ln]
    assert len(said) == 1 and said[0].startswith(f"[{stage}] started "), err.getvalue()[-800:]
    resumed = json.loads((out / "verdict.json").read_text())["resumed_after"]
    assert len(resumed) == 1 and resumed[0].startswith(f"[{stage}] started ")

    def files(folder: Path) -> dict[str, str]:
        return {str(f.relative_to(folder)): file_digest(f) for f in sorted(folder.rglob("*"))
                if f.is_file() and f.name not in ("run.json", ".run.lock", "verdict.json",
                                                  "report.html")
                and f.parts[len(folder.parts)] != "evals"}  # the cache keeps its seconds

    assert files(out) == files(ref)
    # the verdict and the report are the never-killed run's but for the resume's record
    verdicts = [json.loads((f / "verdict.json").read_text()) for f in (out, ref)]
    assert verdicts[1]["resumed_after"] == []
    assert {**verdicts[0], "resumed_after": []} == verdicts[1]
