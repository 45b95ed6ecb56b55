"""run's rewrite options, generated from the rewrite registry (the sixth rewrite as a
command: tests/test_rewrites_registry.py): ``run --rewrites`` names the
rewrites (the five legacy switches stay aliases), and either spelling gives the same run
(the same folder keys: a rerun the other way runs nothing)."""

import dataclasses

import numpy as np
import onnx
import pytest
from test_repair_heads import SEQ
from test_repair_heads import _encoder as attention_encoder

from quantscope.cli import main
from quantscope.rewrites.registry import REWRITES


def _run_args(tmp_path):
    onnx.save(attention_encoder(), tmp_path / "enc.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(100, 1000, (32, SEQ)).astype(np.int64),
             attention_mask=np.ones((32, SEQ), np.int64))
    return ["run", str(tmp_path / "enc.onnx"), "--data", str(tmp_path / "x.npz"),
            "--target", "hailo10h", "--out", str(tmp_path / "W"), "--seq-len", str(SEQ)]


def _options(argv):
    """The RunOptions ``quantscope run argv`` builds (parsed as main parses it)."""
    from quantscope.cli.commands import parser
    from quantscope.cli.run import run_rewrites
    from quantscope.pipeline import RunOptions

    args = parser(["run"]).parse_args(argv)
    return RunOptions(model=args.model, data=args.data, target=args.target, out=args.folder,
                      seq_len=args.seq_len, **run_rewrites(args))


@pytest.mark.parametrize(("legacy", "named"), [
    (["--headsplit", "--tokensplit", "4"], ["--rewrites", "tokensplit,headsplit",
                                            "--tokensplit-chunk", "4"]),
    (["--outscale", "--peel", "--rowscale"], ["--rewrites", "rowscale,peel,outscale"]),
    (["--tokensplit", "4", "--tokensplit-linears"], ["--rewrites", "tokensplit",
                                                     "--tokensplit-chunk", "4",
                                                     "--tokensplit-linears"]),
])
def test_the_legacy_switches_and_rewrites_give_the_same_run_options(tmp_path, legacy, named):
    from quantscope.pipeline.context import Context

    argv = _run_args(tmp_path)
    old, new = _options([*argv, *legacy]), _options([*argv, *named])
    assert old == new
    assert [rw.name for rw, _ in new.rewrite_configs()] == [n for n in REWRITES
                                                           if n in new.rewrites]
    assert Context(old, tmp_path / "W").model_digest() == Context(new,
                                                                   tmp_path / "W").model_digest()


def test_a_run_given_the_old_flags_resumes_under_rewrites_with_nothing_rerun(tmp_path,
                                                                              capsys):
    argv = _run_args(tmp_path)
    assert main([*argv, "--headsplit"]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in (tmp_path / "W").iterdir() if p.is_file()}
    assert main([*argv, "--rewrites", "headsplit"]) == 0
    out = capsys.readouterr().out
    assert "stages run: none;" in out
    after = {p.name: p.read_bytes() for p in (tmp_path / "W").iterdir() if p.is_file()}
    assert after == before


def test_a_rewrite_config_value_changes_the_run_key_and_a_default_does_not(tmp_path):
    from quantscope.pipeline.context import Context

    argv = _run_args(tmp_path)
    plain = _options([*argv, "--rewrites", "rowscale"])
    grown = _options([*argv, "--rewrites", "rowscale", "--rowscale-growth", "1.5"])
    assert dict(dataclasses.asdict(grown.rewrite_configs()[0][1])) == {"growth": 1.5}
    folder = tmp_path / "W"
    assert Context(plain, folder).model_digest().endswith("/rowscale")  # as before
    assert Context(grown, folder).model_digest().endswith("/rowscale:growth=1.5")


@pytest.mark.parametrize(("extra", "needle"), [
    (["--rewrites", "auto", "--headsplit"], "--rewrites auto chooses the rewrites itself"),
    (["--rewrites", "heads"], "argument --rewrites: unknown rewrite 'heads': use 'none' or a "
                              "comma list of outscale, peel, headsplit, rowscale, tokensplit"),
    (["--rowscale-growth", "1.5"], "--rowscale-growth needs --rewrites rowscale"),
    (["--rewrites", "rowscale", "--rowscale-growth", "0.5"], "argument --rowscale-growth: 0.5 "
                                                              "is below 1"),
    (["--tokensplit-linears"], "--tokensplit-linears needs --tokensplit N or --rewrites "
                               "tokensplit"),
])
def test_a_bad_rewrite_option_is_one_line_before_any_stage(tmp_path, capsys, extra, needle):
    assert main([*_run_args(tmp_path), *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "W").exists()
