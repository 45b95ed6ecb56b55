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

from collections.abc import Collection
from pathlib import Path

import onnx

from quantscope.model.load import Model
from quantscope.model.shapes import Shapes
from quantscope.types import QuantscopeError

PHASES = ("prefill", "decode")
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
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


INTERFACE = ("A prefill graph takes only input_ids [1, N] and returns logits + "
             "present.{i}.key|value; a decode graph takes input_ids [1, 1] + past.{i}.key|value "
             "and returns the same (docs/models-and-data.md)")


CONVERT = ("a Hugging Face causal-LM export (one graph: input_ids, attention_mask, "
           "past_key_values.* -> logits, present.*) is converted to such a pair by "
           "'quantscope phases EXPORT --out DIR'")


def check_phase_interface(path: Path, phase: str) -> Path:
    """A phase graph file that the LM evaluation cannot feed (other inputs, e.g. a Hugging
    Face export's ``attention_mask`` and ``past_key_values.*``, or no ``logits`` /
    ``present.*`` outputs): one line naming what differs, before any run fails inside ONNX
    Runtime. Reads the graph only (no external weights); returns ``path``."""
    graph = onnx.load(str(path), load_external_data=False).graph
    inits = {t.name for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in inits]
    outputs = [o.name for o in graph.output]
    present = {n[len("present."):] for n in outputs if n.startswith("present.")}
    past = {n[len(PAST_PREFIX):] for n in inputs if n.startswith(PAST_PREFIX)}
    other = [n for n in inputs if n != "input_ids"
             and not (phase == "decode" and n[len(PAST_PREFIX):] in present)]
    problems = []
    if "input_ids" not in inputs:
        problems.append("no input 'input_ids'")
    if other:
        problems.append("input(s) " + ", ".join(f"'{n}'" for n in other[:4])
                        + (f" (+{len(other) - 4} more)" if len(other) > 4 else ""))
    if "logits" not in outputs:
        problems.append("no output 'logits'")
    if not present:
        problems.append("no present.{i}.key|value outputs")
    elif phase == "decode" and past != present:
        problems.append("past.* inputs that do not match its present.* outputs")
    if problems:
        raise QuantscopeError(
            f"'{Path(path).name}' is no {phase} graph quantscope can run: it has "
            f"{'; '.join(problems)}. {INTERFACE}; {CONVERT}")
    return path


def language_model(proto: onnx.ModelProto, outputs: Collection[str]) -> str | None:
    """Why a graph is a language model (a KV cache in or out, or one of ``outputs`` with
    one value per token for each row of the table its token ids index: logits over the
    vocabulary), in words; None when it shows neither."""
    from quantscope.model.host_gather import host_gathers

    graph = proto.graph
    inits = {t.name for t in graph.initializer}
    past = [i.name for i in graph.input if i.name not in inits and i.name.startswith("past")]
    if past:
        return f"it reads a KV cache, input '{past[0]}'"
    present = [o.name for o in graph.output if o.name.startswith("present")]
    if present:
        return f"it writes a KV cache, output '{present[0]}'"
    # the vocabulary: the largest table looked up by an input (not a token-type table)
    vocab = max((g.shape[0] for g in host_gathers(proto, 3)), default=0)
    for o in graph.output:
        dims = o.type.tensor_type.shape.dim
        last = dims[-1].dim_value if len(dims) >= 2 else 0
        if o.name in outputs and last == vocab > 0:
            return (f"its output '{o.name}' has {last:,} values per token, one per row of the "
                    "table its token ids index: logits over its vocabulary")
    return None


def refuse_language_model(proto: onnx.ModelProto, output: str | None) -> None:
    """A decoder LLM (or any LM head) given text data: one line, not retrieval scored on
    its mean-pooled logits as if they were sentence embeddings. The output read is
    ``output``, else the one a sentence encoder's would be (the first float output of rank
    3, else of rank 2)."""
    floats = [(len(o.type.tensor_type.shape.dim), o.name) for o in proto.graph.output
              if o.type.tensor_type.elem_type in _FLOATS]
    read = [output] if output else [n for r, n in floats if r == 3][:1] or [
        n for r, n in floats if r == 2][:1]
    why = language_model(proto, read)
    if why:
        raise QuantscopeError(
            f"the model is a language model, not a sentence encoder ({why}): text data would "
            "score retrieval on its mean-pooled outputs. Next-token quality (top-1, KL, "
            "perplexity vs FP32) is measured for a decoder given as phase graphs "
            "NAME.prefill.onnx + NAME.decode.onnx + NAME.tokenizer.json (--phase "
            "prefill,decode, as the built-in smollm2-135m; docs/models-and-data.md): "
            f"{_convert_hint(proto)}; for its outputs' tensor fidelity give --data "
            "TOKENS.npz")


def _convert_hint(proto: onnx.ModelProto) -> str:
    """How to get the phase pair from this export."""
    inits = {t.name for t in proto.graph.initializer}
    if any(i.name.startswith("past_key_values.") for i in proto.graph.input
           if i.name not in inits):
        return "'quantscope run MODEL --data stdlib-docs …' measures this export (converted "\
               "into the run folder), or 'quantscope phases MODEL --out DIR' keeps the pair"
    return "export it with its KV cache (past_key_values.* in, present.* out) and convert "\
           "that with 'quantscope phases EXPORT --out DIR'"


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


__all__ = ["CONVERT", "PHASES", "check_phase_interface", "language_model", "parse_phases",
           "refuse_language_model", "phase_of", "phase_path",
           "phase_shapes"]
