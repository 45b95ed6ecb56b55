"""docs/architecture.md "Where things go": each addition done once, here, with the edits it took.

Every test adds one kind of thing the way a contributor would: the new code lives in the
test (or in a module the test writes, standing for the new module) and each registry entry is
one ``monkeypatch.setitem`` — one line of the registry's literal. ``EDITS`` counts the places
touched; ``test_the_docs_table_gives_these_counts`` keeps docs/architecture.md's "edits"
column equal to them, so the table cannot claim fewer edits than doing it takes.
"""

from __future__ import annotations

import importlib
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_models as tm

from quantscope.types import Metrics, Plan, Precision, Problem

ROOT = Path(__file__).resolve().parents[1]

# row of the docs table -> (edits, the test here or elsewhere that does it)
EDITS: dict[str, int] = {
    "a target rule": 1,
    "a target rule with a new check": 4,
    "a target": 2,
    "a repair": 2,
    "a rewrite": 2,
    "a task metric": 2,
    "a built-in model": 2,
    "an export format": 2,
    "a step of `quantscope run`": 2,
    "a table of figures in the docs": 3,
    "a result file (typed, tagged)": 2,
}


def _write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> None:
    """The contributor's one new module, importable by its name."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)


def _model(tmp_path: Path):
    from quantscope import stages

    path = tmp_path / "m.onnx"
    onnx.save(tm.layernorm_block(), path)
    return stages.open_model(path)


def _target_toml(tmp_path: Path, extra: str = "", name: str = "ort_cpu") -> Path:
    src = (ROOT / "src/quantscope/targets/ort_cpu.toml").read_text()
    path = tmp_path / f"{name}.toml"
    path.write_text(src.replace('name = "ort_cpu"', f'name = "{name}"') + extra)
    return path


RULE = """
[[rules]]
id = "mine.no_16bit_layernorm"
check = "{check}"
severity = "error"
reason = "the compiler refuses 16-bit LayerNorm (example rule)"
provenance = "an example in tests/test_where_things_go.py"
fix = "keep LayerNorm at a8_w8"
params = {{ kinds = ["normalization"] }}
"""


def _all16(model) -> Plan:
    return Plan.uniform(Precision.A16_W16)


def _problems(model, target) -> list[Problem]:
    from quantscope.model.groups import find_groups
    from quantscope.plan.check import check

    groups = find_groups(model)
    return check(_all16(model), groups, model, target)


def test_a_target_rule_is_one_toml_entry(tmp_path):
    """1 edit: a ``[[rules]]`` entry naming an existing check."""
    from quantscope.targets.profile import load_target_file

    model = _model(tmp_path)
    plain = load_target_file(_target_toml(tmp_path))
    ruled = load_target_file(_target_toml(tmp_path, RULE.format(check="act16_on_kinds"),
                                          name="ruled"))
    assert not [p for p in _problems(model, plain) if p.rule == "mine.no_16bit_layernorm"]
    hits = [p for p in _problems(model, ruled) if p.rule == "mine.no_16bit_layernorm"]
    assert hits and "16-bit LayerNorm" in hits[0].reason


def test_a_target_rule_with_a_new_check(tmp_path, monkeypatch):
    """4 edits: the check function, its ``CHECKS`` entry, its ``CHECK_NAMES`` line (the
    profile reader sits below ``plan`` and validates names without importing it), the rule."""
    check_mod = importlib.import_module("quantscope.plan.check")  # the package face
    # re-exports the function `check` under the same name
    from quantscope.targets import profile
    from quantscope.targets.profile import load_target_file

    def no_layernorm_16(rule, group, precision, ctx) -> Problem | None:  # the new check
        if group.op_type == "LayerNormalization" and precision.act_bits == 16:
            return Problem(group=group.name, rule=rule.id, reason=rule.reason,
                           provenance=rule.provenance, fix=rule.fix, severity=rule.severity)
        return None

    monkeypatch.setitem(check_mod.CHECKS, "no_layernorm_16", no_layernorm_16)
    monkeypatch.setattr(profile, "CHECK_NAMES", (*profile.CHECK_NAMES, "no_layernorm_16"))
    target = load_target_file(_target_toml(tmp_path, RULE.format(check="no_layernorm_16")))
    hits = [p for p in _problems(_model(tmp_path), target) if p.rule == "mine.no_16bit_layernorm"]
    assert hits


def test_a_target_is_a_toml_file_and_one_entry(tmp_path, monkeypatch):
    """2 edits: ``targets/NAME.toml`` and its ``BUILTIN_TARGETS`` entry."""
    from quantscope import targets

    path = _target_toml(tmp_path, name="mine")
    with pytest.raises(Exception, match="mine"):
        targets.load_target("mine")
    monkeypatch.setitem(targets.BUILTIN_TARGETS, "mine", str(path))  # absolute: joins as is
    assert targets.load_target("mine").name == "mine"


def test_a_repair_is_one_module_and_one_entry(tmp_path, monkeypatch):
    """2 edits: a module with a ``*_step`` function and one ``REGISTRY`` entry."""
    from quantscope import stages
    from quantscope.repair import registry
    from quantscope.repair.apply import run_repairs

    _write_module(tmp_path, monkeypatch, "qs_example_repair", """
        from quantscope.repair import RepairInput, RepairStep

        def noop_step(inp: RepairInput) -> RepairStep:
            return RepairStep(reason=f"looked at {len(inp.model.proto.graph.node)} nodes")
    """)
    import qs_example_repair

    monkeypatch.setitem(registry.REGISTRY, "noop", registry.RepairSpec(
        qs_example_repair.noop_step, keeps_fp32=True, default=False, help="an example"))
    model = _model(tmp_path)
    x = np.random.default_rng(0).normal(0, 1, (8, 6, 24)).astype(np.float32)
    feeds = [{model.proto.graph.input[0].name: x}]
    data = tmp_path / "x.npy"
    np.save(data, x)
    stats = stages.calibrate_model(model, stages.open_data(data, model, show=False))
    ran = run_repairs(model, stats, _all16(model), feeds, repairs=["noop"],
                      registry=registry.REGISTRY)
    assert [r.name for r in ran.records] == ["noop"]
    assert "looked at" in ran.records[0].reason


def test_a_rewrite_is_proved_in_its_own_test():
    """2 edits (1 module + 1 ``REWRITES`` entry): tests/test_rewrites_registry.py registers a
    sixth rewrite and runs it through ``quantscope run`` and its verdict."""
    text = (ROOT / "tests/test_rewrites_registry.py").read_text()
    assert "sixth" in text and "REWRITES" in text


def test_a_task_metric_is_a_function_and_a_line(tmp_path):
    """2 edits: the metric function (``tasks/metrics.py``) and one line in the task's
    ``metrics`` values; the new key reaches the result and can be a goal's metric."""
    from dataclasses import dataclass

    from quantscope.tasks.maps import ScoreTask

    def score_sq_error_mean(r: np.ndarray, t: np.ndarray) -> float:  # edit 1
        return float(np.mean((t - r) ** 2))

    @dataclass(frozen=True, eq=False)
    class Edited(ScoreTask):  # stands for the task's own metrics(), edited in place
        def metrics(self, ref, test) -> Metrics:
            m = super().metrics(ref, test)
            r, t = ref.concat(self.output), test.concat(self.output)
            values = {**m.values, "score_sq_error_mean": score_sq_error_mean(r, t)}  # edit 2
            return Metrics(values=values, notes=m.notes)

    rng = np.random.default_rng(0)
    ref = rng.uniform(0, 1, (16, 1)).astype(np.float32)
    test = (ref + rng.normal(0, 0.01, ref.shape)).astype(np.float32)
    from quantscope.types import Outputs

    def outs(a):
        return Outputs(names=("p",), batches=((a,),))

    m = Edited(name="score", output="p").metrics(outs(ref), outs(test))
    assert 0 < m.values["score_sq_error_mean"] < 1e-3


