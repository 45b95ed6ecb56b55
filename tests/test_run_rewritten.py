"""The rewritten model is part of a run's resumable state: a rerun reuses it (no
recalibration, no rewrite) when the given model, the rewrite choice and the data match."""

import contextlib
import io
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from test_repair_heads import SEQ, _encoder

from quantscope.cli import main
from quantscope.pipeline import context
from quantscope.pipeline.manifest import MANIFEST, file_digest


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: file_digest(p) for p in sorted(folder.iterdir())
            if p.is_file() and p.name not in (MANIFEST, ".run.lock")}


def _headsplit_run(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """A tiny encoder, its token data and ``run --headsplit``'s argv (model, folder, argv);
    ``--repairs none``: no repair offer measured in the plan stage, which the reuse does not
    touch (test_repair_heads.test_run_with_headsplit_and_tokensplit runs the default)."""
    model = tmp_path / "enc.onnx"
    onnx.save(_encoder(), model)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(100, 1000, (16, SEQ)).astype(np.int64),
             attention_mask=np.ones((16, SEQ), np.int64))
    out = tmp_path / "W"
    return model, out, ["run", str(model), "--data", str(tmp_path / "x.npz"), "--target",
                        "hailo10h", "--out", str(out), "--headsplit", "--repairs", "none"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """The first ``run --headsplit`` both tests start from, made once: its folder (model,
    data, run folder) kept aside, the rewrites it ran and what it said on stderr."""
    base = tmp_path_factory.mktemp("rewritten")
    work = base / "work"
    work.mkdir()
    calls: list[str] = []
    real = context.run_rewrite

    def counted(*args, **kwargs):
        calls.append(args[0].name)
        return real(*args, **kwargs)

    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err):
        mp.setattr(context, "run_rewrite", counted)
        model, out, argv = _headsplit_run(work)
        assert main(argv) == 0
    shutil.copytree(work, base / "kept")
    return work, base / "kept", calls, err.getvalue(), (model, out, argv)


def _after_first_run(first_run) -> tuple[Path, Path, list[str], list[str], str]:
    """The first run's folder as it left it, at the path it ran in (the report names the
    run folder: a copy elsewhere would not be the same run): (model, folder, argv, the
    rewrites it ran, its stderr)."""
    work, kept, calls, err, (model, out, argv) = first_run
    shutil.rmtree(work)
    shutil.copytree(kept, work)
    return model, out, argv, list(calls), err


def test_rerun_reuses_the_rewritten_model_until_the_model_changes(first_run, capsys,
                                                                   monkeypatch):
    model, out, argv, calls, err = _after_first_run(first_run)
    assert calls == ["headsplit"] and (out / context.REWRITTEN).is_file()
    assert "rewritten model reused" not in err
    real = context.run_rewrite

    def counted(*args, **kwargs):
        calls.append(args[0].name)
        return real(*args, **kwargs)

    monkeypatch.setattr(context, "run_rewrite", counted)
    first = _digests(out)
    # a rerun: nothing rewritten again, every stage skipped
    assert main(argv) == 0
    said = capsys.readouterr().err
    assert calls == ["headsplit"] and "rewritten model reused" in said
    assert "headsplit: 1 attention(s) split" in said and "skipped" in said
    # every stage recomputed on the reused model: the same files, byte for byte
    assert main([*argv, "--force", "calibrate"]) == 0
    assert calls == ["headsplit"] and _digests(out) == first
    capsys.readouterr()
    # a changed given model (one weight) is rewritten again
    proto = _encoder()
    init = next(i for i in proto.graph.initializer if i.name == "wq")
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.01, "wq"))
    onnx.save(proto, model)
    assert main(argv) == 0
    assert calls == ["headsplit", "headsplit"]
    assert "rewritten model reused" not in capsys.readouterr().err
    assert _digests(out)[context.REWRITTEN] != first[context.REWRITTEN]


def test_the_reused_rewritten_model_is_read_as_the_run_loaded_it(first_run, capsys,
                                                                  monkeypatch):
    """rewritten.onnx holds the loaded form (checked, named, opset 21, shapes inferred):
    a rerun reads it back without loading it again and computes the same files; a folder
    written before (no "loaded" in rewritten.json) is still reused, loaded in full."""
    import json

    from quantscope import stages

    model, out, argv, _, _ = _after_first_run(first_run)
    first = _digests(out)
    kept = json.loads((out / context.REWRITTEN_KEY).read_text())
    assert kept[context.LOADED] is True and kept["notes"] == []
    written = onnx.load(out / context.REWRITTEN)
    assert written.opset_import[0].version >= 21 and len(written.graph.value_info) > 0
    loads = []
    real = stages.load_proto
    monkeypatch.setattr(stages, "load_proto", lambda p, s="": loads.append(s) or real(p, s))
    capsys.readouterr()
    assert main([*argv, "--force", "calibrate"]) == 0
    assert "rewritten model reused" in capsys.readouterr().err
    # the rewritten model (source: the given file) is not loaded again; the given model's
    # own load does not go through stages.load_proto, repaired.onnx's does
    assert str(model) not in loads and _digests(out) == first
    del kept[context.LOADED]  # as a folder written before wrote it
    (out / context.REWRITTEN_KEY).write_text(json.dumps(kept))
    assert main([*argv, "--force", "calibrate"]) == 0
    assert "rewritten model reused" in capsys.readouterr().err
    assert loads.count(str(model)) == 1 and _digests(out) == {
        **first, context.REWRITTEN_KEY: _digests(out)[context.REWRITTEN_KEY]}
