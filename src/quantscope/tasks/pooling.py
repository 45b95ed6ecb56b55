"""The pooling a sentence-transformers folder declares, checked against the one quantscope
applies: a ``[B, S, H]`` token output is mean pooled over the mask (``tasks/text.py``).

A BGE, GTE or Arctic-embed model pools by its CLS token, E5 and the MiniLMs by the mean;
the ONNX graph of an export that stops at ``last_hidden_state`` does not say which. The
sentence-transformers folder it came from does (``modules.json`` naming a ``Pooling``
module, whose ``config.json`` has ``pooling_mode_*`` flags). Where such a folder sits with
the model (its folder or the one above it: optimum writes ``onnx/model.onnx``) or the
tokenizer, a pooling other than the mean is refused in one line before any work: mean
pooling a CLS-trained model scores another model's embeddings, silently (h31)."""

from __future__ import annotations

import json
from pathlib import Path

from quantscope.types import QuantscopeError

POOLING_MODULE = "sentence_transformers.models.Pooling"


def _pooling_configs(folder: Path) -> list[Path]:
    modules = folder / "modules.json"
    if modules.is_file():
        try:
            listed = json.loads(modules.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise QuantscopeError(f"cannot read {modules}: {e}") from None
        return [folder / str(m.get("path", "")) / "config.json" for m in listed
                if isinstance(m, dict) and m.get("type") == POOLING_MODULE]
    plain = folder / "1_Pooling" / "config.json"
    return [plain] if plain.is_file() else []


def declared_pooling(model_file: str | Path, tokenizer: str | Path | None = None,
                     ) -> tuple[str, Path] | None:
    """The pooling modes a sentence-transformers folder beside the model (or the
    tokenizer) declares, joined by '+', and the config file; None where none is found."""
    model_dir = Path(model_file).parent
    folders = [model_dir, model_dir.parent]
    if tokenizer:
        tok = Path(tokenizer)
        folders.append(tok if tok.is_dir() else tok.parent)
    for folder in dict.fromkeys(folders):
        for cfg in _pooling_configs(folder):
            if not cfg.is_file():
                continue
            try:
                flags = json.loads(cfg.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise QuantscopeError(f"cannot read {cfg}: {e}") from None
            modes = [k.removeprefix("pooling_mode_") for k, v in flags.items()
                     if k.startswith("pooling_mode_") and v is True]
            return "+".join(modes) or "none", cfg
    return None


def refuse_other_pooling(model_file: str | Path, tokenizer: str | Path | None,
                         output: str, output_kind: str) -> None:
    """One line where the model's sentence-transformers folder pools otherwise than by
    the mean of the token output quantscope pools (``output_kind`` "tokens" or "auto")."""
    if output_kind == "pooled":
        return
    found = declared_pooling(model_file, tokenizer)
    if found is None or found[0] == "mean_tokens":
        return
    mode, cfg = found
    raise QuantscopeError(
        f"model '{Path(model_file).name}' pools by {mode} ({cfg}), and quantscope mean-pools "
        f"its token output '{output}' over the mask: the figures would be another model's; "
        "export the model with its pooling in the graph (an output [B, H], e.g. "
        "sentence-transformers' sentence_embedding); where the token output stays beside "
        "it, evaluate, analyze, plan, whatif and repair score that one with --output NAME "
        "(run takes no --output: it reads the token output)")
