"""The phases of a decoder LLM: one graph each, the same layer (node) names in both.

============  ======================================================================
``prefill``   the whole prompt at once: ``input_ids [1, N]`` -> logits + ``present.*``
``decode``    one token against the KV cache: ``input_ids [1, 1]`` + ``past.*`` of
              length P -> logits + ``present.*`` of length P + 1 (Hailo calls it TBT)
files         the decode graph sits next to the prefill graph, ``.prefill.`` in the
              file name replaced by ``.decode.`` (the built-in ``smollm2-135m`` does so)
shapes        ``--seq-len N`` means N prompt tokens in prefill and a cache of N tokens
              in decode: the shapes the legality rules are evaluated at
============  ======================================================================
"""

from __future__ import annotations

from pathlib import Path

from quantscope.model.load import Model
from quantscope.model.shapes import Shapes
from quantscope.types import QuantscopeError

PHASES = ("prefill", "decode")
PAST_PREFIX = "past."


def parse_phases(text: str) -> tuple[str, ...]:
    """``prefill,decode`` -> ('prefill', 'decode'); unknown names: one line."""
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in names if p not in PHASES]
    if bad or not names:
        raise QuantscopeError(f"unknown phase '{','.join(bad) or text}': use prefill, decode "
                              "or prefill,decode")
    return tuple(dict.fromkeys(names))


def phase_of(model: Model) -> str | None:
    """'decode' if the graph reads a past KV cache, 'prefill' if it writes one, else None."""
    if any(n.startswith(PAST_PREFIX) for n in model.input_names()):
        return "decode"
    if any(n.startswith("present.") for n in model.output_names()):
        return "prefill"
    return None


def phase_path(path: str | Path, phase: str) -> Path:
    """The file of ``phase`` for a prefill or decode graph file (the sibling by name)."""
    path = Path(path)
    for known in PHASES:
        tag = f".{known}."
        if tag in path.name:
            sibling = path.with_name(path.name.replace(tag, f".{phase}."))
            if not sibling.is_file():
                raise QuantscopeError(f"no {phase} graph next to '{path}': expected '{sibling}'")
            return sibling
    raise QuantscopeError(f"'{path}' is not a phase graph: its file name has no '.prefill.' or "
                          "'.decode.' (give the built-in smollm2-135m or such a pair of files)")


def phase_shapes(model: Model, phase: str, seq_len: int) -> Shapes:
    """Concrete input shapes of a phase graph at ``seq_len`` prompt / cache tokens."""
    shapes = model.value_shapes()
    out: Shapes = {"input_ids": (1, seq_len if phase == "prefill" else 1)}
    if phase == "decode":
        for name in model.input_names():
            if name.startswith(PAST_PREFIX):
                _, heads, _, dim = shapes[name]
                out[name] = (1, int(heads), seq_len, int(dim))  # type: ignore[arg-type]
    return out


__all__ = ["PHASES", "parse_phases", "phase_of", "phase_path", "phase_shapes"]
