"""Regenerate the frozen ``stdlib-docs`` retrieval data in ``src/quantscope/data/``.

query = the summary (first paragraph) of a Python standard-library docstring, document =
the rest of that docstring. Kept: summary >= 4 words, body >= 15 words, summaries and
bodies unique. The set depends on the Python version, so it is frozen in the package;
``stdlib_docs.meta.json`` records the version and counts.

Selection is deterministic: candidates are ranked by the SHA-256 of their qualified name;
the first ``--pairs`` become evaluation pairs. Calibration texts (``--calib``) come from
the other docstrings (spare pairs' summaries and bodies, docstrings that are no pair) and
never equal an evaluation query or document.

    python tools/build_stdlib_docs.py            # writes src/quantscope/data/stdlib_docs*
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import importlib
import inspect
import io
import json
import pkgutil
import sys
import warnings
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "src" / "quantscope" / "data"
# side effects on import (browser, GUI, prints, deprecated shims) or not docs at all
SKIP = {
    "antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "ensurepip",
    "lib2to3", "pydoc_data", "test", "__main__", "__future__", "xxlimited", "xxsubtype",
    "xxlimited_35", "msilib", "winreg", "winsound", "_winapi", "nt", "msvcrt",
}  # fmt: skip
MAX_BODY_WORDS = 300


def clean(text: str) -> str:
    return " ".join(text.split())


def split_doc(doc: str) -> tuple[str, str]:
    """Summary = first paragraph, body = the rest (whitespace normalised)."""
    head, _, rest = doc.strip().partition("\n\n")
    return clean(head), " ".join(clean(rest).split(" ")[:MAX_BODY_WORDS])


def try_import(name: str) -> bool:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - platform-specific modules are skipped
            return False
    return True


def public_modules() -> list[str]:
    """Public top-level stdlib modules and their public submodules, sorted, importable here."""
    found = []
    for name in sorted(n for n in sys.stdlib_module_names if not n.startswith("_")):
        if name in SKIP or not try_import(name):
            continue
        found.append(name)
        path = getattr(sys.modules[name], "__path__", None)
        for sub in sorted(m.name for m in pkgutil.walk_packages(path, f"{name}.") if path):
            parts = sub.split(".")
            if not any(p.startswith("_") or p in SKIP or p == "tests" for p in parts):
                if try_import(sub):
                    found.append(sub)
    return found


def belongs(obj: object, module_name: str) -> bool:
    """Defined in this module, or in a private/C module it re-exports (heapq <- _heapq)."""
    owner = getattr(obj, "__module__", None)
    return owner == module_name or (isinstance(owner, str) and owner.startswith(("_", "posix")))


def members(module_name: str) -> list[tuple[str, object]]:
    """(qualified name, object) for the module, its public classes/functions, their methods."""
    module = sys.modules[module_name]
    out: list[tuple[str, object]] = [(module_name, module)]
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_"):
            continue
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        out.append((f"{module_name}.{name}", obj))
        if inspect.isclass(obj):
            for meth, fn in sorted(vars(obj).items()):
                if not meth.startswith("_") and inspect.isroutine(fn):
                    out.append((f"{module_name}.{name}.{meth}", fn))
    return out


def looks_like_signature(summary: str, qualname: str) -> bool:
    short = qualname.rsplit(".", 1)[-1]
    return "->" in summary or summary.startswith((f"{short}(", f"S.{short}", f"B.{short}"))


def docstrings() -> list[tuple[str, str]]:
    """(qualified name, cleaned docstring) for every public stdlib object, first name wins."""
    seen: set[str] = set()
    out = []
    for module_name in public_modules():
        for qualname, obj in members(module_name):
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str) and doc.strip() and doc not in seen:
                seen.add(doc)
                out.append((qualname, inspect.cleandoc(doc)))
    return out


def split_pairs(docs: list[tuple[str, str]]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(pair candidates, other texts): a pair needs summary >= 4 words, body >= 15 words."""
    pairs, others = [], []
    seen_q: set[str] = set()
    seen_d: set[str] = set()
    for name, doc in docs:
        query, document = split_doc(doc)
        ok = len(query.split()) >= 4 and len(document.split()) >= 15
        ok = ok and not looks_like_signature(query, name)
        if ok and query not in seen_q and document not in seen_d:
            seen_q.add(query)
            seen_d.add(document)
            pairs.append({"name": name, "query": query, "document": document})
        else:
            others.append({"name": name, "text": clean(doc)})
    return pairs, others


def rank(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return sorted(rows, key=lambda r: hashlib.sha256(r["name"].encode()).hexdigest())


def calibration(
    spare_pairs: list[dict[str, str]], others: list[dict[str, str]], used: set[str], count: int
) -> list[str]:
    """Texts disjoint from the evaluation pairs: spare pairs' halves and other docstrings."""
    pool = [
        {"name": r["name"] + suffix, "text": r[key]}
        for r in spare_pairs
        for suffix, key in ((":q", "query"), (":d", "document"))
    ] + others
    texts: list[str] = []
    for row in rank(pool):
        text = " ".join(row["text"].split(" ")[:MAX_BODY_WORDS])
        if len(text.split()) >= 6 and text not in used and text not in texts:
            texts.append(text)
    if len(texts) < count:
        sys.exit(f"only {len(texts)} calibration texts; lower --calib")
    return texts[:count]


def write_gzip(path: Path, text: str) -> None:
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        gz.write(text.encode("utf-8"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=1500)
    parser.add_argument("--calib", type=int, default=512)
    parser.add_argument("--out", type=Path, default=DATA)
    args = parser.parse_args()
    candidates, others = split_pairs(docstrings())
    rows = rank(candidates)
    if len(rows) < args.pairs:
        sys.exit(f"only {len(rows)} candidate pairs; lower --pairs")
    pairs = rows[: args.pairs]
    used = {t for r in pairs for t in (r["query"], r["document"])}
    calib = calibration(rows[args.pairs :], others, used, args.calib)
    args.out.mkdir(parents=True, exist_ok=True)
    write_gzip(args.out / "stdlib_docs.jsonl.gz", "".join(json.dumps(r) + "\n" for r in pairs))
    write_gzip(args.out / "stdlib_docs_calib.txt.gz", "".join(t + "\n" for t in calib))
    meta = {
        "python": sys.version.split()[0],
        "candidate_pairs": len(rows),
        "pairs": len(pairs),
        "calibration_texts": len(calib),
        "licence": "PSF-2.0 (text of CPython docstrings)",
        "generator": "tools/build_stdlib_docs.py",
    }
    (args.out / "stdlib_docs.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
