"""A text encoder's outputs that its task does not score, said in one note.

A sentence-transformers export often returns both ``token_embeddings`` / ``last_hidden_state``
``[B, S, H]`` and ``sentence_embedding`` ``[B, H]`` (the pooling and Normalize in the
graph). The text task scores one of them (:func:`quantscope.tasks.text.detect_encoder`);
the other is scored for fidelity only, and the task's figures (the headline) do not include
its own error (the in-graph pooling's, for ``sentence_embedding``): the data notes say so,
and ``run``'s verdict repeats it as a ``warning:``.

Tensor data alike: a model whose outputs are read by tasks (declared with ``--layout`` or
detected: a Softmax face map) beside float outputs that no task reads (MTCNN's
box-regression map next to its face probabilities) has those scored for fidelity only, and
the headline is the tasks' (:func:`tensor_unscored_note`); ``run``'s verdict adds their
held-out figures.
"""

from __future__ import annotations

import onnx

MARK = "scored for fidelity only"  # the note's fixed words (the verdict finds them)
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)


def unscored_note(proto: onnx.ModelProto, scored: str) -> str | None:
    """The note naming the float outputs other than ``scored`` (None: there are none)."""
    others = [o for o in proto.graph.output
              if o.name != scored and o.type.tensor_type.elem_type in _FLOATS]
    if not others:
        return None
    names = ", ".join(f"'{o.name}' {_shape(o)}" for o in others)
    return (f"output {names} {MARK} (cosine, SQNR): the text task's figures (recall, "
            f"top1_agreement, embedding_*) are '{scored}''s; --output {others[0].name} "
            "makes the task score that output instead (commands that take --output)")


def embedding_note(proto: onnx.ModelProto, task: str) -> str | None:
    """The note of an image or face task, which reads the first output as the embedding:
    names it, and the other float outputs as scored for fidelity only (None: one output)."""
    first = proto.graph.output[0]
    others = [o for o in proto.graph.output[1:] if o.type.tensor_type.elem_type in _FLOATS]
    if not others:
        return None
    names = ", ".join(f"'{o.name}' {_shape(o)}" for o in others)
    return (f"the {task} task reads the first output '{first.name}' {_shape(first)} as the "
            f"embedding; output {names} {MARK} (cosine, SQNR)")


def tensor_unscored_note(proto: onnx.ModelProto, tasked: list[str],
                         kinds: tuple[str, ...] = ()) -> str | None:
    """The note naming the float outputs of tensor data that no task reads, when some
    task reads the others (``tasked``; None: every float output has a task, or none has);
    ``kinds``: the ``--layout`` kinds that score an output (the layout's registry's)."""
    others = [o for o in proto.graph.output
              if o.name not in tasked and o.type.tensor_type.elem_type in _FLOATS]
    if not tasked or not others:
        return None
    names = ", ".join(f"'{o.name}' {_shape(o)}" for o in others)
    read = ", ".join(f"'{t}'" for t in tasked)
    return (f"output {names} {MARK} (cosine, SQNR, per channel, in 'outputs'): the task's "
            f"figures and the headline are {read}'s; declare --layout "
            f"{others[0].name}=KIND ({', '.join(kinds)}) where a kind fits what it is for")


def unscored_names(note: str, names: list[str]) -> list[str]:
    """Which of ``names`` (the model's outputs) ``note`` names as scored for fidelity only:
    each named with its shape (``'boxes' [B,4,H,W]``). A detect layout's ``output 'boxes'
    read as ... of output 'scores' ...; rows 4-5 not read (... scored for fidelity only)``
    names outputs a task reads: some rows of one are fidelity-only, not the outputs."""
    head = note.partition(MARK)[0]
    return [n for n in names if f"'{n}' [" in head]


def is_unscored_note(note: str) -> bool:
    return MARK in note


def _shape(info: onnx.ValueInfoProto) -> str:
    """``[B,S,384]``: a symbolic dim is B (first) or S (the names shape inference makes up
    are long and say nothing); of a rank-4 output, ``[B,4,H,W]``."""
    dims = info.type.tensor_type.shape.dim
    return "[" + ",".join(str(d.dim_value) if d.dim_value else _free(i, len(dims))
                          for i, d in enumerate(dims)) + "]"


def _free(axis: int, rank: int) -> str:
    """The letter of a symbolic dim: B the samples, H and W an image's, else S."""
    return "B" if axis == 0 else ("HW"[axis - 2] if rank == 4 and axis >= 2 else "S")