def test_a_built_in_model_is_one_builder_and_one_entry(tmp_path, monkeypatch):
    """2 edits: a builder module and one ``BUILTIN_MODELS`` entry."""
    from quantscope import stages, zoo

    monkeypatch.setenv("QUANTSCOPE_CACHE", str(tmp_path / "cache"))
    _write_module(tmp_path, monkeypatch, "qs_example_zoo", """
        from pathlib import Path

        import onnx
        import tiny_models

        def build(folder: Path) -> Path:
            dest = folder / "example.v1.onnx"
            onnx.save(tiny_models.layernorm_block(), dest)
            return dest
    """)
    monkeypatch.setitem(zoo.BUILTIN_MODELS, "example-tiny", zoo.BuiltinModel(
        builder="qs_example_zoo:build", filename="example.v1.onnx", requires=(), extra="",
        task="image", summary="an example", package="", version="", licence="MIT"))
    model = stages.open_model("example-tiny")
    assert len(model.proto.graph.node) == len(tm.layernorm_block().graph.node)


def test_an_export_format_is_proved_in_its_own_test():
    """2 edits (a translator + one ``FORMATS`` entry; a target whose vendor default does not
    include it names it in its TOML ``formats``): tests/test_export_formats.py."""
    text = (ROOT / "tests/test_export_formats.py").read_text()
    assert "FORMATS" in text


