"""The README's first section (the one command and the verdict of a real run) and the
per-stage block of docs/expert.md (the README links it), as written, on an image model
with static shapes.

Every ``quantscope`` line of the per-stage block runs twice: with the optional
``[…]`` parts left out, and with them in (the first alternative of ``a|b``). Built-in
model/data lines (``demo``, ``models``) and ``pip`` are skipped; ``FILE`` becomes one
output per export format.
"""

import re
import shlex
from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_models as tm

from quantscope.cli import main

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
EXPERT = ROOT / "docs" / "expert.md"
RUN_VERDICT = ROOT / "docs" / "data" / "run_verdict.json"
"""The verdict.json of the real run whose console verdict the README shows (regenerate the
README's block with ``format_verdict`` when the verdict's form changes)."""
ONE_COMMAND = ("quantscope run minilm-l6 --data stdlib-docs --target hailo10h --goal 0.97 "
               "--max-cost 1.5 --out W")


def _commands() -> list[str]:
    text = EXPERT.read_text()
    block = text[text.index("## Per-stage commands"):]
    block = block[block.index("```bash") + 7: block.index("```", block.index("```bash") + 7)]
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [re.sub(r"\s+#.*$", "", ln).strip() for ln in joined.splitlines()]
    return [ln for ln in lines if ln.startswith("quantscope ")]


def _variant(line: str, *, optional: bool) -> list[str]:
    if optional:
        line = re.sub(r"\[([^\]]*)\]", r"\1", line)
        line = re.sub(r"(\S+)\|\S+", lambda m: m.group(1).split("|")[0], line)
    else:
        line = re.sub(r"\s*\[[^\]]*\]", "", line)
    return shlex.split(line)[1:]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    onnx.save(tm.conv_net(), "model.onnx")  # image input [N, 3, 16, 16]
    rng = np.random.default_rng(0)
    np.savez("calib.npz", image=rng.normal(0, 1, (64, 3, 16, 16)).astype(np.float32))
    np.savez("eval.npz", image=rng.normal(0, 1, (48, 3, 16, 16)).astype(np.float32))
    return tmp_path


@pytest.mark.parametrize("optional", [False, True], ids=["required", "with-options"])
def test_quick_start_runs_as_written_on_an_image_model(workdir, optional, capsys):
    ran = []
    for line in _commands():
        argv = _variant(line, optional=optional)
        if argv[0] in ("demo", "models") or argv[0].startswith("--"):
            continue
        if argv[0] == "lint" and "model.hn.json" in argv:
            continue  # needs a Hailo parser's .hn file, which this test has none of
        if argv[0] == "io" and "--check-mapping" in argv:
            argv[argv.index("--check-mapping") + 1] = "embedding=0:-1,127:0,255:1"
        if argv[0] == "export":
            for fmt, out in (("alls", "model.alls"), ("qdq", "q.onnx")):  # a hailo10h plan
                args = [a if a != "FILE" else out for a in argv]
                args[args.index("--format") + 1] = fmt
                assert main(args) == 0, (args, capsys.readouterr().err)
            ran.append("export")
            continue
        code = main(argv)
        assert code == 0, (argv, capsys.readouterr().err)
        ran.append(argv[0])
    want = {"calibrate", "evaluate", "analyze", "plan", "repair", "check", "io", "report",
            "export", "export-qdq", "groups"} | (set() if optional else {"lint"})
    assert want <= set(ran)
    assert Path("report.html").stat().st_size > 0 and Path("model.alls").exists()


def test_the_readme_opens_with_the_one_command_and_the_verdict_of_its_real_run():
    """The first section: the issue's command, with no other flag, and the console verdict
    a real run printed, equal to what today's code prints from that run's verdict.json;
    the expert commands are one link away."""
    import json

    from quantscope.pipeline.verdict import format_verdict

    text = README.read_text()
    first = text[text.index("\n## "):]
    first = first[: first.index("\n## ", 4)]
    assert first.startswith("\n## One command") and ONE_COMMAND in first
    block = first[first.index("```text\n") + 8:]
    block = block[: block.index("```")]
    assert block.rstrip("\n") == format_verdict(json.loads(RUN_VERDICT.read_text()))
    assert block.startswith("verdict: goal top-1 agreement >= 97.0 % ")
    assert "](docs/expert.md)" in first
    assert "quantscope calibrate" not in text.split("## What `run` does", 1)[0]
