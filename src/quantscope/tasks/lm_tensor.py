"""What the figures of a language model given tensor data say, in one note.

A decoder LLM (or any LM head) run on token ids saved as ``.npz`` is scored as tensor
data. Its logits' fidelity (SQNR, cosine) says little of next-token quality. Declared as
class scores over the vocabulary (``--layout logits=class``: the last axis, from the graph
or ``axis=-1``), its top-1 agreement is FP32's top token kept at each position of the ids
given (teacher-forced): a next-token figure, but not KL, perplexity or decoding on a
quantized KV cache. Either way the note says which, and where the rest is measured; it
holds the words "says little", so ``run``'s verdict repeats it as a ``warning:``.
"""

from __future__ import annotations

from quantscope.model.load import Model
from quantscope.tasks.classes import ClassTask

PHASES = ("that is measured for a decoder given as prefill/decode phase graphs (--phase "
          "prefill,decode; docs/models-and-data.md; 'quantscope phases' converts a Hugging "
          "Face export with its KV cache)")


def vocabulary_outputs(model: Model, task: object | None) -> list[str]:
    """The outputs ``task`` scores as class scores on their last axis (per token)."""
    tasks = getattr(task, "tasks", None) or ((task,) if task is not None else ())
    shapes = model.value_shapes()
    out = []
    for t in tasks:
        rank = len(shapes.get(t.output) or ()) if isinstance(t, ClassTask) else 0
        if rank > 2 and t.axis % rank == rank - 1:
            out.append(t.output)
    return out


def language_model_note(model: Model, task: object | None) -> str | None:
    """The note for a language model (None when the graph shows none)."""
    from quantscope.model.phases import language_model

    why = language_model(model.proto, model.output_names())
    if not why:
        return None
    scored = vocabulary_outputs(model, task)
    if scored:
        names = ", ".join(f"'{o}'" for o in scored)
        return (f"language model ({why}): {names} scored as class scores over the last axis: "
                "the top-1 agreement is FP32's top token kept at each position of the token "
                "ids given (teacher-forced), which says little of KL, perplexity or decoding "
                f"on a quantized KV cache; {PHASES}")
    return (f"language model ({why}): the figures are its outputs' tensor fidelity (SQNR, "
            "cosine), which says little of next-token quality (top-1, KL, perplexity vs "
            f"FP32); {PHASES}")
