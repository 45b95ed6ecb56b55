"""``run`` given a Hugging Face causal-LM export itself: the phase pair made in the run
folder, once.

``quantscope run qwen/model.onnx --data stdlib-docs --target hailo10h --out R`` converts
the export as ``quantscope phases`` does (:func:`quantscope.model.hf_phases.convert_export`)
into ``R/phases/``, then runs the decoder pipeline on ``R/phases/model.prefill.onnx``. The
conversion is part of the run's resumable state: ``R/phases/export.json`` records the
digests of the export, its weight files and its tokenizer, so a rerun on the same files
reuses the pair (and the decoder stages' keys, which digest the pair, stay valid); a
changed export is converted again. The export is only read.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from quantscope.pipeline.manifest import file_digest
from quantscope.serde import read_json, write_json
from quantscope.types import QuantscopeError

PHASES_DIR = "phases"
STAMP = "export.json"


def _weight_files(export: Path) -> list[Path]:
    """The files the export's external weights are in (its ``location`` entries)."""
    graph = onnx.load(str(export), load_external_data=False).graph
    found: dict[str, None] = {}
    for t in graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for kv in t.external_data:
                if kv.key == "location":
                    found[kv.value] = None
    return [export.parent / name for name in found]


def _sources(export: Path, tokenizer: Path) -> dict[str, str]:
    """Digest of every file the conversion reads, by its path."""
    return {str(p.resolve()): file_digest(p)
            for p in (export, *_weight_files(export), tokenizer) if p.is_file()}


def phases_for_run(export: Path, folder: Path, tokenizer: Path | None,
                   say: bool = True) -> Path:
    """The prefill graph of ``export`` converted into ``folder/phases/`` (``folder``: the
    run folder, made here), or the one converted by an earlier run on the same files.
    Without a tokenizer (none beside the export, no ``--tokenizer``) one line, before any
    file is written: a decoder's run measures on text."""
    from quantscope.model.hf_phases import convert_export, read_export

    read_export(onnx.load(str(export), load_external_data=False))  # convertible: else one line
    if tokenizer is None:
        raise QuantscopeError(
            f"'{export}': a Hugging Face export's run measures on text, and there is no "
            "tokenizer.json beside it: give --tokenizer (its tokenizer.json or model folder)")
    out = folder / PHASES_DIR
    name = export.name.removesuffix(".onnx")
    prefill = out / f"{name}.prefill.onnx"
    sources = _sources(export, tokenizer)
    stamp = out / STAMP
    if stamp.is_file() and prefill.is_file() \
            and read_json(stamp, "conversion record").get("sources") == sources:
        if say:
            print(f"[phases] done already (same export): {prefill}")
        return prefill
    folder.mkdir(exist_ok=True)
    if say:
        print(f"[phases] converting {export} into {out}/ (as 'quantscope phases' does) …")
    done = convert_export(export, out, name, tokenizer)
    write_json(stamp, {"export": str(export), "sources": sources,
                       "files": [str(p) for p in done.written]})
    if say:
        print(done.said(export))
    return prefill


__all__ = ["PHASES_DIR", "phases_for_run"]
