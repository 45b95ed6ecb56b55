"""No import circles between quantscope's modules (tools/import_cycles.py)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import import_cycles  # noqa: E402


def test_the_package_has_no_import_circle() -> None:
    found = import_cycles.cycles(import_cycles.import_edges(
        import_cycles.module_names(ROOT / "src" / "quantscope")))
    assert found == []


def test_the_finder_sees_a_circle_through_a_function_local_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import g\n\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text("def g():\n    from pkg import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from pkg import a\n")
    found = import_cycles.cycles(import_cycles.import_edges(import_cycles.module_names(pkg)))
    assert found == [["pkg.a", "pkg.b"]]
