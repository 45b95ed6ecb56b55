"""Export formats are a registry: a format is one translator plus one entry in ``FORMATS``,
and a target profile says which formats its compiler takes (``formats`` in its TOML)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import tiny_models as tm

from quantscope.calibrate.collect import calibrate
from quantscope.export.formats import FORMATS, ExportFormat, ExportInput
from quantscope.export.plan_export import export_plan
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.pipeline import steps
from quantscope.pipeline.context import Context, RunOptions
from quantscope.serde import write_plan, write_stats
from quantscope.targets import BUILTIN_TARGETS, load_target
from quantscope.targets.profile import parse_target
from quantscope.types import Plan, Precision, QuantscopeError

HERE = Path(steps.__file__).parents[1] / "targets"


def _profile(tmp_path: Path, name: str, formats_line: str | None, base: str = "ort_cpu") -> Path:
    text = (HERE / f"{base}.toml").read_text().replace(f'"{base}"', f'"{name}"')
    lines = [ln for ln in text.splitlines() if not ln.startswith("formats =")]
    if formats_line is not None:
        lines.insert(lines.index(next(ln for ln in lines if ln.startswith("name ="))) + 1,
                     formats_line)
    path = tmp_path / f"my_{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _group_names(inp: ExportInput) -> bytes:
    """A toy format: one line per group, its precision in the plan."""
    return "".join(f"{g.name} {inp.plan.precision_of(g.name)}\n"
                   for g in inp.groups.groups).encode()


def _run_folder(tmp_path: Path, target: str) -> Path:
    """The files the run's export step reads: the repaired model, its stats, its plan."""
    model = load_proto(tm.conv_net(), "conv")
    stats = calibrate(model, find_groups(model), [tm.sample_inputs(model.proto, seed=i)
                                                  for i in range(2)])
    folder = tmp_path / "run"
    folder.mkdir()
    onnx.save(model.proto, folder / steps.REPAIRED)
    write_stats(folder / steps.REPAIRED_STATS, stats)
    write_plan(folder / steps.REPAIRED_PLAN, Plan(default=Precision.A8_W8, target=target))
    return folder


def test_a_new_format_is_one_entry_and_the_run_writes_it(tmp_path, monkeypatch):
    # the one edit: an entry in the registry (its translator is the function above)
    monkeypatch.setitem(FORMATS, "groups", ExportFormat(
        "groups", "groups.txt", None, "the plan's precision per group", _group_names))
    # the target's own file says it takes the format (its own name: a file named like a
    # built-in that states other values is refused; once loaded, it is known by its name)
    profile = _profile(tmp_path, "my_cpu", 'formats = ["groups"]')
    assert load_target(profile).formats == ("groups",)
    folder = _run_folder(tmp_path, "my_cpu")
    ctx = Context(RunOptions(model="unused.onnx", data="unused.tsv", target=str(profile),
                             out=str(folder)), folder)
    done = steps.export(ctx)
    assert done.files == (steps.QDQ, "groups.txt")
    lines = (folder / "groups.txt").read_text().splitlines()
    assert lines and all(ln.endswith(" a8_w8") for ln in lines)
    # ``quantscope export --format groups`` writes through the same entry
    model, stats, plan = steps.repaired(ctx)
    out = export_plan(model, stats, plan, fmt="groups", out=tmp_path / "g.txt")
    assert out.read_text() == (folder / "groups.txt").read_text()


def test_builtin_profiles_name_the_formats_their_compilers_take():
    taken = {name: load_target(name).formats for name in BUILTIN_TARGETS}
    assert taken == {"hailo8": ("alls",), "hailo8l": ("alls",), "hailo10h": ("alls",),
                     "qnn_htp_v73": ("qnn",), "ort_cpu": ()}
    assert steps.formats("hailo10h") == [("alls", "model.alls")]
    assert steps.formats("qnn_htp_v73") == [("qnn", "qnn.encodings.json")]
    assert steps.formats("ort_cpu") == []


def test_a_profile_without_formats_takes_its_vendors(tmp_path):
    assert load_target(_profile(tmp_path, "myhailo", None, base="hailo8")).formats == ("alls",)
    assert load_target(_profile(tmp_path, "mycpu", None)).formats == ()


@pytest.mark.parametrize("line, message", [
    ('formats = ["alls", "onnx"]', "unknown export format 'onnx' in 'formats'"),
    ('formats = "alls"', "'formats' in target profile"),
    ('formats = ["qnn", "qnn"]', "names a format twice"),
])
def test_profile_formats_are_checked_against_the_registry(tmp_path, line, message):
    with pytest.raises(QuantscopeError, match=message) as err:
        load_target(_profile(tmp_path, "bad", line))
    assert "\n" not in str(err.value) and "my_bad.toml" in str(err.value)


def test_an_unknown_format_is_one_line_before_any_work():
    raw = {"name": "x"}  # never read: the format is refused first
    with pytest.raises(QuantscopeError, match=r"unknown export format 'npy': use alls, qnn or qdq"):
        export_plan(raw, raw, Plan(default=Precision.A8_W8), fmt="npy",  # type: ignore[arg-type]
                    out="never.npy")
    with pytest.raises(QuantscopeError):
        parse_target({"formats": ["npy"]}, source="x.toml")


def test_the_verdict_lists_the_formats_of_a_profile_from_a_file(tmp_path):
    """A target profile read from a file (no built-in name) still gets its compiler files
    in the verdict, from its own ``formats`` (not from its name)."""
    from pathlib import Path

    from quantscope.pipeline.verdict import compiler_files
    from quantscope.targets.profile import load_target_file

    src = Path(__file__).resolve().parents[1] / "src/quantscope/targets/hailo10h.toml"
    mine = tmp_path / "mine.toml"
    mine.write_text(src.read_text().replace('name = "hailo10h"', 'name = "my_npu"', 1))
    files = compiler_files(load_target_file(mine))
    assert "model.alls" in files and "Dataflow Compiler" in files["model.alls"]
    assert list(files)[-1] == "quantized.qdq.onnx"
