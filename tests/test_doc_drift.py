"""The docs' tables of figures equal the JSON they are generated from (tools/doc_tables.py).

README.md and docs/*.md mark generated tables with ``<!-- table:NAME -->`` … ``<!-- /table
-->``; the JSON lives in docs/data/ (``demo.json`` as ``quantscope demo --json`` wrote it).
A figure edited by hand fails here; a fresh demo run (slow) must reproduce the kept JSON.
"""

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import doc_tables  # noqa: E402


def test_every_marked_table_equals_the_render_of_its_json() -> None:
    assert doc_tables.drift() == []


def test_the_docs_mark_the_tables_they_generate() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    bench = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    peers = (ROOT / "docs" / "peers.md").read_text(encoding="utf-8")
    assert {"demo", "peers-summary"} <= set(doc_tables.tables_in(readme))
    assert "demo" in doc_tables.tables_in(bench)
    assert {"peers", "peers-side-by-side"} <= set(doc_tables.tables_in(peers))


def _copy_docs(dst: Path) -> None:
    for rel in doc_tables.DOCS:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, dst / rel)


def test_a_figure_edited_by_hand_is_drift(tmp_path: Path) -> None:
    _copy_docs(tmp_path)
    readme = tmp_path / "README.md"
    text = readme.read_text(encoding="utf-8")
    row = "| a8_w8 (all ops) | 0.324 | 50.6 % |"
    assert row in text
    readme.write_text(text.replace(row, "| a8_w8 (all ops) | 0.330 | 50.6 % |"), encoding="utf-8")
    assert doc_tables.drift(tmp_path) == ["README.md: table demo"]


def test_a_peer_figure_edited_by_hand_is_drift(tmp_path: Path) -> None:
    _copy_docs(tmp_path)
    peers = tmp_path / "docs" / "peers.md"
    text = peers.read_text(encoding="utf-8")
    assert "| 69.8 % | 0.934 |" in text
    peers.write_text(text.replace("| 69.8 % | 0.934 |", "| 70.8 % | 0.934 |"), encoding="utf-8")
    assert doc_tables.drift(tmp_path) == ["docs/peers.md: table peers"]


def test_the_check_command_exits_1_on_drift_and_names_the_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _copy_docs(tmp_path)
    bench = tmp_path / "docs" / "benchmarks.md"
    text = bench.read_text(encoding="utf-8")
    bench.write_text(text.replace("| a16_w16 (all ops) | 0.389 | 99.6 %",
                                  "| a16_w16 (all ops) | 0.389 | 99.9 %"), encoding="utf-8")
    monkeypatch.setattr(doc_tables, "ROOT", tmp_path)
    assert doc_tables.main(["--check"]) == 1
    assert "docs/benchmarks.md: table demo" in capsys.readouterr().out
    assert doc_tables.main(["--write"]) == 0
    assert doc_tables.main(["--check"]) == 0


@pytest.mark.slow
def test_a_fresh_demo_run_reproduces_the_kept_figures() -> None:
    from quantscope.demo import run_demo

    fresh = run_demo(progress=False)
    kept = doc_tables.load("demo.json")
    assert (fresh["model"], fresh["data"], fresh["calibration_samples"]) == (
        kept["model"], kept["data"], kept["calibration_samples"])
    assert doc_tables.demo_table(fresh["results"]) == doc_tables.demo_table()


def test_every_rule_cites_a_public_source_by_title_not_a_bare_id() -> None:
    from quantscope.targets import BUILTIN_TARGETS, load_target

    sources = (ROOT / "docs" / "sources.md").read_text(encoding="utf-8")
    for name in BUILTIN_TARGETS:
        for rule in load_target(name).rules:
            assert "seeds/" not in rule.provenance, (name, rule.id)
            assert '"' in rule.provenance and "docs/sources.md" in rule.provenance, (name, rule.id)
            report = rule.provenance.split("field report ")[1][:3]
            assert f"| {report} |" in sources, (name, rule.id, report)
