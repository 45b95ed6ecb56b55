"""A ``tokenizer.json`` read into a :class:`tokenizers.Tokenizer` once per content.

Reading one builds its whole vocabulary (the packaged BERT tokenizer: ~30-60 ms), and a
run opens its data at several stages, each opening reading the tokenizer again, and
measuring the texts' untruncated lengths copied it again (through its JSON). Here the
tokenizers are kept by the file's bytes (a file edited in place, even with its times
kept, is read again) and the truncation length, the last :data:`KEPT_TOKENIZERS`, each
with its untruncated twin. A kept tokenizer is shared: quantscope never changes one after
it is made (padding off, truncation set here), and callers must not either.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import tokenizers

from quantscope.kept import Kept
from quantscope.types import QuantscopeError

KEPT_TOKENIZERS = 8
_UNTRUNCATED: dict[int, tokenizers.Tokenizer] = {}  # id of a kept one -> its twin
_KEPT: Kept[tuple[str, int], tokenizers.Tokenizer] = Kept(
    KEPT_TOKENIZERS, dropped=lambda t: _UNTRUNCATED.pop(id(t), None))


def read_tokenizer(file: Path, max_length: int) -> tokenizers.Tokenizer:
    """``file`` (a tokenizer.json) as a tokenizer without padding, truncating at
    ``max_length``: the one made before for the same bytes and length, if kept."""
    try:
        data = file.read_bytes()
    except OSError as err:
        raise QuantscopeError(f"cannot read tokenizer {file}: {err}") from None
    key = (hashlib.sha256(data).hexdigest(), max_length)
    got = _KEPT.get(key)
    if got is not None:
        return got
    try:
        tokenizer = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
    except Exception as err:  # noqa: BLE001 - the library raises plain Exception
        raise QuantscopeError(_tokenizer_error(file, err)) from None
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    return _KEPT.put(key, tokenizer)


def untruncated(tokenizer: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    """A copy of ``tokenizer`` that neither truncates nor pads: made once for a kept one."""
    kept = any(t is tokenizer for t in _KEPT.values())
    if kept and id(tokenizer) in _UNTRUNCATED:
        return _UNTRUNCATED[id(tokenizer)]
    full = tokenizers.Tokenizer.from_str(tokenizer.to_str())
    full.no_truncation()
    full.no_padding()
    if kept:
        _UNTRUNCATED[id(tokenizer)] = full
    return full


def _tokenizer_error(file: Path, err: Exception) -> str:
    """Why a file is no tokenizer: not JSON at all, or JSON of another kind (the library
    reports a valid JSON without the tokenizer's fields as a syntax error)."""
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, OSError):
        return f"cannot read tokenizer {file}: {err}"
    if not isinstance(doc, dict) or "model" not in doc:
        found = (f"keys {', '.join(sorted(doc)[:5])}" if isinstance(doc, dict) else
                 f"a JSON {type(doc).__name__}")
        return (f"tokenizer '{file}' is valid JSON but no tokenizer (it has {found}, not a "
                "'model' table): pass the tokenizer.json of a Hugging Face tokenizer")
    return f"cannot read tokenizer {file}: {err}"


__all__ = ["KEPT_TOKENIZERS", "read_tokenizer", "untruncated"]
