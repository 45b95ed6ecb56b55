"""File helpers of the commands: text and JSON files read with one-line errors, a
model's opset, the tokenizer that must sit beside a written model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx

from quantscope.serde import read_json
from quantscope.stages.open import resolve_model_path
from quantscope.types import QuantscopeError


def tokenizer_beside(spec: str, proto: onnx.ModelProto, out: str | Path) -> tuple[Path, Path] | None:
    """(tokenizer, where it must go) when a model written to ``out`` would lose the
    tokenizer ``spec``'s model names or sits with; None when there is none or it is there.
    """
    from quantscope.tasks.text import model_tokenizer

    source = model_tokenizer(resolve_model_path(spec), proto)
    if source is None:
        return None
    dest = Path(out).parent / source.name
    if dest.exists():
        if dest.resolve() == source.resolve() or dest.read_bytes() == source.read_bytes():
            return None
        raise QuantscopeError(
            f"'{dest}' exists and is not the tokenizer of '{spec}' ({source}): write the "
            "model into another folder (its tokenizer file goes beside it)")
    return source, dest


def opset_of(proto: onnx.ModelProto) -> int:
    return next((i.version for i in proto.opset_import if i.domain in ("", "ai.onnx")), 0)


def read_text(path: str | Path, what: str) -> str:
    path = Path(path)
    if not path.is_file():
        raise QuantscopeError(f"{what} file '{path}' does not exist: check the path")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise QuantscopeError(f"{what} file '{path}' is not UTF-8 text") from None


def read_json_file(path: str | Path, what: str) -> Any:
    return read_json(path, what)
