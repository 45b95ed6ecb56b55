"""A built-in text encoder made small enough for the device tool's 64 MiB carry.

The word-embedding table (a Gather of an initializer, most of a small encoder's bytes) is
read only at the ids the data's texts tokenize to: every other row is set to zero and the
file is written gzip-compressed, so the zero rows cost nothing. Every figure computed on
the packaged data (stdlib-docs, tokenized by the packaged tokenizer, calibration text
included) is the same on the trimmed model as on the original; other texts are not.

    python bench/device_model.py minilm-l3 OUT_DIR     # writes OUT_DIR/minilm-l3.v1.onnx.gz

On the device: ``gunzip -c OUT_DIR/minilm-l3.v1.onnx.gz > $QUANTSCOPE_CACHE/minilm-l3.v1.onnx``.
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from quantscope.tasks.text import _data_file, load_pairs, load_tokenizer
from quantscope.zoo import resolve_model


def used_ids(max_length: int = 512) -> set[int]:
    """Every token id the packaged texts (pairs and calibration text) tokenize to."""
    tok = load_tokenizer(max_length=max_length)
    pairs = load_pairs("stdlib-docs")
    with gzip.open(_data_file("stdlib_docs_calib.txt.gz"), "rt", encoding="utf-8") as f:
        calib = f.read().splitlines()
    ids: set[int] = set()
    for enc in tok.encode_batch([*pairs.queries, *pairs.documents, *calib]):
        ids.update(enc.ids)
    ids.update(range(0, 1000))  # [PAD], [unused*], [UNK], [CLS], [SEP], [MASK]
    return ids


def trim(model: onnx.ModelProto, ids: set[int]) -> tuple[str, int, int]:
    """Zero the rows no id reads of the largest initializer a Gather reads; (name, kept, rows)."""
    inits = {i.name: i for i in model.graph.initializer}
    tables = [n.input[0] for n in model.graph.node if n.op_type == "Gather" and n.input[0] in inits]
    name = max(tables, key=lambda t: int(np.prod(inits[t].dims)))
    table = numpy_helper.to_array(inits[name]).copy()
    keep = np.zeros(table.shape[0], dtype=bool)
    keep[[i for i in ids if i < table.shape[0]]] = True
    table[~keep] = 0
    inits[name].CopyFrom(numpy_helper.from_array(table, name))
    return name, int(keep.sum()), int(table.shape[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    path = Path(resolve_model(args.model))
    model = onnx.load(str(path))
    name, kept, rows = trim(model, used_ids())
    args.out.mkdir(parents=True, exist_ok=True)
    dest = args.out / f"{path.name}.gz"
    with gzip.open(dest, "wb", compresslevel=6) as f:
        f.write(model.SerializeToString())
    print(f"{dest}: {name} {kept} of {rows} rows kept, {dest.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
