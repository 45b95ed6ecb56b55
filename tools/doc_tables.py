"""Tables of figures in README.md and docs/*.md, generated from JSON kept in docs/data/.

A generated table sits between two marker comments in the markdown::

    <!-- table:demo -->
    | config | recall@1 | ... |
    <!-- /table -->

``NAME`` is a key of ``TABLES``: a renderer that reads JSON files under ``docs/data/``
(written by a command, e.g. ``quantscope demo --json docs/data/demo.json``, or transcribed
from a dated source, e.g. ``docs/data/peers.json``) and returns the table's lines.

    python tools/doc_tables.py --write   # regenerate every marked table in place
    python tools/doc_tables.py --check   # exit 1, naming each table that differs

``tests/test_doc_drift.py`` runs the check, so a figure edited by hand in a marked table
fails the suite; change the JSON (by rerunning its command) and ``--write`` instead.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data"
DOCS = ("README.md", "docs/benchmarks.md", "docs/peers.md")

MARK = re.compile(r"<!-- table:([a-z0-9-]+) -->\n(.*?)<!-- /table -->", re.S)

# demo.json's result labels -> the row label the docs print, in the docs' order
DEMO_ROWS = (
    ("fp32", "fp32"),
    ("a8_w8", "a8_w8 (all ops)"),
    ("a16_w8", "a16_w8 (all ops)"),
    ("a16_w16", "a16_w16 (all ops)"),
    ("a8_w8 weighted only", "a8_w8, weighted layers only"),
)
# the README's peer rows: (row label, demo.json result label, peers.json row keys)
PEER_ROWS = (
    ("W8A8, every op", "a8_w8", ("ort-w8a8-all", "aimet-w8a8", "aimet-w8a8-mask")),
    ("W8A8 weighted ops only", "a8_w8 weighted only", ("ort-w8a8-matmul-pc", "ort-w8a8-matmul-pt")),
    ("W8A16", "a16_w8", ("ort-w8a16", "aimet-w8a16")),
    ("W16A16", "a16_w16", ("ort-w16a16", "aimet-w16a16")),
)


def load(name: str) -> dict[str, Any]:
    """One JSON file of ``docs/data/``."""
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _span(v: float | list[float], fmt: Callable[[float], str]) -> str:
    """A figure or a [low, high] range as the peers reported it."""
    if isinstance(v, list):
        lo, hi = (fmt(x) for x in v)
        return f"{lo.removesuffix(' %')}–{hi}"
    return fmt(v)


def demo_table(results: dict[str, Any] | None = None) -> list[str]:
    """README / benchmarks: ``quantscope demo``'s table, from ``docs/data/demo.json``.

    ``results`` (``run_demo()["results"]``) renders a fresh run instead, for the drift test.
    """
    res = load("demo.json")["results"] if results is None else results
    out = ["| config | recall@1 | top-1 agreement with FP32 | cosine mean | cosine min | norm CV | collapse |",
           "|---|---|---|---|---|---|---|"]
    for key, label in DEMO_ROWS:
        m = res[key]["metrics"]
        out.append(f"| {label} | {m['recall@1']:.3f} | {pct(m['top1_agreement'])} | "
                   f"{m['embedding_cosine_mean']:.4f} | {m['embedding_cosine_min']:.4f} | "
                   f"{m['norm_cv']:.3f} | {'YES' if m['collapsed'] else 'no'} |")
    return out


def _peer_cell(rows: dict[str, dict[str, Any]], keys: tuple[str, ...], tool: str) -> str:
    cells = []
    for k in keys:
        r = rows[k]
        if r["tool"] != tool:
            continue
        cell = _span(r["top1_agreement"], pct)
        if r.get("short"):
            cell += f" ({r['short']})"
        cells.append(cell)
    return ", ".join(cells) or "–"


def peers_summary_table() -> list[str]:
    """README: quantscope (demo.json) beside the peer tools (peers.json), top-1 agreement."""
    res, peers = load("demo.json")["results"], load("peers.json")
    rows = {r["key"]: r for r in peers["rows"]}
    why = peers["why"]
    out = ["| configuration | quantscope | ONNX Runtime quantizer | AIMET-ONNX | why they differ |",
           "|---|---|---|---|---|"]
    for label, demo_key, keys in PEER_ROWS:
        ours = pct(res[demo_key]["metrics"]["top1_agreement"])
        ours = f"**{ours}**" if demo_key == "a8_w8" else ours
        out.append(f"| {label} | {ours} | {_peer_cell(rows, keys, 'ORT')} | "
                   f"{_peer_cell(rows, keys, 'AIMET')} | {why[label]} |")
    return out


def peers_table() -> list[str]:
    """docs/peers.md: every peer measurement of ``docs/data/peers.json``."""
    peers = load("peers.json")
    out = ["| tool | configuration | top-1 agreement (evaluation pairs) | cosine mean | notes |",
           "|---|---|---|---|---|"]
    for r in peers["rows"]:
        cos = _span(r["cosine_mean"], lambda x: f"{x:.4g}")
        out.append(f"| {peers['tools'][r['tool']]} | {r['config']} | "
                   f"{_span(r['top1_agreement'], pct)} | {cos} | {r.get('notes', '')} |")
    return out


def side_by_side_table() -> list[str]:
    """docs/peers.md: quantscope and the peers on the identical pairs (peers.json)."""
    s = load("peers.json")["side_by_side"]
    out = ["| configuration | quantscope | ONNX Runtime quantizer | AIMET-ONNX |",
           "|---|---|---|---|"]
    for r in s["rows"]:
        cells = [pct(r[k]) if r.get(k) is not None else "–" for k in ("quantscope", "ort", "aimet")]
        out.append(f"| {r['config']} | " + " | ".join(cells) + " |")
    return out


TABLES: dict[str, Callable[[], list[str]]] = {
    "demo": demo_table,
    "peers-summary": peers_summary_table,
    "peers": peers_table,
    "peers-side-by-side": side_by_side_table,
}


def render(text: str) -> str:
    """``text`` with every marked table replaced by its render."""
    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in TABLES:
            raise SystemExit(f"unknown table {name!r}; known: {', '.join(TABLES)}")
        body = "\n".join(TABLES[name]())
        return f"<!-- table:{name} -->\n{body}\n<!-- /table -->"
    return MARK.sub(one, text)


def tables_in(text: str) -> dict[str, str]:
    """Every marked table's body, by name (a name used twice keeps its last body)."""
    return {m.group(1): m.group(2) for m in MARK.finditer(text)}


def drift(root: Path | None = None) -> list[str]:
    """``file: table NAME`` for every marked table (of the docs under ``root``, by default the
    repository) whose text differs from its render."""
    out = []
    for rel in DOCS:
        text = ((root or ROOT) / rel).read_text(encoding="utf-8")
        want = tables_in(render(text))
        for m in MARK.finditer(text):
            if m.group(2) != want[m.group(1)]:
                out.append(f"{rel}: table {m.group(1)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate every marked table in place")
    mode.add_argument("--check", action="store_true", help="exit 1 when a marked table differs")
    args = ap.parse_args(argv)
    if args.check:
        bad = drift()
        for line in bad:
            print(f"drift: {line} differs from its JSON (python tools/doc_tables.py --write)")
        return 1 if bad else 0
    for rel in DOCS:
        path = ROOT / rel
        text = path.read_text(encoding="utf-8")
        new = render(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
