"""The CLI's front door: grouped --help that imports no command, each command's help opening
with what it is for and an example, defaults stated, options checked before any stage runs,
consistent option spellings, and the README's command table generated from the CLI's."""

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_models as tm

from quantscope.cli import main
from quantscope.cli.commands import COMMANDS, EXAMPLE, GROUPS, markdown_table, parser


def _subparsers():
    action = next(a for a in parser()._actions if a.dest == "command")
    return action.choices


def test_help_groups_every_command_and_ends_with_the_example(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    heads = [out.index(f"  {g}:\n") for g in GROUPS]
    assert heads == sorted(heads)  # start here, steps, rewrites, deployment
    for name, c in COMMANDS.items():  # each command under its own group's heading
        at = out.index(f"\n    {name} ")
        assert heads[GROUPS.index(c.group)] < at, name
        assert all(at < h for h in heads[GROUPS.index(c.group) + 1:]), name
    assert out.rstrip().endswith(EXAMPLE)
    assert list(COMMANDS)[:3] == ["run", "demo", "models"]


def test_help_imports_no_command_module_and_no_stage():
    """``quantscope --help`` reads the rewrite registry (the rewrite rows are its entries'
    summaries; that loads onnx) but imports no command module, no stage and no pipeline."""
    code = ("import sys\nfrom quantscope.cli import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\n"
            "heavy = [m for m in sys.modules if m in ('quantscope.stages', 'quantscope.pipeline')"
            " or m.startswith("
            "'quantscope.cli.') and m.split('.')[-1] not in ('commands', 'options', 'types', 'numbers')]"
            "\nprint('HEAVY', ','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().splitlines()[-1] == "HEAVY", out


def test_running_a_command_imports_only_its_module(tmp_path):
    onnx.save(tm.layernorm_block(), tmp_path / "m.onnx")
    code = ("import sys\nfrom quantscope.cli import main\n"
            f"assert main(['groups', {str(tmp_path / 'm.onnx')!r}]) == 0\n"
            "print('CLI', ','.join(sorted(m for m in sys.modules "
            "if m.startswith('quantscope.cli.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    families = out.strip().splitlines()[-1].removeprefix("CLI ").split(",")
    assert {f.split(".")[-1] for f in families} == {"commands", "inputs", "inspect", "numbers", "options",
                                                    "types"}


def test_every_command_help_opens_with_its_purpose_and_an_example():
    for name, sub in _subparsers().items():
        summary = COMMANDS[name].summary
        assert sub.description.startswith(summary[0].upper() + summary[1:] + ".\n\n"), name
        text = sub.format_help()
        purpose, example = text.split("\n\n")[1:3]  # after the usage
        assert purpose.startswith(summary[0].upper() + summary[:9][1:]), name
        assert (example + " ").startswith(f"  quantscope {name} "), name


def test_run_help_states_its_defaults():
    run = _subparsers()["run"]
    helps = {a.dest: a.help for a in run._actions}
    for dest in ("goal", "max_cost", "seq_len", "pairs", "method", "proxy", "repairs",
                 "repair_batches", "eval_data", "metric"):
        assert "default" in helps[dest], dest


@pytest.mark.parametrize(("options", "needle"), [
    (["--target", "hailo11"], "unknown target 'hailo11': use one of hailo8, hailo8l, hailo10h"),
    (["--target", "hailo10h", "--repairs", "equalise"], "unknown repair 'equalise': use "),
])
def test_a_bad_option_of_run_fails_before_any_stage(tmp_path, monkeypatch, capsys, options,
                                                     needle):
    """A mistyped target or repair is one line within a second: no model is built (the
    built-in model's cache stays empty), no data read, no run folder made."""
    import quantscope.cli.run  # noqa: F401  (the imports are not what is timed)

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("QUANTSCOPE_CACHE", str(cache))
    argv = ["run", "minilm-l3", "--data", "stdlib-docs", *options, "--out", str(tmp_path / "W")]
    started = time.perf_counter()
    code = main(argv)
    seconds = time.perf_counter() - started
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert needle in err, err
    assert seconds < 1.0
    assert not (tmp_path / "W").exists() and list(cache.iterdir()) == []


@pytest.mark.parametrize(("argv", "needle"), [
    (["check", "--model", "{m}", "--target", "hailo99", "{p}"],
     "argument --target: unknown target 'hailo99'"),
    (["calibrate", "{m}", "--data", "stdlib-docs", "--tokenizer", "{tmp}/nope.json", "--out",
      "{tmp}/s.npz"], "argument --tokenizer: tokenizer not found: "),
])
def test_a_bad_name_is_reported_before_the_model_is_opened(tmp_path, capsys, argv, needle):
    """The target and the tokenizer are checked while parsing, before the (here truncated)
    model is read; before, the model's error came first."""
    (tmp_path / "m.onnx").write_bytes(b"\x08\x07")
    (tmp_path / "p.json").write_text('{"default": "a8_w8", "groups": {}}')
    code = main([a.format(m=tmp_path / "m.onnx", p=tmp_path / "p.json", tmp=tmp_path)
                 for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and needle in err, err


@pytest.mark.parametrize(("command", "old", "new", "dest", "value"), [
    ("buckets", "--lengths", "--seq-len", "lengths", (64, 128)),
    ("repair", "--batches", "--repair-batches", "batches", 4),
])
def test_aligned_option_spellings_keep_the_old_one(command, old, new, dest, value):
    sub = _subparsers()[command]
    action = next(a for a in sub._actions if a.dest == dest)
    assert action.option_strings[:2] == [new, old]  # the consistent spelling first
    text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
    assert action.type(text) == value


def test_io_snippet_is_spelled_like_every_other_output(tmp_path, capsys):
    onnx.save(tm.layernorm_block(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy",
            np.random.default_rng(0).normal(0, 1, (16, 5, 24)).astype(np.float32))
    assert main(["calibrate", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npy"),
                 "--out", str(tmp_path / "s.npz")]) == 0
    for flag, name in (("--out-snippet", "a.py"), ("--snippet", "b.py")):
        assert main(["io", str(tmp_path / "m.onnx"), "--stats", str(tmp_path / "s.npz"),
                     "--precision", "a8_w8", flag, str(tmp_path / name)]) == 0
    capsys.readouterr()
    assert (tmp_path / "a.py").read_text() == (tmp_path / "b.py").read_text()


def test_readme_command_table_is_the_clis():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert markdown_table() in readme
    assert markdown_table().count("\n| ") == len(COMMANDS)


def test_a_command_is_one_entry_and_two_functions(monkeypatch, capsys):
    """Adding a command, done once: one COMMANDS entry, and add_NAME / cmd_NAME side by side
    in its family's module (here a module of its own); help, parsing and running follow."""
    import argparse
    import types

    from quantscope.cli import commands
    from quantscope.cli.options import command

    family = types.ModuleType("quantscope.cli.hello")

    def add_hello(sub: argparse._SubParsersAction, summary: str) -> None:
        p = command(sub, "hello", summary, example="quantscope hello --name world")
        p.add_argument("--name", default="world", help="whom to greet (default: world)")

    def cmd_hello(args: argparse.Namespace) -> int:
        print(f"hello {args.name}")
        return 0

    family.add_hello, family.cmd_hello = add_hello, cmd_hello
    monkeypatch.setitem(sys.modules, "quantscope.cli.hello", family)
    monkeypatch.setitem(commands.COMMANDS, "hello",
                        commands.Command("hello", "steps", "greet someone"))
    assert main(["hello", "--name", "npu"]) == 0
    assert capsys.readouterr().out == "hello npu\n"
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert out.index("  steps:") < out.index("    hello       greet someone") < out.index(
        "  rewrites:")
    assert "| steps | `hello` | greet someone |" in commands.markdown_table()