def test_a_run_step_is_one_function_and_one_entry(tmp_path, monkeypatch, capsys):
    """2 edits: a ``(Context) -> Done`` function and its ``pipeline.STAGES`` entry."""
    import quantscope.pipeline as pipeline
    from quantscope.pipeline.context import RunOptions
    from quantscope.pipeline.steps import Done
    from quantscope.serde import read_json

    def shapes(ctx) -> Done:  # the new step: writes one stable file
        (ctx.path("shapes.txt")).write_text("one line\n")
        return Done(("shapes.txt",))

    stages = dict(pipeline.STAGES)
    ordered = {k: v for k, v in stages.items() if k != "report"}
    ordered["shapes"] = pipeline.StageSpec(shapes, (), (), False)
    ordered["report"] = stages["report"]
    monkeypatch.setattr(pipeline, "STAGES", ordered)
    m = tmp_path / "m.onnx"
    onnx.save(tm.layernorm_block(), m)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(0, 1, (16, 6, 24))
            .astype(np.float32))
    out = tmp_path / "W"
    res = pipeline.run_pipeline(RunOptions(model=str(m), data=str(tmp_path / "x.npy"),
                                           target="hailo10h", out=str(out)), progress=False)
    assert "shapes" in res.ran and (out / "shapes.txt").read_text() == "one line\n"
    assert "shapes" in read_json(out / "run.json", "run")["stages"]


def test_a_docs_table_is_a_renderer_an_entry_and_markers(monkeypatch):
    """3 edits: a renderer, its ``TABLES`` entry, the two markers in the markdown."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import doc_tables
    finally:
        sys.path.remove(str(ROOT / "tools"))
    monkeypatch.setitem(doc_tables.TABLES, "example", lambda: ["| a |", "|---|", "| 1 |"])
    text = "before\n<!-- table:example -->\nstale\n<!-- /table -->\nafter\n"
    assert "| 1 |" in doc_tables.render(text) and "stale" not in doc_tables.render(text)


def test_a_result_file_is_proved_in_its_own_test():
    """2 edits: a ``TaggedResult`` type and one ``RESULT_READERS`` entry:
    tests/test_results.py::test_another_result_type_is_one_registry_entry."""
    text = (ROOT / "tests/test_results.py").read_text()
    assert "def test_another_result_type_is_one_registry_entry" in text


def test_the_docs_table_gives_these_counts():
    """docs/architecture.md's "edits" column says what the tests above took."""
    doc = (ROOT / "docs/architecture.md").read_text()
    section = doc.split("## Where things go", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0].startswith("a"):
            rows[cells[0]] = cells[3]
    for row, edits in EDITS.items():
        assert row in rows, f"docs table has no row '{row}'"
        got = re.match(r"\d+", rows[row])
        assert got and int(got.group()) == edits, (row, rows[row], edits)
