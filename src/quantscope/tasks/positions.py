"""How many tokens a text encoder takes: the rows of its learned position table.

A BERT-style export adds a learned position embedding: a ``Gather`` from a float table
``[P, H]`` whose indices the graph computes (a slice of a constant ``position_ids`` buffer;
RoBERTa's cumulative sum of the mask plus the padding index) instead of reading them from
a model input. A text longer than the table fails inside ONNX Runtime ("Attempting to
broadcast an axis by a dimension other than 1. 128 by 256"), which stopped every command
that reads text with an internal error. The texts are truncated at what the model takes.

==========================  ==============================================================
candidate table             a 2-D float initializer read by a ``Gather`` whose indices are
                            no model input, with more than 8 and at most ``upto + 2`` rows
                            (the word table is indexed by ``input_ids``; a token-type table
                            has 1 or 2 rows; RoBERTa's table has 2 rows more than it takes)
the limit                   none without a candidate (no run); else the model is run once
                            at ``upto`` tokens, and when that fails, the longest length
                            that runs is found by bisection (a few runs of one text)
==========================  ==============================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from quantscope.model.load import FLOAT_TYPES, Model
from quantscope.types import QuantscopeError


@dataclass(frozen=True)
class TokenLimit:
    """The most tokens the model runs, and the table that limits it."""

    tokens: int
    table: str
    rows: int

    def describe(self) -> str:
        return (f"the model takes at most {self.tokens} tokens (its position table "
                f"'{self.table}' has {self.rows} rows)")


def _candidates(proto: onnx.ModelProto, upto: int) -> list[tuple[str, int]]:
    inputs = {i.name for i in proto.graph.input}
    tables = {t.name: int(t.dims[0]) for t in proto.graph.initializer
              if t.data_type in FLOAT_TYPES and len(t.dims) == 2}
    return [(n.input[0], tables[n.input[0]]) for n in proto.graph.node
            if n.op_type == "Gather" and n.input[0] in tables and n.input[1] not in inputs
            and 8 < tables[n.input[0]] <= upto + 2]


def token_limit(proto: onnx.ModelProto, inputs: dict[str, str], upto: int
                ) -> TokenLimit | None:
    """The most tokens (< ``upto``) the encoder runs, or None when it runs ``upto`` or no
    position table could limit it. ``inputs``: role (``input_ids``, ``attention_mask``,
    ``token_type_ids``) -> graph input name; ``proto`` with its weights loaded."""
    found = _candidates(proto, upto)
    if not found:
        return None
    import onnxruntime as ort

    from quantscope.emulate.session import make_session

    session = make_session(proto)
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4  # the failing lengths are expected: ORT's log says nothing
    dtypes = {i.name: i.type.tensor_type.elem_type for i in proto.graph.input}

    def runs(length: int) -> bool:
        feeds = {}
        for role, name in inputs.items():
            dtype = np.int32 if dtypes.get(name) == onnx.TensorProto.INT32 else np.int64
            fill = 1 if role == "attention_mask" else 0
            feeds[name] = np.full((1, length), fill, dtype)
        try:
            session.run(None, feeds, quiet)
        except Exception:  # noqa: BLE001 - ORT raises its own Fail/RuntimeError kinds
            return False
        return True

    if runs(upto) or not runs(2):  # fits, or fails for another reason: not ours to say
        return None
    lo, hi = 2, upto  # runs(lo), not runs(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if runs(mid) else (lo, mid)
    table, rows = min(found, key=lambda c: abs(c[1] - lo))
    return TokenLimit(tokens=lo, table=table, rows=rows)


def check_length(proto: onnx.ModelProto, length: int, flag: str = "--seq-len",
                 batch: int | None = None) -> None:
    """A text encoder asked to run at ``length`` tokens (``flag``) that its position table
    cannot hold: one line naming the limit. A model that is no text encoder passes.
    ``batch``: the length is the dim 1 of ``--input-shape NAME=BATCHxLENGTH`` (``flag``
    the input's name)."""
    from quantscope.tasks.text import detect_encoder

    try:
        enc = detect_encoder(proto)
    except QuantscopeError:
        return
    limit = token_limit(proto, {r: n for r, n, _ in enc.inputs}, length)
    if limit is not None and batch is not None:
        raise QuantscopeError(f"--input-shape {flag}={batch}x{length}: {limit.describe()}, so "
                              f"it cannot be compiled at {length}: give {flag}={batch}x"
                              f"{limit.tokens} or less")
    if limit is not None:
        raise QuantscopeError(f"{flag} {length}: {limit.describe()}, so it cannot be "
                              f"compiled at {length}: give {flag} {limit.tokens} or less")


def check_token_lengths(model: Model, seq_len: int | None,
                        input_shapes: Sequence[tuple[str, tuple[int, ...]]] = ()) -> None:
    """``--seq-len`` and each token input's ``--input-shape`` length against the model's
    position table (:func:`check_length`): the commands that run the model at that length
    (run, the rewrites) refuse it before any work."""
    from quantscope.model.shapes import token_inputs

    if seq_len is not None:
        check_length(model.proto, seq_len)
    tokens = token_inputs(model) if input_shapes else set()
    for name, shape in input_shapes:
        if len(shape) == 2 and name in tokens:
            check_length(model.proto, shape[1], flag=name, batch=shape[0])
